// SPDX-License-Identifier: GPL-2.0
/*
 * PMU sampler: attribution of perf_event overflows on vCPU threads to
 * (VM, tier), and the threads that run KVM_RUN (for VMMs that do not name
 * their vCPU threads vcpuN).
 *
 * Userspace (profiler/src/sampler/pmu/loader.rs) opens one perf event per
 * (vCPU thread, table entry) and attaches pmu_sample to each fd with a BPF
 * cookie: the tier index of that entry for this VM (the event a sample
 * comes from is not visible in the context otherwise), and for precise
 * entries a flag saying "take the tier from the sample's data_src". The VM
 * is found from the sampled thread: vcpu_owner[tid] -> vm slot. Samples on
 * a thread nobody registered count as unattributed; samples of a known VM
 * that fit none of its tiers (a precise sample served by a cache, a kind
 * the VM has no tier of, an entry with no tier) go to pmu_no_tier.
 *
 * Layouts are shared with loader.rs byte for byte: change both together.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "pmu_data_src.h"

char LICENSE[] SEC("license") = "GPL";

#define PMU_MAX_VMS 64
#define PMU_MAX_TIERS 8
#define PMU_MAX_VCPUS 4096
/* Threads remembered by the KVM_RUN watch (LRU: the least recent go). */
#define PMU_MAX_KVM_THREADS 4096
/* Cookie: bits 0-7 tier index (PMU_NO_TIER: none), bit 8 PMU_COOKIE_DATA_SRC. */
#define PMU_COOKIE_TIER_MASK 0xff
#define PMU_NO_TIER 0xff
#define PMU_COOKIE_DATA_SRC (1ULL << 8)

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
	__uint(max_entries, (PMU_MAX_VMS * PMU_MAX_TIERS));
	__type(key, __u32);
	__type(value, struct pmu_count);
} pmu_counts SEC(".maps");

/* Samples of a thread with no owner. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pmu_count);
} pmu_unattributed SEC(".maps");

/*
 * slot * PMU_SRC_COUNT + PMU_SRC_* -> tier index + 1 of the VM's tier of
 * that kind; 0: the VM has none. Only kinds 1..4 are ever set.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, (PMU_MAX_VMS * PMU_SRC_COUNT));
	__type(key, __u32);
	__type(value, __u32);
} kind_tier SEC(".maps");

/* slot * PMU_SRC_COUNT + PMU_SRC_* -> samples of the VM that went to no tier. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, (PMU_MAX_VMS * PMU_SRC_COUNT));
	__type(key, __u32);
	__type(value, struct pmu_count);
} pmu_no_tier SEC(".maps");

/* Source decoded by the last pmu_account_test run (tests). */
__u32 pmu_test_source = 0;

static __always_inline void pmu_add(void *map, __u32 key, __u64 period)
{
	struct pmu_count *c = bpf_map_lookup_elem(map, &key);

	/* Per-CPU, and tracing programs do not nest on a CPU
	 * (bpf_prog_active): plain adds are exact. */
	if (c) {
		c->samples += 1;
		c->period += period;
	}
}

/*
 * One overflow of `period` events on thread `tid`. With PMU_COOKIE_DATA_SRC
 * and a data_src in the sample, the tier is the VM's tier of the decoded
 * kind; otherwise the cookie's.
 */
static __always_inline void pmu_account(__u32 tid, __u64 cookie, bool has_ds, __u64 ds,
					__u64 period)
{
	__u32 tier = cookie & PMU_COOKIE_TIER_MASK;
	__u32 src = PMU_SRC_UNKNOWN;
	__u32 *slot, *t, s, key;

	slot = bpf_map_lookup_elem(&vcpu_owner, &tid);
	if (!slot || *slot >= PMU_MAX_VMS) {
		pmu_add(&pmu_unattributed, 0, period);
		return;
	}
	s = *slot;
	if ((cookie & PMU_COOKIE_DATA_SRC) && has_ds) {
		src = pmu_data_src_source(ds);
		key = s * PMU_SRC_COUNT + src;
		t = bpf_map_lookup_elem(&kind_tier, &key);
		tier = (t && *t > 0 && *t <= PMU_MAX_TIERS) ? *t - 1 : PMU_NO_TIER;
	}
	if (tier >= PMU_MAX_TIERS) {
		pmu_add(&pmu_no_tier, s * PMU_SRC_COUNT + src, period);
		return;
	}
	pmu_add(&pmu_counts, s * PMU_MAX_TIERS + tier, period);
}

