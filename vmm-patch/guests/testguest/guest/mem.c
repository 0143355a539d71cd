/* Zones and their page bitmaps; see mem.h. */
#include "mem.h"

#include "acpi.h"
#include "arch.h"
#include "console.h"
#include "paging.h"

struct zone zones[VIRTIO_BALLOON_TIERS_MAX];
unsigned nzones;
unsigned nzones_boot;
unsigned ntiers;
int vmem_zone = -1;

extern char _image_end[];
static uint64_t bump_next, bump_end;

void *bump_alloc(uint64_t bytes)
{
	uint64_t p = bump_next;

	bytes = (bytes + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1);
	if (bump_end - bump_next < bytes)
		die("mem: reserved area too small (%lu more bytes)", bytes);
	bump_next += bytes;
	memset((void *)p, 0, bytes);
	return (void *)p;
}

/* Set (val = 1) or clear bits [from, to) of `map`, a word at a time where possible. */
static void bits_fill(uint64_t *map, uint64_t from, uint64_t to, int val)
{
	while (from < to && (from & 63)) {
		if (val)
			map[from >> 6] |= 1ULL << (from & 63);
		else
			map[from >> 6] &= ~(1ULL << (from & 63));
		from++;
	}
	if (to - from >= 64) {
		uint64_t w = (to - from) >> 6;

		memset(&map[from >> 6], val ? 0xff : 0, w * 8);
		from += w << 6;
	}
	while (from < to) {
		if (val)
			map[from >> 6] |= 1ULL << (from & 63);
		else
			map[from >> 6] &= ~(1ULL << (from & 63));
		from++;
	}
}

/* SWAR popcount: no libgcc helper, no reliance on the POPCNT instruction. */
static uint32_t popcount64(uint64_t x)
{
	x = x - ((x >> 1) & 0x5555555555555555ULL);
	x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
	x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
	return (uint32_t)((x * 0x0101010101010101ULL) >> 56);
}

static uint32_t bits_count(const uint64_t *map, uint32_t words)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < words; i++)
		n += popcount64(map[i]);
	return n;
}

/*
 * Boot zones from the SRAT, one per NUMA node in node order, over its
 * non-hotpluggable ranges; 0 (and nothing set) when there is no SRAT or
 * its nodes interleave, which a zone's single span cannot describe.
 */
static int srat_zones(const struct hvm_start_info *si)
{
	struct tg_numa_range r[16];
	unsigned n, nodes = 0;
	uint32_t node[VIRTIO_BALLOON_TIERS_MAX];
	uint64_t lo[VIRTIO_BALLOON_TIERS_MAX], hi[VIRTIO_BALLOON_TIERS_MAX];

	if (si->version < 1)
		return 0;
	n = acpi_srat_memory(si->rsdp_paddr, r, 16);
	for (unsigned i = 0; i < n; i++) {
		unsigned k;

		if (r[i].hotpluggable)
			continue;
		for (k = 0; k < nodes && node[k] != r[i].node; k++)
			;
		if (k == nodes) {
			/* One zone is kept free for a virtio-mem region. */
			if (nodes + 1 == VIRTIO_BALLOON_TIERS_MAX) {
				con_printf("tg acpi srat: more than %u nodes, one zone instead\n", nodes);
				return 0;
			}
			/* Insert in node order. */
			while (k > 0 && node[k - 1] > r[i].node) {
				node[k] = node[k - 1], lo[k] = lo[k - 1], hi[k] = hi[k - 1];
				k--;
			}
			node[k] = r[i].node, lo[k] = r[i].base, hi[k] = r[i].base + r[i].size;
			nodes++;
			continue;
		}
		if (r[i].base < lo[k])
			lo[k] = r[i].base;
		if (r[i].base + r[i].size > hi[k])
			hi[k] = r[i].base + r[i].size;
	}
	for (unsigned a = 0; a < nodes; a++)
		for (unsigned b = 0; b < nodes; b++)
			if (a != b && lo[a] < hi[b] && lo[b] < hi[a]) {
				con_printf("tg acpi srat: nodes %u and %u interleave, one zone instead\n",
					   node[a], node[b]);
				return 0;
			}
	for (unsigned k = 0; k < nodes; k++) {
		zones[k].base_pfn = lo[k] >> PAGE_SHIFT;
		zones[k].span = (uint32_t)((hi[k] - lo[k]) >> PAGE_SHIFT);
		zones[k].node = node[k];
	}
	nzones = nodes;
	return nodes > 0;
}

