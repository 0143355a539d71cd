//! The host backend's ~95 % interval of the DRAM-hit ratio, as the
//! fidelity bench scores it (`tier_benches::verdict`: coverage, width,
//! one-sided and vacuous shares).
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
}
