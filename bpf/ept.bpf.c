// SPDX-License-Identifier: GPL-2.0
/*
 * EPT sampler: young guest pages per VM and memory tier, from KVM's ageing
 * of its accessed bits. Two hooks feed the same counters (tier_common.h);
 * the loader (profiler/src/sampler/ept/load.rs) loads whichever the kernel
 * allows.
 *
 * - raw_tp/kvm_tdp_mmu_spte_changed: the TDP MMU emits it for every SPTE
 *   change (handle_changed_spte) and, from 6.12, directly from its ageing
 *   (age_gfn_range; kvm_tdp_mmu_age_spte from 6.13). Only the ageing
 *   transition is counted; the VM is the one tierd's scanning thread is
 *   ageing right now (scan_slot(), by the current tid). Needs the TDP MMU:
 *   shadow paging (kvm_intel.ept=N, kvm_amd.npt=N) or kvm.tdp_mmu=N age
 *   through the rmaps (kvm_rmap_age_gfn_range) without this tracepoint.
 * - fexit/kvm_age_gfn: the result of each ageing call of a gfn range (TDP
 *   MMU or shadow rmaps alike), attributed by the `struct kvm *`
 *   (age_account()).
 *
 * ept_age_test runs age_account() on synthetic arguments through
 * BPF_PROG_TEST_RUN (fexit programs cannot be test-run, and need
 * trampolines some kernels refuse). raw_tp_empty does nothing: the baseline
 * of the bpf-cost benchmark.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "tier_common.h"

char LICENSE[] SEC("license") = "GPL";

/*
 * SPTE bits (arch/x86/kvm/mmu/spte.h, the same in 6.1 and 6.12):
 * - SPTE_MMU_PRESENT_MASK, bit 11: is_shadow_present_pte(). Frozen/removed
 *   SPTEs (FROZEN_SPTE, 6.1's REMOVED_SPTE: 0x5a0, which has bit 8 and
 *   bit 5 set), the non-present value and MMIO SPTEs (whose generation uses
 *   bits 3-10) never have it.
 * - SPTE_TDP_AD_MASK, bits 52-53: SPTE_TDP_AD_DISABLED (1 << 52) when the
 *   SPTE has no A/D bits (spte_ad_enabled()); set by make_spte() from
 *   role.ad_disabled = !kvm_ad_enabled(), i.e. kvm_intel.eptad=N.
 * - base address, bits 12-51 (SPTE_BASE_ADDR_MASK without MKTME/SME
 *   bits): ageing never changes the pfn.
 */
#define SPTE_MMU_PRESENT_MASK (1ULL << 11)
#define SPTE_TDP_AD_MASK (3ULL << 52)
#define SPTE_TDP_AD_DISABLED (1ULL << 52)
#define SPTE_PFN_MASK (((1ULL << 52) - 1) & ~0xfffULL)

/*
 * Set by userspace before load from the host's vendor module
 * (sampler/ept/host.rs), as KVM sets shadow_accessed_mask and
 * shadow_acc_track_mask (arch/x86/kvm/mmu/spte.c):
 * - accessed_mask: VMX_EPT_ACCESS_BIT (bit 8) for EPT with A/D bits
 *   (kvm_mmu_set_ept_masks), 0 without; PT_ACCESSED_MASK (bit 5) for NPT
 *   (kvm_mmu_reset_all_pte_masks).
 * - acc_track_mask: VMX_EPT_RWX_MASK (bits 0-2) for EPT, 0 for NPT.
 */
const volatile __u64 accessed_mask = 1ULL << 8;
const volatile __u64 acc_track_mask = 0x7;

/*
 * is_accessed_spte() of a shadow-present SPTE: with A/D bits the accessed
 * bit; without (access tracking) any of the RWX bits, which
 * mark_spte_for_access_track() clears (saving R and X in bits 54/56).
 */
static __always_inline bool spte_young(__u64 spte)
{
	if ((spte & SPTE_TDP_AD_MASK) == SPTE_TDP_AD_DISABLED)
		return (spte & acc_track_mask) != 0;
	return (spte & accessed_mask) != 0;
}

/*
 * The ageing transition of age_gfn_range() (6.1, 6.12) /
 * kvm_tdp_mmu_age_spte() (6.13+): a shadow-present young SPTE becomes a
 * shadow-present old one for the same pfn. Nothing else does that: zaps
 * and freezes leave a non-present SPTE, write-protection and dirty
 * clearing (kvm_tdp_mmu_clear_dirty_pt_masked) clear W or D only, faults
 * and fast_page_fault's restore_acc_track_spte make an SPTE young.
 */
static __always_inline bool is_ageing(__u64 old_spte, __u64 new_spte)
{
	/* Most changes are faults and zaps: old not present or not young. */
	if (!(old_spte & SPTE_MMU_PRESENT_MASK) || !spte_young(old_spte))
		return false;
	if (!(new_spte & SPTE_MMU_PRESENT_MASK) || spte_young(new_spte))
		return false;
	return !((old_spte ^ new_spte) & SPTE_PFN_MASK);
}

/* Largest leaf level of the TDP MMU: PG_LEVEL_512G. */
#define MAX_LEAF_LEVEL 4

SEC("raw_tp/kvm_tdp_mmu_spte_changed")
int BPF_PROG(ept_spte_changed, int as_id, u64 gfn, int level, u64 old_spte, u64 new_spte)
{
	__u32 tid, *slot;
	__u64 pages;

	if (!is_ageing(old_spte, new_spte))
		return 0;
	/* Address space 1 (SMM) aliases the same guest memory: count it once. */
	if (as_id != 0)
		return 0;
	if (level < 1 || level > MAX_LEAF_LEVEL)
		return 0;
	/* A level-L SPTE maps 512^(L-1) pages. */
	pages = 1ULL << (9 * (level - 1));

	tid = (__u32)bpf_get_current_pid_tgid();
	slot = scan_slot(tid);
	if (!slot) {
		/* No kvm in the arguments: foreign ageing cannot be told per VM. */
		count_unattributed(pages, true);
		return 0;
	}
	/* The tracepoint fires only for young SPTEs: checked == young. */
	account(*slot, gfn, pages, true);
	return 0;
}

/* kvm_age_gfn(struct kvm *, struct kvm_gfn_range *) -> bool young. */
SEC("fexit/kvm_age_gfn")
int BPF_PROG(ept_fexit_age_gfn, struct kvm *kvm, struct kvm_gfn_range *range, bool ret)
{
	__u32 as_id = BPF_CORE_READ(range, slot, as_id);
	__u64 start = BPF_CORE_READ(range, start);
	__u64 end = BPF_CORE_READ(range, end);

	age_account((__u32)bpf_get_current_pid_tgid(), (__u64)kvm, as_id, start, end, ret);
	return 0;
}

/*
 * age_account() on arguments given by BPF_PROG_TEST_RUN: (tid, kvm, as_id,
 * start, end, young). Loaded by tests only.
 */
SEC("raw_tp")
int BPF_PROG(ept_age_test, __u64 tid, __u64 kvm, __u64 as_id, __u64 start, __u64 end, __u64 young)
{
	age_account((__u32)tid, kvm, (__u32)as_id, start, end, young != 0);
	return 0;
}

/* Baseline for the cost benchmark: same hook, no work. Never attached. */
SEC("raw_tp/kvm_tdp_mmu_spte_changed")
int raw_tp_empty(void *ctx)
{
	return 0;
}
