/*
 * Wire formats of the per-tier balloon (vmm-patch/SPEC.md): config-space
 * parsing, queue order, stats encoding. Pure functions with no guest
 * dependencies: the same object code logic runs in the guest and, compiled
 * for the host, in the crate's SPEC agreement tests.
 */
#ifndef TG_PROTO_H
#define TG_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "spec.h"

struct tg_tier_cfg {
	uint32_t num_pages;
	uint32_t actual;
	uint32_t guest_node;
	uint64_t gpa_start;
	uint32_t zone_pages;
	uint32_t span_pages;
};

/*
 * The workload's exact counts, kept where the host can read them from guest
 * memory at any instant (its guest-physical address is `truth=` on the
 * `tg ready` line), so that no serial line is needed in the access loop.
 * Each field is written by the guest with one aligned 8-byte store.
 */
struct tg_truth {
	uint64_t acc[VIRTIO_BALLOON_TIERS_MAX]; /* accesses per tier (mem.h) */
	uint64_t total;
	uint64_t seconds; /* RTC second changes since the workload started */
	uint64_t phase;	  /* the phase running */
	uint64_t lost[VIRTIO_BALLOON_TIERS_MAX]; /* canary losses per tier (TG_CANARY) */
	/*
	 * Per zone, where its page stamps are: `stamp_pages` u64s at
	 * guest-physical `stamp_gpa`, one per page from pfn `stamp_pfn`, each
	 * the access count (the sum of acc[]) when the guest last touched the
	 * page, plus one; 0: never touched. Moves and boot count as touches.
	 * The host reads which pages were touched since any instant (the
	 * working-set truth) from them and acc[] read at that instant.
	 */
	uint64_t stamp_gpa[VIRTIO_BALLOON_TIERS_MAX];
	uint64_t stamp_pfn[VIRTIO_BALLOON_TIERS_MAX];
	uint64_t stamp_pages[VIRTIO_BALLOON_TIERS_MAX];
};

/*
 * Canary of a workload page (docs/testguest.md): the last 8 bytes of every
 * page the workload owns hold TG_CANARY ^ the page's guest-physical address;
 * pages the guest does not use (free, ballooned) hold 0 there. A page the
 * host released reads as zeros, so a missing canary in a page in use is a
 * page the host took from under the guest; the host can check the same
 * pattern from outside in the VMM's memory.
 */
#define TG_CANARY 0x7A1EDCA900000000ULL
#define TG_CANARY_OFFSET 4088

struct tg_balloon_cfg {
	uint32_t num_pages;
	uint32_t actual;
	uint32_t tier_count;
	struct tg_tier_cfg tier[VIRTIO_BALLOON_TIERS_MAX];
};

/* Size of the config space with `tiers` tiers (8 bytes without tiers). */
size_t tg_cfg_size(unsigned tiers);
/* Offset of field `field` (VIRTIO_BALLOON_TIER_*) of tier `tier`. */
uint32_t tg_cfg_tier_field(unsigned tier, unsigned field);
/*
 * Decode a config-space image of `len` bytes. Without tiers (len < 0x18)
 * tier_count is 0. Returns 0, or -1 when tier_count is above
 * VIRTIO_BALLOON_TIERS_MAX or the image is shorter than it says.
 */
int tg_cfg_parse(const uint8_t *buf, size_t len, struct tg_balloon_cfg *out);

/* Queue order of SPEC.md section 3; `stats`/`reporting` are 0 or 1 as negotiated. */
unsigned tg_queue_count(int stats, int reporting, unsigned tiers);
/* Index of the stats queue, or -1 when not negotiated. */
int tg_queue_stats(int stats);
/* Index of the reporting queue, or -1 when not negotiated. */
int tg_queue_reporting(int stats, int reporting);
/* Index of tier `tier`'s inflate (`inflate` = 1) or deflate queue. */
unsigned tg_queue_tier(int stats, int reporting, unsigned tier, int inflate);

/* Stats tag of tier `tier`, kind VIRTIO_BALLOON_S_TIER_{ACCESSES,FREE,TOTAL}. */
uint16_t tg_stat_tier_tag(unsigned tier, unsigned kind);

/* What the driver knows about one tier when it fills the stats buffer. */
struct tg_tier_stats {
	uint64_t accesses;    /* cumulative workload accesses to this tier */
	uint64_t free_bytes;  /* free (not workload, not ballooned) memory */
	uint64_t total_bytes; /* memory of the tier the guest manages */
};

/* Most entries tg_stats_build writes: 3 standard + 3 per tier. */
#define TG_STATS_MAX_ENTRIES (3 + 3 * VIRTIO_BALLOON_TIERS_MAX)

/*
 * The driver's entries: MEMFREE, MEMTOT, AVAIL (sums over tiers, bytes),
 * then per tier TIER_ACCESSES, TIER_FREE, TIER_TOTAL. Returns the count.
 */
size_t tg_stats_build(uint16_t *tags, uint64_t *vals, const struct tg_tier_stats *tiers,
		      unsigned ntiers);
/*
 * What `lie=` makes the driver report, in place: tier i gets tier
 * (ntiers - 1 - i)'s access count x 1000 (saturating; with two tiers the
 * counts swap), and every tier's free bytes become 0 (so MEMFREE and AVAIL
 * are 0 too); total bytes stay true.
 */
void tg_stats_lie(struct tg_tier_stats *tiers, unsigned ntiers);
/*
 * Pack entries as SPEC.md section 4 (10 bytes each: le16 tag, le64 value).
 * Writes as many whole entries as fit in `cap`; returns the bytes written.
 */
size_t tg_stats_encode(uint8_t *buf, size_t cap, const uint16_t *tags, const uint64_t *vals,
		       size_t n);

#endif
