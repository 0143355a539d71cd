//! The DRAM-hit ratio as the policy judges it: a point and a ~95 % interval
//! (docs/estimate.md). Accessed bits under-read pages touched faster than the
//! shortest pass resolves, so the point alone can be far off (25 % read
//! against a true 55 %); the interval covers the truth and may be wide or
//! one-sided. The policy moves DRAM only when the interval lies outside the
//! hold band (`ActOn::Interval`, the default).

/// What came with a sample besides the per-tier accesses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HitEvidence {
    /// No interval (a tierd from before intervals, docs/estimate.md, untimed passes): the
    /// point +- `error`, the sampling-only half-width (`dram_hit_error`,
    /// 0 for exact samples). Decisions say so.
    Sampling { error: f64 },
    /// The estimator's ~95 % interval (`VmStats.dram_hit_low/high`); an
    /// open end is 0 or 1 only because a tier's accesses have no upper
    /// bound from accessed bits.
    Interval {
        low: f64,
        high: f64,
        low_open: bool,
        high_open: bool,
    },
    /// The pmu source counted every tier: exact, interval = point.
    Counted(f64),
}

impl Default for HitEvidence {
    fn default() -> Self {
        HitEvidence::Sampling { error: 0.0 }
    }
}

/// Which part of the interval the policy acts on (`Tuning::act_on`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ActOn {
    /// Move DRAM towards a VM only when the whole interval is below the
    /// band, away only when it is all above: no move on a ratio the
    /// interval cannot place.
    #[default]
    Interval,
    /// The point estimate, as before intervals (trusts a skewed estimate).
    Point,
    /// The VM-protective bound: DRAM goes to a VM whose interval reaches
    /// below the band (low end), away only when the low end is above it.
    Protective,
}

/// Where the interval came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HitKind {
    Counted,
    Estimate,
    /// Point +- sampling error, no interval from the sender.
    SamplingOnly,
}

/// The ratio the policy judges: point and interval, low <= point <= high.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hit {
    pub point: f64,
    pub low: f64,
    pub high: f64,
    pub low_open: bool,
    pub high_open: bool,
    pub kind: HitKind,
}

/// A ratio as a percentage, without a needless ".0".
fn pct(v: f64) -> String {
    let p = v * 100.0;
    if (p - p.round()).abs() < 0.05 {
        format!("{p:.0}")
    } else {
        format!("{p:.1}")
    }
}

impl Hit {
    /// The interval for a sample whose point (from the per-tier accesses,
    /// `Load::ratio`) is `point`; `None` without accesses. An estimator
    /// interval that misses its own point is widened to include it.
    pub fn of(ev: HitEvidence, point: Option<f64>) -> Option<Hit> {
        let p = point?.clamp(0.0, 1.0);
        let unit = |v: f64| if v.is_finite() { v.clamp(0.0, 1.0) } else { p };
        Some(match ev {
            HitEvidence::Counted(_) => Hit {
                point: p,
                low: p,
                high: p,
                low_open: false,
                high_open: false,
                kind: HitKind::Counted,
            },
            HitEvidence::Interval {
                low,
                high,
                low_open,
                high_open,
            } => Hit {
                point: p,
                low: unit(low).min(p),
                high: unit(high).max(p),
                low_open,
                high_open,
                kind: HitKind::Estimate,
            },
            HitEvidence::Sampling { error } => {
                let e = if error.is_finite() { error.abs() } else { 0.0 };
                Hit {
                    point: p,
                    low: (p - e).max(0.0),
                    high: (p + e).min(1.0),
                    low_open: false,
                    high_open: false,
                    kind: HitKind::SamplingOnly,
                }
            }
        })
    }

    /// Known to be below `edge`, by `act_on`.
    pub fn below(&self, edge: f64, act_on: ActOn) -> bool {
        match act_on {
            ActOn::Interval => self.high < edge,
            ActOn::Point => self.point < edge,
            ActOn::Protective => self.low < edge,
        }
    }

