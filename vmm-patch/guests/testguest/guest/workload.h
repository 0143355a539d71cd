/*
 * The workload: hot sets of pages, set i preferring tier i, touched in a
 * pseudo-random order with per-phase weights, each phase touching a prefix
 * of each set (eviction takes pages from the end, promotion from the start,
 * so an inactive tail is what a balloon pushes out first). Every access is counted for
 * the tier the touched page is in (the guest's ground truth). Inside a set
 * pages are equally popular, or Zipf-ranked by `zipf=` (zipf.h): rank 1 =
 * the set's first page; a chain of sets (`+`) is one ranking, its first set
 * holding the head.
 *
 * Every workload page carries its canary (proto.h TG_CANARY) in its last 8
 * bytes, set when the page joins the workload and cleared to 0 before it
 * is freed; accesses never write there and check it on every access.
 */
#ifndef TG_WORKLOAD_H
#define TG_WORKLOAD_H

#include <stdint.h>

#include "cmdline.h"
#include "proto.h"
#include "zipf.h"

struct workload {
	unsigned nsets;
	uint32_t n[TG_MAX_SETS];
	uint32_t active[TG_MAX_SETS];	 /* pages of set i the phase touches: its first ones */
	uint32_t *pfn[TG_MAX_SETS];
	uint8_t *where[TG_MAX_SETS];	 /* zone of pfn[i][k] */
	uint32_t away[TG_MAX_SETS];	 /* pages of set i not in tier i */
	uint64_t thr[TG_MAX_SETS];	 /* cumulative weight thresholds, units of 2^-32 */
	uint8_t ranked[TG_MAX_SETS];	 /* set i heads a Zipf ranking (zipf[i]) */
	struct tg_zipf zipf[TG_MAX_SETS]; /* over set i and the sets continuing it */
	uint32_t ractive[TG_MAX_SETS];	 /* ranks of zipf[i] the phase touches */
	uint64_t rtot[TG_MAX_SETS];	 /* their weight (tg_zipf_total) */
	struct tg_truth t;		 /* accesses per tier, total, clock (proto.h) */
	uint64_t x;			 /* xorshift state */
	uint64_t tsc_step, tsc_next;	 /* pacing (rate=): TSC cycles per access, next slot */
	uint64_t tsc_slack;		 /* lateness after which missed slots are dropped */
	uint64_t evicted, promoted;	 /* pages moved between zones for the balloon */
	uint32_t lost_logged;		 /* `tg canary lost` lines printed */
};

extern struct workload wl;

/* Bytes of reserved memory wl_init needs. */
uint64_t wl_mem_need(const struct tg_params *p);
/* Allocate the hot sets (set i in tier i, else the nearest tier with room). */
void wl_init(const struct tg_params *p);
void wl_set_phase(const struct tg_phase *ph);
/* `n` accesses, paced to `rate` per second when wl_pace set one. */
void wl_run(uint64_t n);
/* Pace accesses to `rate` per second on a TSC of `tsc_khz` (0: unpaced). */
void wl_pace(uint64_t rate, uint32_t tsc_khz);
/* Move up to `need` workload pages out of zone `z`; returns how many moved. */
uint32_t wl_evict(unsigned z, uint32_t need);
/* Move up to `max` pages of zone `z`'s tier's set that live in another
 * tier into zone `z` while it has room; returns how many moved. */
uint32_t wl_promote(unsigned z, uint32_t max);
/*
 * Move up to `max` workload pages of zone `z` in pfns [lo, hi) elsewhere
 * (zone z outside the range first, then its tier, then the others) and
 * take the pages they leave out of the zone (zone_isolate). The caller
 * checked there is room. Returns the pages moved: fewer than `max` when
 * none is left in the range.
 */
uint32_t wl_vacate(unsigned z, uint64_t lo, uint64_t hi, uint32_t max);
/* Workload pages per tier (ntiers entries). */
void wl_resident(uint32_t *res);

#endif
