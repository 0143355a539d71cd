//! EPT accessed bits as tierd's ept backends read them: aged by
//! page_idle (or tierd's kdamonds) through the MMU notifier, one pass per
//! `pass_ends` boundary, every `ept_sample_stride`-th page examined.
//!
//! Modelled kernel behaviour (Linux 6.1-6.12):
//! - A guest access sets the EPT accessed bit (bit 8, A/D mode) only when
//!   the CPU walks the EPT to fill a TLB entry; a TLB hit sets nothing.
//!   KVM installs a faulted page with the bit set (`make_spte`,
//!   arch/x86/kvm/mmu/spte.c), so a page starts young.
//! - A page_idle bitmap write (`page_idle_bitmap_write` ->
//!   `page_idle_clear_pte_refs`, mm/page_idle.c) runs the rmap walk whose
//!   `ptep_clear_young_notify` calls `mmu_notifier_clear_young` ->
//!   `kvm_mmu_notifier_clear_young` -> `kvm_handle_hva_range_no_flush`
//!   (virt/kvm/kvm_main.c: "we never issue secondary TLB flushes from
//!   clear_young") -> `kvm_age_gfn` (arch/x86/kvm/mmu/mmu.c) ->
//!   `kvm_tdp_mmu_age_gfn_range` / `age_gfn_range` (tdp_mmu.c), which
//!   clears the accessed bit of each young SPTE and reports "was young"
//!   (the `kvm_tdp_mmu_spte_changed` tracepoint and fexit of `kvm_age_gfn`
//!   count exactly these). No TLB flush: a page whose translation stays
//!   cached is not re-marked until the entry is evicted.
//! - So one write pass both reads "young since the last pass" and re-arms:
//!   `age` returns the young examined pages of each tier and clears them.

use super::tlb::Tlb;

/// Accessed bits of the simulated pages under one TLB.
#[derive(Debug, Clone)]
pub struct EptBits {
    young: Vec<bool>,
    pub tlb: Tlb,
    /// Flush the TLB at each pass (`clear_flush_young`, or tierd doing a
    /// VM-wide flush per pass): what the bits would read without the
    /// reach effect. tierd does not do this.
    pub flush: bool,
    pub stride: usize,
    /// Per page, end time of the last pass that found it young.
    pub last_young: Vec<f64>,
}

impl EptBits {
    pub fn new(pages: usize, tlb: Tlb, stride: usize, flush: bool) -> EptBits {
        EptBits {
            young: vec![true; pages],
            tlb,
            flush,
            stride: stride.max(1),
            last_young: vec![f64::NEG_INFINITY; pages],
        }
    }

    /// A guest touch of `page` at `now`: a TLB miss walks and marks it.
    pub fn touch(&mut self, page: u32, now: f64) {
        if !self.tlb.access(page, now) {
            self.young[page as usize] = true;
        }
    }

    /// One ageing pass at `now`: (examined, young) pages per tier of the
    /// examined ones (`page % stride == 0`), their bits cleared.
    pub fn age(&mut self, tier_of: &[u8], tiers: usize, now: f64) -> Vec<(u64, u64)> {
        let mut out = vec![(0u64, 0u64); tiers];
        for p in (0..self.young.len()).step_by(self.stride) {
            let t = &mut out[tier_of[p] as usize];
            t.0 += 1;
            if std::mem::take(&mut self.young[p]) {
                t.1 += 1;
                self.last_young[p] = now;
            }
        }
        if self.flush {
            self.tlb.flush();
        }
        out
    }

    /// Examined pages found young in a pass that ended after `since`.
    pub fn young_since(&self, since: f64) -> u64 {
        (0..self.last_young.len())
            .step_by(self.stride)
            .filter(|&p| self.last_young[p] > since)
            .count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::twin::tlb::Tlb;

    #[test]
    fn a_hot_page_in_the_tlb_reads_idle_without_a_flush() {
        let tiers = [0u8, 1];
        for flush in [false, true] {
            let mut e = EptBits::new(2, Tlb::sets(1536, 12), 1, flush);
            // The first pass finds the pages young from their fault.
            assert_eq!(e.age(&tiers, 2, 0.0), vec![(1, 1), (1, 1)]);
            let mut seen = 0;
            for pass in 1..=10 {
                for i in 0..1000 {
                    e.touch(0, f64::from(pass) + f64::from(i) * 1e-4);
                }
                seen += e.age(&tiers, 2, f64::from(pass))[0].1;
            }
            // Touched 1000 times per pass: young in every pass only when
            // the ageing flushes; else only after its first walk.
            assert_eq!(seen, if flush { 10 } else { 1 }, "flush {flush}");
        }
    }

    #[test]
    fn stride_examines_every_nth_page() {
        let tier_of = vec![0u8; 100];
        let mut e = EptBits::new(100, Tlb::sets(64, 4), 8, false);
        let r = e.age(&tier_of, 1, 0.0);
        assert_eq!(r, vec![(13, 13)]);
        assert_eq!(e.young_since(-1.0), 13);
    }
}
