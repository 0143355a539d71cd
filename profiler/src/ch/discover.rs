//! Finding cloud-hypervisor VMs by their API sockets, once per interval,
//! without ever waiting on a VMM in the sampling loop: probes (connect,
//! SO_PEERCRED, `vm.info`) run on their own tasks with deadlines and are
//! collected on a later interval.
//!
//! Candidates: every unix socket in `[discovery] ch_api_dir` (and one
//! directory level below), plus the `--api-socket` of every process that
//! holds a kvm-vm fd (`ch_cmdline`). A socket is linked to its VM by the
//! PID of the process listening on it (SO_PEERCRED), whose kvm-vm fd gives
//! the VM id `ch:<pid>:<fd>`; the same fd is what the samplers and the
//! kvm-fd discovery key on, so a kvm-fd VM of that process is replaced.
//! A socket that fails (refused, no answer, not a VMM, VM not booted, VMM
//! without vmm-patch 0003) is retried with backoff (1 s doubling to 30 s)
//! and logged when its error changes; it affects no other VM.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tier_controller::actuate::{Backoff, ChApi, MemoryZone, VmInfo};
use tier_proto::v1::{TierKind, Vm, VmSource};
use tokio::task::{Id, JoinSet};

use super::handle::{ChHandle, Fleet};
use super::tracked::ChVm;
use super::{layout, sockets};
use crate::discovery::{self, KvmFd};
use crate::memtier::MemoryTiers;
use crate::registry::Registry;

/// `[discovery]` settings for cloud-hypervisor.
#[derive(Debug, Clone, PartialEq)]
pub struct ChConfig {
    /// Directory of API sockets; `None`: no directory scan.
    pub api_dir: Option<PathBuf>,
    /// Also the `--api-socket` of processes holding a kvm-vm fd.
    pub cmdline: bool,
    /// Per-attempt timeout of every API call.
    pub timeout: Duration,
    /// Root of the kernel's memory tiers (normally [`crate::memtier::SYSFS`]).
    pub memtier_root: PathBuf,
}

/// What a successful probe learnt.
#[derive(Debug)]
struct Probed {
    pid: u32,
    info: VmInfo,
}

#[derive(Debug)]
struct Retry {
    next: Instant,
    failures: u32,
    error: String,
}

/// Longest wait between two probes of a failing socket.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The cloud-hypervisor part of discovery.
#[derive(Debug)]
pub struct ChDiscovery {
    cfg: ChConfig,
    proc_root: PathBuf,
    overrides: HashMap<String, TierKind>,
    fleet: Fleet,
    probes: JoinSet<(PathBuf, Result<Probed, String>)>,
    /// Socket of each probe in flight, and the PID named by its command
    /// line (None for a socket found in the directory).
    probing: HashMap<Id, (PathBuf, Option<u32>)>,
    retry: HashMap<PathBuf, Retry>,
    /// Socket paths (as found) -> id of the VM they lead to.
    tracked: HashMap<PathBuf, String>,
    /// Zones each tracked VM's tier map was built from.
    built: HashMap<String, Vec<MemoryZone>>,
    warned_no_runtime: bool,
}

async fn probe(socket: PathBuf, timeout: Duration) -> Result<Probed, String> {
    let pid = match tokio::time::timeout(timeout, sockets::listener_pid(&socket)).await {
        Ok(Ok(pid)) => pid,
        Ok(Err(e)) => return Err(format!("connect: {e}")),
        Err(_) => return Err(format!("connect: no answer within {timeout:?}")),
    };
    let api = ChApi::new(&socket)
        .with_timeout(timeout)
        .with_backoff(Backoff {
            attempts: 1,
            ..Backoff::default()
        });
    match tokio::time::timeout(timeout * 2, api.vm_info()).await {
        Ok(Ok(info)) => Ok(Probed { pid, info }),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("GET /api/v1/vm.info: no answer within {timeout:?}")),
    }
}

impl ChDiscovery {
    pub fn new(
        cfg: ChConfig,
        proc_root: &Path,
        overrides: HashMap<String, TierKind>,
        fleet: Fleet,
    ) -> ChDiscovery {
        ChDiscovery {
            cfg,
            proc_root: proc_root.to_path_buf(),
            overrides,
            fleet,
            probes: JoinSet::new(),
            probing: HashMap::new(),
            retry: HashMap::new(),
            tracked: HashMap::new(),
            built: HashMap::new(),
            warned_no_runtime: false,
        }
    }

