//! The VMs tierd tracks. Each source (the embedded demo VM, kvm-fd
//! processes, cloud-hypervisor VMs found by their API socket, synthetic
//! VMs) implements `TrackedVm`.

use tier_proto::v1::Vm;

/// A tier's virtio-mem part: (requested, plugged if reported) bytes;
/// `None` for a tier without one.
pub type TierHotplugBytes = Option<(u64, Option<u64>)>;

/// One VM as the aggregator sees it. Implementations must be cheap to call
/// once per interval.
pub trait TrackedVm: Send + Sync {
    /// Identity and tier map.
    fn vm(&self) -> &Vm;
    /// False once the VM is gone; the registry then drops it.
    fn alive(&self) -> bool;
    /// Host-resident bytes per tier, in `Vm::tiers` order; `Err` with the
    /// reason when they cannot be read (unknown, never 0).
    fn resident_bytes(&self) -> Result<Vec<u64>, String>;
    /// Cumulative accesses per tier that the guest itself reports, if it
    /// does (ground truth of the demo VM and test guests).
    fn guest_reported_accesses(&self) -> Option<Vec<u64>>;
    /// Readings of a synthetic VM (benchmarks only), which no host sampler
    /// can look at; `None` for real VMs.
    fn synthetic_readings(&self) -> Option<Vec<crate::sampler::TierReading>> {
        None
    }
    /// Whether this is a synthetic source (no host sampler looks at it);
    /// asks without drawing readings.
    fn is_synthetic(&self) -> bool {
        false
    }
    /// Per-tier balloon (target, actual) in bytes, in `Vm::tiers` order, as
    /// the VMM last reported it; `None` without a per-tier balloon.
    fn balloon_bytes(&self) -> Option<Vec<(u64, u64)>> {
        None
    }
    /// Per tier in `Vm::tiers` order: the virtio-mem part's (requested,
    /// plugged if reported) bytes, `None` for a tier without one; `None`
    /// for a VM without any (docs/virtio-mem.md).
    fn hotplug_bytes(&self) -> Option<Vec<TierHotplugBytes>> {
        None
    }
}

/// A VM shared with its owner (a bench or test that also drives it): the
/// registry sees the VM itself.
impl<T: TrackedVm + ?Sized> TrackedVm for std::sync::Arc<T> {
    fn vm(&self) -> &Vm {
        (**self).vm()
    }
    fn alive(&self) -> bool {
        (**self).alive()
    }
    fn resident_bytes(&self) -> Result<Vec<u64>, String> {
        (**self).resident_bytes()
    }
    fn guest_reported_accesses(&self) -> Option<Vec<u64>> {
        (**self).guest_reported_accesses()
    }
    fn synthetic_readings(&self) -> Option<Vec<crate::sampler::TierReading>> {
        (**self).synthetic_readings()
    }
    fn is_synthetic(&self) -> bool {
        (**self).is_synthetic()
    }
    fn balloon_bytes(&self) -> Option<Vec<(u64, u64)>> {
        (**self).balloon_bytes()
    }
    fn hotplug_bytes(&self) -> Option<Vec<TierHotplugBytes>> {
        (**self).hotplug_bytes()
    }
}

/// All tracked VMs, sorted by id.
#[derive(Default)]
pub struct Registry {
    vms: Vec<Box<dyn TrackedVm>>,
    /// Bumped whenever a VM comes or goes, so readers can tell whether the
    /// VM list changed without comparing it.
    generation: u64,
    /// Ids removed by `retire`, reported by the next `reap`.
    retired: Vec<String>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.vms.iter().map(|v| &v.vm().id))
            .finish()
    }
}

impl Registry {
    /// Adds a VM; a VM with the same id replaces the old one.
    pub fn insert(&mut self, vm: Box<dyn TrackedVm>) {
        self.vms.retain(|v| v.vm().id != vm.vm().id);
        self.vms.push(vm);
        self.vms.sort_by(|a, b| a.vm().id.cmp(&b.vm().id));
        self.generation += 1;
    }

