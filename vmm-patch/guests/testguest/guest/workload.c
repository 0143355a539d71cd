/* The access workload; see workload.h. */
#include "workload.h"

#include "arch.h"
#include "console.h"
#include "mem.h"

struct workload wl;

/* `tg canary lost` lines printed at most (each loss is counted in lost=). */
#define CANARY_LOG_MAX 8

/* Page `pfn` of zone `z` touched after `count` accesses (proto.h tg_truth). */
static inline void stamp(unsigned z, uint64_t pfn, uint64_t count)
{
	if (zones[z].stamp)
		zones[z].stamp[pfn - zones[z].base_pfn] = count + 1;
}

static void canary_set(uint64_t pfn)
{
	uint64_t page = pfn << PAGE_SHIFT;

	*(volatile uint64_t *)(page + TG_CANARY_OFFSET) = TG_CANARY ^ page;
}

static void canary_clear(uint64_t pfn)
{
	*(volatile uint64_t *)((pfn << PAGE_SHIFT) + TG_CANARY_OFFSET) = 0;
}

/*
 * Page k of set j has lost its canary: the host released a page in use (it
 * reads back as zeros) or something else wrote it. Counted for its zone,
 * logged for the first few, then stamped again, so one loss counts once and
 * a page released again counts again.
 */
static __attribute__((noinline, cold)) void canary_lost(unsigned j, uint32_t k, uint64_t got)
{
	uint64_t pfn = wl.pfn[j][k];
	unsigned z = zones[wl.where[j][k]].tier;

	wl.t.lost[z]++;
	if (wl.lost_logged < CANARY_LOG_MAX) {
		wl.lost_logged++;
		con_printf("tg canary lost gpa=0x%lx tier=%u set=%u page=%u read=0x%lx\n",
			   pfn << PAGE_SHIFT, z, j, k, got);
	}
	canary_set(pfn);
}

/* Sets of the chain that set j heads (1: j alone; 0: j continues another). */
static unsigned chain_len(const struct tg_params *p, unsigned j)
{
	unsigned n = 1;

	if (p->zipf_cont[j])
		return 0;
	while (j + n < p->nsets && p->zipf_cont[j + n])
		n++;
	return n;
}

/* Ranks of set j's Zipf table; 0: the set is uniform (or continues another). */
static uint64_t ranks(const struct tg_params *p, unsigned j)
{
	unsigned len = chain_len(p, j);
	uint64_t n = 0;

	if (!len || (len == 1 && !p->zipf[j]))
		return 0;
	for (unsigned m = j; m < j + len; m++)
		n += p->hot[m];
	return n;
}

uint64_t wl_mem_need(const struct tg_params *p)
{
	uint64_t need = 0;

	for (unsigned j = 0; j < p->nsets; j++) {
		uint64_t n = ranks(p, j);

		need += ((uint64_t)p->hot[j] * 4 + PAGE_SIZE) + ((uint64_t)p->hot[j] + PAGE_SIZE);
		if (n && n <= TG_ZIPF_MAX_RANKS)
			need += tg_zipf_mem((uint32_t)n) + PAGE_SIZE;
	}
	return need;
}

/* The first zone of tier `t` with a free page, other than zone `skip`. */
static int free_in_tier(unsigned t, int skip)
{
	for (unsigned c = 0; c < nzones; c++)
		if (zones[c].tier == t && (int)c != skip && zones[c].free)
			return (int)c;
	return -1;
}

/*
 * Where a page of tier `t` goes, not into zone `skip` (-1: any): its own
 * tier's zones (boot zone first), then slower tiers, then faster ones.
 */
static int place(unsigned t, int skip)
{
	int c = free_in_tier(t, skip);

	for (unsigned d = 1; c < 0 && t + d < ntiers; d++)
		c = free_in_tier(t + d, skip);
	for (unsigned d = 1; c < 0 && d <= t; d++)
		c = free_in_tier(t - d, skip);
	return c;
}

static unsigned tier_of(unsigned z)
{
	return zones[z].tier;
}