    pub fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    /// PIDs whose VM this part tracks, or whose `--api-socket` it is
    /// probing (the kvm-fd part leaves them alone; a failed probe hands
    /// them back, so a VMM with a broken API is still sampled).
    pub fn claimed_pids(&self) -> HashSet<u32> {
        let mut pids: HashSet<u32> = self.fleet.all().iter().map(|h| h.pid()).collect();
        pids.extend(self.probing.values().filter_map(|(_, pid)| *pid));
        pids
    }

    /// One interval, given this interval's kvm-vm fds: adopt finished
    /// probes, forget departed VMs, rebuild changed tier maps, refresh the
    /// tracked VMs and probe new sockets.
    pub fn run(&mut self, reg: &mut Registry, kvm: &[KvmFd]) {
        if tokio::runtime::Handle::try_current().is_err() {
            if !self.warned_no_runtime {
                tracing::warn!("cloud-hypervisor discovery needs the tokio runtime; skipped");
                self.warned_no_runtime = true;
            }
            return;
        }
        let left = self.fleet.retain(|id| reg.contains(id));
        for h in left {
            self.built.remove(h.vm_id());
            self.tracked.retain(|_, id| id != h.vm_id());
        }
        while let Some(done) = self.probes.try_join_next_with_id() {
            let (id, socket, result) = match done {
                Ok((id, (socket, r))) => (id, socket, r),
                Err(e) => {
                    let socket = self.probing.remove(&e.id()).unwrap_or_default().0;
                    tracing::warn!(socket = %socket.display(), error = %e, "cloud-hypervisor probe task failed");
                    continue;
                }
            };
            self.probing.remove(&id);
            match result.and_then(|p| self.adopt(reg, kvm, &socket, p)) {
                Ok(()) => {}
                Err(e) => self.failed(&socket, e),
            }
        }
        self.rebuild_changed(reg, kvm);
        for h in self.fleet.all() {
            h.spawn_refresh();
        }
        self.probe_new(kvm);
    }

    /// Socket paths, with the PID whose command line names them.
    fn candidates(&self, kvm: &[KvmFd]) -> BTreeMap<PathBuf, Option<u32>> {
        let mut out = BTreeMap::new();
        if let Some(dir) = &self.cfg.api_dir {
            out.extend(sockets::in_dir(dir).into_iter().map(|s| (s, None)));
        }
        if self.cfg.cmdline {
            let me = std::process::id();
            let pids: BTreeSet<u32> = kvm.iter().map(|k| k.pid).filter(|p| *p != me).collect();
            for p in pids {
                if let Some(s) = sockets::of_process(&self.proc_root, p) {
                    out.insert(s, Some(p));
                }
            }
        }
        out
    }

    fn probe_new(&mut self, kvm: &[KvmFd]) {
        let found = self.candidates(kvm);
        let now = Instant::now();
        // A socket that is gone starts afresh if it comes back.
        self.retry.retain(|s, _| found.contains_key(s));
        let probing: HashSet<PathBuf> = self.probing.values().map(|(s, _)| s.clone()).collect();
        for (socket, pid) in found {
            if self.tracked.contains_key(&socket)
                || probing.contains(&socket)
                || self.retry.get(&socket).is_some_and(|r| r.next > now)
            {
                continue;
            }
            let timeout = self.cfg.timeout;
            let s = socket.clone();
            let h = self
                .probes
                .spawn(async move { (s.clone(), probe(s, timeout).await) });
            self.probing.insert(h.id(), (socket, pid));
        }
    }

    fn failed(&mut self, socket: &Path, error: String) {
        let r = self.retry.entry(socket.to_path_buf()).or_insert(Retry {
            next: Instant::now(),
            failures: 0,
            error: String::new(),
        });
        r.failures += 1;
        let wait = Duration::from_secs(1u64 << (r.failures - 1).min(5)).min(MAX_BACKOFF);
        r.next = Instant::now() + wait;
        if r.error != error {
            tracing::warn!(socket = %socket.display(), error = %error, retry_in = ?wait, "cloud-hypervisor API socket not usable");
            r.error = error;
        } else {
            tracing::debug!(socket = %socket.display(), error = %error, retry_in = ?wait, "cloud-hypervisor API socket still not usable");
        }
    }

