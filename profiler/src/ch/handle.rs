//! One discovered cloud-hypervisor VM's API as tierd uses it: the last
//! `vm.info` (read once per interval, in the background), per-zone balloon
//! targets (serialised per VM), and the fleet of them by VM id, shared by
//! discovery, the in-process controller and SetBalloonTargets.
//!
//! Every call has a deadline and runs on its own task: a VMM that stops
//! answering costs its own VM a stale snapshot and errors, never the
//! sampling loop or the other VMs.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tier_controller::actuate::{
    ActuateError, BALLOON_DEVICE, Backoff, BalloonInfo, BalloonZone, ChApi, ResizableZone, VmInfo,
    Vmm,
};

/// What tierd last learnt from one VMM.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The last `vm.info` that answered.
    pub info: Option<VmInfo>,
    /// When it was read.
    pub read_at: Option<Instant>,
    /// Why the last attempt failed; `None` if it answered.
    pub error: Option<String>,
    /// Cumulative accesses per balloon tier index that the guest reports
    /// through the stats queue (`tier<i>_guest_accesses`), if it does.
    pub guest_accesses: BTreeMap<u32, u64>,
}

impl Snapshot {
    /// The balloon zone of `tier` (a zone id).
    pub fn zone(&self, tier: &str) -> Option<&BalloonZone> {
        self.info
            .as_ref()?
            .balloon
            .as_ref()?
            .zones
            .iter()
            .find(|z| z.id == tier)
    }

    /// The last `vm.info`, if it answered and was read within `max_age`;
    /// otherwise why not, for humans.
    pub fn fresh(&self, max_age: Duration) -> Result<&VmInfo, String> {
        if let Some(e) = &self.error {
            return Err(format!("its VMM API does not answer: {e}"));
        }
        let (Some(info), Some(at)) = (&self.info, self.read_at) else {
            return Err("no vm.info read yet".into());
        };
        if at.elapsed() > max_age {
            return Err(format!(
                "vm.info last read {:.1} s ago",
                at.elapsed().as_secs_f64()
            ));
        }
        Ok(info)
    }

    /// Zone `tier`'s hot-pluggable virtio-mem part, if it has one (from
    /// the last `vm.info`, however old).
    pub fn resizable(&self, tier: &str) -> Option<ResizableZone> {
        ResizableZone::of(self.info.as_ref()?, tier)
    }

    /// The per-tier balloon, if it can be driven for `tiers` now: read
    /// within `max_age`, offered, every tier a zone of it, and negotiated
    /// by the guest driver. Otherwise why not, for humans.
    pub fn drivable(&self, max_age: Duration, tiers: &[&str]) -> Result<&BalloonInfo, String> {
        let info = self.fresh(max_age)?;
        let Some(b) = info.balloon.as_ref().filter(|b| b.tiers_offered) else {
            return Err(
                "cloud-hypervisor runs it without a per-tier balloon (--balloon tiers=on)".into(),
            );
        };
        if let Some(t) = tiers.iter().find(|t| !b.zones.iter().any(|z| z.id == **t)) {
            return Err(format!("the per-tier balloon has no zone {t:?}"));
        }
        if !b.tiers_negotiated {
            return Err("the guest driver has not negotiated VIRTIO_BALLOON_F_TIERS (no per-tier balloon driver in the guest)".into());
        }
        Ok(b)
    }
}

/// A VMM call that did not complete.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error(transparent)]
    Vmm(#[from] ActuateError),
    #[error("no answer from the VMM on {socket} within {deadline:?}")]
    Deadline { socket: PathBuf, deadline: Duration },
}

/// One VM's cloud-hypervisor API.
#[derive(Debug)]
pub struct ChHandle {
    vm_id: String,
    pid: u32,
    socket: PathBuf,
    api: ChApi,
    deadline: Duration,
    state: Mutex<Snapshot>,
    refreshing: AtomicBool,
    /// One balloon change at a time per VM, in order.
    writes: tokio::sync::Mutex<()>,
}