void wl_init(const struct tg_params *p)
{
	wl.nsets = p->nsets;
	wl.x = p->seed;
	for (unsigned j = 0; j < p->nsets; j++) {
		wl.n[j] = p->hot[j];
		wl.pfn[j] = bump_alloc((uint64_t)p->hot[j] * 4);
		wl.where[j] = bump_alloc(p->hot[j]);
		for (uint32_t k = 0; k < wl.n[j]; k++) {
			int z = place(j, -1);
			uint64_t pfn;

			if (z < 0 || zone_alloc((unsigned)z, &pfn))
				die("workload: no free page for hot set %u page %u", j, k);
			canary_set(pfn);
			stamp((unsigned)z, pfn, 0);
			wl.pfn[j][k] = (uint32_t)pfn;
			wl.where[j][k] = (uint8_t)z;
			wl.away[j] += tier_of((unsigned)z) != j;
		}
	}
	for (unsigned j = 0; j < p->nsets; j++) {
		uint64_t n = ranks(p, j);

		if (!n)
			continue;
		if (n > TG_ZIPF_MAX_RANKS)
			die("workload: zipf ranking of set %u has %lu pages, at most %u", j, n,
			    TG_ZIPF_MAX_RANKS);
		tg_zipf_build(&wl.zipf[j], (uint32_t)n, p->zipf[j],
			      bump_alloc(tg_zipf_mem((uint32_t)n)));
		wl.ranked[j] = (uint8_t)chain_len(p, j);
	}
}

void wl_set_phase(const struct tg_phase *ph)
{
	uint64_t cum = 0;

	for (unsigned j = 0; j < TG_MAX_SETS; j++) {
		cum += ph->weight[j];
		wl.thr[j] = (cum << 32) / 100;
		wl.active[j] = ph->active[j] && ph->active[j] < wl.n[j] ? ph->active[j] : wl.n[j];
	}
	/* A chain touches all of its sets but the last (cmdline.c checks), so its
	 * touched ranks are a prefix of the ranking. */
	for (unsigned j = 0; j < wl.nsets; j++) {
		if (!wl.ranked[j])
			continue;
		wl.ractive[j] = 0;
		for (unsigned m = j; m < j + wl.ranked[j]; m++)
			wl.ractive[j] += wl.active[m];
		wl.rtot[j] = tg_zipf_total(&wl.zipf[j], wl.ractive[j]);
	}
}

void wl_pace(uint64_t rate, uint32_t tsc_khz)
{
	wl.tsc_step = rate && tsc_khz ? (uint64_t)tsc_khz * 1000 / rate : 0;
	wl.tsc_slack = tsc_khz; /* 1 ms */
	wl.tsc_next = rdtsc();
}

/* Waits for the next access slot. A guest held up (host faults, exits)
 * drops the slots it missed instead of bursting through them, so accesses
 * stay spread evenly over time. */
static void pace(void)
{
	uint64_t now;

	while ((now = rdtsc()) < wl.tsc_next)
		cpu_relax();
	if (now - wl.tsc_next > wl.tsc_slack)
		wl.tsc_next = now;
	wl.tsc_next += wl.tsc_step;
}

void wl_run(uint64_t n)
{
	uint64_t x = wl.x;

	for (uint64_t i = 0; i < n; i++) {
		uint64_t r, hi, page, canary;
		unsigned j = 0;
		uint32_t k;

		if (wl.tsc_step)
			pace();

		x ^= x >> 12;
		x ^= x << 25;
		x ^= x >> 27;
		r = x * 0x2545f4914f6cdd1dULL;
		hi = r >> 32;
		while (hi >= wl.thr[j])
			j++;
		if (wl.ranked[j]) {
			k = tg_zipf_pick(&wl.zipf[j], wl.ractive[j], wl.rtot[j], (uint32_t)r);
			while (k >= wl.n[j]) /* a later set of the chain */
				k -= wl.n[j++];
		} else {
			k = (uint32_t)(((r & 0xffffffffULL) * wl.active[j]) >> 32);
		}
		page = (uint64_t)wl.pfn[j][k] << PAGE_SHIFT;
		stamp(wl.where[j][k], wl.pfn[j][k], wl.t.total + i);
		/* Word 0..510 of the page (bits 23-31 of r scaled by 511/512): the
		 * last word is the canary, never written here. */
		*(volatile uint64_t *)(page | (((r >> 23) & 0x1ff) * 511 >> 9) << 3) += 1;
		wl.t.acc[zones[wl.where[j][k]].tier]++;
		canary = *(volatile uint64_t *)(page + TG_CANARY_OFFSET);
		if (__builtin_expect(canary != (TG_CANARY ^ page), 0))
			canary_lost(j, k, canary);
	}
	wl.x = x;
	wl.t.total += n;
}

