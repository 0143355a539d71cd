//! The estimate's intervals as Prometheus series (docs/estimate.md): per tier the
//! ~95 % interval of the access rate, pages too hot to count and the fit's
//! misfit; per VM the interval of the DRAM-hit ratio, which ends are open
//! and the ratio the PMU counted. Also how old the fit behind each tier's
//! estimate is and whether the estimator's CPU budget deferred it.
//!
//! An open upper end (accessed bits set no bound) is an absent `_high`
//! series plus `..._high_open 1`, not +Inf: prometheus_client 0.25 writes
//! non-finite values through dtoa, which prints `inf`, not the `+Inf` the
//! OpenMetrics grammar wants. The ratio's ends are bounded by [0, 1]
//! anyway: an open end is exported as 0 or 1 with
//! `tierd_vm_dram_hit_bound_open{end}` = 1 saying why.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tier_proto::v1::{TierSample, VmStats};

use super::{FGauge, TierLabels, VmLabels, set};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct EndLabels {
    vm: String,
    name: String,
    end: String,
}

fn ends(vl: &VmLabels) -> [EndLabels; 2] {
    ["low", "high"].map(|e| EndLabels {
        vm: vl.vm.clone(),
        name: vl.name.clone(),
        end: e.into(),
    })
}

#[derive(Debug, Default)]
pub(super) struct Bounds {
    rate_low: FGauge<TierLabels>,
    rate_high: FGauge<TierLabels>,
    high_open: Family<TierLabels, Gauge>,
    saturated: FGauge<TierLabels>,
    misfit: FGauge<TierLabels>,
    fit_age: Family<TierLabels, Gauge>,
    fit_deferred: Family<TierLabels, Gauge>,
    hit_low: FGauge<VmLabels>,
    hit_high: FGauge<VmLabels>,
    hit_open: Family<EndLabels, Gauge>,
    counted: FGauge<VmLabels>,
}

impl Bounds {
    pub(super) fn register(&self, r: &mut Registry) {
        let f = |g: &FGauge<TierLabels>| g.clone();
        r.register(
            "tier_estimated_accesses_per_second_low",
            "Lower end of the ~95% interval of the tier's estimated access rate: firm (pages young in a pass were touched in it); absent without an interval",
            f(&self.rate_low),
        );
        r.register(
            "tier_estimated_accesses_per_second_high",
            "Upper end of that interval; absent without an interval or when accessed bits set no upper bound (tier_estimated_accesses_high_open 1)",
            f(&self.rate_high),
        );
        r.register(
            "tier_estimated_accesses_high_open",
            "1 if some of the tier's pages are touched faster than the shortest pass resolves, so the access rate has no upper bound from accessed bits; absent without an interval",
            self.high_open.clone(),
        );
        r.register(
            "tier_saturated_pages",
            "Pages (scaled to the tier) the passes require to be touched faster than the shortest pass resolves (lower end of the fit's range)",
            f(&self.saturated),
        );
        r.register(
            "tier_fit_misfit",
            "Goodness of fit of the per-page rate mixture, in standard errors: below ~2 it fits, above ~3 the tier changed within the passes and the interval was widened; absent without an interval",
            f(&self.misfit),
        );
        r.register(
            "tier_fit_age_intervals",
            "Intervals since the full fit the tier's estimate rests on (0: fitted in this interval; older: a kept fit the passes agreed with, or a deferred one); absent for a tier without passes",
            self.fit_age.clone(),
        );
        r.register(
            "tier_fit_deferred",
            "1 if the tier's full fit was due and the estimator's CPU budget ([sampler] fit_budget_pct) deferred it: the estimate is at the kept rate and the interval only firm below, open above; absent for a tier without passes",
            self.fit_deferred.clone(),
        );
        r.register(
            "vm_dram_hit_ratio_low",
            "Lower end of the ~95% interval of the DRAM-hit ratio (model misfit and pages too hot to count included, unlike vm_dram_hit_sampling_error_ratio); absent without an interval",
            self.hit_low.clone(),
        );
        r.register(
            "vm_dram_hit_ratio_high",
            "Upper end of that interval; absent without an interval",
            self.hit_high.clone(),
        );
        r.register(
            "vm_dram_hit_bound_open",
            "1 if that end of the interval is 0 (low) or 1 (high) only because a tier's accesses have no upper bound from accessed bits",
            self.hit_open.clone(),
        );
        r.register(
            "vm_counted_dram_hit_ratio",
            "DRAM-hit ratio counted by the pmu source on every tier (exact; the controller acts on it); absent unless the PMU measured every tier",
            self.counted.clone(),
        );
    }

