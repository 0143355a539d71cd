//! Guests whose per-tier accesses a bench controls and counts exactly.
//!
//! A [`WorkloadSource`] runs a guest with two tiers (`dram` fast, `slow`)
//! through a row of [`Shape`]s given up front, reports the exact accesses it
//! made (ground truth) and hands tierd a registry entry whose
//! `guest_reported_accesses` is the guest-reported source. Two sources:
//! the raw-KVM demo VM in this process ([`DemoSource`]: exact counters) and
//! the PVH test guest under the patched cloud-hypervisor
//! ([`TestGuestSource`]: the balloon stats queue, as tierd reads it).
//! The Linux bed (`linux`) runs real programs instead of shapes and has a
//! run loop of its own in the fidelity bench.

mod demo;
pub mod guest_plan;
pub mod guest_truth;
pub mod guest_ws;
pub mod linux;
pub mod linux_map;
pub mod linux_truth;
pub mod serial;
pub mod testguest;

use std::time::{Duration, Instant};

use tier_profiler::demo_vm::DemoVmError;
use tier_profiler::registry::Registry;

pub use demo::DemoSource;
pub use testguest::TestGuestSource;

/// Work per round: `pages` distinct 4 KiB pages per tier, each
/// read-modify-written `repeat` times, spread over the pages as `skew` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub dram_pages: u32,
    pub dram_repeat: u32,
    pub slow_pages: u32,
    pub slow_repeat: u32,
    pub skew: Skew,
}

/// How a tier's accesses spread over its pages (the test guest's `zipf=`,
/// docs/testguest.md; the demo VM knows only `Uniform`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Skew {
    /// Every page of a tier as often as any other.
    #[default]
    Uniform,
    /// Zipf popularity inside each tier's pages, exponent in thousandths
    /// [dram, slow] (0: uniform); the split between tiers is still pages x
    /// repeat.
    Zipf([u32; 2]),
    /// One Zipf ranking (exponent in thousandths) over dram's pages, then
    /// slow's: dram holds the popular head, slow the tail, and the split
    /// between tiers is the ranking's (repeat counts are ignored).
    Chain(u32),
}

impl Skew {
    /// Short form for labels: `` (uniform), `z0.99/1.2`, `chain1`.
    pub fn label(self) -> String {
        let e = |m: u32| tier_testguest::params::Zipf::Exponent(m).token();
        match self {
            Skew::Uniform => String::new(),
            Skew::Zipf([d, s]) => format!(" z{}/{}", e(d), e(s)),
            Skew::Chain(m) => format!(" chain z{}", e(m)),
        }
    }
}

impl Shape {
    /// Every page of both tiers once per round.
    pub const fn pages(dram_pages: u32, slow_pages: u32) -> Shape {
        Shape {
            dram_pages,
            dram_repeat: 1,
            slow_pages,
            slow_repeat: 1,
            skew: Skew::Uniform,
        }
    }

    /// The same shape with accesses spread by `skew`.
    pub const fn skewed(self, skew: Skew) -> Shape {
        Shape { skew, ..self }
    }

    /// Accesses per round [dram, slow].
    pub fn accesses_per_round(&self) -> [u64; 2] {
        [
            u64::from(self.dram_pages) * u64::from(self.dram_repeat),
            u64::from(self.slow_pages) * u64::from(self.slow_repeat),
        ]
    }

    /// Short form, `dram pages x repeat | slow pages x repeat [skew]`.
    pub fn label(&self) -> String {
        format!(
            "{}x{}|{}x{}{}",
            self.dram_pages,
            self.dram_repeat,
            self.slow_pages,
            self.slow_repeat,
            self.skew.label()
        )
    }
}

/// Where a row's intervals and phase changes fall, relative to the row
/// start: `warmup` unscored intervals, then `per_step` measured intervals
/// per step; the change to step s >= 1 lands at `change_at` of the first
/// interval of step s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    pub interval: Duration,
    pub warmup: u32,
    pub per_step: u32,
    pub change_at: f64,
}

impl Schedule {
    /// Index (within the row) of the interval that holds the change to `step`.
    pub fn change_interval(&self, step: usize) -> usize {
        self.warmup as usize + step * self.per_step as usize
    }

    /// Offset of the change to `step` (>= 1) from the row start.
    pub fn change_offset(&self, step: usize) -> Duration {
        let whole = u32::try_from(self.change_interval(step)).unwrap_or(u32::MAX);
        self.interval * whole + self.interval.mul_f64(self.change_at)
    }

    /// Intervals in a row of `steps` steps.
    pub fn intervals(&self, steps: usize) -> usize {
        self.warmup as usize + steps * self.per_step as usize
    }
}

