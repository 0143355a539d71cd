//! Sampler backends: per interval, per VM, per tier, which pages were
//! accessed. Each backend reads what the host saw, never the guest.

pub mod budget;
pub mod budget_stream;
pub mod canary;
pub mod damon;
pub mod ept;
pub mod ept_ageing;
pub mod ept_recency;
pub mod folio;
pub mod hostpte;
pub mod hostpte_ages;
pub mod page_idle;
pub mod pmu;

use tier_proto::v1::{Backend, Vm};

/// Young pages of one tier over one pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierReading {
    /// Pages examined.
    pub sampled_pages: u64,
    /// Pages found accessed.
    pub young_pages: u64,
    /// How long the pages could turn young: from the re-arm that began the
    /// pass to the walk that read this tier, where the backend knows both.
    /// `None`: the time between the starts of two passes stands in, which
    /// counts the sampler's own walk as time the guest was watched.
    pub exposure: Option<std::time::Duration>,
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
    /// Health signals counted since the last call (EPT backends).
    fn take_signals(&mut self) -> Signals {
        Signals::default()
    }
    /// The CPU budget the sampler keeps (`[sampler] cpu_budget_pct`):
    /// the daemon takes its report each interval and gives it each VM's
    /// need. `None`: the backend keeps none.
    fn budget(&mut self) -> Option<&mut budget::Budget> {
        None
    }
    /// The horizons and pass schedule of the working-set ages
    /// (docs/working-set.md); backends without ages ignore it.
    fn set_ages(&mut self, _config: &crate::ages::AgesConfig) {}
    /// The next `sample` call is the interval's last pass (the tick).
    fn interval_ends(&mut self) {}
    /// Per-tier ages of `vm` after the interval's last pass, in `vm.tiers`
    /// order; `None`: this backend gives no ages.
    /// Why `vm`, read this interval, gave the estimate no pass (hostpte's
    /// sweep); `None`: it did, or the reason is elsewhere.
    fn quiet(&self, _vm: &Vm) -> Option<String> {
        None
    }
    fn ages(&mut self, _vm: &Vm) -> Option<Vec<tier_proto::v1::TierAges>> {
        None
    }
}

/// What an EPT backend saw besides its readings, in pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Signals {
    pub unattributed: u64,
    pub foreign_young: u64,
    pub unmapped: u64,
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
    /// The backend cannot measure this VM on this host, and says why.
    #[error("{reason}")]
    Unmeasurable { reason: String },
}

/// Why the configured backend cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    #[error("backend {0:?}: unavailable here: {1}")]
    Unavailable(String, String),
    #[error("backend {0:?}: unknown (implemented: auto, ept-fexit, ept-tracepoint, hostpte, none)")]
    Unknown(String),
}

/// The sampler for a configured backend name: `auto` takes the probe's best
/// implemented backend; a named one must be available. The ept backends age
/// every `stride`-th page of each tier (by folio), through page_idle or, where
/// it is absent, DAMON ageing every `damon_sample`. `budget` keeps their
/// CPU within `[sampler] cpu_budget_pct`, raising the stride (ept) or
/// skipping passes (hostpte).
pub fn select(
    name: &str,
    report: &crate::probe::Report,
    stride: u32,
    damon_sample: std::time::Duration,
    budget: budget::Budget,
) -> Result<Option<Box<dyn Sampler>>, SelectError> {
    let wanted = match name {
        "auto" => report.best_backend(),
        "none" => None,
        "hostpte" => Some(Backend::Hostpte),
        "ept-fexit" => Some(Backend::EptFexit),
        "ept-tracepoint" => Some(Backend::EptTracepoint),
        other => return Err(SelectError::Unknown(other.into())),
    };
    match wanted {
        None => Ok(None),
        Some(Backend::Hostpte) => match report.get("hostpte") {
            Some(c) if !c.available => Err(SelectError::Unavailable(name.into(), c.reason.clone())),
            _ => Ok(Some(Box::new(hostpte::HostPte::with_budget(budget)))),
        },
        Some(b @ (Backend::EptFexit | Backend::EptTracepoint)) => {
            if let Some(c) = report.get(b.short_name()).filter(|c| !c.available) {
                return Err(SelectError::Unavailable(name.into(), c.reason.clone()));
            }
            if !report.ageing_driver() {
                return Err(SelectError::Unavailable(
                    name.into(),
                    report.no_ageing_driver_reason(),
                ));
            }
            let s = ept_ageing::EptAgeing::new(b, u64::from(stride), damon_sample)
                .map_err(|e| SelectError::Unavailable(name.into(), e.to_string()))?
                .with_budget(budget);
            Ok(Some(Box::new(s)))
        }
        Some(other) => {
            tracing::warn!(
                backend = other.short_name(),
                "best backend has no sampler yet; running without one"
            );
            Ok(None)
        }
    }
}
