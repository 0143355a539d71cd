//! Working-set ages as Prometheus series (docs/working-set.md): per tier
//! and horizon the bytes touched within it with the ~95 % interval, cold
//! bytes and promotion pressure. A horizon that is not measured this
//! interval has no series (no stale value).

use std::collections::HashMap;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::registry::Registry;
use tier_proto::v1::TierSample;

use super::{FGauge, TierLabels, set};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct HorizonLabels {
    vm: String,
    tier: String,
    kind: String,
    horizon: String,
}

#[derive(Debug, Default)]
pub(super) struct Ages {
    ws: [FGauge<HorizonLabels>; 3],
    cold: [FGauge<TierLabels>; 3],
    promoted: [FGauge<TierLabels>; 3],
    history: FGauge<TierLabels>,
    /// Horizon labels exported per tier, to remove them.
    horizons: HashMap<TierLabels, Vec<HorizonLabels>>,
}

impl Ages {
    pub(super) fn register(&self, r: &mut Registry) {
        let ends = [
            ("", "estimate"),
            ("_low", "lower end of its ~95% interval"),
            ("_high", "upper end of its ~95% interval"),
        ];
        for (i, (suffix, what)) in ends.iter().enumerate() {
            r.register(
                format!("tier_working_set_bytes{suffix}"),
                format!("Bytes of the tier touched within the horizon (label horizon, e.g. 10s), {what}; absent where the backend does not measure that horizon this interval"),
                self.ws[i].clone(),
            );
            r.register(
                format!("tier_cold_bytes{suffix}"),
                format!("Bytes of the tier not touched within the longest horizon, {what}; absent while that horizon is not measured"),
                self.cold[i].clone(),
            );
            r.register(
                format!("tier_promoted_bytes_per_second{suffix}"),
                format!("Promotion pressure: bytes per second found touched after being cold for the longest horizon, {what}; absent until the longest horizon was watched"),
                self.promoted[i].clone(),
            );
        }
        r.register(
            "tier_ages_history_seconds",
            "Seconds of history the tier's working-set ages rest on",
            self.history.clone(),
        );
    }

    pub(super) fn tier(&mut self, tl: &TierLabels, s: &TierSample) {
        let Some(a) = &s.ages else {
            self.forget_tier(tl);
            return;
        };
        let labels = self.horizons.entry(tl.clone()).or_default();
        for w in &a.working_set {
            let l = HorizonLabels {
                vm: tl.vm.clone(),
                tier: tl.tier.clone(),
                kind: tl.kind.clone(),
                horizon: tier_profiler::ages::horizon_label(w.horizon_seconds),
            };
            let m = w.not_measured.is_empty();
            for (f, v) in self.ws.iter().zip([w.bytes, w.bytes_low, w.bytes_high]) {
                set(f, &l, m.then_some(v));
            }
            if !labels.contains(&l) {
                labels.push(l);
            }
        }
        let tri = |p: Option<f64>, lo: Option<f64>, hi: Option<f64>| [p, lo, hi];
        for (f, v) in self
            .cold
            .iter()
            .zip(tri(a.cold_bytes, a.cold_bytes_low, a.cold_bytes_high))
        {
            set(f, tl, v);
        }
        let p = tri(
            a.promoted_bytes_per_s,
            a.promoted_bytes_per_s_low,
            a.promoted_bytes_per_s_high,
        );
        for (f, v) in self.promoted.iter().zip(p) {
            set(f, tl, v);
        }
        set(&self.history, tl, Some(a.history_seconds));
    }

    pub(super) fn forget_tier(&mut self, tl: &TierLabels) {
        for l in self.horizons.remove(tl).unwrap_or_default() {
            for f in &self.ws {
                f.remove(&l);
            }
        }
        for f in self.cold.iter().chain(&self.promoted) {
            f.remove(tl);
        }
        self.history.remove(tl);
    }
}
