// SPDX-License-Identifier: GPL-2.0
// Capability probes: each program is loaded (and attached where possible) on
// its own by `tierd probe`, so the report says exactly which hook this
// kernel refuses and why. They do no work.
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

// Hit counters, so a test can see that a program really ran.
__u64 fexit_hits = 0;
__u64 raw_tp_hits = 0;

// Needs BPF trampolines (fentry/fexit); vendor kernels may refuse with EPERM.
SEC("fexit/kvm_age_gfn")
int BPF_PROG(probe_fexit_age_gfn, struct kvm *kvm, struct kvm_gfn_range *range, bool ret)
{
	__sync_fetch_and_add(&fexit_hits, 1);
	return 0;
}

// Emitted by the TDP MMU for each young SPTE it ages.
SEC("raw_tp/kvm_tdp_mmu_spte_changed")
int probe_raw_tp_spte(struct bpf_raw_tracepoint_args *ctx)
{
	__sync_fetch_and_add(&raw_tp_hits, 1);
	return 0;
}
