//! Host page-table accessed bits as tierd's hostpte backend reads them:
//! `Referenced:` of `/proc/PID/smaps` per pass, re-armed with
//! `clear_refs` `1` then `4`.
//!
//! Modelled kernel behaviour: `clear_refs_write` (fs/proc/task_mmu.c)
//! clears young bits with `ptep_test_and_clear_young` and ends with
//! `flush_tlb_mm`; the `4` (soft-dirty) write runs an MMU-notifier
//! invalidation over the address space, which zaps every SPTE of the VM
//! (`kvm_mmu_notifier_invalidate_range_start`, with a remote TLB flush).
//! Every first touch after a pass therefore faults and marks its page:
//! the bits are exact at page granularity ("touched at least once since
//! the pass"), at the price of a VM-wide TLB flush and a refault of the
//! working set per pass. `smaps_pte_entry` counts a young PTE as
//! Referenced.

/// Accessed bits of the simulated pages, exact per pass.
#[derive(Debug, Clone)]
pub struct HostPteBits {
    young: Vec<bool>,
    pub last_young: Vec<f64>,
    /// Pages re-faulted since the start (one KVM fault each).
    pub refaults: u64,
}

impl HostPteBits {
    pub fn new(pages: usize) -> HostPteBits {
        HostPteBits {
            young: vec![true; pages],
            last_young: vec![f64::NEG_INFINITY; pages],
            refaults: 0,
        }
    }

    pub fn touch(&mut self, page: u32) {
        let y = &mut self.young[page as usize];
        if !*y {
            *y = true;
            self.refaults += 1;
        }
    }

    /// One pass at `now`: (examined, young) per tier, then re-armed.
    pub fn age(&mut self, tier_of: &[u8], tiers: usize, now: f64) -> Vec<(u64, u64)> {
        let mut out = vec![(0u64, 0u64); tiers];
        for (p, y) in self.young.iter_mut().enumerate() {
            let t = &mut out[tier_of[p] as usize];
            t.0 += 1;
            if std::mem::take(y) {
                t.1 += 1;
                self.last_young[p] = now;
            }
        }
        out
    }

    pub fn young_since(&self, since: f64) -> u64 {
        self.last_young.iter().filter(|&&t| t > since).count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_touched_page_is_young_once_per_pass() {
        let tier_of = [0u8, 0, 1];
        let mut h = HostPteBits::new(3);
        h.age(&tier_of, 2, 0.0);
        for _ in 0..50 {
            h.touch(0);
            h.touch(2);
        }
        assert_eq!(h.age(&tier_of, 2, 1.0), vec![(2, 1), (1, 1)]);
        assert_eq!(h.age(&tier_of, 2, 2.0), vec![(2, 0), (1, 0)]);
        assert_eq!(h.refaults, 2);
        assert_eq!(h.young_since(0.5), 2);
    }
}