void mem_init(const struct hvm_start_info *si, const struct tg_balloon_cfg *cfg,
	      const struct tg_vmem_region *vr, uint64_t extra)
{
	const struct hvm_memmap_entry *mm = (const void *)si->memmap_paddr;
	uint64_t need = extra, reserve_end;
	unsigned i, e;

	if (cfg->tier_count) {
		nzones = cfg->tier_count;
		for (i = 0; i < nzones; i++) {
			zones[i].base_pfn = cfg->tier[i].gpa_start >> PAGE_SHIFT;
			zones[i].span = cfg->tier[i].span_pages;
			zones[i].node = cfg->tier[i].guest_node;
		}
	} else if (!srat_zones(si)) {
		/* No per-tier balloon and no NUMA layout: one zone over all RAM. */
		uint64_t lo = ~0ULL, hi = 0;

		for (e = 0; e < si->memmap_entries; e++) {
			if (mm[e].type != E820_RAM)
				continue;
			if (mm[e].addr < lo)
				lo = mm[e].addr;
			if (mm[e].addr + mm[e].size > hi)
				hi = mm[e].addr + mm[e].size;
		}
		nzones = 1;
		zones[0].base_pfn = lo >> PAGE_SHIFT;
		zones[0].span = (uint32_t)((hi - lo) >> PAGE_SHIFT);
		zones[0].node = VIRTIO_BALLOON_TIER_NO_NODE;
	}
	nzones_boot = nzones;
	for (i = 0; i < nzones; i++)
		zones[i].tier = i;
	ntiers = nzones;
	/* Not in the e820 map: the loop below leaves it all used (unplugged). */
	if (vr->size && nzones < VIRTIO_BALLOON_TIERS_MAX) {
		vmem_zone = (int)nzones;
		zones[nzones].base_pfn = vr->addr >> PAGE_SHIFT;
		zones[nzones].span = (uint32_t)(vr->size >> PAGE_SHIFT);
		zones[nzones].node = vr->node;
		/* Plugged memory is more of its node's tier (Linux adds it to
		 * that node); a tier of its own when no boot zone is on it. */
		zones[nzones].tier = nzones;
		for (i = 0; i < nzones_boot; i++)
			if (vr->node != VIRTIO_BALLOON_TIER_NO_NODE && zones[i].node == vr->node) {
				zones[nzones].tier = i;
				break;
			}
		if (zones[nzones].tier == nzones)
			ntiers++;
		nzones++;
	}
	for (i = 0; i < nzones; i++) {
		zones[i].words = (zones[i].span + 63) / 64;
		need += 2 * (((uint64_t)zones[i].words * 8 + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1));
		/* Not the virtio-mem zone: its span may be far larger than its memory. */
		if (i < nzones_boot)
			need += ((uint64_t)zones[i].span * 8 + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1);
	}
	bump_next = (uint64_t)_image_end;
	bump_end = bump_next + need;
	reserve_end = bump_end >> PAGE_SHIFT;
	for (i = 0; i < nzones; i++) {
		struct zone *z = &zones[i];

		z->used = bump_alloc((uint64_t)z->words * 8);
		z->balloon = bump_alloc((uint64_t)z->words * 8);
		z->stamp = i < nzones_boot ? bump_alloc((uint64_t)z->span * 8) : 0;
		bits_fill(z->used, 0, (uint64_t)z->words * 64, 1);
		for (e = 0; e < si->memmap_entries; e++) {
			uint64_t s = (mm[e].addr + PAGE_SIZE - 1) >> PAGE_SHIFT;
			uint64_t t = (mm[e].addr + mm[e].size) >> PAGE_SHIFT;

			if (mm[e].type != E820_RAM)
				continue;
			if (s < z->base_pfn)
				s = z->base_pfn;
			if (t > z->base_pfn + z->span)
				t = z->base_pfn + z->span;
			/* The image, its reserved area and the first MiB (boot data) stay reserved. */
			if (s < reserve_end)
				s = reserve_end;
			if (s >= t)
				continue;
			if ((t << PAGE_SHIFT) > (1ULL << 32))
				map_identity(s << PAGE_SHIFT, (t - s) << PAGE_SHIFT, 0);
			bits_fill(z->used, s - z->base_pfn, t - z->base_pfn, 0);
		}
		/* Bits past the span were set above and count as used. */
		z->free = z->words * 64 - bits_count(z->used, z->words);
		z->total = z->free;
	}
}

int zone_of(uint64_t pfn)
{
	for (unsigned i = 0; i < nzones; i++)
		if (pfn >= zones[i].base_pfn && pfn - zones[i].base_pfn < zones[i].span)
			return (int)i;
	return -1;
}

int zone_alloc(unsigned zi, uint64_t *pfn)
{
	struct zone *z = &zones[zi];
	uint32_t w = z->hint;

	if (!z->free)
		return -1;
	for (uint32_t n = 0; n < z->words; n++, w = w + 1 == z->words ? 0 : w + 1) {
		uint64_t bits = ~z->used[w];

		if (bits) {
			unsigned b = (unsigned)__builtin_ctzll(bits);

			z->used[w] |= 1ULL << b;
			z->free--;
			z->hint = w;
			*pfn = z->base_pfn + (uint64_t)w * 64 + b;
			return 0;
		}
	}
	die("mem: zone %u count says %u free pages, bitmap has none", zi, z->free);
}