    /// The tier map and identity of a probed VMM.
    fn build(
        &self,
        socket: &Path,
        pid: u32,
        key: KvmFd,
        zones: &[MemoryZone],
        info: &VmInfo,
    ) -> Result<Vm, String> {
        let dir = self.proc_root.join(pid.to_string());
        let maps = std::fs::read_to_string(dir.join("maps"))
            .map_err(|e| format!("process {pid}: maps: {e}"))?;
        let numa = std::fs::read_to_string(dir.join("numa_maps")).unwrap_or_default();
        let memtiers = MemoryTiers::read(&self.cfg.memtier_root);
        let mut tiers = layout::tiers(zones, &maps, &numa, &self.overrides, &memtiers);
        layout::unreported_hotplug(&mut tiers, info);
        if tiers.is_empty() {
            return Err("vm.info memory_zones has no zone with RAM".into());
        }
        Ok(Vm {
            id: format!("ch:{}:{}", key.pid, key.fd),
            name: sockets::vm_name(socket, self.cfg.api_dir.as_deref()),
            vmm_pid: pid,
            api_socket: socket.display().to_string(),
            vcpus: discovery::vcpu_count(&dir),
            tiers,
            source: VmSource::CloudHypervisor as i32,
            discovered_unix_ns: crate::unix_now_ns(),
        })
    }

    fn adopt(
        &mut self,
        reg: &mut Registry,
        kvm: &[KvmFd],
        socket: &Path,
        p: Probed,
    ) -> Result<(), String> {
        if p.pid == std::process::id() {
            return Err("the socket is tierd's own".into());
        }
        let Some(zones) = layout::zones_of(&p.info) else {
            return Err(format!(
                "vm.info (state {}) has neither memory_zones (vmm-patch 0003) nor config.memory.zones: a VM not booted, or one without memory zones",
                p.info.state
            ));
        };
        let mut fds = kvm.iter().filter(|k| k.pid == p.pid);
        let Some(&key) = fds.next() else {
            return Err(format!(
                "process {} listens on it but holds no kvm-vm fd (VM state {})",
                p.pid, p.info.state
            ));
        };
        if fds.next().is_some() {
            tracing::warn!(
                pid = p.pid,
                "several kvm-vm fds in one cloud-hypervisor process; using the first"
            );
        }
        let id = format!("ch:{}:{}", key.pid, key.fd);
        if reg.contains(&id) {
            // Another path to the same socket (symlink, relative path).
            self.tracked.insert(socket.to_path_buf(), id);
            self.retry.remove(socket);
            return Ok(());
        }
        let vm = self.build(socket, p.pid, key, &zones, &p.info)?;
        let handle = Arc::new(ChHandle::new(
            id.clone(),
            p.pid,
            socket.to_path_buf(),
            self.cfg.timeout,
            p.info,
        ));
        let replaced =
            reg.retire(|v| v.vm().vmm_pid == p.pid && v.vm().source() == VmSource::KvmFd);
        tracing::info!(
            vm = %id,
            name = %vm.name,
            socket = %socket.display(),
            pid = p.pid,
            tiers = ?vm.tiers.iter().map(|t| (t.name.as_str(), t.kind().short_name(), t.size_bytes)).collect::<Vec<_>>(),
            replaces = ?replaced,
            "cloud-hypervisor VM discovered"
        );
        for t in &vm.tiers {
            tracing::debug!(vm = %id, tier = %t.name, derivation = %t.derivation, "tier map");
        }
        reg.insert(Box::new(ChVm::new(
            vm,
            key,
            self.proc_root.clone(),
            handle.clone(),
            zones.clone(),
        )));
        self.fleet.insert(handle);
        self.built.insert(id.clone(), zones);
        self.tracked.insert(socket.to_path_buf(), id);
        self.retry.remove(socket);
        Ok(())
    }

    /// A VMM whose zones changed (memory hot-plugged into a zone) gets its
    /// tier map rebuilt under the same id; watchers get the new VM list.
    fn rebuild_changed(&mut self, reg: &mut Registry, kvm: &[KvmFd]) {
        for h in self.fleet.all() {
            let Some(info) = h.snapshot().info else {
                continue;
            };
            let Some(zones) = layout::zones_of(&info) else {
                continue;
            };
            if self.built.get(h.vm_id()) == Some(&zones) {
                continue;
            }
            let Some(&key) = kvm
                .iter()
                .find(|k| format!("ch:{}:{}", k.pid, k.fd) == h.vm_id())
            else {
                continue;
            };
            match self.build(h.socket(), h.pid(), key, &zones, &info) {
                Ok(mut vm) => {
                    vm.id = h.vm_id().to_string();
                    tracing::info!(vm = %vm.id, "cloud-hypervisor memory zones changed; tier map rebuilt");
                    reg.insert(Box::new(ChVm::new(
                        vm,
                        key,
                        self.proc_root.clone(),
                        h.clone(),
                        zones.clone(),
                    )));
                    self.built.insert(h.vm_id().to_string(), zones);
                }
                Err(e) => {
                    tracing::warn!(vm = %h.vm_id(), error = %e, "rebuilding the tier map");
                }
            }
        }
    }
}
