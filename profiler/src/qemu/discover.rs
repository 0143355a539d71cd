//! Finding QEMU VMs by their QMP sockets, once per interval, without ever
//! waiting on a QEMU in the sampling loop: probes (connect, SO_PEERCRED,
//! the layout through QMP) run on their own tasks with deadlines and are
//! collected on a later interval.
//!
//! A socket leads to the process listening on it (SO_PEERCRED), whose VM
//! id is `qemu:<pid>`: two sockets of one QEMU are one VM, and a kvm-fd VM
//! of that process (`kvm:<pid>:<fd>`) is replaced. A socket that fails is
//! retried with backoff (1 s doubling to 30 s) and logged when its error
//! changes; it affects no other VM.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tier_proto::v1::{TierKind, Vm, VmSource};
use tokio::task::{Id, JoinSet};

use super::handle::{Fleet, QemuHandle, TierDevice};
use super::machine::{self, Live, Machine};
use super::qmp::Qmp;
use super::tracked::QemuVm;
use super::{layout, sockets};
use crate::memtier::MemoryTiers;
use crate::registry::Registry;

/// `[discovery]` settings for QEMU.
#[derive(Debug, Clone, PartialEq)]
pub struct QemuConfig {
    /// QMP socket paths and globs.
    pub sockets: Vec<PathBuf>,
    /// Per-step timeout of every QMP call.
    pub timeout: Duration,
    /// Root of the kernel's memory tiers (normally [`crate::memtier::SYSFS`]).
    pub memtier_root: PathBuf,
}

#[derive(Debug)]
struct Probed {
    pid: u32,
    machine: Machine,
}

#[derive(Debug)]
struct Retry {
    next: Instant,
    failures: u32,
    error: String,
}

const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The QEMU part of discovery.
#[derive(Debug)]
pub struct QemuDiscovery {
    cfg: QemuConfig,
    proc_root: PathBuf,
    overrides: HashMap<String, TierKind>,
    fleet: Fleet,
    probes: JoinSet<(PathBuf, Result<Probed, String>)>,
    probing: HashMap<Id, PathBuf>,
    retry: HashMap<PathBuf, Retry>,
    /// Socket paths -> id of the VM they lead to.
    tracked: HashMap<PathBuf, String>,
    /// The last QMP error logged per VM.
    errors: HashMap<String, String>,
    warned_no_runtime: bool,
}

async fn probe(socket: PathBuf, timeout: Duration) -> Result<Probed, String> {
    let read = async {
        let mut q = Qmp::connect(&socket, timeout).await?;
        let machine = machine::read(&mut q).await?;
        Ok::<_, super::qmp::QmpError>(Probed {
            pid: q.pid(),
            machine,
        })
    };
    // Many short calls: the whole probe gets a few timeouts' worth.
    match tokio::time::timeout(timeout * 4, read).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err(format!(
            "the QMP layout queries took longer than {:?}",
            timeout * 4
        )),
    }
}

impl QemuDiscovery {
    pub fn new(
        cfg: QemuConfig,
        proc_root: &Path,
        overrides: HashMap<String, TierKind>,
        fleet: Fleet,
    ) -> QemuDiscovery {
        QemuDiscovery {
            cfg,
            proc_root: proc_root.to_path_buf(),
            overrides,
            fleet,
            probes: JoinSet::new(),
            probing: HashMap::new(),
            retry: HashMap::new(),
            tracked: HashMap::new(),
            errors: HashMap::new(),
            warned_no_runtime: false,
        }
    }

    /// PIDs whose VM this part tracks (the kvm-fd part leaves them alone).
    pub fn claimed_pids(&self) -> HashSet<u32> {
        self.fleet.all().iter().map(|h| h.pid()).collect()
    }

    /// One interval: adopt finished probes, forget departed VMs, refresh
    /// the tracked ones and probe new sockets.
    pub fn run(&mut self, reg: &mut Registry) {
        if tokio::runtime::Handle::try_current().is_err() {
            if !self.warned_no_runtime {
                tracing::warn!("QEMU discovery needs the tokio runtime; skipped");
                self.warned_no_runtime = true;
            }
            return;
        }
        self.relayout(reg);
        for h in self.fleet.retain(|id| reg.contains(id)) {
            tracing::info!(vm = %h.vm_id(), "QEMU VM gone");
            self.tracked.retain(|_, id| id != h.vm_id());
            self.errors.remove(h.vm_id());
        }
        while let Some(done) = self.probes.try_join_next_with_id() {
            let (id, socket, result) = match done {
                Ok((id, (socket, r))) => (id, socket, r),
                Err(e) => {
                    let socket = self.probing.remove(&e.id()).unwrap_or_default();
                    tracing::warn!(socket = %socket.display(), error = %e, "QMP probe task failed");
                    continue;
                }
            };
            self.probing.remove(&id);
            if let Err(e) = result.and_then(|p| self.adopt(reg, &socket, p)) {
                self.failed(&socket, e);
            }
        }
        for h in self.fleet.all() {
            self.log_change(&h);
            h.spawn_refresh();
        }
        self.probe_new();
    }

    /// Forgets VMs whose virtio-mem devices changed since discovery, so
    /// their sockets are probed again and the tier map rebuilt (the VM
    /// departs and comes back under the same id).
    fn relayout(&mut self, reg: &mut Registry) {
        for h in self.fleet.all() {
            let Some(change) = h.devices_changed() else {
                continue;
            };
            tracing::info!(vm = %h.vm_id(), %change, "QEMU VM's memory devices changed; re-reading its layout");
            reg.retire(|v| v.vm().id == h.vm_id());
            self.fleet.retain(|id| id != h.vm_id());
            self.tracked.retain(|_, id| id != h.vm_id());
            self.errors.remove(h.vm_id());
        }
    }

