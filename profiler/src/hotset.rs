//! What accessed bits measure of a VM's split between tiers, and what they
//! do not: the page-weighted share of the hot set held in DRAM
//! (`VmStats.hot_set_dram`), the DRAM-hit estimate marked not measured
//! where its interval is vacuous, and vacuous working sets marked too.

use tier_proto::v1::{Backend, HotSetShare, Tier, TierSample};

use crate::aggregate::HitInterval;

/// An end within this of 0 or 1 (or of 0 and the tier's bytes) is that end.
const EDGE: f64 = 1e-9;

/// Why the accessed-bit DRAM-hit estimate says nothing this interval: its
/// interval spans 0-100 %. Empty when it says something (or has no
/// interval to judge by).
pub fn ratio_not_measured(backend: i32, interval: Option<HitInterval>) -> String {
    let Some(i) = interval.filter(|i| i.low <= EDGE && i.high >= 1.0 - EDGE) else {
        return String::new();
    };
    let b = Backend::try_from(backend).map_or("accessed bits", |b| b.short_name());
    let why = match (i.low_open, i.high_open) {
        (true, true) => "every tier holds pages touched faster than the shortest pass resolves",
        (false, true) => "DRAM holds pages touched faster than the shortest pass resolves",
        (true, false) => "slow memory holds pages touched faster than the shortest pass resolves",
        (false, false) => "the passes fit every split of the accesses",
    };
    format!(
        "{b}: DRAM-hit interval 0-100 %: {why}; accessed bits count pages, not how often \
         (the hot-set share is what they measure)"
    )
}

/// Marks working sets whose interval spans 0 to the whole tier as not
/// measured: such a reading says nothing about the tier.
pub fn mark_vacuous(samples: &mut [TierSample], tiers: &[Tier]) {
    for (s, t) in samples.iter_mut().zip(tiers) {
        let Some(ages) = s.ages.as_mut() else {
            continue;
        };
        let size = t.size_bytes as f64;
        for w in &mut ages.working_set {
            if w.not_measured.is_empty() && size > 0.0 && vacuous(w.bytes_low, w.bytes_high, size) {
                w.not_measured = format!(
                    "interval 0-{} spans the whole tier: not measured",
                    tier_proto::human_bytes(t.size_bytes)
                );
            }
        }
    }
}

fn vacuous(low: f64, high: f64, all: f64) -> bool {
    low <= EDGE && high >= all * (1.0 - EDGE)
}

/// The share of the VM's hot set in DRAM tiers at the shortest horizon
/// every tier with ages measured this interval; `None` where a tier has no
/// ages, no horizon is measured on all of them, or nothing was touched.
/// The interval pairs DRAM's low end with slow's high end and the other
/// way round (each end at 97.5 %, so ~95 % for both).
pub fn dram_share(samples: &[TierSample], fast: &[bool]) -> Option<HotSetShare> {
    if samples.is_empty() || samples.len() != fast.len() {
        return None;
    }
    let ages: Vec<_> = samples
        .iter()
        .map(|s| s.ages.as_ref().filter(|a| a.not_measured.is_empty()))
        .collect::<Option<_>>()?;
    let measured = |a: &tier_proto::v1::TierAges, h: f64| {
        a.working_set
            .iter()
            .find(|w| w.horizon_seconds == h && w.not_measured.is_empty())
            .cloned()
    };
    let horizon = ages
        .first()?
        .working_set
        .iter()
        .map(|w| w.horizon_seconds)
        .filter(|&h| ages.iter().all(|a| measured(a, h).is_some()))
        .min_by(f64::total_cmp)?;
    // (bytes, low, high) of the DRAM tiers and of the others.
    let mut sum = [[0.0f64; 3]; 2];
    for (a, f) in ages.iter().zip(fast) {
        let w = measured(a, horizon)?;
        let s = &mut sum[usize::from(!*f)];
        s[0] += w.bytes.max(0.0);
        s[1] += w.bytes_low.max(0.0);
        s[2] += w.bytes_high.max(0.0);
    }
    let [[d, d_lo, d_hi], [s, s_lo, s_hi]] = sum;
    if d + s <= 0.0 || !(d + s).is_finite() {
        return None;
    }
    let part = |a: f64, b: f64, none: f64| if a + b > 0.0 { a / (a + b) } else { none };
    let share = d / (d + s);
    Some(HotSetShare {
        horizon_seconds: horizon,
        share,
        share_low: part(d_lo, s_hi, 0.0).min(share),
        share_high: part(d_hi, s_lo, 1.0).max(share),
        hot_bytes: d + s,
        dram_bytes: d,
    })
}