/// A row as started: its first interval begins at `t0` (step 0 already
/// runs then) and the change to step s happens at
/// `t0 + schedule.change_offset(s)`.
#[derive(Debug, Clone)]
pub struct RowStart {
    pub t0: Instant,
    /// The VM's id in the registry.
    pub vm_id: String,
}

/// Exact cumulative counts from the guest side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Truth {
    pub rounds: u64,
    /// Accesses [dram, slow].
    pub accesses: [u64; 2],
}

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("demo VM: {0}")]
    Demo(#[from] DemoVmError),
    #[error("shape {shape} does not fit: {why}")]
    Shape { shape: String, why: String },
    #[error("schedule: {0}")]
    Schedule(String),
    #[error(transparent)]
    Params(#[from] tier_testguest::params::ParamsError),
    #[error("test guest: {0}")]
    Guest(String),
    #[error("Linux bed: {0}")]
    Linux(String),
}

/// A guest with a `dram` and a `slow` tier whose work the bench sets.
pub trait WorkloadSource: Send + Sync {
    /// What runs the guest, for the report.
    fn describe(&self) -> String;
    /// Where the guest-reported numbers come from, for the report.
    fn guest_reported_kind(&self) -> String;
    /// Work pages available [dram, slow].
    fn capacity(&self) -> [u32; 2];
    /// Starts a row whose steps follow `schedule`; the VM is in `reg` when
    /// this returns, and `t0` is not in the past.
    fn begin_row(
        &self,
        steps: &[Shape],
        schedule: &Schedule,
        reg: &mut Registry,
    ) -> Result<RowStart, WorkloadError>;
    /// Called by the run loop at the instant of the change to `step`: the
    /// demo VM switches then; the test guest switches on its own.
    fn change(&self, step: usize) -> Result<(), WorkloadError>;
    /// What tierd does for this VM's source once per interval, right
    /// before its tick (cloud-hypervisor discovery and refresh).
    fn discover(&self, reg: &mut Registry);
    /// Ground truth at `at`, an instant just passed (called right after
    /// tierd's tick); may wait briefly until the guest has reported past it.
    fn truth_at(&self, at: Instant) -> Result<Truth, WorkloadError>;
    /// Ends the row: measured offsets of each phase change from where the
    /// schedule put it (seconds, positive = late), when the source can see
    /// them.
    fn end_row(&self, reg: &mut Registry) -> Result<Vec<f64>, WorkloadError>;
    /// Process holding the guest memory, and the vCPU thread ids in it.
    fn vcpu_threads(&self) -> (u32, Vec<i32>);
    /// Distinct pages [dram, slow] the guest touches that are not work
    /// pages (code, parameters): visible to the host, not in the truth.
    fn overhead_pages(&self) -> [u32; 2];
    /// Err once the guest has stopped.
    fn check(&self) -> Result<(), WorkloadError>;
    /// Called at `at`, the instant the truth is to be read at, right
    /// before tierd's tick: a source whose working-set truth changes as
    /// the guest runs on takes what it needs of it now.
    fn mark(&self, _at: Instant) {}
    /// Distinct pages [dram, slow] the guest touched in `[at - horizon,
    /// at]`, its own pages included (the working-set truth,
    /// docs/working-set.md), as (low, high): equal where the source knows
    /// it exactly, a band as narrow as its clock allows otherwise; None
    /// where the source cannot tell.
    fn touched_within(&self, _at: Instant, _horizon: Duration) -> Option<[(u64, u64); 2]> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_accesses_and_label() {
        let s = Shape {
            dram_pages: 48,
            dram_repeat: 4,
            slow_pages: 96,
            slow_repeat: 1,
            skew: Skew::Uniform,
        };
        assert_eq!(s.accesses_per_round(), [192, 96]);
        assert_eq!(s.label(), "48x4|96x1");
        assert_eq!(
            s.skewed(Skew::Zipf([990, 1200])).label(),
            "48x4|96x1 z0.99/1.2"
        );
        assert_eq!(
            Shape::pages(512, 3584).skewed(Skew::Chain(1000)).label(),
            "512x1|3584x1 chain z1"
        );
        assert_eq!(Shape::pages(3, 5).accesses_per_round(), [3, 5]);
    }

    #[test]
    fn changes_land_at_their_fraction_of_an_interval() {
        let s = Schedule {
            interval: Duration::from_millis(1000),
            warmup: 1,
            per_step: 6,
            change_at: 0.4,
        };
        assert_eq!(s.change_interval(1), 7);
        assert_eq!(s.change_interval(2), 13);
        assert_eq!(s.change_offset(1), Duration::from_millis(7400));
        assert_eq!(s.change_offset(2), Duration::from_millis(13400));
        assert_eq!(s.intervals(3), 19);
        let half = Schedule {
            interval: Duration::from_millis(500),
            ..s
        };
        assert_eq!(half.change_offset(1), Duration::from_millis(3700));
    }
}