/*
 * No data_src read here: that needs bpf_cast_to_kern_ctx (6.2+; 6.1, Debian
 * 12's kernel, lacks it and libbpf fails a whole object on an unresolved
 * strong kfunc, and a weak one guarded by bpf_ksym_exists() needs 6.4+ once
 * the kfunc exists). tierd refuses data_src entries (guest-only events
 * cannot be sampled precisely from the host: docs/pmu.md) and counts
 * rather than samples, so the overflow path takes its tier from the cookie
 * alone (a data_src entry's cookie has no tier: pmu_no_tier). The decoder
 * is still exercised through pmu_account_test.
 */
SEC("perf_event")
int pmu_sample(struct bpf_perf_event_data *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 cookie = bpf_get_attach_cookie(ctx);

	pmu_account(tid, cookie, false, 0, ctx->sample_period);
	/* 0: no record into the event's ring buffer (there is none). */
	return 0;
}

/*
 * pmu_account on arguments given by BPF_PROG_TEST_RUN: (tid, cookie,
 * has_ds, data_src, period). perf_event programs cannot be test-run, so
 * this is how the data_src path is exercised without a PMU that fills
 * data_src. Not loaded unless asked for.
 */
SEC("raw_tp")
int BPF_PROG(pmu_account_test, __u64 tid, __u64 cookie, __u64 has_ds, __u64 ds, __u64 period)
{
	pmu_test_source = pmu_data_src_source(ds);
	pmu_account((__u32)tid, cookie, has_ds != 0, ds, period);
	return 0;
}

/* --- KVM_RUN watch ------------------------------------------------------ */

/* A thread seen entering the guest or returning from KVM_RUN. */
struct kvm_thread {
	__u32 tgid;
	__s32 vcpu_id;	     /* vcpu->vcpu_id from kvm_entry; -1 until then */
	__u32 userspace_pid; /* vcpu->kvm->userspace_pid: the thread that created the VM */
	__u32 _pad;
	__u64 start_boottime; /* task->start_boottime (ns): tells a reused tid apart */
	__u64 last_seen_ns;   /* bpf_ktime_get_boot_ns() of the last hit */
	__u64 entries;	      /* kvm_entry hits */
	__u64 exits;	      /* kvm_userspace_exit hits */
};

/* tid -> what the two tracepoints saw of it. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, PMU_MAX_KVM_THREADS);
	__type(key, __u32);
	__type(value, struct kvm_thread);
} kvm_threads SEC(".maps");

/* The current thread's entry; a new one, or a fresh one when the tid now
 * belongs to another process. */
static __always_inline struct kvm_thread *kvm_thread_current(__u64 now)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)pid_tgid, tgid = pid_tgid >> 32;
	struct kvm_thread *t = bpf_map_lookup_elem(&kvm_threads, &tid);
	struct task_struct *task;
	struct kvm_thread fresh = {};

	if (t && t->tgid == tgid)
		return t;
	task = (struct task_struct *)bpf_get_current_task();
	fresh.tgid = tgid;
	fresh.vcpu_id = -1;
	fresh.start_boottime = BPF_CORE_READ(task, start_boottime);
	fresh.last_seen_ns = now;
	bpf_map_update_elem(&kvm_threads, &tid, &fresh, BPF_ANY);
	return bpf_map_lookup_elem(&kvm_threads, &tid);
}

/* arch/x86/kvm/trace.h: kvm_entry(struct kvm_vcpu *vcpu, bool force_immediate_exit),
 * emitted by the vendor module right before it enters the guest. */
SEC("raw_tp/kvm_entry")
int BPF_PROG(pmu_kvm_entry, struct kvm_vcpu *vcpu)
{
	__u64 now = bpf_ktime_get_boot_ns();
	struct kvm_thread *t = kvm_thread_current(now);

	if (!t)
		return 0;
	if (t->entries == 0) {
		t->vcpu_id = BPF_CORE_READ(vcpu, vcpu_id);
		t->userspace_pid = BPF_CORE_READ(vcpu, kvm, userspace_pid);
	}
	t->entries += 1;
	t->last_seen_ns = now;
	return 0;
}

/* include/trace/events/kvm.h: kvm_userspace_exit(__u32 reason, int errno),
 * in the vCPU thread when KVM_RUN returns to userspace (any vendor). */
SEC("raw_tp/kvm_userspace_exit")
int BPF_PROG(pmu_kvm_userspace_exit)
{
	__u64 now = bpf_ktime_get_boot_ns();
	struct kvm_thread *t = kvm_thread_current(now);

	if (!t)
		return 0;
	t->exits += 1;
	t->last_seen_ns = now;
	return 0;
}
