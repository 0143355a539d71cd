/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Shared maps and attribution of the EPT sampler programs (ept.bpf.c).
 *
 * Every hook reduces an event to (vm slot, first gfn, pages, young?) and
 * calls account(). The VM slot comes from scan ownership of the current
 * thread (scan_slot) or, for the fexit hook, from the `struct kvm *` learned
 * while an owner scanned (age_account); the tier comes from the VM's gfn
 * ranges in vm_ranges. Userspace (profiler/src/sampler/ept/) owns every map
 * but the counters and kvm_slot, and reads the counters summed over CPUs.
 *
 * Layouts are shared with ept.rs byte for byte: change both together.
 */
#ifndef TIER_COMMON_H
#define TIER_COMMON_H

#define MAX_VMS 64
#define MAX_TIERS 8
#define MAX_RANGES 16
#define MAX_SCAN_OWNERS 256
/* Direct-mapped scan owner cache: tid & (SCAN_OWNER_CACHE - 1). */
#define SCAN_OWNER_CACHE 1024
/* Learned `struct kvm *` -> slot entries (a few per VM at most). */
#define MAX_KVMS 256
/* Default size of the heat histogram; userspace may resize it before load. */
#define HEAT_MAX_ENTRIES 65536
/* Heat granule: 2 MiB = 512 pages of 4 KiB. */
#define HEAT_GRANULE_SHIFT 9

/*
 * One guest-physical range of a VM: [start_gfn, end_gfn) lies in `tier`.
 * Its 2 MiB granules (counted from start_gfn >> HEAT_GRANULE_SHIFT) own the
 * heat slots [heat_base, heat_base + heat_len); userspace hands them out, and
 * a granule past heat_len (the histogram was full) counts as dropped.
 */
struct gfn_range {
	__u64 start_gfn;
	__u64 end_gfn;
	__u32 tier;
	__u32 heat_base;
	__u32 heat_len;
	__u32 _pad;
};

/* Value of vm_ranges: the first nr_ranges entries are used. */
struct vm_ranges {
	__u32 nr_ranges;
	__u32 _pad;
	struct gfn_range ranges[MAX_RANGES];
};

/* Per-CPU counters of one (vm, tier), of unmapped gfns, or of unattributed events. */
struct tier_count {
	__u64 checked_pages;
	__u64 young_pages;
	__u64 events;
};

struct scan_owner_entry {
	__u32 tid; /* 0: empty */
	__u32 slot;
};

/*
 * tid of a tierd scanning thread -> vm slot it is ageing right now. The
 * cache answers with one inlined array lookup; userspace puts an owner in
 * the hash only when its cache entry is held by another tid.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SCAN_OWNER_CACHE);
	__type(key, __u32);
	__type(value, struct scan_owner_entry);
} scan_owner_cache SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SCAN_OWNERS);
	__type(key, __u32);
	__type(value, __u32);
} scan_owner SEC(".maps");

/* The vm slot thread `tid` is scanning for, or NULL. */
static __always_inline __u32 *scan_slot(__u32 tid)
{
	__u32 idx = tid & (SCAN_OWNER_CACHE - 1);
	struct scan_owner_entry *e = bpf_map_lookup_elem(&scan_owner_cache, &idx);

	if (e && tid != 0 && e->tid == tid)
		return &e->slot;
	return bpf_map_lookup_elem(&scan_owner, &tid);
}