static void move_page(unsigned j, uint32_t k, unsigned to)
{
	uint64_t pfn;

	if (zone_alloc(to, &pfn))
		die("workload: zone %u has no free page to move into", to);
	memcpy((void *)(pfn << PAGE_SHIFT), (void *)((uint64_t)wl.pfn[j][k] << PAGE_SHIFT),
	       PAGE_SIZE);
	canary_set(pfn);
	stamp(to, pfn, wl.t.total);
	/* Free pages carry no canary: the balloon may hand this one to the host. */
	canary_clear(wl.pfn[j][k]);
	stamp(wl.where[j][k], wl.pfn[j][k], wl.t.total);
	zone_free(wl.where[j][k], wl.pfn[j][k]);
	wl.away[j] += (tier_of(to) != j) - (tier_of(wl.where[j][k]) != j);
	wl.pfn[j][k] = (uint32_t)pfn;
	wl.where[j][k] = (uint8_t)to;
}

uint32_t wl_evict(unsigned z, uint32_t need)
{
	uint32_t moved = 0;

	/* Pages of other sets that only borrowed zone z go first, then z's own. */
	for (unsigned pass = 0; pass < 2; pass++) {
		for (unsigned j = 0; j < wl.nsets; j++) {
			if ((j == tier_of(z)) != (pass == 1))
				continue;
			for (uint32_t k = wl.n[j]; k-- > 0 && moved < need;) {
				int to;

				if (wl.where[j][k] != z)
					continue;
				to = place(tier_of(z), (int)z);
				if (to < 0)
					goto out;
				move_page(j, k, (unsigned)to);
				moved++;
			}
		}
	}
out:
	wl.evicted += moved;
	return moved;
}

uint32_t wl_promote(unsigned z, uint32_t max)
{
	uint32_t moved = 0;

	/*
	 * Runs on every poll: without pages away it must not scan the set.
	 * Under an emulating KVM (kvm_pvm) each guest instruction costs
	 * about 1.5 us, and the scan stalled the workload 9 us per page.
	 */
	unsigned j = tier_of(z);

	if (j >= wl.nsets || !wl.away[j])
		return 0;
	for (uint32_t k = 0; k < wl.n[j] && zones[z].free && moved < max; k++) {
		if (tier_of(wl.where[j][k]) != j) {
			move_page(j, k, z);
			moved++;
		}
	}
	wl.promoted += moved;
	return moved;
}

uint32_t wl_vacate(unsigned z, uint64_t lo, uint64_t hi, uint32_t max)
{
	uint32_t moved = 0;

	for (unsigned j = 0; j < wl.nsets && moved < max; j++) {
		for (uint32_t k = 0; k < wl.n[j] && moved < max; k++) {
			uint64_t old = wl.pfn[j][k];
			int to;

			if (wl.where[j][k] != z || old < lo || old >= hi)
				continue;
			to = zones[z].free ? (int)z : place(tier_of(z), (int)z);
			if (to < 0)
				die("workload: no room to vacate pfn 0x%lx of zone %u", old, z);
			move_page(j, k, (unsigned)to);
			/* Its old page must not be handed out again: it is leaving. */
			zone_isolate(z, old, 1);
			moved++;
		}
	}
	wl.evicted += moved;
	return moved;
}

void wl_resident(uint32_t *res)
{
	for (unsigned i = 0; i < ntiers; i++)
		res[i] = 0;
	for (unsigned j = 0; j < wl.nsets; j++)
		for (uint32_t k = 0; k < wl.n[j]; k++)
			res[tier_of(wl.where[j][k])]++;
}
