//! What the DRAM-hit ratio and each tier's accesses rest on, for the
//! detail pane (docs/estimate.md): the interval and its open ends, the sampling
//! error, the PMU's count beside the accessed-bit estimate.

use tier_proto::v1::{TierSample, VmStats};

use crate::view::rate;

/// What the ratio rests on: the interval's point and open ends, the
/// sampling error, or the PMU's count beside the accessed-bit estimate.
pub(super) fn estimate_line(s: &VmStats) -> String {
    let p = |v: f64| format!("{:.1} %", v * 100.0);
    let bits = if !s.has_accesses {
        "accessed bits: no accesses".to_string()
    } else if let Some(why) = crate::signal::ratio_not_measured(s) {
        // No point, no sampling error: the interval says nothing.
        format!("accessed bits: DRAM-hit not measured: {why}")
    } else {
        let sampling = if s.dram_hit_error > 0.0 {
            format!(", page sampling alone ±{:.1}", s.dram_hit_error * 100.0)
        } else {
            String::new()
        };
        let open = match (s.dram_hit_low_open, s.dram_hit_high_open) {
            (true, true) => "; both ends open: hot pages in every tier cannot be counted",
            (false, true) => "; open above: DRAM holds pages too hot to count",
            (true, false) => "; open below: slow memory holds pages too hot to count",
            (false, false) => "",
        };
        match (s.dram_hit_low, s.dram_hit_high) {
            (Some(lo), Some(hi)) => format!(
                "accessed bits: {:.1}-{:.1} % (point {}{sampling}){open}",
                lo * 100.0,
                hi * 100.0,
                p(s.dram_hit_ratio)
            ),
            _ => format!(
                "accessed bits: point {} (no interval from this tierd{sampling})",
                p(s.dram_hit_ratio)
            ),
        }
    };
    match s.counted_dram_hit_ratio {
        Some(c) => format!("PMU-counted {} on every tier (acted on); {bits}", p(c)),
        None => bits,
    }
}

/// What accessed bits measure of the split: the hot set's share in DRAM,
/// with its interval, horizon and size; `None` where not measured.
pub(super) fn hot_set_line(s: &VmStats) -> Option<String> {
    let h = crate::signal::hot_set(s)?;
    Some(format!(
        "hot set ({}): {} in DRAM of {} touched (point {:.1} %, dram {})",
        crate::signal::horizon(h.horizon_seconds, h.from_pass),
        crate::signal::hot_text(h).trim_start_matches("hot "),
        tier_proto::human_bytes(h.hot_bytes.max(0.0) as u64),
        h.share * 100.0,
        tier_proto::human_bytes(h.dram_bytes.max(0.0) as u64),
    ))
}

/// One tier's estimate: the accesses' interval, pages too hot to count,
/// and how well the rate mixture fits.
pub(super) fn tier_estimate(name: &str, s: &TierSample, secs: f64) -> Option<String> {
    let lo = s.accesses_low?;
    let per_s = |v: f64| rate((secs > 0.0).then(|| v / secs));
    let range = match s.accesses_high {
        Some(hi) if !s.accesses_high_open => format!("{}-{}", per_s(lo), per_s(hi)),
        _ => format!("≥{} (no upper bound from accessed bits)", per_s(lo)),
    };
    let misfit = s.fit_misfit.map_or("-".into(), |m| {
        format!("{m:.1}{}", if m > 3.0 { "!" } else { "" })
    });
    Some(format!(
        "{name}: acc/s {range}  saturated pages {:.0}  misfit {misfit}",
        s.saturated_pages
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_ratio_rests_on() {
        let mut s = VmStats {
            has_accesses: true,
            dram_hit_ratio: 0.343,
            dram_hit_error: 0.012,
            ..Default::default()
        };
        assert_eq!(
            estimate_line(&s),
            "accessed bits: point 34.3 % (no interval from this tierd, page sampling alone ±1.2)"
        );
        (s.dram_hit_low, s.dram_hit_high, s.dram_hit_high_open) = (Some(0.34), Some(1.0), true);
        s.dram_hit_error = 0.0;
        assert_eq!(
            estimate_line(&s),
            "accessed bits: 34.0-100.0 % (point 34.3 %); open above: DRAM holds pages too hot to count"
        );
        s.dram_hit_low = Some(0.0);
        s.dram_hit_not_measured = "hostpte: DRAM-hit interval 0-100 %".into();
        assert_eq!(
            estimate_line(&s),
            "accessed bits: DRAM-hit not measured: hostpte: DRAM-hit interval 0-100 %"
        );
        assert!(!estimate_line(&s).contains("34.3"));
        (s.dram_hit_low, s.dram_hit_not_measured) = (Some(0.34), String::new());
        s.counted_dram_hit_ratio = Some(0.667);
        assert!(
            estimate_line(&s).starts_with(
                "PMU-counted 66.7 % on every tier (acted on); accessed bits: 34.0-100.0 %"
            ),
            "{}",
            estimate_line(&s)
        );
    }

    #[test]
    fn the_hot_set_line() {
        let mut s = VmStats::default();
        assert_eq!(hot_set_line(&s), None);
        s.hot_set_dram = Some(tier_proto::v1::HotSetShare {
            horizon_seconds: 0.39,
            share: 0.342,
            share_low: 0.342,
            share_high: 0.342,
            hot_bytes: 146.0 * 4096.0,
            dram_bytes: 50.0 * 4096.0,
            tier_bytes: vec![50.0 * 4096.0, 96.0 * 4096.0],
            from_pass: true,
        });
        assert_eq!(
            hot_set_line(&s).unwrap(),
            "hot set (pass 0.39 s): 34.2 % in DRAM of 584.0K touched (point 34.2 %, dram 200.0K)"
        );
    }

    #[test]
    fn a_tier_s_accesses() {
        let mut t = TierSample {
            accesses_low: Some(100.0),
            accesses_high: Some(250.0),
            fit_misfit: Some(3.5),
            ..Default::default()
        };
        assert_eq!(
            tier_estimate("dram", &t, 0.5).unwrap(),
            "dram: acc/s 200-500  saturated pages 0  misfit 3.5!"
        );
        t.accesses_high_open = true;
        t.saturated_pages = 12.0;
        assert_eq!(
            tier_estimate("dram", &t, 0.5).unwrap(),
            "dram: acc/s ≥200 (no upper bound from accessed bits)  saturated pages 12  misfit 3.5!"
        );
        t.accesses_low = None;
        assert_eq!(tier_estimate("dram", &t, 0.5), None);
    }
}