impl ChHandle {
    /// `timeout` bounds each attempt; a call with its one retry is bounded
    /// by about twice that.
    pub fn new(
        vm_id: String,
        pid: u32,
        socket: PathBuf,
        timeout: Duration,
        info: VmInfo,
    ) -> ChHandle {
        let api = ChApi::new(&socket)
            .with_timeout(timeout)
            .with_backoff(Backoff {
                attempts: 2,
                initial: Duration::from_millis(50),
                max: Duration::from_millis(200),
            });
        ChHandle {
            vm_id,
            pid,
            socket,
            api,
            deadline: timeout * 2 + Duration::from_millis(250),
            state: Mutex::new(Snapshot {
                info: Some(info),
                read_at: Some(Instant::now()),
                ..Default::default()
            }),
            refreshing: AtomicBool::new(false),
            writes: tokio::sync::Mutex::new(()),
        }
    }

    pub fn vm_id(&self) -> &str {
        &self.vm_id
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Longest a call (with its retry) may take.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    pub fn snapshot(&self) -> Snapshot {
        self.state.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn update(&self, f: impl FnOnce(&mut Snapshot)) {
        if let Ok(mut s) = self.state.lock() {
            f(&mut s);
        }
    }

    /// Reads `vm.info` (and the guest's per-tier stats from `vm.counters`)
    /// into the snapshot. Returns the error text if vm.info failed.
    pub async fn refresh(&self) -> Result<(), String> {
        let info = match tokio::time::timeout(self.deadline, self.api.vm_info()).await {
            Ok(Ok(info)) => info,
            Ok(Err(e)) => return Err(self.failed(e.to_string())),
            Err(_) => {
                return Err(self.failed(format!(
                    "GET /api/v1/vm.info: no answer within {:?}",
                    self.deadline
                )));
            }
        };
        let has_balloon = info.balloon.is_some();
        self.update(|s| {
            s.info = Some(info);
            s.read_at = Some(Instant::now());
            s.error = None;
        });
        if has_balloon
            && let Ok(Ok(counters)) = tokio::time::timeout(self.deadline, self.api.counters()).await
        {
            let guest = guest_accesses(counters.get(BALLOON_DEVICE));
            self.update(|s| s.guest_accesses = guest);
        }
        Ok(())
    }

    fn failed(&self, e: String) -> String {
        self.update(|s| s.error = Some(e.clone()));
        e
    }

    /// Starts a refresh on its own task unless one is still running.
    pub fn spawn_refresh(self: &Arc<Self>) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let h = self.clone();
        tokio::spawn(async move {
            // Cleared however the task ends (a panic included), or the VM
            // would never be refreshed again.
            let _done = ClearOnDrop(&h.refreshing);
            let _ = h.refresh().await;
        });
    }

    /// Sets per-zone balloon targets (all or nothing, SPEC.md section 5),
    /// then reads `vm.info` back so the snapshot shows them.
    pub async fn set_targets(&self, targets: &[(String, u64)]) -> Result<(), CallError> {
        let _one_at_a_time = self.writes.lock().await;
        let r = tokio::time::timeout(self.deadline, self.api.set_tier_targets(targets)).await;
        let r = match r {
            Ok(r) => r.map_err(CallError::from),
            Err(_) => Err(CallError::Deadline {
                socket: self.socket.clone(),
                deadline: self.deadline,
            }),
        };
        let _ = self.refresh().await;
        r
    }
}

impl ChHandle {
    /// Resizes zone `zone` to `desired_ram` bytes in all (boot +
    /// hot-plugged; `vm.resize-zone`), one change at a time per VM like
    /// balloon targets, then reads `vm.info` back.
    pub async fn resize_zone(&self, zone: &str, desired_ram: u64) -> Result<(), CallError> {
        let _one_at_a_time = self.writes.lock().await;
        let r = tokio::time::timeout(self.deadline, self.api.resize_zone(zone, desired_ram)).await;
        let r = match r {
            Ok(r) => r.map_err(CallError::from),
            Err(_) => Err(CallError::Deadline {
                socket: self.socket.clone(),
                deadline: self.deadline,
            }),
        };
        let _ = self.refresh().await;
        r
    }
}

/// `tier<i>_guest_accesses` of the balloon's counters, by tier index.
pub fn guest_accesses(counters: Option<&BTreeMap<String, u64>>) -> BTreeMap<u32, u64> {
    counters
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| {
            let i = k.strip_prefix("tier")?.strip_suffix("_guest_accesses")?;
            Some((i.parse().ok()?, *v))
        })
        .collect()
}

