//! Scan owners (the threads whose ageing tierd counts) and the `struct kvm *`
//! -> slot entries the fexit hook learns from them.

use libbpf_rs::{MapCore, MapFlags};

use super::counts::{u32_at, u64_at};
use super::{EptError, EptPrograms, SCAN_OWNER_CACHE, current_tid, map_err};

impl EptPrograms {
    /// From now on, ageing on thread `tid` counts for the VM in `slot`,
    /// until [`EptPrograms::clear_scan_owner`]: a persistent owner, such as
    /// tierd's own kdamond thread for as long as it runs (one slot per
    /// thread: the tracepoint has no other way to tell VMs apart). Ageing
    /// by threads that own no scan is never counted as a reading.
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

    /// Learned `struct kvm *` addresses (as numbers) and their slots: what
    /// the fexit hook attributes by. A VM appears once a scan owner's
    /// ageing has reached it; a VM that never appears was never aged by
    /// tierd's scans (a health signal: nothing of it can be counted).
    pub fn learned_kvms(&self) -> Result<Vec<(u64, u32)>, EptError> {
        let map = &self.skel.maps.kvm_slot;
        let mut out = Vec::new();
        for key in map.keys() {
            if let Some(v) = map
                .lookup(&key, MapFlags::ANY)
                .map_err(map_err("kvm_slot", "lookup"))?
            {
                out.push((u64_at(&key, 0), u32_at(&v, 0)));
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Deletes the kvm entries learned for `slot`.
    pub fn forget_kvms(&self, slot: u32) -> Result<(), EptError> {
        Self::check_slot(slot)?;
        for (kvm, s) in self.learned_kvms()? {
            if s != slot {
                continue;
            }
            match self.skel.maps.kvm_slot.delete(&kvm.to_ne_bytes()) {
                Ok(()) => {}
                Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => {}
                Err(e) => return Err(map_err("kvm_slot", "delete")(e)),
            }
        }
        Ok(())
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
