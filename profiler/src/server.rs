//! tier.v1 gRPC service. Stats fan out through a broadcast channel: each
//! watcher has its own bounded queue, so a slow watcher only loses its own
//! updates (seen as a gap in sequence numbers) and never stalls the others.
//! Watchers of the whole update share one encoding of it (`watch`).

use std::pin::Pin;
use std::sync::{Arc, RwLock};

use tokio::sync::{broadcast, mpsc};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use tier_proto::v1::tier_service_server::TierService;
use tier_proto::v1::*;

use tier_controller::policy::default_policy;

use crate::publish::{Frame, Published, frame};

/// Updates a watcher may fall behind before it starts losing them.
const WATCH_BACKLOG: usize = 8;

/// State shared by the sampling loop and the gRPC handlers.
#[derive(Debug)]
pub struct Shared {
    info: DaemonInfo,
    latest: RwLock<Option<Arc<Published>>>,
    /// Known VMs; set at start-up and by every update, so ListVms answers
    /// before the first interval has passed.
    vms: RwLock<Arc<Vec<Vm>>>,
    stats_tx: broadcast::Sender<Arc<Published>>,
    /// Controller decisions; the in-process controller publishes here.
    decisions_tx: broadcast::Sender<Arc<Decision>>,
    /// The last decision per VM, replayed to a new decision watcher so a
    /// fresh `tierctl top` shows every VM's last action.
    last_decisions: RwLock<std::collections::BTreeMap<String, Arc<Decision>>>,
    policy: RwLock<Policy>,
    /// `[controller] policy_file`: SetPolicy is written there first.
    policy_file: std::sync::OnceLock<std::path::PathBuf>,
    /// One SetPolicy at a time, so the file and memory agree.
    policy_write: tokio::sync::Mutex<()>,
    /// Set once at shutdown: every open stream ends so connections drain.
    closing: tokio::sync::watch::Sender<bool>,
    /// VMs whose per-tier balloon tierd can drive (SetBalloonTargets).
    fleet: RwLock<Option<crate::ch::Fleet>>,
    /// QEMU VMs whose virtio-mem devices SetBalloonTargets resizes.
    qemu_fleet: RwLock<crate::qemu::Fleet>,
    /// One beat per published interval, for grpc.health.v1.
    heartbeat: crate::health::Heartbeat,
}

impl Shared {
    pub fn new(info: DaemonInfo) -> Arc<Shared> {
        let (stats_tx, _) = broadcast::channel(WATCH_BACKLOG);
        let (decisions_tx, _) = broadcast::channel(256);
        Arc::new(Shared {
            info,
            latest: RwLock::new(None),
            vms: RwLock::new(Arc::new(Vec::new())),
            stats_tx,
            decisions_tx,
            last_decisions: RwLock::new(Default::default()),
            policy: RwLock::new(default_policy()),
            policy_file: std::sync::OnceLock::new(),
            policy_write: tokio::sync::Mutex::new(()),
            closing: tokio::sync::watch::Sender::new(false),
            fleet: RwLock::new(None),
            qemu_fleet: RwLock::new(Default::default()),
            heartbeat: crate::health::Heartbeat::default(),
        })
    }

    /// The actuators SetBalloonTargets may use.
    pub fn set_fleet(&self, fleet: crate::ch::Fleet) {
        if let Ok(mut f) = self.fleet.write() {
            *f = Some(fleet);
        }
    }

    /// The QEMU VMs SetBalloonTargets may resize.
    pub fn set_qemu_fleet(&self, fleet: crate::qemu::Fleet) {
        if let Ok(mut f) = self.qemu_fleet.write() {
            *f = fleet;
        }
    }

    fn qemu(&self, vm_id: &str) -> Option<Arc<crate::qemu::QemuHandle>> {
        self.qemu_fleet.read().ok()?.get(vm_id)
    }

    fn actuator(&self, vm_id: &str) -> Option<Arc<crate::ch::ChHandle>> {
        self.fleet.read().ok()?.as_ref()?.get(vm_id)
    }

    /// Replaces the list of known VMs.
    pub fn set_vms(&self, vms: Vec<Vm>) {
        if let Ok(mut v) = self.vms.write() {
            *v = Arc::new(vms);
        }
    }

    /// The known VMs.
    pub fn vms(&self) -> Arc<Vec<Vm>> {
        self.vms.read().map(|v| v.clone()).unwrap_or_default()
    }

