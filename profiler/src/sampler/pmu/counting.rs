//! Counting mode: each interval, the counts of every (vCPU thread, event)
//! counter since the last read, scaled for multiplexing the way perf does
//! (`count * time_enabled / time_running`), summed into the VM's tiers; and
//! for each tier either its counts or why it is not measured.
//!
//! A counter runs only while the PMU has room for it: with more events
//! than hardware counters, or another perf user (a `perf stat` on the host,
//! the NMI watchdog), the kernel rotates them and `time_running` falls
//! below `time_enabled`. Counts are then scaled up, and the share of time
//! they ran is reported (`SourceCount.running_ratio`). A counter that was
//! enabled but never ran in the interval has nothing to scale: its tier is
//! reported as partly counted.

use std::collections::BTreeSet;

use super::loader::Reading;

/// Below this share of enabled time, the health says the counters were
/// multiplexed (perf's own rounding leaves ratios a hair under 1).
pub const MULTIPLEXED_BELOW: f64 = 0.999;

/// One tier's counts over an interval.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tally {
    /// Events counted, unscaled.
    pub raw: u64,
    /// Events scaled by enabled / running per counter.
    pub scaled: f64,
    pub enabled_ns: u64,
    pub running_ns: u64,
    /// Counter reads that went into it.
    pub reads: u32,
    /// Reads of counters enabled but never running in the interval.
    pub starved: u32,
    /// Counters opened in the interval: they count from the next one.
    pub opened: u32,
    /// Seconds the counts span (between the VM's last two reads).
    pub seconds: f64,
    /// Assumptions behind the attribution (said once each).
    pub notes: BTreeSet<String>,
}

impl Tally {
    /// Adds one counter's change over the interval.
    pub fn add(&mut self, d: Reading) {
        self.raw = self.raw.saturating_add(d.count);
        self.enabled_ns = self.enabled_ns.saturating_add(d.enabled_ns);
        self.running_ns = self.running_ns.saturating_add(d.running_ns);
        self.reads += 1;
        if d.running_ns >= d.enabled_ns {
            // Not multiplexed: nothing to scale (and no rounding).
            self.scaled += d.count as f64;
        } else if d.running_ns > 0 {
            self.scaled += d.count as f64 * d.enabled_ns as f64 / d.running_ns as f64;
        } else {
            self.starved += 1;
        }
    }

    /// Share of the enabled time the counters ran; 0 if none was enabled.
    pub fn running_ratio(&self) -> f64 {
        if self.enabled_ns == 0 {
            0.0
        } else {
            self.running_ns as f64 / self.enabled_ns as f64
        }
    }
}

/// What the source says about one tier of a VM for one interval.
#[derive(Debug, Clone, PartialEq)]
pub enum TierReading {
    Counted(Tally),
    NotMeasured(String),
}

impl TierReading {
    /// The tally's verdict: counts, or why they cannot be trusted.
    pub fn from_tally(t: Tally) -> TierReading {
        if t.reads == 0 && t.opened > 0 {
            return TierReading::NotMeasured(
                "its counters were opened in this interval: counting starts with the next one"
                    .into(),
            );
        }
        if t.reads == 0 {
            return TierReading::NotMeasured(
                "no counter was read (no vCPU thread found yet, or its events failed to open)"
                    .into(),
            );
        }
        if t.enabled_ns > 0 && t.running_ns == 0 {
            return TierReading::NotMeasured(
                "every counter was multiplexed out for the whole interval (another perf user, or more events than hardware counters)".into(),
            );
        }
        let mut t = t;
        if t.opened > 0 {
            t.notes.insert(format!(
                "{} counters opened in this interval (new vCPU threads) count from the next one",
                t.opened
            ));
        }
        if t.starved > 0 {
            t.notes.insert(format!(
                "{} of {} counters never ran in the interval (multiplexed): their events are missing",
                t.starved, t.reads
            ));
        }
        TierReading::Counted(t)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn r(count: u64, enabled_ns: u64, running_ns: u64) -> Reading {
        Reading {
            count,
            enabled_ns,
            running_ns,
        }
    }

    #[test]
    fn readings_subtract_without_wrapping() {
        assert_eq!(r(10, 100, 90).since(&r(4, 40, 40)), r(6, 60, 50));
        // A counter that went backwards (re-opened) gives 0, not 2^64.
        assert_eq!(r(1, 1, 1).since(&r(4, 40, 40)), r(0, 0, 0));
    }

    /// Model of multiplexing (no hardware counters here to multiplex):
    /// counters that ran part of their enabled time are scaled up each by
    /// its own share, the way perf stat scales.
    #[test]
    fn multiplexing_model_scales_each_counter_by_its_own_running_share() {
        let mut t = Tally::default();
        t.add(r(1_000, 100, 100)); // ran all the time
        t.add(r(500, 100, 25)); // a quarter: 2000
        t.add(r(0, 0, 0)); // thread never ran: nothing
        assert_eq!(t.raw, 1_500);
        assert!((t.scaled - 3_000.0).abs() < 1e-9, "{}", t.scaled);
        assert!((t.running_ratio() - 125.0 / 200.0).abs() < 1e-12);
        assert!(t.running_ratio() < MULTIPLEXED_BELOW);
        assert!(
            matches!(TierReading::from_tally(t), TierReading::Counted(c) if c.notes.is_empty())
        );
    }

    #[test]
    fn starved_counters_are_said_and_all_starved_is_not_measured() {
        let mut t = Tally::default();
        t.add(r(100, 100, 100));
        t.add(r(0, 100, 0));
        let TierReading::Counted(c) = TierReading::from_tally(t) else {
            panic!("counted")
        };
        assert_eq!(c.starved, 1);
        assert!(
            c.notes
                .iter()
                .any(|n| n.contains("1 of 2 counters never ran"))
        );
        let mut t = Tally::default();
        t.add(r(0, 100, 0));
        assert!(matches!(
            TierReading::from_tally(t),
            TierReading::NotMeasured(w) if w.contains("multiplexed out")
        ));
        assert!(matches!(
            TierReading::from_tally(Tally::default()),
            TierReading::NotMeasured(w) if w.contains("no counter was read")
        ));
    }

    #[test]
    fn an_idle_vcpu_is_measured_as_zero_not_unknown() {
        // Enabled time only advances while the thread runs: a halted vCPU
        // reads 0/0/0, which is a real zero.
        let mut t = Tally::default();
        t.add(r(0, 0, 0));
        let TierReading::Counted(c) = TierReading::from_tally(t) else {
            panic!("counted")
        };
        assert_eq!((c.raw, c.scaled, c.running_ratio()), (0, 0.0, 0.0));
    }
}