    /// Known to be above `edge`, by `act_on`.
    pub fn above(&self, edge: f64, act_on: ActOn) -> bool {
        match act_on {
            ActOn::Interval | ActOn::Protective => self.low > edge,
            ActOn::Point => self.point > edge,
        }
    }

    /// The interval for a decision's text: `dram-hit 34-71 % (open above;
    /// point 52.0 %)`, `dram-hit 66.7 % (PMU-counted)`, `dram-hit 34.3 %
    /// +-1.2 (no interval from the sampler: sampling error only)`.
    pub fn quote(&self) -> String {
        let p = pct(self.point);
        match self.kind {
            HitKind::Counted => format!("dram-hit {p} % (PMU-counted)"),
            HitKind::SamplingOnly if self.high - self.low < 1e-9 => {
                format!("dram-hit {p} % (no interval from the sampler)")
            }
            HitKind::SamplingOnly => format!(
                "dram-hit {p} % +-{:.1} (no interval from the sampler: sampling error only)",
                (self.high - self.low) * 50.0
            ),
            HitKind::Estimate => {
                let open = match (self.low_open, self.high_open) {
                    (true, true) => "open both ends; ",
                    (true, false) => "open below; ",
                    (false, true) => "open above; ",
                    (false, false) => "",
                };
                format!(
                    "dram-hit {}-{} % ({open}point {p} %)",
                    pct(self.low),
                    pct(self.high)
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn est(low: f64, high: f64, lo_open: bool, hi_open: bool) -> HitEvidence {
        HitEvidence::Interval {
            low,
            high,
            low_open: lo_open,
            high_open: hi_open,
        }
    }

    #[test]
    fn placing_an_interval_against_an_edge() {
        let h = Hit::of(est(0.34, 0.71, false, false), Some(0.5)).unwrap();
        // Straddles 0.6: neither below nor above by the interval.
        assert!(!h.below(0.6, ActOn::Interval) && !h.above(0.6, ActOn::Interval));
        assert!(h.below(0.6, ActOn::Point));
        assert!(h.below(0.6, ActOn::Protective) && !h.above(0.6, ActOn::Protective));
        assert!(h.below(0.8, ActOn::Interval));
        assert!(h.above(0.3, ActOn::Interval));
        // Counted: the point is the interval.
        let c = Hit::of(HitEvidence::Counted(0.7), Some(0.7)).unwrap();
        assert!(c.below(0.71, ActOn::Interval) && c.above(0.69, ActOn::Interval));
        // No accesses, no ratio.
        assert_eq!(Hit::of(HitEvidence::default(), None), None);
        // An interval that misses its point is widened to it.
        let w = Hit::of(est(0.6, 0.7, false, false), Some(0.5)).unwrap();
        assert_eq!((w.low, w.high), (0.5, 0.7));
    }

    #[test]
    fn quotes_never_say_plus_minus_zero() {
        let q = |ev, p| Hit::of(ev, Some(p)).unwrap().quote();
        assert_eq!(
            q(est(0.34, 1.0, false, true), 0.343),
            "dram-hit 34-100 % (open above; point 34.3 %)"
        );
        assert_eq!(
            q(est(0.0, 1.0, true, true), 0.5),
            "dram-hit 0-100 % (open both ends; point 50 %)"
        );
        assert_eq!(
            q(HitEvidence::Counted(0.667), 0.667),
            "dram-hit 66.7 % (PMU-counted)"
        );
        assert_eq!(
            q(HitEvidence::default(), 0.343),
            "dram-hit 34.3 % (no interval from the sampler)"
        );
        assert_eq!(
            q(HitEvidence::Sampling { error: 0.012 }, 0.343),
            "dram-hit 34.3 % +-1.2 (no interval from the sampler: sampling error only)"
        );
    }
}