/*
 * `struct kvm *` (as a number) -> vm slot, learned by age_account() the first
 * time a scan owner's ageing reaches that kvm. kvm->userspace_pid cannot key
 * it: it is the tid of the thread that issued KVM_CREATE_VM
 * (kvm_uevent_notify_change at KVM_CREATE_VM: task_pid_nr(current)), e.g. cloud-hypervisor's `vmm`
 * thread, not the VMM's process id. Userspace deletes a slot's entries when
 * the slot is cleared (a freed kvm's address can be reused).
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_KVMS);
	__type(key, __u64);
	__type(value, __u32);
} kvm_slot SEC(".maps");

/* vm slot -> its gfn ranges and their tiers. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_VMS);
	__type(key, __u32);
	__type(value, struct vm_ranges);
} vm_ranges SEC(".maps");

/* vm_slot * MAX_TIERS + tier -> counters. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, (MAX_VMS * MAX_TIERS));
	__type(key, __u32);
	__type(value, struct tier_count);
} tier_counts SEC(".maps");

/* vm slot -> pages of a known VM outside every one of its ranges. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_VMS);
	__type(key, __u32);
	__type(value, struct tier_count);
} unmapped SEC(".maps");

/*
 * vm slot -> ageing of a known VM (its kvm learned) by a thread that is no
 * scan owner: reclaim, MGLRU walks, khugepaged, someone else's DAMON. Each
 * such call clears accessed bits tierd's next pass will then miss.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_VMS);
	__type(key, __u32);
	__type(value, struct tier_count);
} foreign SEC(".maps");

/*
 * [0]: ageing no VM could be found for: a tracepoint event on a thread that
 * owns no scan (whoever ages, of whichever VM), or a fexit call on a kvm not
 * learned yet by a thread that owns no scan.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tier_count);
} unattributed SEC(".maps");

/*
 * Heat slot (see gfn_range) -> young pages; only when heat_enabled. A
 * per-CPU array indexed from the range found anyway costs one inlined
 * lookup, where a hash keyed by (vm, granule) cost a jhash and an atomic.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, HEAT_MAX_ENTRIES);
	__type(key, __u32);
	__type(value, __u64);
} heat SEC(".maps");

/* [0]: young pages not recorded in `heat` because it was full. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} heat_dropped SEC(".maps");

/* Set by userspace before load. */
const volatile bool heat_enabled = false;

static __always_inline void add_count(struct tier_count *c, __u64 pages, bool young)
{
	c->checked_pages += pages;
	if (young)
		c->young_pages += pages;
	c->events += 1;
}

static __always_inline void count_unattributed(__u64 pages, bool young)
{
	__u32 zero = 0;
	struct tier_count *c = bpf_map_lookup_elem(&unattributed, &zero);

	if (c)
		add_count(c, pages, young);
}

/* Young pages of range r from gfn on, into the heat slot of gfn's granule. */
static __always_inline void heat_add(const struct gfn_range *r, __u64 gfn, __u64 pages)
{
	__u64 g = (gfn >> HEAT_GRANULE_SHIFT) - (r->start_gfn >> HEAT_GRANULE_SHIFT);
	__u32 zero = 0, idx;
	__u64 *v;

	if (g < r->heat_len) {
		idx = r->heat_base + (__u32)g;
		v = bpf_map_lookup_elem(&heat, &idx);
		if (v) {
			*v += pages;
			return;
		}
	}
	v = bpf_map_lookup_elem(&heat_dropped, &zero);
	if (v)
		*v += pages;
}

/* Steps of the binary search over MAX_RANGES sorted ranges: log2(16) + 1. */
#define RANGE_SEARCH_STEPS 5

/* Adds n pages to (slot, tier); false when the tier is out of range. */
static __always_inline bool count_tier(__u32 slot, __u32 tier, __u64 n, bool young, bool event)
{
	struct tier_count *c;
	__u32 idx;

	if (tier >= MAX_TIERS)
		return false;
	idx = slot * MAX_TIERS + tier;
	c = bpf_map_lookup_elem(&tier_counts, &idx);
	if (!c)
		return false;
	c->checked_pages += n;
	if (young)
		c->young_pages += n;
	if (event)
		c->events += 1;
	return true;
}

/*
 * One page: binary search for the last range starting at or before gfn
 * (ranges are sorted by start_gfn and disjoint; userspace guarantees it).
 * Returns the pages counted (0 or 1).
 */
