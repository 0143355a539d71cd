/* Wire formats of the per-tier balloon; see proto.h. */
#include "proto.h"

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
	return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

size_t tg_cfg_size(unsigned tiers)
{
	if (tiers == 0)
		return VIRTIO_BALLOON_CFG_ACTUAL + 4; /* v53.0: num_pages, actual */
	return VIRTIO_BALLOON_CFG_TIERS + (size_t)VIRTIO_BALLOON_CFG_TIER_SIZE * tiers;
}

uint32_t tg_cfg_tier_field(unsigned tier, unsigned field)
{
	return VIRTIO_BALLOON_CFG_TIERS + VIRTIO_BALLOON_CFG_TIER_SIZE * tier + field;
}

int tg_cfg_parse(const uint8_t *buf, size_t len, struct tg_balloon_cfg *out)
{
	unsigned i;

	*out = (struct tg_balloon_cfg){0};
	if (len < tg_cfg_size(0))
		return -1;
	out->num_pages = le32(buf + VIRTIO_BALLOON_CFG_NUM_PAGES);
	out->actual = le32(buf + VIRTIO_BALLOON_CFG_ACTUAL);
	if (len < VIRTIO_BALLOON_CFG_TIERS)
		return 0;
	out->tier_count = le32(buf + VIRTIO_BALLOON_CFG_TIER_COUNT);
	if (out->tier_count > VIRTIO_BALLOON_TIERS_MAX || len < tg_cfg_size(out->tier_count))
		return -1;
	for (i = 0; i < out->tier_count; i++) {
		struct tg_tier_cfg *t = &out->tier[i];

		t->num_pages = le32(buf + tg_cfg_tier_field(i, VIRTIO_BALLOON_TIER_NUM_PAGES));
		t->actual = le32(buf + tg_cfg_tier_field(i, VIRTIO_BALLOON_TIER_ACTUAL));
		t->guest_node = le32(buf + tg_cfg_tier_field(i, VIRTIO_BALLOON_TIER_GUEST_NODE));
		t->gpa_start = le64(buf + tg_cfg_tier_field(i, VIRTIO_BALLOON_TIER_GPA_START));
		t->zone_pages = le32(buf + tg_cfg_tier_field(i, VIRTIO_BALLOON_TIER_ZONE_PAGES));
		t->span_pages = le32(buf + tg_cfg_tier_field(i, VIRTIO_BALLOON_TIER_SPAN_PAGES));
	}
	return 0;
}

/* B = 2 + STATS_VQ + REPORTING (SPEC.md section 3). */
static unsigned tier_base(int stats, int reporting)
{
	return 2 + (stats ? 1 : 0) + (reporting ? 1 : 0);
}

unsigned tg_queue_count(int stats, int reporting, unsigned tiers)
{
	return tier_base(stats, reporting) + 2 * tiers;
}

int tg_queue_stats(int stats)
{
	return stats ? 2 : -1;
}

int tg_queue_reporting(int stats, int reporting)
{
	return reporting ? 2 + (stats ? 1 : 0) : -1;
}

unsigned tg_queue_tier(int stats, int reporting, unsigned tier, int inflate)
{
	return tier_base(stats, reporting) + 2 * tier + (inflate ? 0 : 1);
}

uint16_t tg_stat_tier_tag(unsigned tier, unsigned kind)
{
	return (uint16_t)(VIRTIO_BALLOON_S_TIER_BASE + VIRTIO_BALLOON_S_TIER_STRIDE * tier + kind);
}

size_t tg_stats_build(uint16_t *tags, uint64_t *vals, const struct tg_tier_stats *tiers,
		      unsigned ntiers)
{
	uint64_t free = 0, total = 0;
	size_t n = 3;
	unsigned i;

	if (ntiers > VIRTIO_BALLOON_TIERS_MAX)
		ntiers = VIRTIO_BALLOON_TIERS_MAX;
	for (i = 0; i < ntiers; i++) {
		free += tiers[i].free_bytes;
		total += tiers[i].total_bytes;
		tags[n] = tg_stat_tier_tag(i, VIRTIO_BALLOON_S_TIER_ACCESSES);
		vals[n++] = tiers[i].accesses;
		tags[n] = tg_stat_tier_tag(i, VIRTIO_BALLOON_S_TIER_FREE);
		vals[n++] = tiers[i].free_bytes;
		tags[n] = tg_stat_tier_tag(i, VIRTIO_BALLOON_S_TIER_TOTAL);
		vals[n++] = tiers[i].total_bytes;
	}
	/* Nothing is reclaimable in this guest: available = free. */
	tags[0] = VIRTIO_BALLOON_S_MEMFREE;
	vals[0] = free;
	tags[1] = VIRTIO_BALLOON_S_MEMTOT;
	vals[1] = total;
	tags[2] = VIRTIO_BALLOON_S_AVAIL;
	vals[2] = free;
	return n;
}

void tg_stats_lie(struct tg_tier_stats *tiers, unsigned ntiers)
{
	uint64_t acc[VIRTIO_BALLOON_TIERS_MAX];
	unsigned i;

	if (ntiers > VIRTIO_BALLOON_TIERS_MAX)
		ntiers = VIRTIO_BALLOON_TIERS_MAX;
	for (i = 0; i < ntiers; i++)
		acc[i] = tiers[i].accesses;
	for (i = 0; i < ntiers; i++) {
		uint64_t a = acc[ntiers - 1 - i];

		tiers[i].accesses = a > UINT64_MAX / 1000 ? UINT64_MAX : a * 1000;
		tiers[i].free_bytes = 0;
	}
}

size_t tg_stats_encode(uint8_t *buf, size_t cap, const uint16_t *tags, const uint64_t *vals,
		       size_t n)
{
	size_t i, off = 0;
	unsigned b;

	for (i = 0; i < n && off + VIRTIO_BALLOON_S_ENTRY_SIZE <= cap; i++) {
		buf[off] = (uint8_t)tags[i];
		buf[off + 1] = (uint8_t)(tags[i] >> 8);
		for (b = 0; b < 8; b++)
			buf[off + 2 + b] = (uint8_t)(vals[i] >> (8 * b));
		off += VIRTIO_BALLOON_S_ENTRY_SIZE;
	}
	return off;
}