    /// Publishes one interval's update to every watcher; an update whose
    /// VM list changed also replaces the known VMs. Returns it, shared.
    pub fn publish(&self, update: StatsUpdate) -> Arc<StatsUpdate> {
        if let Ok(mut last) = self.last_decisions.write() {
            for id in &update.departed_vm_ids {
                last.remove(id);
            }
        }
        if !update.vms_unchanged {
            self.set_vms(update.vms.clone());
        }
        let sampled = update.health.iter().any(|h| h.active);
        let update = Arc::new(update);
        let published = Arc::new(Published::new(update.clone()));
        if let Ok(mut latest) = self.latest.write() {
            *latest = Some(published.clone());
        }
        // No receivers is fine: nobody watches right now.
        let _ = self.stats_tx.send(published);
        self.heartbeat.beat(sampled);
        update
    }

    /// What grpc.health.v1 follows (`health::health`).
    pub fn heartbeat(&self) -> &crate::health::Heartbeat {
        &self.heartbeat
    }

    /// Publishes one controller decision to every decision watcher.
    pub fn publish_decision(&self, d: Decision) {
        let d = Arc::new(d);
        if let Ok(mut last) = self.last_decisions.write() {
            last.insert(d.vm_id.clone(), d.clone());
        }
        let _ = self.decisions_tx.send(d);
    }

    /// Keeps the policy in `path` from now on, starting from the one stored
    /// there if any (true when one was). Call once, before serving.
    pub fn keep_policy_in(
        &self,
        path: std::path::PathBuf,
    ) -> Result<bool, crate::policy_store::PolicyStoreError> {
        let stored = crate::policy_store::load(&path)?;
        let found = stored.is_some();
        if let Some(p) = stored
            && let Ok(mut cur) = self.policy.write()
        {
            *cur = p;
        }
        // A second call keeps the first path: there is one file per daemon.
        let _ = self.policy_file.set(path);
        Ok(found)
    }

    /// The policy in force.
    pub fn policy(&self) -> Policy {
        self.policy
            .read()
            .map(|p| p.clone())
            .unwrap_or_else(|_| default_policy())
    }

    /// Ends every open stream (graceful shutdown).
    pub fn close_streams(&self) {
        self.closing.send_replace(true);
    }

    fn latest(&self) -> Option<Arc<Published>> {
        self.latest.read().ok().and_then(|l| l.clone())
    }

    /// A WatchStats stream of `ids` (empty: every VM), each message made by
    /// `out` from what the watcher gets of an update (`publish::frame`).
    pub(crate) fn watch<U: Send + 'static>(
        self: &Arc<Self>,
        ids: Vec<String>,
        out: fn(Frame) -> U,
    ) -> Result<BoxStream<U>, Status> {
        check_ids(&ids)?;
        let rx = self.stats_tx.subscribe();
        let first = self.latest().into_iter().collect();
        let closing = self.closing.subscribe();
        let shared = self.clone();
        let mut sent_vms = false;
        Ok(forward(rx, closing, first, move |p| {
            Some(out(frame(p, &ids, &mut sent_vms, || shared.vms())))
        }))
    }
}

/// The service handed to tonic.
#[derive(Debug, Clone)]
pub struct TierServer {
    shared: Arc<Shared>,
}

impl TierServer {
    pub fn new(shared: Arc<Shared>) -> TierServer {
        TierServer { shared }
    }
}

pub(crate) type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn check_ids(ids: &[String]) -> Result<(), Status> {
    if let Some(i) = ids.iter().position(|s| s.is_empty()) {
        return Err(Status::invalid_argument(format!("vm_ids[{i}] is empty")));
    }
    Ok(())
}

/// Every target names a tier of `vm` once and fits in it.
fn check_balloon_targets(vm: &Vm, targets: &[BalloonTarget]) -> Result<(), Status> {
    if targets.is_empty() {
        return Err(Status::invalid_argument("targets is empty"));
    }
    let mut seen = std::collections::HashSet::new();
    for t in targets {
        if !seen.insert(t.tier.as_str()) {
            return Err(Status::invalid_argument(format!(
                "tier {:?} is given twice",
                t.tier
            )));
        }
        let Some(tier) = vm.tiers.iter().find(|x| x.name == t.tier) else {
            let names: Vec<&str> = vm.tiers.iter().map(|x| x.name.as_str()).collect();
            return Err(Status::invalid_argument(format!(
                "VM {} has no tier {:?}; its tiers: {}",
                vm.name,
                t.tier,
                names.join(", ")
            )));
        };
        if t.target_bytes > tier.size_bytes {
            return Err(Status::out_of_range(format!(
                "balloon {}={} bytes is larger than the tier ({} bytes)",
                t.tier, t.target_bytes, tier.size_bytes
            )));
        }
        if !t.target_bytes.is_multiple_of(4096) {
            return Err(Status::invalid_argument(format!(
                "balloon {}={} bytes is not a multiple of 4096",
                t.tier, t.target_bytes
            )));
        }
    }
    Ok(())
}