    /// Removes the VMs for which `pred` holds (e.g. a kvm-fd VM that a
    /// better source now tracks); the next `reap` reports them as gone.
    pub fn retire(&mut self, mut pred: impl FnMut(&dyn TrackedVm) -> bool) -> Vec<String> {
        let mut gone = Vec::new();
        self.vms.retain(|v| {
            let drop = pred(v.as_ref());
            if drop {
                gone.push(v.vm().id.clone());
            }
            !drop
        });
        if !gone.is_empty() {
            self.generation += 1;
            self.retired.extend(gone.iter().cloned());
        }
        gone
    }

    /// Removes VMs that are no longer alive (and retired ones) and returns
    /// their ids.
    pub fn reap(&mut self) -> Vec<String> {
        let mut gone = std::mem::take(&mut self.retired);
        self.vms.retain(|v| {
            let alive = v.alive();
            if !alive {
                gone.push(v.vm().id.clone());
            }
            alive
        });
        if !gone.is_empty() {
            self.generation += 1;
        }
        gone
    }

    /// Changes whenever the set of VMs changes.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn contains(&self, id: &str) -> bool {
        self.vms.iter().any(|v| v.vm().id == id)
    }

    /// Whether some tracked VM lives in process `pid`.
    pub fn has_pid(&self, pid: u32) -> bool {
        self.vms.iter().any(|v| v.vm().vmm_pid == pid)
    }

    pub fn iter(&self) -> impl Iterator<Item = &dyn TrackedVm> {
        self.vms.iter().map(|v| v.as_ref())
    }

    pub fn len(&self) -> usize {
        self.vms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.vms.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake(Vm, bool);
    impl TrackedVm for Fake {
        fn vm(&self) -> &Vm {
            &self.0
        }
        fn alive(&self) -> bool {
            self.1
        }
        fn resident_bytes(&self) -> Result<Vec<u64>, String> {
            Ok(Vec::new())
        }
        fn guest_reported_accesses(&self) -> Option<Vec<u64>> {
            None
        }
    }

    fn vm(id: &str, pid: u32, alive: bool) -> Box<dyn TrackedVm> {
        Box::new(Fake(
            Vm {
                id: id.into(),
                vmm_pid: pid,
                ..Default::default()
            },
            alive,
        ))
    }

    #[test]
    fn retired_vms_are_reported_by_the_next_reap_with_the_dead() {
        let mut r = Registry::default();
        r.insert(vm("kvm:7:30", 7, true));
        r.insert(vm("kvm:8:30", 8, false));
        r.insert(vm("kvm:9:30", 9, true));
        assert!(r.has_pid(7) && !r.has_pid(6));
        let g = r.generation();
        assert_eq!(r.retire(|v| v.vm().vmm_pid == 7), vec!["kvm:7:30"]);
        assert!(r.generation() > g && !r.contains("kvm:7:30"));
        assert!(r.retire(|_| false).is_empty());
        r.insert(vm("ch:7:30", 7, true));
        assert_eq!(r.reap(), vec!["kvm:7:30", "kvm:8:30"]);
        assert!(r.reap().is_empty());
        let ids: Vec<&str> = r.iter().map(|v| v.vm().id.as_str()).collect();
        assert_eq!(ids, ["ch:7:30", "kvm:9:30"]);
    }

    #[test]
    fn a_shared_vm_is_tracked_as_itself() {
        let vm = std::sync::Arc::new(Fake(
            Vm {
                id: "demo:1".into(),
                ..Default::default()
            },
            false,
        ));
        let mut r = Registry::default();
        r.insert(Box::new(std::sync::Arc::clone(&vm)));
        assert!(r.contains("demo:1"));
        // Its owner still holds it; the registry sees it die and drops it.
        assert_eq!(r.reap(), vec!["demo:1"]);
        assert_eq!(std::sync::Arc::strong_count(&vm), 1);
    }
}