/// Clears a flag when dropped.
struct ClearOnDrop<'a>(&'a AtomicBool);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The discovered cloud-hypervisor VMs by VM id.
#[derive(Debug, Clone, Default)]
pub struct Fleet {
    inner: Arc<RwLock<HashMap<String, Arc<ChHandle>>>>,
}

impl Fleet {
    pub fn get(&self, vm_id: &str) -> Option<Arc<ChHandle>> {
        self.inner.read().ok()?.get(vm_id).cloned()
    }

    pub fn insert(&self, h: Arc<ChHandle>) {
        if let Ok(mut m) = self.inner.write() {
            m.insert(h.vm_id.clone(), h);
        }
    }

    /// Keeps the VMs for which `keep(id)` holds; returns the others.
    pub fn retain(&self, mut keep: impl FnMut(&str) -> bool) -> Vec<Arc<ChHandle>> {
        let Ok(mut m) = self.inner.write() else {
            return Vec::new();
        };
        let gone: Vec<String> = m.keys().filter(|id| !keep(id)).cloned().collect();
        gone.iter().filter_map(|id| m.remove(id)).collect()
    }

    pub fn all(&self) -> Vec<Arc<ChHandle>> {
        self.inner
            .read()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(json: &str) -> VmInfo {
        serde_json::from_str(json).unwrap()
    }

    const BALLOON: &str = r#"{"state":"Running","balloon":{"tiers_offered":true,"tiers_negotiated":NEG,"legacy_target":0,"legacy_actual":0,"zones":[
        {"id":"dram","tier":0,"target":67108864,"actual":0,"host_ballooned":0,"inflated_pfns":0,"deflated_pfns":0,"rejected_pfns":0},
        {"id":"slow","tier":1,"target":0,"actual":0,"host_ballooned":0,"inflated_pfns":0,"deflated_pfns":0,"rejected_pfns":0}]}}"#;

    fn snap(json: &str) -> Snapshot {
        Snapshot {
            info: Some(info(json)),
            read_at: Some(Instant::now()),
            ..Default::default()
        }
    }

    #[test]
    fn drivable_needs_a_fresh_offered_negotiated_balloon_with_every_tier() {
        let age = Duration::from_secs(5);
        let ok = snap(&BALLOON.replace("NEG", "true"));
        assert!(ok.drivable(age, &["dram", "slow"]).is_ok());
        assert_eq!(ok.zone("dram").unwrap().target, 64 << 20);
        let e = ok.drivable(age, &["dram", "pmem"]).unwrap_err();
        assert!(e.contains("no zone \"pmem\""), "{e}");
        let e = snap(&BALLOON.replace("NEG", "false"))
            .drivable(age, &["dram"])
            .unwrap_err();
        assert!(e.contains("not negotiated"), "{e}");
        let e = snap(r#"{"state":"Running"}"#)
            .drivable(age, &["dram"])
            .unwrap_err();
        assert!(e.contains("tiers=on"), "{e}");
        let mut stale = ok.clone();
        stale.read_at = Instant::now().checked_sub(Duration::from_secs(10));
        assert!(stale.drivable(age, &["dram"]).unwrap_err().contains("ago"));
        let mut failing = ok.clone();
        failing.error = Some("connection refused".into());
        assert!(
            failing
                .drivable(age, &["dram"])
                .unwrap_err()
                .contains("connection refused")
        );
        assert!(Snapshot::default().drivable(age, &[]).is_err());
    }

    #[test]
    fn guest_access_counters_by_tier_index() {
        let c: BTreeMap<String, u64> = [
            ("tier0_guest_accesses", 10),
            ("tier1_guest_accesses", 30),
            ("tier1_target_bytes", 4096),
            ("stat_free_memory", 1),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(guest_accesses(Some(&c)), BTreeMap::from([(0, 10), (1, 30)]));
        assert!(guest_accesses(None).is_empty());
    }
}