/// Whether a hot-set share's interval says nothing (0-100 %).
pub fn share_vacuous(h: &HotSetShare) -> bool {
    h.share_low <= EDGE && h.share_high >= 1.0 - EDGE
}

#[cfg(test)]
mod tests {
    use super::*;
    use tier_proto::v1::{TierAges, WorkingSet};

    fn ws(h: f64, bytes: f64, lo: f64, hi: f64, nm: &str) -> WorkingSet {
        WorkingSet {
            horizon_seconds: h,
            bytes,
            bytes_low: lo,
            bytes_high: hi,
            not_measured: nm.into(),
        }
    }

    fn sample(sets: Vec<WorkingSet>) -> TierSample {
        TierSample {
            ages: Some(TierAges {
                working_set: sets,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn share_at_the_shortest_horizon_every_tier_measured() {
        // 1 s is not measured on the slow tier: 10 s is the horizon.
        let t = [
            sample(vec![
                ws(1.0, 1e6, 0.9e6, 1.1e6, ""),
                ws(10.0, 3e6, 2.9e6, 3.1e6, ""),
            ]),
            sample(vec![
                ws(1.0, 0.0, 0.0, 0.0, "not this interval"),
                ws(10.0, 1e6, 0.9e6, 1.1e6, ""),
            ]),
        ];
        let h = dram_share(&t, &[true, false]).unwrap();
        assert_eq!(h.horizon_seconds, 10.0);
        assert!((h.share - 0.75).abs() < 1e-12);
        assert!((h.share_low - 2.9 / 4.0).abs() < 1e-12);
        assert!((h.share_high - 3.1 / 4.0).abs() < 1e-12);
        assert_eq!(h.hot_bytes, 4e6);
        assert!(!share_vacuous(&h));
    }

    #[test]
    fn no_share_without_a_common_horizon_or_a_touch() {
        let t = [
            sample(vec![ws(1.0, 1e6, 1e6, 1e6, "")]),
            sample(vec![ws(1.0, 0.0, 0.0, 0.0, "not measured")]),
        ];
        assert_eq!(dram_share(&t, &[true, false]), None);
        let t = [sample(vec![ws(1.0, 0.0, 0.0, 0.0, "")])];
        assert_eq!(dram_share(&t, &[true]), None);
        assert_eq!(dram_share(&[TierSample::default()], &[true]), None);
    }

    #[test]
    fn a_vacuous_ratio_is_not_measured_with_the_reason() {
        let i = |low, high, low_open, high_open| {
            Some(HitInterval {
                low,
                high,
                low_open,
                high_open,
            })
        };
        let why = ratio_not_measured(Backend::Hostpte as i32, i(0.0, 1.0, true, true));
        assert!(
            why.starts_with("hostpte: DRAM-hit interval 0-100 %: every tier holds"),
            "{why}"
        );
        assert_eq!(
            ratio_not_measured(Backend::Hostpte as i32, i(0.34, 1.0, false, true)),
            ""
        );
        assert_eq!(ratio_not_measured(Backend::Hostpte as i32, None), "");
    }

    #[test]
    fn a_working_set_spanning_the_tier_is_marked() {
        let mut t = [sample(vec![
            ws(1.0, 2e6, 0.0, 16.0 * 1048576.0, ""),
            ws(10.0, 2e6, 1e6, 3e6, ""),
        ])];
        let tiers = [Tier {
            size_bytes: 16 << 20,
            ..Default::default()
        }];
        mark_vacuous(&mut t, &tiers);
        let w = &t[0].ages.as_ref().unwrap().working_set;
        assert!(w[0].not_measured.contains("spans the whole tier"));
        assert!(w[1].not_measured.is_empty());
    }
}
