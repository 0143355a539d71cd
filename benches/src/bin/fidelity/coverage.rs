//! Does a host backend's ~95 % interval of the DRAM-hit ratio contain the
//! truth? Per row: coverage (share of scored intervals whose interval holds
//! the truth; an interval the backend gave no interval for counts as not
//! covered, and is counted apart as `no_interval`) and the median width.
//!
//! The interval is tierd's own `tier_profiler::aggregate::hit_interval`
//! (what fills `VmStats.dram_hit_low`/`high`) applied to the `dram` and
//! `slow` tiers only, as the bench's ratio is (the test guest's `sys` tier
//! is not in the truth): low = dram_low / (dram_low + slow_high), high =
//! dram_high / (dram_high + slow_low), an open upper end making the
//! matching ratio end 0 or 1, widened to hold the point.

use tier_profiler::aggregate::hit_interval;
use tier_proto::v1::TierSample;

/// [low, high] of dram / (dram + slow) around `point`; None when either
/// tier was read and has no interval.
pub fn ratio_interval(dram: &TierSample, slow: &TierSample, point: f64) -> Option<(f64, f64)> {
    hit_interval(&[dram.clone(), slow.clone()], &[true, false], point).map(|i| (i.low, i.high))
}

/// Coverage of one row by one backend.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Coverage {
    /// Scored intervals (the truth has a ratio).
    pub n: usize,
    /// Of them, intervals whose interval holds the truth.
    pub covered: usize,
    /// Of them, intervals without an interval (not covered).
    pub no_interval: usize,
    /// Median width of the intervals given (None: none given).
    pub width_median: Option<f64>,
}

impl Coverage {
    /// Over (truth, interval) pairs of scored intervals; None with none.
    pub fn of(pairs: &[(f64, Option<(f64, f64)>)]) -> Option<Coverage> {
        if pairs.is_empty() {
            return None;
        }
        // A hair of slack for the float ends (the truth is a ratio of integers).
        const EPS: f64 = 1e-9;
        let covered = pairs
            .iter()
            .filter(|(t, i)| i.is_some_and(|(lo, hi)| lo - EPS <= *t && *t <= hi + EPS))
            .count();
        let mut widths: Vec<f64> = pairs
            .iter()
            .filter_map(|(_, i)| i.map(|(lo, hi)| hi - lo))
            .collect();
        widths.sort_by(f64::total_cmp);
        let width_median = match widths.len() {
            0 => None,
            n if n % 2 == 1 => Some(widths[n / 2]),
            n => Some((widths[n / 2 - 1] + widths[n / 2]) / 2.0),
        };
        Some(Coverage {
            n: pairs.len(),
            covered,
            no_interval: pairs.iter().filter(|(_, i)| i.is_none()).count(),
            width_median,
        })
    }

    pub fn share(&self) -> f64 {
        self.covered as f64 / self.n as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tier(low: Option<f64>, high: Option<f64>) -> TierSample {
        TierSample {
            passes: 5,
            accesses_low: low,
            accesses_high: high,
            accesses_high_open: low.is_some() && high.is_none(),
            ..Default::default()
        }
    }

    #[test]
    fn ratio_ends_pair_each_tier_low_with_the_other_high() {
        let (d, s) = (tier(Some(60.0), Some(90.0)), tier(Some(10.0), Some(40.0)));
        assert_eq!(ratio_interval(&d, &s, 0.7), Some((0.6, 0.9)));
        // Widened to hold the point.
        assert_eq!(ratio_interval(&d, &s, 0.95), Some((0.6, 0.95)));
        // Open ends: slow unbounded -> low 0; dram unbounded -> high 1.
        assert_eq!(
            ratio_interval(&d, &tier(Some(10.0), None), 0.7),
            Some((0.0, 0.9))
        );
        assert_eq!(
            ratio_interval(&tier(Some(60.0), None), &s, 0.7),
            Some((0.6, 1.0))
        );
        // A tier read without an interval: none.
        assert_eq!(ratio_interval(&tier(None, None), &s, 0.7), None);
    }

    #[test]
    fn coverage_counts_missing_intervals_as_not_covered() {
        let pairs = [
            (0.5, Some((0.4, 0.6))), // covered, width 0.2
            (0.5, Some((0.5, 0.5))), // covered at a point end, width 0
            (0.7, Some((0.1, 0.3))), // missed, width 0.2
            (0.5, None),             // no interval
            (0.2, Some((0.0, 1.0))), // covered, width 1
        ];
        let c = Coverage::of(&pairs).unwrap();
        assert_eq!((c.n, c.covered, c.no_interval), (5, 3, 1));
        assert!((c.share() - 0.6).abs() < 1e-12);
        // Widths 0, 0.2, 0.2, 1: median 0.2.
        assert!((c.width_median.unwrap() - 0.2).abs() < 1e-12);
        let none = Coverage::of(&[(0.5, None)]).unwrap();
        assert_eq!(
            (none.covered, none.no_interval, none.width_median),
            (0, 1, None)
        );
        assert_eq!(none.share(), 0.0);
        assert_eq!(Coverage::of(&[]), None);
    }
}
