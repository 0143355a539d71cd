/*
 * Guest memory by tier: one zone per balloon tier (the config space's
 * gpa_start/span_pages) or NUMA node (SRAT), intersected with the e820 RAM
 * map, each with a page bitmap, so that the workload and the balloon never
 * share a page; plus a zone for a virtio-mem region, which joins the tier
 * of its node.
 */
#ifndef TG_MEM_H
#define TG_MEM_H

#include <stdint.h>

#include "proto.h"

struct hvm_start_info {
	uint32_t magic;
	uint32_t version;
	uint32_t flags;
	uint32_t nr_modules;
	uint64_t modlist_paddr;
	uint64_t cmdline_paddr;
	uint64_t rsdp_paddr;
	uint64_t memmap_paddr;
	uint32_t memmap_entries;
	uint32_t reserved;
};

struct hvm_memmap_entry {
	uint64_t addr;
	uint64_t size;
	uint32_t type;
	uint32_t reserved;
};

#define HVM_START_MAGIC 0x336ec578
#define E820_RAM 1

struct zone {
	uint64_t base_pfn;
	uint32_t span;	    /* pages in [base_pfn, base_pfn + span) */
	uint32_t words;	    /* 64-bit words per bitmap */
	uint64_t *used;	    /* 1 = not free: hole, reserved, workload or balloon */
	uint64_t *balloon;  /* 1 = in the balloon */
	uint32_t total;	    /* RAM pages the guest manages (not reserved at boot) */
	uint32_t free;
	uint32_t ballooned;
	uint32_t hint;	    /* word to start the next free-page search at */
	uint32_t bhint;	    /* word to start the next ballooned-page search at */
	uint32_t node;	    /* guest NUMA node (balloon config space, SRAT, virtio-mem) */
	uint32_t tier;	    /* the workload's set of this index calls it home */
	uint64_t *stamp;    /* per page: accesses counted when last touched, + 1 (boot zones) */
};

extern struct zone zones[VIRTIO_BALLOON_TIERS_MAX];
extern unsigned nzones;
/* Zones of boot RAM (balloon tiers, or all RAM): zones[0, nzones_boot). */
extern unsigned nzones_boot;
/* Tiers (zones[].tier < ntiers): the boot zones, plus the virtio-mem
 * zone's own when no boot zone shares its node. */
extern unsigned ntiers;
/* Zone of the virtio-mem region (vmem.c), -1 when there is none. */
extern int vmem_zone;

/* A virtio-mem device region: a zone of its own, empty until blocks are plugged. */
struct tg_vmem_region {
	uint64_t addr, size; /* size 0: no region */
	uint32_t node;
};

/*
 * Build the zones: from the balloon's tiers when `cfg->tier_count` > 0,
 * else one per NUMA node of the SRAT, else one zone of all RAM; then one
 * for the virtio-mem region `vr`, if any, in the tier of the boot zone on
 * its node. Everything below the end of the image plus `extra` bytes
 * (handed out by bump_alloc) is reserved.
 */
void mem_init(const struct hvm_start_info *si, const struct tg_balloon_cfg *cfg,
	      const struct tg_vmem_region *vr, uint64_t extra);
/* Page-aligned zeroed memory from the reserved area. */
void *bump_alloc(uint64_t bytes);
/* Zone holding `pfn`, or -1. */
int zone_of(uint64_t pfn);
/* Take a free page of zone `z`; 0 and *pfn, or -1 when none is free. */
int zone_alloc(unsigned z, uint64_t *pfn);
void zone_free(unsigned z, uint64_t pfn);
/*
 * Balloon side, a bitmap word at a time (per-page loops are what costs under
 * emulation): zone_take moves up to `max` free pages into the balloon and
 * writes their PFNs to `out`; zone_untake takes up to `max` pages out of the
 * balloon (they stay allocated) and zone_release frees them. Each returns
 * the number of pages.
 */
uint32_t zone_take(unsigned z, uint32_t max, uint32_t *out);
uint32_t zone_untake(unsigned z, uint32_t max, uint32_t *out);
void zone_release(unsigned z, const uint32_t *pfns, uint32_t n);
/*
 * virtio-mem side (whole blocks, 64-page aligned): zone_plug adds pages
 * [pfn, pfn + n) to zone `z` (free); zone_isolate takes the free ones of
 * them out of the zone (used, no longer counted in total) and returns how
 * many; zone_used_in counts pages of the range in use.
 */
void zone_plug(unsigned z, uint64_t pfn, uint32_t n);
uint32_t zone_isolate(unsigned z, uint64_t pfn, uint32_t n);
uint32_t zone_used_in(unsigned z, uint64_t pfn, uint32_t n);

#endif