void zone_free(unsigned zi, uint64_t pfn)
{
	struct zone *z = &zones[zi];
	uint64_t i = pfn - z->base_pfn;

	z->used[i >> 6] &= ~(1ULL << (i & 63));
	z->free++;
	if ((i >> 6) < z->hint)
		z->hint = (uint32_t)(i >> 6);
}

uint32_t zone_take(unsigned zi, uint32_t max, uint32_t *out)
{
	struct zone *z = &zones[zi];
	uint32_t n = 0, w = z->hint;

	for (uint32_t seen = 0; seen < z->words && n < max && z->free;
	     seen++, w = w + 1 == z->words ? 0 : w + 1) {
		uint64_t bits = ~z->used[w];
		uint32_t base = (uint32_t)(z->base_pfn + (uint64_t)w * 64);

		if (!bits)
			continue;
		if (bits == ~0ULL && max - n >= 64) {
			z->used[w] = ~0ULL;
			z->balloon[w] = ~0ULL;
			for (uint32_t b = 0; b < 64; b++)
				out[n + b] = base + b;
			n += 64;
			z->free -= 64;
		} else {
			while (bits && n < max) {
				unsigned b = (unsigned)__builtin_ctzll(bits);

				bits &= bits - 1;
				z->used[w] |= 1ULL << b;
				z->balloon[w] |= 1ULL << b;
				out[n++] = base + b;
				z->free--;
			}
		}
		z->hint = w;
	}
	z->ballooned += n;
	return n;
}

uint32_t zone_untake(unsigned zi, uint32_t max, uint32_t *out)
{
	struct zone *z = &zones[zi];
	uint32_t n = 0, w = z->bhint;

	for (uint32_t seen = 0; seen < z->words && n < max && n < z->ballooned;
	     seen++, w = w + 1 == z->words ? 0 : w + 1) {
		uint64_t bits = z->balloon[w];
		uint32_t base = (uint32_t)(z->base_pfn + (uint64_t)w * 64);

		if (!bits)
			continue;
		if (bits == ~0ULL && max - n >= 64) {
			z->balloon[w] = 0;
			for (uint32_t b = 0; b < 64; b++)
				out[n + b] = base + b;
			n += 64;
		} else {
			while (bits && n < max) {
				unsigned b = (unsigned)__builtin_ctzll(bits);

				bits &= bits - 1;
				z->balloon[w] &= ~(1ULL << b);
				out[n++] = base + b;
			}
		}
		z->bhint = w;
	}
	z->ballooned -= n;
	return n;
}

void zone_release(unsigned zi, const uint32_t *pfns, uint32_t n)
{
	struct zone *z = &zones[zi];

	for (uint32_t i = 0; i < n;) {
		uint64_t rel = pfns[i] - z->base_pfn;

		/* zone_untake hands out whole words as ascending runs of 64. */
		if (!(rel & 63) && n - i >= 64 && pfns[i + 63] == pfns[i] + 63) {
			z->used[rel >> 6] = 0;
			z->free += 64;
			if ((rel >> 6) < z->hint)
				z->hint = (uint32_t)(rel >> 6);
			i += 64;
		} else {
			zone_free(zi, pfns[i++]);
		}
	}
}

void zone_plug(unsigned zi, uint64_t pfn, uint32_t n)
{
	struct zone *z = &zones[zi];
	uint64_t rel = pfn - z->base_pfn;

	bits_fill(z->used, rel, rel + n, 0);
	z->free += n;
	z->total += n;
	if ((rel >> 6) < z->hint)
		z->hint = (uint32_t)(rel >> 6);
}

uint32_t zone_isolate(unsigned zi, uint64_t pfn, uint32_t n)
{
	struct zone *z = &zones[zi];
	uint64_t rel = pfn - z->base_pfn;
	uint32_t got = 0;

	for (uint64_t i = rel; i < rel + n; i++) {
		if (z->used[i >> 6] & (1ULL << (i & 63)))
			continue;
		z->used[i >> 6] |= 1ULL << (i & 63);
		got++;
	}
	z->free -= got;
	z->total -= got;
	return got;
}

uint32_t zone_used_in(unsigned zi, uint64_t pfn, uint32_t n)
{
	struct zone *z = &zones[zi];
	uint64_t rel = pfn - z->base_pfn;
	uint32_t used = 0;

	for (uint64_t i = rel; i < rel + n; i++)
		used += (uint32_t)((z->used[i >> 6] >> (i & 63)) & 1);
	return used;
}