    /// Logs a VM's QMP error when it changes (and when it clears).
    fn log_change(&mut self, h: &QemuHandle) {
        let now = h.snapshot().error;
        let last = self.errors.get(h.vm_id());
        match (now, last) {
            (Some(e), l) if l != Some(&e) => {
                tracing::warn!(vm = %h.vm_id(), error = %e, "QMP of a tracked QEMU VM fails; it stays tracked, its memory is not resized");
                self.errors.insert(h.vm_id().to_string(), e);
            }
            (None, Some(_)) => {
                tracing::info!(vm = %h.vm_id(), "QMP answers again");
                self.errors.remove(h.vm_id());
            }
            _ => {}
        }
    }

    fn probe_new(&mut self) {
        let found = sockets::find(&self.cfg.sockets);
        let now = Instant::now();
        self.retry.retain(|s, _| found.contains(s));
        let probing: HashSet<&PathBuf> = self.probing.values().collect();
        let mut new = Vec::new();
        for socket in found {
            if self.tracked.contains_key(&socket)
                || probing.contains(&socket)
                || self.retry.get(&socket).is_some_and(|r| r.next > now)
            {
                continue;
            }
            new.push(socket);
        }
        for socket in new {
            let (s, timeout) = (socket.clone(), self.cfg.timeout);
            let h = self
                .probes
                .spawn(async move { (s.clone(), probe(s, timeout).await) });
            self.probing.insert(h.id(), socket);
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
            tracing::warn!(socket = %socket.display(), error = %error, retry_in = ?wait, "QMP socket not usable");
            r.error = error;
        } else {
            tracing::debug!(socket = %socket.display(), error = %error, retry_in = ?wait, "QMP socket still not usable");
        }
    }

    /// The VM and its resizable tiers.
    fn build(&self, socket: &Path, pid: u32, m: &Machine) -> Result<(Vm, Vec<TierDevice>), String> {
        let dir = self.proc_root.join(pid.to_string());
        let maps = std::fs::read_to_string(dir.join("maps"))
            .map_err(|e| format!("process {pid}: maps: {e}"))?;
        let numa = std::fs::read_to_string(dir.join("numa_maps")).unwrap_or_default();
        let memtiers = MemoryTiers::read(&self.cfg.memtier_root);
        let tiers = layout::tiers(m, &maps, &numa, &self.overrides, &memtiers)?;
        let mut devices = Vec::new();
        for (node, boot) in layout::node_backends(m)? {
            let on: Vec<_> = m.devices.iter().filter(|d| d.node == node).collect();
            match on.as_slice() {
                [d] => devices.push(TierDevice {
                    tier: format!("node{node}"),
                    device: d.id.clone(),
                    boot: boot.map_or(0, |b| b.size),
                }),
                [] => {}
                _ => tracing::warn!(
                    pid,
                    node,
                    devices = on.len(),
                    "several virtio-mem devices on one guest node: tierd does not resize them"
                ),
            }
        }
        let vm = Vm {
            id: format!("qemu:{pid}"),
            name: m.name.clone().unwrap_or_else(|| sockets::vm_name(socket)),
            vmm_pid: pid,
            api_socket: socket.display().to_string(),
            vcpus: m.cpus,
            tiers,
            source: VmSource::Qemu as i32,
            discovered_unix_ns: crate::unix_now_ns(),
        };
        Ok((vm, devices))
    }

    fn adopt(&mut self, reg: &mut Registry, socket: &Path, p: Probed) -> Result<(), String> {
        if p.pid == std::process::id() {
            return Err("the socket is tierd's own".into());
        }
        let id = format!("qemu:{}", p.pid);
        if reg.contains(&id) {
            // Another socket of the same QEMU.
            self.tracked.insert(socket.to_path_buf(), id);
            self.retry.remove(socket);
            return Ok(());
        }
        let (vm, devices) = self.build(socket, p.pid, &p.machine)?;
        let live = Live {
            devices: p.machine.devices.clone(),
            balloon: p.machine.balloon,
        };
        let handle = Arc::new(QemuHandle::new(
            id.clone(),
            p.pid,
            socket.to_path_buf(),
            self.cfg.timeout,
            devices,
            live,
        ));
        let replaced =
            reg.retire(|v| v.vm().vmm_pid == p.pid && v.vm().source() == VmSource::KvmFd);
        tracing::info!(
            vm = %id,
            name = %vm.name,
            socket = %socket.display(),
            pid = p.pid,
            tiers = ?vm.tiers.iter().map(|t| (t.name.as_str(), t.kind().short_name(), t.size_bytes)).collect::<Vec<_>>(),
            other_memory_devices = ?p.machine.other_devices,
            replaces = ?replaced,
            "QEMU VM discovered"
        );
        for t in &vm.tiers {
            tracing::info!(vm = %id, tier = %t.name, derivation = %t.derivation, "tier map");
        }
        reg.insert(Box::new(QemuVm::new(
            vm,
            self.proc_root.clone(),
            handle.clone(),
        )));
        self.fleet.insert(handle);
        self.tracked.insert(socket.to_path_buf(), id);
        self.retry.remove(socket);
        Ok(())
    }
}
