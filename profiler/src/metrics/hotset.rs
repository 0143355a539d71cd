//! What accessed bits measure of a VM's split, as Prometheus series: the
//! hot set's share in DRAM with its interval (`VmStats.hot_set_dram`), and
//! whether the DRAM-hit estimate is measured at all (0: its interval spans
//! 0-100 %, the reason in the stream's `dram_hit_not_measured`).

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tier_proto::v1::VmStats;

use super::{FGauge, VmLabels};

#[derive(Debug, Default)]
pub(super) struct HotSet {
    share: [FGauge<VmLabels>; 3],
    bytes: FGauge<VmLabels>,
    horizon: FGauge<VmLabels>,
    hit_measured: Family<VmLabels, Gauge>,
}

impl HotSet {
    pub(super) fn register(&self, r: &mut Registry) {
        let ends = [
            ("", "estimate"),
            ("_low", "lower end of its ~95% interval"),
            ("_high", "upper end of its ~95% interval"),
        ];
        for (f, (suffix, what)) in self.share.iter().zip(ends) {
            r.register(
                format!("vm_hot_set_dram_ratio{suffix}"),
                format!("Of the bytes the VM touched within vm_hot_set_horizon_seconds, the share in DRAM tiers (page-weighted: what accessed bits measure), {what}; absent where no horizon is measured on every tier"),
                f.clone(),
            );
        }
        r.register(
            "vm_hot_set_bytes",
            "Bytes the VM touched within vm_hot_set_horizon_seconds, all tiers",
            self.bytes.clone(),
        );
        r.register(
            "vm_hot_set_horizon_seconds",
            "The horizon of the hot set: the shortest one every tier of the VM measured this interval",
            self.horizon.clone(),
        );
        r.register(
            "vm_dram_hit_measured",
            "1 if the DRAM-hit estimate says something this interval (a PMU count, or an accessed-bit interval narrower than 0-100%), 0 if not (the reason is the stream's VmStats.dram_hit_not_measured); the ratio's series are absent meanwhile",
            self.hit_measured.clone(),
        );
    }

    /// `ratio_ok`: the accessed-bit estimate is measured this interval.
    pub(super) fn vm(&self, vl: &VmLabels, s: &VmStats, ratio_ok: bool) {
        let measured = ratio_ok || s.counted_dram_hit_ratio.is_some();
        self.hit_measured.get_or_create(vl).set(i64::from(measured));
        match &s.hot_set_dram {
            Some(h) => {
                for (f, v) in self.share.iter().zip([h.share, h.share_low, h.share_high]) {
                    f.get_or_create(vl).set(v);
                }
                self.bytes.get_or_create(vl).set(h.hot_bytes);
                self.horizon.get_or_create(vl).set(h.horizon_seconds);
            }
            None => self.forget_values(vl),
        }
    }

    fn forget_values(&self, vl: &VmLabels) {
        for f in self.share.iter().chain([&self.bytes, &self.horizon]) {
            f.remove(vl);
        }
    }

    pub(super) fn forget_vm(&self, vl: &VmLabels) {
        self.forget_values(vl);
        self.hit_measured.remove(vl);
    }
}
