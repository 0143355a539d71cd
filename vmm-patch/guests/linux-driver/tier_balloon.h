/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * tier_balloon: per-tier ballooning (VIRTIO_BALLOON_F_TIERS, bit 23) for
 * Linux's virtio_balloon.c.  The protocol is vmm-patch/SPEC.md of tierd.
 * Included by the patched virtio_balloon.c after its own includes; the
 * functions are in tier_balloon_tiers.c, included after
 * virtballoon_migratepage().
 */
#ifndef TIER_BALLOON_H
#define TIER_BALLOON_H

#include <linux/version.h>
#include <linux/nodemask.h>
#include <linux/mmzone.h>
#include <linux/vmstat.h>
#ifdef CONFIG_ACPI_NUMA
#include <linux/acpi.h>
#endif

#define VIRTIO_BALLOON_F_TIERS		23	/* SPEC.md section 1 */
#define TB_TIERS_MAX			8
#define TB_CFG_TIER_COUNT		0x10
#define TB_CFG_TIER(i)			(0x18 + 32 * (i))
#define TB_CFG_NUM_PAGES		0x00
#define TB_CFG_ACTUAL			0x04
#define TB_CFG_GUEST_NODE		0x08
#define TB_CFG_GPA_START		0x10
#define TB_CFG_ZONE_PAGES		0x18
#define TB_CFG_SPAN_PAGES		0x1c
#define TB_NO_NODE			0xffffffffU
/* Stats tags 0x8000 + 0x10*i + {0,1,2} (SPEC.md section 4). */
#define TB_TAG_FREE(i)			(0x8000 + 0x10 * (i) + 1)
#define TB_TAG_TOTAL(i)			(0x8000 + 0x10 * (i) + 2)
#define TB_STATS_MAX			(2 * TB_TIERS_MAX)
/*
 * Tier pages are taken in blocks of up to 2^TB_BLOCK_ORDER pages (one
 * 256-PFN descriptor), at most TB_SPAN_TRIES blocks per order and batch:
 * blocks outside the tier are held until the batch ends, then freed.
 */
#define TB_BLOCK_ORDER			8
#define TB_SPAN_TRIES			64

struct tb_tier {
	unsigned int index;
	struct virtqueue *inflate_vq, *deflate_vq;
	/* Pages of this tier in the balloon; migratepage finds the tier. */
	struct balloon_dev_info bdi;
	unsigned int num_pages;		/* tier[i].actual */
	u64 pfn_start, pfn_end;		/* [gpa_start, +span_pages) >> 12 */
	int nid;			/* NUMA_NO_NODE: span allocation */
	struct virtio_balloon *vb;
};

struct tb_tiers {
	unsigned int count;		/* 0: F_TIERS not negotiated */
	struct tb_tier tier[TB_TIERS_MAX];
};

/* Queue names, in SPEC.md order: tier i inflate, tier i deflate. */
static const char *const tb_vq_names[2 * TB_TIERS_MAX] = {
	"tier0-inflate", "tier0-deflate", "tier1-inflate", "tier1-deflate",
	"tier2-inflate", "tier2-deflate", "tier3-inflate", "tier3-deflate",
	"tier4-inflate", "tier4-deflate", "tier5-inflate", "tier5-deflate",
	"tier6-inflate", "tier6-deflate", "tier7-inflate", "tier7-deflate",
};

struct virtio_balloon;
static unsigned int tb_stats(struct virtio_balloon *vb, unsigned int idx);
static bool tb_update(struct virtio_balloon *vb);

#endif
