//! A trace-driven twin of what tierd reads on a real host (docs/twin.md):
//! access streams at real rates (`stream`), a last-level cache (`llc`)
//! and a TLB (`tlb`) in front of the memory tiers, the kernel's
//! accessed-bit and PMU behaviour for each backend (`ept`, `hostpte`,
//! `pmu`), tierd's own aggregator, estimator and controller on top
//! (`feed`, `fleet`), CPU cost from this machine's measured per-event
//! costs (`cost`), and the tables, CSV and plots (`report`).
//! docs/twin.md says what it found.

pub mod cost;
pub mod ept;
pub mod ept_ages;
pub mod feed;
pub mod fleet;
pub mod hostpte;
pub mod llc;
pub mod pmu;
pub mod report;
pub mod run;
pub mod stream;
pub mod suite;
pub mod tlb;

/// The backends the twin models, in report order.
pub const BACKENDS: [&str; 5] = ["ept", "ept+flush", "hostpte", "pmu-count", "pmu-sample"];

/// Page-sampling backends (those with accessed bits and a hot set).
pub const PAGE_BACKENDS: usize = 3;
