//! The attribution maps (VM ranges, pids, scan owners) and the counters.

use libbpf_rs::{MapCore, MapFlags};

use super::counts::u32_at;
use super::ranges::{encode, validate_ranges};
use super::{
    EptError, EptPrograms, GfnRange, MAX_TIERS, MAX_VMS, SCAN_OWNER_CACHE, TIER_COUNT_SIZE,
    TierCount, VmCounts, current_tid, map_err,
};

impl EptPrograms {
    pub(super) fn check_slot(slot: u32) -> Result<(), EptError> {
        if slot < MAX_VMS {
            Ok(())
        } else {
            Err(EptError::SlotOutOfRange { slot })
        }
    }

    /// Puts a VM in `slot`: its gfn ranges with their tiers, and the
    /// `kvm->userspace_pid` the fexit hooks know it by (the tid of the
    /// thread that issued KVM_CREATE_VM, also the number in its
    /// `/sys/kernel/debug/kvm/<pid>-<fd>` directory). Ranges must not
    /// overlap; any order. Replaces what the slot held; counters are kept (use
    /// [`EptPrograms::clear_vm`] for a new VM).
    pub fn set_vm(
        &mut self,
        slot: u32,
        pid: Option<u32>,
        ranges: &[GfnRange],
    ) -> Result<(), EptError> {
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
            .map_err(map_err("vm_ranges", "update"))?;
        let old = self.pids[slot as usize];
        if let Some(old) = old
            && Some(old) != pid
        {
            self.delete_pid(old)?;
        }
        if let Some(pid) = pid {
            // A pid names one VM: a slot that had it loses it.
            for (other, p) in self.pids.iter_mut().enumerate() {
                if *p == Some(pid) && other != slot as usize {
                    *p = None;
                }
            }
            self.skel
                .maps
                .vm_by_pid
                .update(&pid.to_ne_bytes(), &slot.to_ne_bytes(), MapFlags::ANY)
                .map_err(map_err("vm_by_pid", "update"))?;
        }
        self.pids[slot as usize] = pid;
        Ok(())
    }

    /// The slot the fexit hooks attribute `kvm->userspace_pid == pid` to.
    pub fn slot_of_pid(&self, pid: u32) -> Result<Option<u32>, EptError> {
        Ok(self
            .skel
            .maps
            .vm_by_pid
            .lookup(&pid.to_ne_bytes(), MapFlags::ANY)
            .map_err(map_err("vm_by_pid", "lookup"))?
            .map(|v| u32_at(&v, 0)))
    }

    fn delete_pid(&self, pid: u32) -> Result<(), EptError> {
        match self.skel.maps.vm_by_pid.delete(&pid.to_ne_bytes()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(map_err("vm_by_pid", "delete")(e)),
        }
    }

    /// Empties `slot`: no ranges (events of its owner count as unmapped),
    /// no pid, counters and heat zeroed.
    pub fn clear_vm(&mut self, slot: u32) -> Result<(), EptError> {
        // No ranges: its heat slots are free, and zeroed when reused.
        self.set_vm(slot, None, &[])?;
        self.reset_vm_counts(slot)
    }

    /// From now on, ageing events on thread `tid` count for the VM in `slot`.
    pub fn set_scan_owner(&self, tid: u32, slot: u32) -> Result<(), EptError> {
        Self::check_slot(slot)?;
        if tid == 0 {
            return Err(EptError::TidZero);
        }
        let (key, held) = self.cache_entry(tid)?;
        if held == 0 || held == tid {
            self.forget_owner_in_hash(tid)?;
            return self
                .skel
                .maps
                .scan_owner_cache
                .update(&key, &owner_entry(tid, slot), MapFlags::ANY)
                .map_err(map_err("scan_owner_cache", "update"));
        }
        // Its cache entry belongs to another thread: the hash holds it.
        self.skel
            .maps
            .scan_owner
            .update(&tid.to_ne_bytes(), &slot.to_ne_bytes(), MapFlags::ANY)
            .map_err(map_err("scan_owner", "update"))
    }

    /// Ageing events on thread `tid` are unattributed again.
    pub fn clear_scan_owner(&self, tid: u32) -> Result<(), EptError> {
        let (key, held) = self.cache_entry(tid)?;
        if held == tid && tid != 0 {
            self.skel
                .maps
                .scan_owner_cache
                .update(&key, &owner_entry(0, 0), MapFlags::ANY)
                .map_err(map_err("scan_owner_cache", "update"))?;
        }
        self.forget_owner_in_hash(tid)
    }

    /// The cache key of `tid` and the tid its entry holds (0: empty).
    fn cache_entry(&self, tid: u32) -> Result<([u8; 4], u32), EptError> {
        let key = (tid & (SCAN_OWNER_CACHE - 1)).to_ne_bytes();
        let held = self
            .skel
            .maps
            .scan_owner_cache
            .lookup(&key, MapFlags::ANY)
            .map_err(map_err("scan_owner_cache", "lookup"))?
            .map_or(0, |v| u32_at(&v, 0));
        Ok((key, held))
    }

    fn forget_owner_in_hash(&self, tid: u32) -> Result<(), EptError> {
        match self.skel.maps.scan_owner.delete(&tid.to_ne_bytes()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(map_err("scan_owner", "delete")(e)),
        }
    }

    /// Makes the calling thread the scan owner of `slot` until the guard
    /// drops.
    pub fn scan_as(&self, slot: u32) -> Result<ScanGuard<'_>, EptError> {
        let tid = current_tid();
        self.set_scan_owner(tid, slot)?;
        Ok(ScanGuard { progs: self, tid })
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
        self.taken[slot as usize] = VmCounts::default();
        Ok(())
    }

    /// Ageing events no VM could be found for, summed over CPUs.
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

/// `struct scan_owner_entry`.
fn owner_entry(tid: u32, slot: u32) -> [u8; 8] {
    let mut v = [0u8; 8];
    v[..4].copy_from_slice(&tid.to_ne_bytes());
    v[4..].copy_from_slice(&slot.to_ne_bytes());
    v
}

/// Scan ownership of the calling thread, cleared on drop.
#[derive(Debug)]
pub struct ScanGuard<'a> {
    progs: &'a EptPrograms,
    tid: u32,
}

impl Drop for ScanGuard<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.progs.clear_scan_owner(self.tid) {
            tracing::warn!("clearing scan owner {}: {e}", self.tid);
        }
    }
}
