//! What an accessed-bit estimate makes of a simulated VM's load (docs/estimate.md):
//! pages touched faster than the shortest pass resolves count once per
//! pass, not per touch, so their tier's accesses read low, and since the
//! guest keeps its hottest pages in DRAM the DRAM-hit ratio reads low
//! too. The estimate's interval covers the truth: each tier's low end is
//! firm, its high end open where pages were too hot to count, and the
//! sampling noise (uniform in +-noise) is inside both.
//!
//! Model: in a phase (`workload`) the page at hot-set fraction x is touched
//! at g(x) = a / ((1 + a x) ln(1 + a)) times the phase's mean rate (1 when
//! uniform). A pass resolves up to `cap` times the mean rate: above it,
//! the estimate counts `cap`, and the tier holding such pages has no upper
//! bound.

use crate::workload::Phase;
use tier_controller::policy::HitEvidence;

/// One tier's estimate: the share of its true accesses the estimate sees,
/// and whether it holds pages too hot to count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seen {
    pub share: f64,
    pub saturated: bool,
}

/// The phase's skew, as `Phase` reads it (tiny = uniform).
fn skew(p: &Phase) -> Option<f64> {
    (p.skew.is_finite() && p.skew > 1e-6).then_some(p.skew)
}

/// Share of the accesses to the hottest fraction `x` of the hot set.
fn share(a: Option<f64>, x: f64) -> f64 {
    let x = x.clamp(0.0, 1.0);
    match a {
        Some(a) => (a * x).ln_1p() / a.ln_1p(),
        None => x,
    }
}

/// Hot-set fraction below which pages are touched faster than `cap` x the
/// mean rate.
fn saturated_below(a: Option<f64>, cap: f64) -> f64 {
    match a {
        Some(a) => ((a / (cap * a.ln_1p()) - 1.0) / a).clamp(0.0, 1.0),
        None if cap < 1.0 => 1.0,
        None => 0.0,
    }
}

/// What the estimate sees of each tier, `[dram, slow]`, when the guest
/// holds `dram` and `slow` bytes (hottest pages in DRAM).
pub fn seen(p: &Phase, dram: u64, slow: u64, cap: f64) -> [Seen; 2] {
    let h = p.hot_bytes.max(1) as f64;
    let xd = (dram.min(p.hot_bytes) as f64 / h).min(1.0);
    let xs = (slow as f64 / h).min(1.0 - xd);
    let a = skew(p);
    let xstar = saturated_below(a, cap.max(0.0));
    let tier = |x0: f64, x1: f64| {
        let truth = share(a, x1) - share(a, x0);
        if truth <= 0.0 {
            return Seen {
                share: 1.0,
                saturated: false,
            };
        }
        let cut = xstar.clamp(x0, x1);
        // Capped pages count `cap` x the mean rate each, the rest in full.
        let visible = cap * (cut - x0) + (share(a, x1) - share(a, cut));
        Seen {
            share: (visible / truth).clamp(0.0, 1.0),
            saturated: cut > x0,
        }
    };
    [tier(0.0, xd), tier(xd, xd + xs)]
}

/// The ratio's interval from the tiers' estimates `est` (accesses read,
/// noise included), what they saw, and the noise bound: each tier's truth
/// lies in [est / (1 + noise), est / (1 - noise)], or above the low end
/// without bound where pages were too hot to count.
pub fn interval(est: [f64; 2], seen: [Seen; 2], noise: f64) -> HitEvidence {
    let n = noise.clamp(0.0, 0.999);
    let low = |e: f64| e / (1.0 + n);
    let high = |e: f64, s: Seen| (!s.saturated).then(|| e / (1.0 - n));
    let (dl, sl) = (low(est[0]), low(est[1]));
    let (dh, sh) = (high(est[0], seen[0]), high(est[1], seen[1]));
    let (lo, low_open) = match sh {
        Some(sh) if dl + sh > 0.0 => (dl / (dl + sh), false),
        Some(_) => (0.0, false),
        None => (0.0, true),
    };
    let (hi, high_open) = match dh {
        Some(dh) if dh + sl > 0.0 => (dh / (dh + sl), false),
        Some(_) => (1.0, false),
        None => (1.0, true),
    };
    HitEvidence::Interval {
        low: lo,
        high: hi,
        low_open,
        high_open,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tier_controller::policy::{Hit, HitKind};

    const G: u64 = 1 << 30;

    fn phase(skew: f64) -> Phase {
        Phase::hot(0, 4 * G, skew, 1000.0)
    }

    #[test]
    fn hot_dram_reads_low_and_the_interval_covers_the_truth() {
        let p = phase(100.0);
        // 1G of the 4G hot set in DRAM: its hottest pages are beyond cap 2.
        let [d, s] = seen(&p, G, 3 * G, 2.0);
        assert!(d.saturated && d.share < 0.8, "{d:?}");
        assert!(!s.saturated && (s.share - 1.0).abs() < 1e-12, "{s:?}");
        let truth = p.load(G, 3 * G);
        let est = [truth.dram_accesses * d.share, truth.slow_accesses];
        let point = est[0] / (est[0] + est[1]);
        let r = truth.ratio().unwrap();
        assert!(point < r - 0.05, "point {point} against {r}");
        let h = Hit::of(interval(est, [d, s], 0.0), Some(point)).unwrap();
        assert_eq!(h.kind, HitKind::Estimate);
        assert!(h.high_open && !h.low_open && h.high == 1.0);
        assert!(h.low <= r && r <= h.high, "{h:?} {r}");
        // Uniform touches below the cap: seen whole, interval = noise.
        let [d, s] = seen(&phase(0.0), G, 3 * G, 2.0);
        assert_eq!((d.share, d.saturated, s.saturated), (1.0, false, false));
        let HitEvidence::Interval { low, high, .. } = interval([250.0, 750.0], [d, s], 0.1) else {
            panic!("an interval");
        };
        assert!(
            low < 0.25 && 0.25 < high && high - low < 0.1,
            "{low} {high}"
        );
    }
}
