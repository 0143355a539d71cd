//! The ept backends' working-set ages: per VM and tier, a recency record of
//! the sampled folios, fed each page_idle pass with which of them the
//! bitmap read found young (docs/working-set.md).

use std::collections::HashMap;
use std::time::Instant;

use tier_proto::v1::{TierAges, Vm};

use crate::ages::profile::{from_recency, tlb_unseen_pages};
use crate::ages::recency::Recency;
use crate::ages::{AgesConfig, not_measured};

const PAGE: u64 = 4096;

#[derive(Debug, Default)]
pub struct EptRecency {
    config: AgesConfig,
    epoch: Option<Instant>,
    vms: HashMap<String, Vec<Recency>>,
    /// Scratch: young flags of one tier (reused, no per-pass allocation).
    young: Vec<bool>,
}

impl EptRecency {
    pub fn set_config(&mut self, config: &AgesConfig) {
        self.config = config.clone();
        self.vms.clear();
    }

    /// One pass over `vm`'s sampled folios: `heads` tier by tier
    /// (`tier_heads` of them each), their pages, and whether each was still
    /// idle; the pass watched from `start` to now.
    pub fn observe(
        &mut self,
        vm: &Vm,
        tier_heads: &[usize],
        heads: &[u64],
        weights: &[u32],
        idle: &[bool],
        start: Instant,
    ) {
        let now = Instant::now();
        let epoch = *self.epoch.get_or_insert(start.min(now));
        let longest = self.config.longest();
        let tiers = self.vms.entry(vm.id.clone()).or_default();
        tiers.resize_with(tier_heads.len(), || Recency::new(epoch, longest));
        let mut at = 0;
        for (rec, &n) in tiers.iter_mut().zip(tier_heads) {
            let end = (at + n).min(heads.len());
            let (h, w, i) = (
                heads.get(at..end).unwrap_or_default(),
                weights.get(at..end).unwrap_or_default(),
                idle.get(at..end).unwrap_or_default(),
            );
            rec.set_units(h, w);
            self.young.clear();
            self.young.extend(i.iter().map(|idle| !idle));
            rec.observe(start, now, &self.young);
            at = end;
        }
    }

    /// Ages of `vm`'s tiers; a sample of one page in `stride` stands for
    /// `stride` times its pages. `why`: the driver gives none.
    pub fn ages(&mut self, vm: &Vm, stride: u64, why: Option<&str>) -> Vec<TierAges> {
        let horizons = &self.config.horizons;
        let tiers = self.vms.get_mut(&vm.id);
        match (why, tiers) {
            (Some(why), _) => vm
                .tiers
                .iter()
                .map(|_| not_measured(horizons, why))
                .collect(),
            (None, None) => vm
                .tiers
                .iter()
                .map(|_| not_measured(horizons, "no page_idle pass read this VM yet"))
                .collect(),
            (None, Some(recs)) => vm
                .tiers
                .iter()
                .enumerate()
                .map(|(i, t)| match recs.get_mut(i) {
                    Some(r) => {
                        let size = (t.size_bytes / PAGE) as f64;
                        let population = (r.sample_pages() * stride as f64).min(size);
                        let unseen = tlb_unseen_pages(vm.vcpus, r.max_unit_pages(), population);
                        from_recency(r, horizons, population, unseen)
                    }
                    None => not_measured(horizons, "tier not sampled"),
                })
                .collect(),
        }
    }

    pub fn forget(&mut self, vm_id: &str) {
        self.vms.remove(vm_id);
    }
}