/// Manual targets through a cloud-hypervisor VM's API: the VMM must offer
/// a per-tier balloon (its last vm.info says so); a guest driver is not
/// needed to set targets. Answers with the targets vm.info reports after
/// the change.
async fn set_through_vmm(
    vm: &Vm,
    h: &crate::ch::ChHandle,
    targets: &[BalloonTarget],
) -> Result<Response<SetBalloonTargetsResponse>, Status> {
    use crate::ch::CallError;
    use tier_controller::actuate::ActuateError;
    let snap = h.snapshot();
    let offered = snap
        .info
        .as_ref()
        .and_then(|i| i.balloon.as_ref())
        .is_some_and(|b| b.tiers_offered);
    if snap.info.is_some() && !offered {
        return Err(Status::failed_precondition(format!(
            "VM {}: cloud-hypervisor runs it without a per-tier balloon (--balloon tiers=on); nothing was changed",
            vm.name
        )));
    }
    let list: Vec<(String, u64)> = targets
        .iter()
        .map(|t| (t.tier.clone(), t.target_bytes))
        .collect();
    if let Err(e) = h.set_targets(&list).await {
        tracing::warn!(vm = %vm.id, error = %e, "manual balloon targets failed");
        let msg = format!("VM {}: {e}; nothing was changed", vm.name);
        return Err(match &e {
            CallError::Deadline { .. }
            | CallError::Vmm(ActuateError::Timeout { .. } | ActuateError::Transport { .. }) => {
                Status::unavailable(msg)
            }
            CallError::Vmm(ActuateError::Vmm { .. } | ActuateError::NotTiered { .. }) => {
                Status::failed_precondition(msg)
            }
            CallError::Vmm(ActuateError::InvalidTargets(_)) => Status::invalid_argument(msg),
            CallError::Vmm(_) => Status::internal(msg),
        });
    }
    let after = h.snapshot();
    let in_force = targets
        .iter()
        .map(|t| BalloonTarget {
            tier: t.tier.clone(),
            // A failed read-back leaves the sent target (accepted: 204).
            target_bytes: match after.error {
                None => after.zone(&t.tier).map_or(t.target_bytes, |z| z.target),
                Some(_) => t.target_bytes,
            },
        })
        .collect();
    tracing::info!(vm = %vm.id, targets = ?list, "manual balloon targets set");
    Ok(Response::new(SetBalloonTargetsResponse {
        vm_id: vm.id.clone(),
        targets: in_force,
    }))
}

/// Forwards a broadcast into a per-watcher bounded queue until the watcher
/// goes away; lagging skips updates instead of blocking the sender.
fn forward<T, U, F>(
    mut rx: broadcast::Receiver<Arc<T>>,
    mut closing: tokio::sync::watch::Receiver<bool>,
    first: Vec<Arc<T>>,
    mut map: F,
) -> BoxStream<U>
where
    T: Send + Sync + 'static,
    U: Send + 'static,
    F: FnMut(&Arc<T>) -> Option<U> + Send + 'static,
{
    let (tx, out) = mpsc::channel(WATCH_BACKLOG);
    tokio::spawn(async move {
        for item in first.iter().filter_map(&mut map) {
            if tx.send(Ok(item)).await.is_err() {
                return;
            }
        }
        loop {
            let received = tokio::select! {
                r = rx.recv() => r,
                _ = closing.wait_for(|c| *c) => return,
            };
            let item = match received {
                Ok(item) => item,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::debug!(skipped = n, "watcher lagged");
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            };
            if let Some(u) = map(&item)
                && tx.send(Ok(u)).await.is_err()
            {
                return;
            }
        }
    });
    Box::pin(ReceiverStream::new(out))
}

#[tonic::async_trait]
impl TierService for TierServer {
    async fn get_info(&self, _: Request<GetInfoRequest>) -> Result<Response<DaemonInfo>, Status> {
        Ok(Response::new(self.shared.info.clone()))
    }