    /// One tier's series; `secs` turns accesses per interval into a rate.
    pub(super) fn tier(&self, tl: &TierLabels, s: &TierSample, secs: f64) {
        let with = s.accesses_low.is_some();
        set(&self.rate_low, tl, s.accesses_low.map(|v| v / secs));
        let high = s
            .accesses_high
            .filter(|_| with && !s.accesses_high_open)
            .map(|v| v / secs);
        set(&self.rate_high, tl, high);
        if with {
            self.high_open
                .get_or_create(tl)
                .set(i64::from(s.accesses_high_open));
        } else {
            self.high_open.remove(tl);
        }
        set(&self.saturated, tl, Some(s.saturated_pages));
        set(&self.misfit, tl, s.fit_misfit);
        if s.passes > 0 {
            self.fit_age.get_or_create(tl).set(i64::from(s.fit_age));
            self.fit_deferred
                .get_or_create(tl)
                .set(i64::from(s.fit_deferred));
        } else {
            self.fit_age.remove(tl);
            self.fit_deferred.remove(tl);
        }
    }

    /// One VM's series; `shown`: the VM was measured and has accesses
    /// (otherwise no ratio is exported at all).
    pub(super) fn vm(&self, vl: &VmLabels, st: &VmStats, shown: bool) {
        let interval = match (st.dram_hit_low, st.dram_hit_high) {
            (Some(l), Some(h)) if shown => Some((l, h)),
            _ => None,
        };
        set(&self.hit_low, vl, interval.map(|i| i.0));
        set(&self.hit_high, vl, interval.map(|i| i.1));
        for (l, open) in ends(vl)
            .iter()
            .zip([st.dram_hit_low_open, st.dram_hit_high_open])
        {
            if interval.is_some() {
                self.hit_open.get_or_create(l).set(i64::from(open));
            } else {
                self.hit_open.remove(l);
            }
        }
        // Counted by the PMU, whether or not the sampler read the VM.
        set(&self.counted, vl, st.counted_dram_hit_ratio);
    }

    pub(super) fn forget_tier(&self, tl: &TierLabels) {
        for f in [
            &self.rate_low,
            &self.rate_high,
            &self.saturated,
            &self.misfit,
        ] {
            f.remove(tl);
        }
        self.high_open.remove(tl);
        self.fit_age.remove(tl);
        self.fit_deferred.remove(tl);
    }

