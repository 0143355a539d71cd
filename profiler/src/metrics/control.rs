//! The in-process controller as series: each VM's target and hold band,
//! whether its balloon was found uncooperative, and decisions by reason and
//! outcome, so alerts can say "below its band for 10 minutes" without
//! knowing the policy.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tier_proto::v1::Decision;

use super::{FGauge, VmLabels};
use tier_profiler::control::InProcess;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DecisionLabels {
    reason: String,
    outcome: String,
}

#[derive(Debug, Default)]
pub(super) struct Control {
    target: FGauge<VmLabels>,
    low: FGauge<VmLabels>,
    high: FGauge<VmLabels>,
    uncooperative: Family<VmLabels, Gauge>,
    drivable: Family<VmLabels, Gauge>,
    decisions: Family<DecisionLabels, Counter>,
}

/// `DECISION_REASON_BELOW_TARGET` -> `below_target`.
fn short(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix)
        .unwrap_or(name)
        .to_ascii_lowercase()
}

impl Control {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "vm_dram_hit_target_ratio",
            "The controller's target DRAM-hit ratio for the VM; absent when the controller is off or excludes the VM",
            self.target.clone(),
        );
        r.register(
            "vm_dram_hit_target_low_ratio",
            "Lower edge of the band around the target within which the controller leaves the VM alone",
            self.low.clone(),
        );
        r.register(
            "vm_dram_hit_target_high_ratio",
            "Upper edge of that band",
            self.high.clone(),
        );
        r.register(
            "vm_balloon_uncooperative",
            "1 if the VM's balloon can be driven but did not follow its target, so the controller stopped pushing it (docs/controller.md); absent when the controller is off",
            self.uncooperative.clone(),
        );
        r.register(
            "vm_balloon_drivable",
            "1 if the controller can drive the VM's per-tier balloon, 0 if not (no per-tier balloon, VMM not answering: the decision's detail says why); absent when the controller is off",
            self.drivable.clone(),
        );
        r.register(
            "controller_decisions",
            "Controller decisions by reason and outcome",
            self.decisions.clone(),
        );
    }

    /// Series of one VM from the controller in force (None: off).
    pub(super) fn vm(&self, vl: &VmLabels, c: Option<&InProcess>) {
        // A disabled policy assesses no VM: nothing to say about balloons.
        let c = c.filter(|c| c.is_enabled());
        match c.and_then(|c| c.target_band(&vl.vm, &vl.name)) {
            Some(b) => {
                self.target.get_or_create(vl).set(b.target);
                self.low.get_or_create(vl).set(b.low);
                self.high.get_or_create(vl).set(b.high);
            }
            None => self.forget_band(vl),
        }
        match c {
            Some(c) => {
                // A VM without a balloon to drive is not "uncooperative".
                let drivable = c.not_actuable(&vl.vm).is_none();
                self.drivable.get_or_create(vl).set(i64::from(drivable));
                self.uncooperative
                    .get_or_create(vl)
                    .set(i64::from(drivable && c.is_uncooperative(&vl.vm)));
            }
            None => {
                self.uncooperative.remove(vl);
                self.drivable.remove(vl);
            }
        }
    }

    pub(super) fn decision(&self, d: &Decision) {
        let l = DecisionLabels {
            reason: short(d.reason().as_str_name(), "DECISION_REASON_"),
            outcome: short(d.outcome().as_str_name(), "DECISION_OUTCOME_"),
        };
        self.decisions.get_or_create(&l).inc();
    }

    fn forget_band(&self, vl: &VmLabels) {
        for f in [&self.target, &self.low, &self.high] {
            f.remove(vl);
        }
    }

    pub(super) fn forget_vm(&self, vl: &VmLabels) {
        self.forget_band(vl);
        self.uncooperative.remove(vl);
        self.drivable.remove(vl);
    }
}
