//! The budget's report in the stream: per VM `VmStats.sampler_budget`, the
//! host's budget and spend in `SamplerHealth`, and each VM's need (its
//! DRAM-hit interval width) handed back to the budget.

use std::collections::HashMap;

use tier_proto::v1::{SamplerBudget, StatsUpdate};

use super::budget::{Budget, Report};

/// Puts `report` into `update`. A VM the budget gave no pass in the
/// interval says so in `not_measured` (never a VM silently without
/// numbers).
pub fn annotate(update: &mut StatsUpdate, report: &Report) {
    let by_vm: HashMap<&str, _> = report.vms.iter().map(|v| (v.vm.as_str(), v)).collect();
    for st in &mut update.stats {
        let Some(v) = by_vm.get(st.vm_id.as_str()) else {
            continue;
        };
        st.sampler_budget = Some(SamplerBudget {
            coverage: v.coverage,
            stride: v.stride,
            passes: v.passes,
            slots: v.slots,
            passes_allowed: v.passes_allowed,
            budget_pct: v.budget_pct,
            spent_pct: v.spent_pct,
            limited: v.limited.clone(),
        });
        let read = st.tiers.iter().any(|t| t.passes > 0);
        if v.passes == 0 && !read && st.not_measured.is_empty() {
            st.not_measured = format!(
                "sampler budget: no pass this interval ({})",
                if v.limited.is_empty() {
                    "waiting for its allowance"
                } else {
                    v.limited.as_str()
                }
            );
        }
    }
    for h in &mut update.health {
        h.cpu_budget_pct = report.budget_pct;
        h.cpu_spent_pct = report.spent_pct;
    }
}

/// Each VM's need for the next interval: the width of its DRAM-hit
/// interval, 1 where it has none.
pub fn needs(update: &StatsUpdate) -> HashMap<String, f64> {
    update
        .stats
        .iter()
        .map(|s| {
            let width = match (s.dram_hit_low, s.dram_hit_high) {
                (Some(lo), Some(hi)) if s.has_accesses => (hi - lo).abs(),
                _ => 1.0,
            };
            (s.vm_id.clone(), width)
        })
        .collect()
}

/// One interval's bookkeeping: takes the budget's report into `update`
/// and gives the budget the needs it shows.
pub fn close_interval(budget: &mut Budget, update: &mut StatsUpdate) {
    let report = budget.take_report();
    annotate(update, &report);
    budget.set_needs(needs(update));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::budget::VmBudget;
    use tier_proto::v1::{SamplerHealth, TierSample, VmStats};

    #[test]
    fn a_vm_without_a_pass_says_why_and_needs_follow_widths() {
        let mut update = StatsUpdate {
            stats: vec![
                VmStats {
                    vm_id: "a".into(),
                    tiers: vec![TierSample::default()],
                    ..Default::default()
                },
                VmStats {
                    vm_id: "b".into(),
                    tiers: vec![TierSample {
                        passes: 5,
                        ..Default::default()
                    }],
                    has_accesses: true,
                    dram_hit_low: Some(0.5),
                    dram_hit_high: Some(0.6),
                    ..Default::default()
                },
            ],
            health: vec![SamplerHealth::default()],
            ..Default::default()
        };
        let report = Report {
            budget_pct: 1.0,
            spent_pct: 0.9,
            spent: std::time::Duration::from_millis(9),
            vms: vec![
                VmBudget {
                    vm: "a".into(),
                    coverage: 1.0,
                    stride: 1,
                    passes: 0,
                    slots: 5,
                    passes_allowed: 0.08,
                    budget_pct: 0.5,
                    spent_pct: 0.0,
                    limited: "0.08 of 5 passes per interval".into(),
                },
                VmBudget {
                    vm: "b".into(),
                    passes: 5,
                    slots: 5,
                    ..Default::default()
                },
            ],
        };
        annotate(&mut update, &report);
        let a = &update.stats[0];
        assert!(a.not_measured.contains("sampler budget: no pass"), "{a:?}");
        assert!(a.not_measured.contains("0.08 of 5 passes"), "{a:?}");
        assert_eq!(
            a.sampler_budget.as_ref().map(|b| b.passes_allowed),
            Some(0.08)
        );
        assert!(update.stats[1].not_measured.is_empty());
        assert_eq!(update.health[0].cpu_budget_pct, 1.0);
        assert_eq!(update.health[0].cpu_spent_pct, 0.9);
        let n = needs(&update);
        assert_eq!(n["a"], 1.0);
        assert!((n["b"] - 0.1).abs() < 1e-12);
    }
}