    pub(super) fn forget_vm(&self, vl: &VmLabels) {
        for f in [&self.hit_low, &self.hit_high, &self.counted] {
            f.remove(vl);
        }
        for l in ends(vl) {
            self.hit_open.remove(&l);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::super::Metrics;
    use tier_proto::v1::{StatsUpdate, Tier, TierKind, TierSample, Vm, VmStats};

    fn update(dram: TierSample, slow: TierSample, vm: VmStats) -> StatsUpdate {
        let tier = |name: &str, kind: TierKind| Tier {
            name: name.into(),
            kind: kind as i32,
            ..Default::default()
        };
        StatsUpdate {
            interval_ns: 500_000_000,
            vms: vec![Vm {
                id: "v".into(),
                name: "v".into(),
                tiers: vec![tier("dram", TierKind::Dram), tier("slow", TierKind::Cxl)],
                ..Default::default()
            }],
            stats: vec![VmStats {
                vm_id: "v".into(),
                tiers: vec![
                    TierSample {
                        tier: "dram".into(),
                        ..dram
                    },
                    TierSample {
                        tier: "slow".into(),
                        ..slow
                    },
                ],
                has_accesses: true,
                dram_hit_ratio: 0.343,
                ..vm
            }],
            ..Default::default()
        }
    }

    fn value(body: &str, key: &str) -> Option<f64> {
        body.lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim().parse().unwrap())
    }

    const DRAM: &str = "{vm=\"v\",tier=\"dram\",kind=\"dram\"} ";
    const SLOW: &str = "{vm=\"v\",tier=\"slow\",kind=\"cxl\"} ";
    const VM: &str = "{vm=\"v\",name=\"v\"} ";

    /// The demo VM's shape: DRAM holds pages too hot to count (open above),
    /// slow is resolved. Rates per second (0.5 s interval), the open end
    /// absent with its flag, the ratio's open end as 1 with its flag.
    #[test]
    fn intervals_export_with_open_ends_flagged() {
        let dram = TierSample {
            accesses_low: Some(100.0),
            accesses_high: Some(1e9),
            accesses_high_open: true,
            saturated_pages: 12.5,
            fit_misfit: Some(1.3),
            ..Default::default()
        };
        let slow = TierSample {
            accesses_low: Some(40.0),
            accesses_high: Some(90.0),
            fit_misfit: Some(0.7),
            ..Default::default()
        };
        let vm = VmStats {
            dram_hit_low: Some(0.34),
            dram_hit_high: Some(1.0),
            dram_hit_high_open: true,
            counted_dram_hit_ratio: Some(0.667),
            ..Default::default()
        };
        let mut m = Metrics::new();
        m.update(&update(dram, slow, vm));
        let body = m.encode();
        let v = |name: &str, l: &str| value(&body, &format!("tierd_{name}{l}"));
        assert_eq!(
            v("tier_estimated_accesses_per_second_low", DRAM),
            Some(200.0)
        );
        assert_eq!(v("tier_estimated_accesses_per_second_high", DRAM), None);
        assert_eq!(v("tier_estimated_accesses_high_open", DRAM), Some(1.0));
        assert_eq!(v("tier_saturated_pages", DRAM), Some(12.5));
        assert_eq!(v("tier_fit_misfit", DRAM), Some(1.3));
        assert_eq!(
            v("tier_estimated_accesses_per_second_low", SLOW),
            Some(80.0)
        );
        assert_eq!(
            v("tier_estimated_accesses_per_second_high", SLOW),
            Some(180.0)
        );
        assert_eq!(v("tier_estimated_accesses_high_open", SLOW), Some(0.0));
        assert_eq!(v("tier_saturated_pages", SLOW), Some(0.0));
        assert_eq!(v("vm_dram_hit_ratio_low", VM), Some(0.34));
        assert_eq!(v("vm_dram_hit_ratio_high", VM), Some(1.0));
        let open = |end: &str| {
            v(
                "vm_dram_hit_bound_open",
                &format!("{{vm=\"v\",name=\"v\",end=\"{end}\"}} "),
            )
        };
        assert_eq!((open("low"), open("high")), (Some(0.0), Some(1.0)));
        assert_eq!(v("vm_counted_dram_hit_ratio", VM), Some(0.667));
        assert!(
            !body
                .lines()
                .any(|l| l.ends_with(" inf") || l.ends_with(" NaN")),
            "{body}"
        );

        // An older sender: no interval series at all, never a 0 interval.
        m.update(&update(
            TierSample::default(),
            TierSample::default(),
            VmStats::default(),
        ));
        let body = m.encode();
        for name in [
            "tierd_tier_estimated_accesses_per_second_low{",
            "tierd_tier_estimated_accesses_high_open{",
            "tierd_tier_fit_misfit{",
            "tierd_vm_dram_hit_ratio_low{",
            "tierd_vm_dram_hit_ratio_high{",
            "tierd_vm_dram_hit_bound_open{",
            "tierd_vm_counted_dram_hit_ratio{",
        ] {
            assert!(!body.contains(name), "{name} in {body}");
        }
        // The point ratio is still there.
        assert_eq!(
            value(&body, &format!("tierd_vm_dram_hit_ratio{VM}")),
            Some(0.343)
        );
    }

    /// The fit's age and deferral per tier with passes; none without.
    #[test]
    fn fit_age_and_deferral_export_for_tiers_with_passes() {
        let dram = TierSample {
            passes: 5,
            fit_age: 3,
            fit_deferred: true,
            ..Default::default()
        };
        let slow = TierSample {
            passes: 5,
            ..Default::default()
        };
        let mut m = Metrics::new();
        m.update(&update(dram, slow, VmStats::default()));
        let body = m.encode();
        let v = |name: &str, l: &str| value(&body, &format!("tierd_{name}{l}"));
        assert_eq!(v("tier_fit_age_intervals", DRAM), Some(3.0));
        assert_eq!(v("tier_fit_deferred", DRAM), Some(1.0));
        assert_eq!(v("tier_fit_age_intervals", SLOW), Some(0.0));
        assert_eq!(v("tier_fit_deferred", SLOW), Some(0.0));
        // No passes (a sampler's arming interval): no fit to speak of.
        m.update(&update(
            TierSample::default(),
            TierSample::default(),
            VmStats::default(),
        ));
        let body = m.encode();
        for name in ["tierd_tier_fit_age_intervals{", "tierd_tier_fit_deferred{"] {
            assert!(!body.contains(name), "{name} in {body}");
        }
    }

    /// A VM that goes away takes its interval series along.
    #[test]
    fn a_departed_vm_leaves_no_interval_series() {
        let t = TierSample {
            accesses_low: Some(1.0),
            accesses_high: Some(2.0),
            ..Default::default()
        };
        let vm = VmStats {
            dram_hit_low: Some(0.2),
            dram_hit_high: Some(0.4),
            ..Default::default()
        };
        let mut m = Metrics::new();
        m.update(&update(t.clone(), t, vm));
        assert!(m.encode().contains("tierd_vm_dram_hit_ratio_low{"));
        m.update(&StatsUpdate::default());
        let body = m.encode();
        assert!(!body.contains("{vm=\"v\""), "{body}");
    }
}
