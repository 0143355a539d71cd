//! A cloud-hypervisor VM as the registry tracks it: the tier map built
//! from its zones, alive while its kvm-vm fd is open, balloon and guest
//! numbers from the handle's last `vm.info` / `vm.counters`.

use std::path::PathBuf;
use std::sync::Arc;

use tier_controller::actuate::MemoryZone;
use tier_proto::v1::Vm;

use super::handle::ChHandle;
use crate::discovery::{self, KvmFd};
use crate::registry::{TierHotplugBytes, TrackedVm};

#[derive(Debug)]
pub struct ChVm {
    vm: Vm,
    key: KvmFd,
    proc_root: PathBuf,
    handle: Arc<ChHandle>,
    /// The zones the tier map was built from: a VMM that reports other
    /// zones later (hot-plug) gets its tier map rebuilt.
    zones: Vec<MemoryZone>,
}

impl ChVm {
    pub fn new(
        vm: Vm,
        key: KvmFd,
        proc_root: PathBuf,
        handle: Arc<ChHandle>,
        zones: Vec<MemoryZone>,
    ) -> ChVm {
        ChVm {
            vm,
            key,
            proc_root,
            handle,
            zones,
        }
    }

    pub fn zones(&self) -> &[MemoryZone] {
        &self.zones
    }
}

impl TrackedVm for ChVm {
    fn vm(&self) -> &Vm {
        &self.vm
    }

    fn alive(&self) -> bool {
        discovery::kvm_fd_alive(&self.proc_root, self.key)
    }

    fn resident_bytes(&self) -> Result<Vec<u64>, String> {
        discovery::resident_bytes(&self.proc_root, self.key.pid, &self.vm.tiers)
    }

    /// From the stats queue (`tier<i>_guest_accesses`), when the guest
    /// sends all of its tiers; tiers map to balloon tier indices by zone id.
    fn guest_reported_accesses(&self) -> Option<Vec<u64>> {
        let snap = self.handle.snapshot();
        if snap.guest_accesses.is_empty() {
            return None;
        }
        self.vm
            .tiers
            .iter()
            .map(|t| {
                let i = snap.zone(&t.name)?.tier;
                snap.guest_accesses.get(&i).copied()
            })
            .collect()
    }

    /// Requested and plugged size of each tier's virtio-mem part (plugged
    /// only from a VMM with vmm-patch 0009).
    fn hotplug_bytes(&self) -> Option<Vec<TierHotplugBytes>> {
        let snap = self.handle.snapshot();
        let zones: Vec<_> = self
            .vm
            .tiers
            .iter()
            .map(|t| snap.resizable(&t.name).map(|z| (z.requested, z.plugged)))
            .collect();
        zones.iter().any(Option::is_some).then_some(zones)
    }

    /// Target and driver-reported actual of each tier's zone; tiers
    /// without a balloon zone read 0.
    fn balloon_bytes(&self) -> Option<Vec<(u64, u64)>> {
        let snap = self.handle.snapshot();
        snap.info.as_ref()?.balloon.as_ref()?;
        Some(
            self.vm
                .tiers
                .iter()
                .map(|t| snap.zone(&t.name).map_or((0, 0), |z| (z.target, z.actual)))
                .collect(),
        )
    }
}
