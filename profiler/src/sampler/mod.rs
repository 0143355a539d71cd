//! Sampler backends: per interval, per VM, per tier, which pages were
//! accessed. Each backend reads what the host saw, never the guest.

pub mod hostpte;

use tier_proto::v1::{Backend, Vm};

/// Young pages of one tier over one interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierReading {
    /// Pages examined.
    pub sampled_pages: u64,
    /// Pages found accessed.
    pub young_pages: u64,
}

/// A source of per-tier young-page counts.
pub trait Sampler: Send {
    fn backend(&self) -> Backend;
    /// Readings for the interval that ends now, one result per VM in
    /// `vms` order, each in `vm.tiers` order; re-arms for the next interval.
    /// All VMs are passed at once because arming may act per process.
    fn sample(&mut self, vms: &[&Vm]) -> Vec<Result<Vec<TierReading>, SampleError>>;
    /// Forgets per-VM state of a VM that went away.
    fn forget(&mut self, _vm_id: &str) {}
}

/// Why a VM could not be sampled this interval.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SampleError {
    #[error("VMM process {pid} is gone")]
    ProcessGone { pid: u32 },
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    #[error("tier {tier}: no host mapping known (hva 0)")]
    NoMapping { tier: String },
}
