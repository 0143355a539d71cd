//! What accessed bits measure of a VM's split between tiers, and what they
//! do not: the page-weighted share of the hot set held in DRAM
//! (`VmStats.hot_set_dram`), the DRAM-hit estimate marked not measured
//! where its interval is vacuous, and vacuous working sets marked too.

use tier_proto::v1::{Backend, HotSetShare, Tier, TierSample};

/// An end within this of 0 or 1 (or of 0 and the tier's bytes) is that end.
const EDGE: f64 = 1e-9;

/// The DRAM-hit ratio's interval as the aggregator forms it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    pub low: f64,
    pub high: f64,
    pub low_open: bool,
    pub high_open: bool,
}

/// Why the accessed-bit DRAM-hit estimate says nothing this interval: its
/// interval spans 0-100 %. Empty when it says something (or has no
/// interval to judge by).
pub fn ratio_not_measured(backend: i32, interval: Option<Bounds>) -> String {
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
        "{b}: DRAM-hit interval 0-100 %: {why}; accessed bits count pages not how often \
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

/// The share of the VM's hot set in DRAM tiers: at the shortest horizon
/// every tier with ages measured this interval, or over the interval's
/// longest pass (`from_pass`), whichever interval is narrower (the ages on
/// a tie). `None` where neither tells, or nothing was touched.
pub fn dram_share(samples: &[TierSample], fast: &[bool]) -> Option<HotSetShare> {
    if samples.is_empty() || samples.len() != fast.len() {
        return None;
    }
    let ages = from_ages(samples, fast).filter(|h| !share_vacuous(h));
    let pass = from_pass(samples, fast);
    let width = |h: &HotSetShare| h.share_high - h.share_low;
    match (ages, pass) {
        (Some(a), Some(p)) if width(&p) < width(&a) => Some(p),
        (a, p) => a.or(p),
    }
}

/// The horizon the working sets give; the interval pairs DRAM's low end
/// with slow's high end and the other way round (each at 97.5 %).
fn from_ages(samples: &[TierSample], fast: &[bool]) -> Option<HotSetShare> {
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
    let sets = ages
        .iter()
        .map(|a| measured(a, horizon).map(|w| [w.bytes, w.bytes_low, w.bytes_high]))
        .collect::<Option<Vec<_>>>()?;
    share(horizon, &sets, fast, false)
}

/// One pass watched every tier over the same span: pages young in it, per
/// tier, scaled from the sample, with the sample's binomial noise (none
/// where every page was read, as hostpte does).
fn from_pass(samples: &[TierSample], fast: &[bool]) -> Option<HotSetShare> {
    let first = samples.first()?;
    let n = first.pass_seconds.len();
    if n == 0
        || samples
            .iter()
            .any(|s| s.pass_seconds.len() != n || s.pass_young_pages.len() != n)
    {
        return None;
    }
    let (i, _) = first
        .pass_seconds
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))?;
    let horizon = samples
        .iter()
        .map(|s| s.pass_seconds[i])
        .fold(0.0, f64::max);
    // 97.5 % one-sided per end, as the other intervals.
    const Z: f64 = 2.241;
    let sets = samples
        .iter()
        .map(|s| {
            if s.sampled_pages == 0 || s.coverage <= 0.0 {
                return None;
            }
            let n = s.sampled_pages as f64;
            let y = (s.pass_young_pages[i] as f64).min(n);
            let scale = PAGE / s.coverage.min(1.0);
            let bytes = y * scale;
            if s.coverage >= 1.0 {
                return Some([bytes; 3]);
            }
            let p = y / n;
            let half = Z * (p * (1.0 - p) / n).sqrt() * n * scale;
            Some([bytes, (bytes - half).max(0.0), bytes + half])
        })
        .collect::<Option<Vec<_>>>()?;
    share(horizon, &sets, fast, true)
}

const PAGE: f64 = 4096.0;

/// The share from each tier's `[bytes, low, high]`.
fn share(horizon: f64, sets: &[[f64; 3]], fast: &[bool], from_pass: bool) -> Option<HotSetShare> {
    // (bytes, low, high) of the DRAM tiers and of the others.
    let mut sum = [[0.0f64; 3]; 2];
    for (w, f) in sets.iter().zip(fast) {
        let s = &mut sum[usize::from(!*f)];
        for k in 0..3 {
            s[k] += w[k].max(0.0);
        }
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
        tier_bytes: sets.iter().map(|w| w[0]).collect(),
        from_pass,
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
    fn a_vacuous_horizon_gives_way_to_the_longest_pass() {
        // hostpte: 1 s straddled by its long pass, [0, 2x] on both tiers.
        let mut t = [
            sample(vec![ws(1.0, 2e5, 0.0, 4e5, "")]),
            sample(vec![ws(1.0, 4e5, 0.0, 8e5, "")]),
        ];
        for (s, young) in t.iter_mut().zip([[10, 50], [20, 96]]) {
            s.pass_seconds = vec![0.1, 0.9];
            s.pass_young_pages = young.to_vec();
            s.sampled_pages = 4096;
            s.coverage = 1.0;
        }
        let h = dram_share(&t, &[true, false]).unwrap();
        assert!(h.from_pass);
        assert_eq!(h.horizon_seconds, 0.9);
        assert_eq!(h.tier_bytes, vec![50.0 * 4096.0, 96.0 * 4096.0]);
        // Every page read: exact.
        assert!((h.share - 50.0 / 146.0).abs() < 1e-12);
        assert_eq!((h.share_low, h.share_high), (h.share, h.share));
        // A sampled tier: a binomial interval around the same point.
        t[1].coverage = 0.5;
        t[1].sampled_pages = 2048;
        let h = dram_share(&t, &[true, false]).unwrap();
        assert!((h.share - 50.0 / 242.0).abs() < 1e-12);
        assert!(h.share_low < h.share && h.share < h.share_high);
        // Passes that do not line up: no share.
        t[1].pass_seconds.pop();
        assert_eq!(dram_share(&t, &[true, false]), None);
        // A horizon that bounds the share, and no exact pass: the horizon;
        // with an exact pass beside a wide horizon: the pass.
        for s in &mut t {
            s.ages.as_mut().unwrap().working_set[0].bytes_low = 1e5;
        }
        let h = dram_share(&t, &[true, false]).unwrap();
        assert!(!h.from_pass && h.horizon_seconds == 1.0, "{h:?}");
        t[1].pass_seconds.push(0.9);
        (t[1].coverage, t[1].sampled_pages) = (1.0, 4096);
        assert!(dram_share(&t, &[true, false]).unwrap().from_pass);
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
            Some(Bounds {
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
