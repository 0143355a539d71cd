// SPDX-License-Identifier: GPL-2.0
/*
 * EPT sampler: young guest pages per VM and memory tier, from KVM's ageing
 * of its accessed bits. Two hook families feed the same counters
 * (tier_common.h); the loader (profiler/src/sampler/ept.rs) loads whichever
 * the kernel allows.
 *
 * - raw_tp/kvm_tdp_mmu_spte_changed: the TDP MMU emits it for every SPTE
 *   change (handle_changed_spte) and from kvm_tdp_mmu_age_spte when it
 *   clears the accessed bit of a young SPTE. Only that ageing transition is
 *   counted; the VM is the one tierd's scanning thread is ageing right now
 *   (scan_slot(): scan_owner_cache, then scan_owner, by the current tid).
 * - fexit/kvm_age_gfn, fexit/kvm_test_age_gfn: the result of each ageing
 *   call of a gfn range; the VM from kvm->userspace_pid (vm_by_pid).
 *
 * raw_tp_empty does nothing: the baseline of the bpf-cost benchmark.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "tier_common.h"

char LICENSE[] SEC("license") = "GPL";

/*
 * SPTE bits, set by userspace before load. Defaults are Intel EPT with A/D
 * bits (kvm_intel.ept_ad=1):
 * - accessed_mask: shadow_accessed_mask (arch/x86/kvm/mmu/spte.c,
 *   kvm_mmu_set_ept_masks) = VMX_EPT_ACCESS_BIT, bit 8
 *   (arch/x86/include/asm/vmx.h). AMD NPT: PT_ACCESSED_MASK, bit 5.
 * - present_mask: the hardware-present bits, VMX_EPT_RWX_MASK = read|write|
 *   exec, bits 0-2 (asm/vmx.h). AMD NPT: PT_PRESENT_MASK, bit 0.
 *   Non-present SPTEs (SHADOW_NONPRESENT_VALUE, bit 63; FROZEN_SPTE,
 *   arch/x86/kvm/mmu/spte.h) carry none of them; note that older kernels'
 *   FROZEN_SPTE (bit 63 | 0x5a0) has bit 8 set, so "young" alone is not
 *   enough.
 * Without EPT A/D bits KVM ages by access tracking instead
 * (mark_spte_for_access_track clears RWX): those events are not counted.
 */
const volatile __u64 accessed_mask = 1ULL << 8;
const volatile __u64 present_mask = 0x7;

/* Largest leaf level of the TDP MMU: PG_LEVEL_512G. */
#define MAX_LEAF_LEVEL 4

SEC("raw_tp/kvm_tdp_mmu_spte_changed")
int BPF_PROG(ept_spte_changed, int as_id, u64 gfn, int level, u64 old_spte, u64 new_spte)
{
	__u32 tid, *slot;
	__u64 pages;

	/* Ageing: present and young before, present and old after. */
	if (!(old_spte & present_mask) || !(old_spte & accessed_mask))
		return 0;
	if (!(new_spte & present_mask) || (new_spte & accessed_mask))
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
		count_unattributed(pages, true);
		return 0;
	}
	/* The tracepoint fires only for young SPTEs: checked == young. */
	account(*slot, gfn, pages, true);
	return 0;
}

static __always_inline int on_age(struct kvm *kvm, struct kvm_gfn_range *range, bool young)
{
	__u32 pid = (__u32)BPF_CORE_READ(kvm, userspace_pid);
	__u64 start = BPF_CORE_READ(range, start);
	__u64 end = BPF_CORE_READ(range, end);
	__u32 *slot;

	if (end <= start)
		return 0;
	slot = bpf_map_lookup_elem(&vm_by_pid, &pid);
	if (!slot) {
		count_unattributed(end - start, young);
		return 0;
	}
	/*
	 * `young` says at least one page of the range was young: exact for the
	 * one-page ranges of page_idle and reclaim, an upper bound otherwise.
	 */
	account(*slot, start, end - start, young);
	return 0;
}

SEC("fexit/kvm_age_gfn")
int BPF_PROG(ept_fexit_age_gfn, struct kvm *kvm, struct kvm_gfn_range *range, bool ret)
{
	return on_age(kvm, range, ret);
}

SEC("fexit/kvm_test_age_gfn")
int BPF_PROG(ept_fexit_test_age_gfn, struct kvm *kvm, struct kvm_gfn_range *range, bool ret)
{
	return on_age(kvm, range, ret);
}

/* Baseline for the cost benchmark: same hook, no work. Never attached. */
SEC("raw_tp/kvm_tdp_mmu_spte_changed")
int raw_tp_empty(void *ctx)
{
	return 0;
}
