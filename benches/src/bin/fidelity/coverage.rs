//! Does a host backend's ~95 % interval of the DRAM-hit ratio contain the
//! truth? Per row: coverage (share of scored intervals whose interval holds
//! the truth; an interval the backend gave no interval for counts as not
//! covered, and is counted apart as `no_interval`) and the median width.
//!
//! The interval is formed over the `dram` and `slow` tiers only, as the
//! bench's ratio is (the test guest's `sys` tier is not in the truth), from
//! each tier's `accesses_low`/`accesses_high` the way the proto documents
//! `VmStats.dram_hit_low`/`high`: low = dram_low / (dram_low + slow_high),
//! high = dram_high / (dram_high + slow_low); an open upper end of slow
//! (dram) makes the low (high) end 0 (1).

use tier_proto::v1::TierSample;

/// One tier's accesses interval; `high` None: open (no upper bound).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    pub low: f64,
    pub high: Option<f64>,
}

impl Bounds {
    /// The tier's interval, None when the estimate gave none.
    pub fn of(t: &TierSample) -> Option<Bounds> {
        let low = t.accesses_low?;
        if t.accesses_high_open {
            return Some(Bounds { low, high: None });
        }
        Some(Bounds {
            low,
            high: Some(t.accesses_high?),
        })
    }
}

/// [low, high] of dram / (dram + slow) from the two tiers' intervals.
pub fn ratio_interval(dram: Bounds, slow: Bounds) -> (f64, f64) {
    let low = match slow.high {
        None => 0.0,
        Some(sh) if dram.low + sh > 0.0 => dram.low / (dram.low + sh),
        Some(_) => 0.0,
    };
    let high = match dram.high {
        None => 1.0,
        Some(dh) if dh + slow.low > 0.0 => dh / (dh + slow.low),
        Some(_) => 1.0,
    };
    (low, high.max(low))
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

    fn b(low: f64, high: f64) -> Bounds {
        Bounds {
            low,
            high: Some(high),
        }
    }

    #[test]
    fn ratio_ends_pair_each_tier_low_with_the_other_high() {
        // dram 60..90, slow 10..40: low 60/100, high 90/100.
        assert_eq!(ratio_interval(b(60.0, 90.0), b(10.0, 40.0)), (0.6, 0.9));
        // Open ends: slow unbounded -> low 0; dram unbounded -> high 1.
        let open = |low| Bounds { low, high: None };
        assert_eq!(ratio_interval(b(60.0, 90.0), open(10.0)), (0.0, 0.9));
        assert_eq!(ratio_interval(open(60.0), b(10.0, 40.0)), (0.6, 1.0));
        // Nothing anywhere: no information, [0, 1].
        assert_eq!(ratio_interval(b(0.0, 0.0), b(0.0, 0.0)), (0.0, 1.0));
        // A point estimate in both tiers is a point.
        assert_eq!(ratio_interval(b(30.0, 30.0), b(10.0, 10.0)), (0.75, 0.75));
    }

    #[test]
    fn tier_bounds_follow_the_proto_fields() {
        let mut t = TierSample {
            accesses_low: Some(5.0),
            accesses_high: Some(9.0),
            ..Default::default()
        };
        assert_eq!(Bounds::of(&t), Some(b(5.0, 9.0)));
        t.accesses_high_open = true;
        assert_eq!(
            Bounds::of(&t),
            Some(Bounds {
                low: 5.0,
                high: None
            })
        );
        t.accesses_low = None;
        assert_eq!(Bounds::of(&t), None, "unset low: no interval");
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
