//! The VMs tierd tracks. Each source (the embedded demo VM now; discovered
//! cloud-hypervisor and kvm-fd processes later) implements `TrackedVm`.

use tier_proto::v1::Vm;

/// One VM as the aggregator sees it. Implementations must be cheap to call
/// once per interval.
pub trait TrackedVm: Send + Sync {
    /// Identity and tier map.
    fn vm(&self) -> &Vm;
    /// False once the VM is gone; the registry then drops it.
    fn alive(&self) -> bool;
    /// Host-resident bytes per tier, in `Vm::tiers` order.
    fn resident_bytes(&self) -> Vec<u64>;
    /// Cumulative accesses per tier that the guest itself reports, if it
    /// does (ground truth of the demo VM and test guests).
    fn guest_reported_accesses(&self) -> Option<Vec<u64>>;
    /// Readings of a synthetic VM (benchmarks only), which no host sampler
    /// can look at; `None` for real VMs.
    fn synthetic_readings(&self) -> Option<Vec<crate::sampler::TierReading>> {
        None
    }
}

/// All tracked VMs, sorted by id.
#[derive(Default)]
pub struct Registry {
    vms: Vec<Box<dyn TrackedVm>>,
    /// Bumped whenever a VM comes or goes, so readers can tell whether the
    /// VM list changed without comparing it.
    generation: u64,
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

    /// Removes VMs that are no longer alive and returns their ids.
    pub fn reap(&mut self) -> Vec<String> {
        let mut gone = Vec::new();
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
