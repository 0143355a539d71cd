// SPDX-License-Identifier: GPL-2.0
/*
 * PMU sampler: attribution of perf_event overflows on vCPU threads to
 * (VM, tier).
 *
 * Userspace (profiler/src/sampler/pmu/loader.rs) opens one perf event per
 * (vCPU thread, table entry) and attaches pmu_sample to each fd with a BPF
 * cookie carrying the tier index of that entry (the event a sample comes
 * from is not visible in the context otherwise). The VM is found from the
 * sampled thread: vcpu_owner[tid] -> vm slot. Samples on a thread nobody
 * registered, or with a tier out of range, count as unattributed.
 *
 * Layouts are shared with loader.rs byte for byte: change both together.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

#define PMU_MAX_VMS 64
#define PMU_MAX_TIERS 8
#define PMU_MAX_VCPUS 4096
/* Cookie: bits 0-7 tier index; the rest is reserved (0). */
#define PMU_COOKIE_TIER_MASK 0xff

/* Per-CPU counters of one (vm, tier), or of unattributed samples. */
struct pmu_count {
	__u64 samples; /* overflows seen (program runs) */
	__u64 period;  /* sum of sample_period: events the counter counted */
};

/* vCPU thread id -> vm slot (set by tierd per discovered vCPU thread). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PMU_MAX_VCPUS);
	__type(key, __u32);
	__type(value, __u32);
} vcpu_owner SEC(".maps");

/* slot * PMU_MAX_TIERS + tier -> counts. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PMU_MAX_VMS * PMU_MAX_TIERS);
	__type(key, __u32);
	__type(value, struct pmu_count);
} pmu_counts SEC(".maps");

/* Samples of a thread with no owner, or with a bad cookie. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pmu_count);
} pmu_unattributed SEC(".maps");

SEC("perf_event")
int pmu_sample(struct bpf_perf_event_data *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 tier = cookie & PMU_COOKIE_TIER_MASK;
	__u32 zero = 0;
	struct pmu_count *c = NULL;
	__u32 *slot;

	slot = bpf_map_lookup_elem(&vcpu_owner, &tid);
	if (slot && *slot < PMU_MAX_VMS && tier < PMU_MAX_TIERS) {
		__u32 key = *slot * PMU_MAX_TIERS + tier;

		c = bpf_map_lookup_elem(&pmu_counts, &key);
	} else {
		c = bpf_map_lookup_elem(&pmu_unattributed, &zero);
	}
	if (c) {
		/* Per-CPU, and tracing programs do not nest on a CPU
		 * (bpf_prog_active): plain adds are exact. */
		c->samples += 1;
		c->period += ctx->sample_period;
	}
	/* 0: no record into the event's ring buffer (there is none). */
	return 0;
}
