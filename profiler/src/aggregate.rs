//! Turns the registry's per-VM readings into one `StatsUpdate` per interval.

use std::collections::HashMap;

use tier_proto::v1::{SamplerHealth, StatsUpdate, TierSample, VmStats};

use crate::registry::Registry;

/// Carries what one interval needs from the previous one (cumulative
/// counters) and numbers the updates.
#[derive(Debug, Default)]
pub struct Aggregator {
    sequence: u64,
    last_guest: HashMap<String, Vec<u64>>,
}

impl Aggregator {
    /// Reaps dead VMs, reads the live ones and returns the next update.
    pub fn tick(
        &mut self,
        registry: &mut Registry,
        interval_ns: u64,
        health: Vec<SamplerHealth>,
    ) -> StatsUpdate {
        let departed = registry.reap();
        for id in &departed {
            self.last_guest.remove(id);
        }
        let mut vms = Vec::with_capacity(registry.len());
        let mut stats = Vec::with_capacity(registry.len());
        for tracked in registry.iter() {
            let vm = tracked.vm();
            let resident = tracked.resident_bytes();
            let guest = tracked.guest_reported_accesses();
            let guest_delta = guest.map(|now| {
                let before = self.last_guest.insert(vm.id.clone(), now.clone());
                delta(&now, before.as_deref())
            });
            let tiers = vm
                .tiers
                .iter()
                .enumerate()
                .map(|(i, t)| TierSample {
                    tier: t.name.clone(),
                    resident_bytes: resident.get(i).copied().unwrap_or(0),
                    ..Default::default()
                })
                .collect::<Vec<_>>();
            let fast: Vec<bool> = vm.tiers.iter().map(|t| t.kind().is_fast()).collect();
            let (ratio, has) = hit_ratio(&tiers, &fast);
            stats.push(VmStats {
                vm_id: vm.id.clone(),
                tiers,
                dram_hit_ratio: ratio,
                dram_hit_error: 0.0,
                has_accesses: has,
                dram_hit_target: None,
                guest_reported_accesses: guest_delta.unwrap_or_default(),
            });
            vms.push(vm.clone());
        }
        self.sequence += 1;
        StatsUpdate {
            sequence: self.sequence,
            timestamp_unix_ns: crate::unix_now_ns(),
            interval_ns,
            vms,
            stats,
            departed_vm_ids: departed,
            health,
        }
    }
}

/// Per-tier increase of cumulative counters; a counter that went backwards
/// (guest restarted its count) is taken as restarted from zero.
fn delta(now: &[u64], before: Option<&[u64]>) -> Vec<u64> {
    now.iter()
        .enumerate()
        .map(|(i, &n)| match before.and_then(|b| b.get(i)) {
            Some(&b) if n >= b => n - b,
            _ => n,
        })
        .collect()
}

/// Share of estimated accesses that hit fast tiers; `(0, false)` with none.
pub fn hit_ratio(tiers: &[TierSample], fast: &[bool]) -> (f64, bool) {
    let total: f64 = tiers.iter().map(|t| t.estimated_accesses).sum();
    if total <= 0.0 {
        return (0.0, false);
    }
    let hits: f64 = tiers
        .iter()
        .zip(fast)
        .filter(|(_, f)| **f)
        .map(|(t, _)| t.estimated_accesses)
        .sum();
    (hits / total, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delta_handles_first_reading_and_restarts() {
        assert_eq!(delta(&[5, 7], None), vec![5, 7]);
        assert_eq!(delta(&[9, 7], Some(&[5, 7])), vec![4, 0]);
        assert_eq!(delta(&[2, 10], Some(&[5, 7])), vec![2, 3]);
    }

    #[test]
    fn hit_ratio_weights_by_estimated_accesses() {
        let s = |a: f64| TierSample {
            estimated_accesses: a,
            ..Default::default()
        };
        let (r, has) = hit_ratio(&[s(300.0), s(100.0)], &[true, false]);
        assert!(has && (r - 0.75).abs() < 1e-12);
        assert_eq!(hit_ratio(&[s(0.0), s(0.0)], &[true, false]), (0.0, false));
    }
}
