//! What each VM's numbers measure, for every output: the DRAM-hit
//! estimate only where its interval says something, the hot-set share
//! accessed bits measure, and which signal the controller steers by.

use tier_proto::v1::{HotSetShare, Policy, PolicyMode, VmStats};

/// An end within this of 0 or 1 is that end.
const EDGE: f64 = 1e-9;

/// Why the accessed-bit DRAM-hit estimate is not a measurement this
/// interval: tierd's reason, or (an older tierd) its interval spanning
/// 0-100 %. `None` when it measures something or there is no estimate.
pub fn ratio_not_measured(s: &VmStats) -> Option<String> {
    if !s.dram_hit_not_measured.is_empty() {
        return Some(s.dram_hit_not_measured.clone());
    }
    match (s.dram_hit_low, s.dram_hit_high) {
        (Some(lo), Some(hi)) if s.has_accesses && lo <= EDGE && hi >= 1.0 - EDGE => Some(
            "DRAM-hit interval 0-100 %: accessed bits cannot place the ratio on this load".into(),
        ),
        _ => None,
    }
}

/// The accessed-bit estimate's point where it is a measurement.
pub fn measured_ratio(s: &VmStats) -> Option<f64> {
    (s.has_accesses && s.not_measured.is_empty() && ratio_not_measured(s).is_none())
        .then_some(s.dram_hit_ratio)
}

/// The hot-set share where its interval says something.
pub fn hot_set(s: &VmStats) -> Option<&HotSetShare> {
    s.hot_set_dram
        .as_ref()
        .filter(|h| !(h.share_low <= EDGE && h.share_high >= 1.0 - EDGE))
}

/// `hot 33-35 %` (one decimal when the ends are within 5 points).
pub fn hot_text(h: &HotSetShare) -> String {
    if h.share_high - h.share_low < 0.0005 {
        return format!("hot {:.1} %", h.share * 100.0);
    }
    let d = if h.share_high - h.share_low < 0.05 {
        1
    } else {
        0
    };
    format!(
        "hot {:.d$}-{:.d$} %",
        h.share_low * 100.0,
        h.share_high * 100.0
    )
}

/// The hot set's horizon: `1 s` for a working-set horizon, `pass 0.38 s`
/// for the interval's longest pass.
pub fn horizon(h: f64, from_pass: bool) -> String {
    if from_pass {
        format!("pass {h:.2} s")
    } else {
        format!("{h} s")
    }
}

/// The VM's mode in the policy: its own override, else the default.
pub fn mode_of(p: &Policy, id: &str, name: &str) -> Option<PolicyMode> {
    let m = p
        .vms
        .iter()
        .find(|v| v.vm == id)
        .or_else(|| p.vms.iter().find(|v| v.vm == name))
        .and_then(|v| v.mode)
        .unwrap_or(p.mode);
    PolicyMode::try_from(m).ok()
}

/// Which signal the controller steers the VM by under `mode` (as its
/// decide step resolves it): `pmu` (a counted DRAM-hit ratio), `hot-set`
/// (accessed-bit working sets), `bits-ratio` (the accessed-bit interval,
/// ratio mode without a count), `none` (nothing measured: held).
pub fn steer(s: &VmStats, mode: PolicyMode) -> &'static str {
    if s.counted_dram_hit_ratio.is_some() {
        return "pmu";
    }
    // A backend that gives ages: the controller holds its last measured
    // view between the intervals that measure the hot horizon.
    let ages = !s.tiers.is_empty() && s.tiers.iter().all(|t| t.ages.is_some());
    match mode {
        PolicyMode::Ratio if s.has_accesses && s.not_measured.is_empty() => "bits-ratio",
        PolicyMode::Ratio => "none",
        PolicyMode::WorkingSet | PolicyMode::Auto if ages => "hot-set",
        PolicyMode::WorkingSet | PolicyMode::Auto => "none",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tier_proto::v1::{TierAges, TierSample, VmPolicy};

    #[test]
    fn a_vacuous_interval_is_no_ratio() {
        let mut s = VmStats {
            has_accesses: true,
            dram_hit_ratio: 0.34,
            dram_hit_low: Some(0.0),
            dram_hit_high: Some(1.0),
            ..Default::default()
        };
        assert!(ratio_not_measured(&s).is_some_and(|r| r.contains("0-100 %")));
        assert_eq!(measured_ratio(&s), None);
        s.dram_hit_low = Some(0.3);
        assert_eq!(ratio_not_measured(&s), None);
        assert_eq!(measured_ratio(&s), Some(0.34));
        s.dram_hit_not_measured = "hostpte: because".into();
        assert_eq!(ratio_not_measured(&s).as_deref(), Some("hostpte: because"));
        assert_eq!(measured_ratio(&s), None);
    }

    #[test]
    fn the_signal_follows_the_mode_and_the_measurements() {
        let aged = TierSample {
            ages: Some(TierAges::default()),
            ..Default::default()
        };
        let mut s = VmStats {
            has_accesses: true,
            tiers: vec![aged.clone(), aged],
            ..Default::default()
        };
        assert_eq!(steer(&s, PolicyMode::Auto), "hot-set");
        assert_eq!(steer(&s, PolicyMode::Ratio), "bits-ratio");
        s.counted_dram_hit_ratio = Some(0.5);
        assert_eq!(steer(&s, PolicyMode::Auto), "pmu");
        assert_eq!(steer(&s, PolicyMode::WorkingSet), "pmu");
        s.counted_dram_hit_ratio = None;
        s.tiers[1].ages = None;
        assert_eq!(steer(&s, PolicyMode::Auto), "none");
        let p = Policy {
            mode: PolicyMode::Auto as i32,
            vms: vec![VmPolicy {
                vm: "b".into(),
                mode: Some(PolicyMode::Ratio as i32),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(mode_of(&p, "a", "a"), Some(PolicyMode::Auto));
        assert_eq!(mode_of(&p, "x", "b"), Some(PolicyMode::Ratio));
    }

    #[test]
    fn a_hot_set_share_reads_as_a_range() {
        let h = HotSetShare {
            share: 0.34,
            share_low: 0.33,
            share_high: 0.35,
            ..Default::default()
        };
        assert_eq!(hot_text(&h), "hot 33.0-35.0 %");
        let exact = HotSetShare {
            share_low: 0.34,
            share_high: 0.34,
            ..h.clone()
        };
        assert_eq!(hot_text(&exact), "hot 34.0 %");
        let wide = HotSetShare {
            share_low: 0.0,
            share_high: 1.0,
            ..h
        };
        let s = VmStats {
            hot_set_dram: Some(wide),
            ..Default::default()
        };
        assert_eq!(hot_set(&s), None);
    }
}