static __always_inline __u64 account_page(struct vm_ranges *vr, __u32 nr, __u32 slot, __u64 gfn,
					  bool young)
{
	struct gfn_range *r;
	__u32 lo = 0, hi = nr, k;

	for (k = 0; k < RANGE_SEARCH_STEPS; k++) {
		__u32 mid;

		if (lo >= hi)
			break;
		mid = ((lo + hi) / 2) & (MAX_RANGES - 1);
		if (vr->ranges[mid].start_gfn <= gfn)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return 0;
	r = &vr->ranges[(lo - 1) & (MAX_RANGES - 1)];
	if (gfn >= r->end_gfn)
		return 0;
	if (!count_tier(slot, r->tier, 1, young, true))
		return 0;
	if (young && heat_enabled)
		heat_add(r, gfn, 1);
	return 1;
}

struct span_walk {
	struct vm_ranges *vr;
	__u64 gfn;
	__u64 end;
	__u64 covered;
	__u32 nr;
	__u32 slot;
	__u32 seen;
	bool young;
};

/* bpf_loop callback: range i against [gfn, end). 1 stops the walk. */
static long span_step(__u64 i, void *ctx)
{
	struct span_walk *w = ctx;
	struct gfn_range *r;
	__u64 lo, hi;
	__u32 tier;

	if (i >= w->nr || w->covered >= w->end - w->gfn)
		return 1;
	r = &w->vr->ranges[i & (MAX_RANGES - 1)];
	if (r->start_gfn >= w->end)
		return 1;
	lo = w->gfn > r->start_gfn ? w->gfn : r->start_gfn;
	hi = w->end < r->end_gfn ? w->end : r->end_gfn;
	if (lo >= hi)
		return 0;
	tier = r->tier & 31;
	if (count_tier(w->slot, tier, hi - lo, w->young, !(w->seen & (1u << tier)))) {
		w->seen |= 1u << tier;
		w->covered += hi - lo;
		/* The chunk's pages go to the granule it starts in. */
		if (w->young && heat_enabled)
			heat_add(r, lo, hi - lo);
	}
	return 0;
}

/*
 * Several pages (huge SPTE, fexit range): split over every range they
 * overlap, one event per tier touched. bpf_loop keeps the verifier from
 * walking 16 unrolled iterations (rare path: huge pages only).
 */
static __always_inline __u64 account_span(struct vm_ranges *vr, __u32 nr, __u32 slot, __u64 gfn,
					  __u64 pages, bool young)
{
	struct span_walk w = {
		.vr = vr,
		.gfn = gfn,
		.end = gfn + pages,
		.covered = 0,
		.nr = nr,
		.slot = slot,
		.seen = 0,
		.young = young,
	};

	bpf_loop(MAX_RANGES, span_step, &w, 0);
	return w.covered;
}

/*
 * Counts `pages` pages starting at `gfn` for the VM in `slot`, in the tiers
 * of the ranges they fall in; pages in no range count as unmapped for the
 * VM. Young pages in a range also go to the heat histogram.
 */
static __always_inline void account(__u32 slot, __u64 gfn, __u64 pages, bool young)
{
	struct vm_ranges *vr;
	struct tier_count *c;
	__u64 covered;
	__u32 nr;

	if (slot >= MAX_VMS) {
		count_unattributed(pages, young);
		return;
	}
	vr = bpf_map_lookup_elem(&vm_ranges, &slot);
	if (!vr)
		return;
	nr = vr->nr_ranges;
	if (nr > MAX_RANGES)
		nr = MAX_RANGES;
	if (pages == 1)
		covered = account_page(vr, nr, slot, gfn, young);
	else
		covered = account_span(vr, nr, slot, gfn, pages, young);
	if (covered < pages) {
		c = bpf_map_lookup_elem(&unmapped, &slot);
		if (c)
			add_count(c, pages - covered, young);
	}
}

/*
 * Attribution of one kvm_age_gfn() call (fexit hook; ept_age_test runs the
 * same code through BPF_PROG_TEST_RUN):
 * - the calling thread owns a scan: the kvm's learned slot if any, else the
 *   owner's slot, learned for this kvm from now on; counted per tier;
 * - it owns none and the kvm is known: `foreign` of that slot;
 * - neither: `unattributed`.
 * Only address space 0: kvm_handle_hva_range() calls kvm_age_gfn() once
 * per memslot, and SMM memslots (as_id 1) alias the same memory.
 */
static __always_inline void age_account(__u32 tid, __u64 kvm, __u32 as_id, __u64 start, __u64 end,
					bool young)
{
	__u32 *owner, *known;
	__u64 pages;

	if (end <= start || as_id != 0)
		return;
	pages = end - start;
	known = bpf_map_lookup_elem(&kvm_slot, &kvm);
	owner = tid ? scan_slot(tid) : NULL;
	if (owner) {
		__u32 slot = *owner;

		if (known)
			slot = *known;
		else
			/* Full map: still counted for the owner, learned later. */
			bpf_map_update_elem(&kvm_slot, &kvm, &slot, BPF_NOEXIST);
		/*
		 * `young` says at least one page of the range was young: exact
		 * for the one-page ranges of page_idle and DAMON's ptes, an upper
		 * bound for a range (a PMD: 512 pages).
		 */
		account(slot, start, pages, young);
		return;
	}
	if (known && *known < MAX_VMS) {
		__u32 slot = *known;
		struct tier_count *c = bpf_map_lookup_elem(&foreign, &slot);

		if (c)
			add_count(c, pages, young);
		return;
	}
	count_unattributed(pages, young);
}

#endif /* TIER_COMMON_H */