    async fn list_vms(
        &self,
        _: Request<ListVmsRequest>,
    ) -> Result<Response<ListVmsResponse>, Status> {
        Ok(Response::new(ListVmsResponse {
            vms: self.shared.vms().to_vec(),
        }))
    }

    async fn get_vm(&self, req: Request<GetVmRequest>) -> Result<Response<Vm>, Status> {
        let id = req.into_inner().id;
        if id.is_empty() {
            return Err(Status::invalid_argument("id is empty"));
        }
        self.shared
            .vms()
            .iter()
            .find(|v| v.id == id)
            .cloned()
            .map(Response::new)
            .ok_or_else(|| Status::not_found(format!("no VM with id {id:?}")))
    }

    type WatchStatsStream = BoxStream<StatsUpdate>;

    async fn watch_stats(
        &self,
        req: Request<WatchStatsRequest>,
    ) -> Result<Response<Self::WatchStatsStream>, Status> {
        // tierd serves this route through `watch::Routes` (shared
        // encodings); this one serves in-process callers.
        self.shared
            .watch(req.into_inner().vm_ids, Frame::into_update)
            .map(Response::new)
    }

    async fn get_policy(&self, _: Request<GetPolicyRequest>) -> Result<Response<Policy>, Status> {
        let p = self
            .shared
            .policy
            .read()
            .map_err(|_| Status::internal("policy lock poisoned"))?;
        Ok(Response::new(p.clone()))
    }

    async fn set_policy(&self, req: Request<SetPolicyRequest>) -> Result<Response<Policy>, Status> {
        let new = req
            .into_inner()
            .policy
            .ok_or_else(|| Status::invalid_argument("policy: required"))?;
        tier_controller::policy::Config::try_from(&new)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let _one_at_a_time = self.shared.policy_write.lock().await;
        if let Some(path) = self.shared.policy_file.get() {
            let (path, stored) = (path.clone(), new.clone());
            tokio::task::spawn_blocking(move || crate::policy_store::save(&path, &stored))
                .await
                .map_err(|e| Status::internal(format!("saving the policy: {e}")))?
                .map_err(|e| {
                    Status::unavailable(format!("{e}; the policy in force is unchanged"))
                })?;
        }
        let mut p = self
            .shared
            .policy
            .write()
            .map_err(|_| Status::internal("policy lock poisoned"))?;
        *p = new;
        tracing::info!(policy = ?*p, "policy replaced");
        Ok(Response::new(p.clone()))
    }

    async fn set_balloon_targets(
        &self,
        req: Request<SetBalloonTargetsRequest>,
    ) -> Result<Response<SetBalloonTargetsResponse>, Status> {
        let req = req.into_inner();
        if req.vm_id.is_empty() {
            return Err(Status::invalid_argument("vm_id is empty"));
        }
        let vms = self.shared.vms();
        let vm = vms
            .iter()
            .find(|v| v.id == req.vm_id)
            .ok_or_else(|| Status::not_found(format!("no VM with id {:?}", req.vm_id)))?;
        check_balloon_targets(vm, &req.targets)?;
        if let Some(h) = self.shared.qemu(&vm.id) {
            return crate::qemu::targets::set_targets(vm, &h, &req.targets).await;
        }
        let Some(h) = self.shared.actuator(&vm.id) else {
            return Err(Status::failed_precondition(format!(
                "VM {} has no per-tier balloon tierd can drive (needs the patched cloud-hypervisor or the vhost-user balloon backend); nothing was changed",
                vm.name
            )));
        };
        set_through_vmm(vm, &h, &req.targets).await
    }

    type WatchDecisionsStream = BoxStream<Decision>;

    async fn watch_decisions(
        &self,
        req: Request<WatchDecisionsRequest>,
    ) -> Result<Response<Self::WatchDecisionsStream>, Status> {
        let ids = req.into_inner().vm_ids;
        check_ids(&ids)?;
        let rx = self.shared.decisions_tx.subscribe();
        let recent = self
            .shared
            .last_decisions
            .read()
            .map(|l| l.values().cloned().collect())
            .unwrap_or_default();
        let closing = self.shared.closing.subscribe();
        Ok(Response::new(forward(
            rx,
            closing,
            recent,
            move |d: &Arc<Decision>| {
                (ids.is_empty() || ids.contains(&d.vm_id)).then(|| (**d).clone())
            },
        )))
    }
}
