//! The VM ranges and the counters.

use libbpf_rs::{MapCore, MapFlags};

use super::ranges::{encode, validate_ranges};
use super::{
    EptError, EptPrograms, GfnRange, MAX_TIERS, MAX_VMS, TIER_COUNT_SIZE, TierCount, VmCounts,
    map_err,
};

impl EptPrograms {
    pub(super) fn check_slot(slot: u32) -> Result<(), EptError> {
        if slot < MAX_VMS {
            Ok(())
        } else {
            Err(EptError::SlotOutOfRange { slot })
        }
    }

    /// Puts a VM in `slot`: its gfn ranges with their tiers. Ranges must
    /// not overlap; any order. Replaces what the slot held; counters and the
    /// learned kvm are kept (use [`EptPrograms::clear_vm`] for a new VM).
    pub fn set_vm(&mut self, slot: u32, ranges: &[GfnRange]) -> Result<(), EptError> {
        Self::check_slot(slot)?;
        validate_ranges(ranges)?;
        // The program binary-searches them: sorted by start.
        let mut sorted = ranges.to_vec();
        sorted.sort_by_key(|r| r.start_gfn);
        let (spans, fresh) = self.heat.assign(slot as usize, &sorted);
        // Zeroed before the ranges point at them.
        self.zero_heat(&fresh)?;
        self.skel
            .maps
            .vm_ranges
            .update(&slot.to_ne_bytes(), &encode(&sorted, &spans), MapFlags::ANY)
            .map_err(map_err("vm_ranges", "update"))
    }

    /// Empties `slot`: no ranges (events of its owner count as unmapped),
    /// no learned kvm (a freed kvm's address may be reused), counters and
    /// heat zeroed.
    pub fn clear_vm(&mut self, slot: u32) -> Result<(), EptError> {
        // No ranges: its heat slots are free, and zeroed when reused.
        self.set_vm(slot, &[])?;
        self.forget_kvms(slot)?;
        self.reset_vm_counts(slot)
    }

    pub(super) fn percpu_sum(
        &self,
        map: &libbpf_rs::MapMut<'static>,
        name: &'static str,
        key: u32,
    ) -> Result<TierCount, EptError> {
        let values = map
            .lookup_percpu(&key.to_ne_bytes(), MapFlags::ANY)
            .map_err(map_err(name, "lookup"))?
            .unwrap_or_default();
        Ok(values
            .iter()
            .map(|v| TierCount::from_bytes(v))
            .fold(TierCount::default(), TierCount::add))
    }

    pub(super) fn percpu_zero(
        &self,
        map: &libbpf_rs::MapMut<'static>,
        name: &'static str,
        key: u32,
        size: usize,
    ) -> Result<(), EptError> {
        let cpus = libbpf_rs::num_possible_cpus().map_err(map_err(name, "num_possible_cpus"))?;
        let zeros = vec![vec![0u8; size]; cpus];
        map.update_percpu(&key.to_ne_bytes(), &zeros, MapFlags::ANY)
            .map_err(map_err(name, "update"))
    }

    /// Totals of `slot` since load or the last reset, summed over CPUs.
    pub fn vm_counts(&self, slot: u32) -> Result<VmCounts, EptError> {
        Self::check_slot(slot)?;
        let mut out = VmCounts::default();
        for (tier, c) in out.tiers.iter_mut().enumerate() {
            let key = slot * MAX_TIERS as u32 + tier as u32;
            *c = self.percpu_sum(&self.skel.maps.tier_counts, "tier_counts", key)?;
        }
        out.unmapped = self.percpu_sum(&self.skel.maps.unmapped, "unmapped", slot)?;
        out.foreign = self.percpu_sum(&self.skel.maps.foreign, "foreign", slot)?;
        Ok(out)
    }

    /// One (VM, tier) counter as each possible CPU holds it.
    pub fn tier_count_per_cpu(&self, slot: u32, tier: u32) -> Result<Vec<TierCount>, EptError> {
        Self::check_slot(slot)?;
        if tier as usize >= MAX_TIERS {
            return Err(EptError::BadRanges {
                reason: format!("tier {tier} out of range (0..{MAX_TIERS})"),
            });
        }
        let key = slot * MAX_TIERS as u32 + tier;
        Ok(self
            .skel
            .maps
            .tier_counts
            .lookup_percpu(&key.to_ne_bytes(), MapFlags::ANY)
            .map_err(map_err("tier_counts", "lookup"))?
            .unwrap_or_default()
            .iter()
            .map(|v| TierCount::from_bytes(v))
            .collect())
    }

    /// Counts of `slot` since the previous take (or reset): read and reset
    /// without losing events that land meanwhile, as the kernel's counters
    /// only grow and the previous reading is kept here.
    pub fn take_vm_counts(&mut self, slot: u32) -> Result<VmCounts, EptError> {
        let now = self.vm_counts(slot)?;
        let base = std::mem::replace(&mut self.taken[slot as usize], now);
        Ok(now.since(&base))
    }

    /// Zeroes the counters of `slot` on every CPU.
    pub fn reset_vm_counts(&mut self, slot: u32) -> Result<(), EptError> {
        Self::check_slot(slot)?;
        for tier in 0..MAX_TIERS as u32 {
            let key = slot * MAX_TIERS as u32 + tier;
            self.percpu_zero(
                &self.skel.maps.tier_counts,
                "tier_counts",
                key,
                TIER_COUNT_SIZE,
            )?;
        }
        self.percpu_zero(&self.skel.maps.unmapped, "unmapped", slot, TIER_COUNT_SIZE)?;
        self.percpu_zero(&self.skel.maps.foreign, "foreign", slot, TIER_COUNT_SIZE)?;
        self.taken[slot as usize] = VmCounts::default();
        Ok(())
    }

    /// Ageing no VM could be found for, summed over CPUs: on the
    /// tracepoint, every event on a thread that owns no scan; on fexit,
    /// calls by a thread that owns no scan on a kvm not learned.
    pub fn unattributed(&self) -> Result<TierCount, EptError> {
        self.percpu_sum(&self.skel.maps.unattributed, "unattributed", 0)
    }

    /// Zeroes [`EptPrograms::unattributed`].
    pub fn reset_unattributed(&self) -> Result<(), EptError> {
        self.percpu_zero(
            &self.skel.maps.unattributed,
            "unattributed",
            0,
            TIER_COUNT_SIZE,
        )
    }
}
