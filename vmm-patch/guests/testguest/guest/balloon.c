/*
 * The per-tier balloon driver (SPEC.md sections 1-4), polled from the main
 * loop. Tier i's pages come from zone i's bitmap (mem.c); when the zone has
 * no free page left, workload pages are moved to another zone first
 * (workload.c), as a guest kernel would migrate them.
 */
#include "balloon.h"

#include "arch.h"
#include "console.h"
#include "mem.h"
#include "virtio.h"
#include "workload.h"

/* Descriptors per kick: 16 x 256 PFNs = 4096 pages (16 MiB). */
#define BATCH_DESCS 16
#define BATCH_PFNS (BATCH_DESCS * VIRTIO_BALLOON_MAX_PFNS_PER_DESC)
_Static_assert(BATCH_DESCS <= VQ_SIZE, "a batch must fit in one queue");
/* Batches per tier and poll: up to 64 MiB before the workload runs again. */
#define BATCHES_PER_POLL 4
#define MAX_QUEUES (4 + 2 * VIRTIO_BALLOON_TIERS_MAX)
/* Polls of a used ring before the device counts as dead (tens of seconds here). */
#define WAIT_SPINS 20000000ULL

static struct {
	int present, tiers, stats, dead;
	int deaf, lie; /* deaf=, lie= windows (balloon.h) */
	unsigned ntiers;
	uint64_t features;
	struct vdev dev;
	struct vq q[MAX_QUEUES];
	unsigned nq;
	uint32_t *pfns;
	uint8_t *stats_buf;
	uint64_t stats_updates;
	uint32_t target[VIRTIO_BALLOON_TIERS_MAX];
	uint8_t stuck[VIRTIO_BALLOON_TIERS_MAX]; /* target out of reach, logged */
	uint8_t legacy_logged;
} b;

/* Read config bytes [0, len) until the config generation is stable. */
static void read_cfg(uint8_t *raw, size_t len)
{
	uint8_t gen;

	do {
		gen = vdev_generation(&b.dev);
		for (size_t i = 0; i + 4 <= len; i += 4) {
			uint32_t v = vdev_cfg_r32(&b.dev, (uint32_t)i);

			raw[i] = (uint8_t)v;
			raw[i + 1] = (uint8_t)(v >> 8);
			raw[i + 2] = (uint8_t)(v >> 16);
			raw[i + 3] = (uint8_t)(v >> 24);
		}
	} while (gen != vdev_generation(&b.dev));
}

int balloon_probe(struct tg_balloon_cfg *cfg)
{
	struct pci_fn f;
	uint64_t want;
	uint8_t raw[0x18 + 32 * VIRTIO_BALLOON_TIERS_MAX];
	uint32_t count = 0;
	size_t len;

	*cfg = (struct tg_balloon_cfg){0};
	if (pci_find(VIRTIO_PCI_VENDOR_ID, VIRTIO_BALLOON_PCI_DEVICE_ID, &f)) {
		con_puts("tg balloon absent\n");
		return 0;
	}
	if (vdev_probe(&b.dev, f))
		die("balloon: %02x:%02x.%u has no usable virtio capabilities", f.bus, f.dev, f.fn);
	vdev_status(&b.dev, 0);
	vdev_status(&b.dev, VIRTIO_STATUS_ACKNOWLEDGE);
	vdev_status(&b.dev, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER);
	b.features = vdev_features(&b.dev);
	if (!(b.features & (1ULL << VIRTIO_F_VERSION_1)))
		die("balloon: device does not offer VERSION_1 (features %lx)", b.features);
	want = (1ULL << VIRTIO_F_VERSION_1) | (1ULL << VIRTIO_BALLOON_F_STATS_VQ) |
	       (1ULL << VIRTIO_BALLOON_F_TIERS);
	want &= b.features;
	vdev_set_features(&b.dev, want);
	vdev_status(&b.dev, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER |
				    VIRTIO_STATUS_FEATURES_OK);
	if (!(vdev_get_status(&b.dev) & VIRTIO_STATUS_FEATURES_OK))
		die("balloon: device refused features %lx", want);
	b.present = 1;
	b.stats = !!(want & (1ULL << VIRTIO_BALLOON_F_STATS_VQ));
	b.tiers = !!(want & (1ULL << VIRTIO_BALLOON_F_TIERS));

	/* The header (for tier_count), then exactly the whole config space. */
	len = tg_cfg_size(0);
	if (b.tiers) {
		read_cfg(raw, VIRTIO_BALLOON_CFG_TIERS);
		count = vdev_cfg_r32(&b.dev, VIRTIO_BALLOON_CFG_TIER_COUNT);
		if (count == 0 || count > VIRTIO_BALLOON_TIERS_MAX)
			die("balloon: TIERS negotiated but tier_count is %u", count);
		len = tg_cfg_size(count);
	}
	read_cfg(raw, len);
	if (tg_cfg_parse(raw, len, cfg) || (b.tiers && cfg->tier_count != count))
		die("balloon: config space changed under the driver (tier_count %u)",
		    cfg->tier_count);
	b.ntiers = cfg->tier_count;
	b.nq = tg_queue_count(b.stats, 0, b.ntiers);
	con_printf("tg balloon pci=%02x:%02x.%u features=0x%lx acked=0x%lx tiers=%u stats=%u queues=%u\n",
		   f.bus, f.dev, f.fn, b.features, want, b.ntiers, b.stats, b.nq);
	return 1;
}

uint64_t balloon_mem_need(void)
{
	if (!b.present)
		return 0;
	return (uint64_t)b.nq * PAGE_SIZE + BATCH_PFNS * 4 + PAGE_SIZE;
}

static uint64_t tier_bytes(uint32_t pages)
{
	return (uint64_t)pages << PAGE_SHIFT;
}

static void post_stats(void)
{
	struct tg_tier_stats ts[VIRTIO_BALLOON_TIERS_MAX];
	uint16_t tags[TG_STATS_MAX_ENTRIES];
	uint64_t vals[TG_STATS_MAX_ENTRIES];
	struct vq *q = &b.q[tg_queue_stats(1)];
	size_t n, len;

	/* The balloon's tiers only: a virtio-mem zone is no balloon tier. */
	for (unsigned i = 0; i < nzones_boot; i++) {
		ts[i].accesses = wl.t.acc[i];
		ts[i].free_bytes = tier_bytes(zones[i].free);
		ts[i].total_bytes = tier_bytes(zones[i].total);
	}
	if (b.lie)
		tg_stats_lie(ts, nzones_boot);
	n = tg_stats_build(tags, vals, ts, nzones_boot);
	len = tg_stats_encode(b.stats_buf, PAGE_SIZE, tags, vals, n);
	vq_post(q, 0, (uint64_t)b.stats_buf, (uint32_t)len, 0);
	vq_kick(q);
}

void balloon_start(void)
{
	uint8_t *ring;

	if (!b.present)
		return;
	ring = bump_alloc((uint64_t)b.nq * PAGE_SIZE);
	b.pfns = bump_alloc(BATCH_PFNS * 4);
	b.stats_buf = bump_alloc(PAGE_SIZE);
	/* Every queue, in SPEC order: the device hands enabled queues out by position. */
	for (unsigned i = 0; i < b.nq; i++)
		if (vq_setup(&b.dev, &b.q[i], (uint16_t)i, ring + (uint64_t)i * PAGE_SIZE))
			die("balloon: queue %u has size 0", i);
	vdev_status(&b.dev, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER |
				    VIRTIO_STATUS_FEATURES_OK | VIRTIO_STATUS_DRIVER_OK);
	if (vdev_get_status(&b.dev) & (VIRTIO_STATUS_NEEDS_RESET | VIRTIO_STATUS_FAILED))
		die("balloon: device status %x after DRIVER_OK", vdev_get_status(&b.dev));
	if (b.stats)
		post_stats();
}

/* Hand `n` PFNs of b.pfns to queue `qi`, 256 per descriptor; 0 once all are used. */
static int send_pfns(unsigned qi, uint32_t n)
{
	struct vq *q = &b.q[qi];
	uint16_t descs = 0;

	for (uint32_t off = 0; off < n; off += VIRTIO_BALLOON_MAX_PFNS_PER_DESC) {
		uint32_t c = n - off;

		if (c > VIRTIO_BALLOON_MAX_PFNS_PER_DESC)
			c = VIRTIO_BALLOON_MAX_PFNS_PER_DESC;
		vq_post(q, descs++, (uint64_t)&b.pfns[off], c * VIRTIO_BALLOON_PFN_SIZE, 0);
	}
	vq_kick(q);
	if (vq_wait(q, descs, WAIT_SPINS)) {
		con_printf("tg error balloon: queue %u did not return %u buffers; balloon off\n", qi,
			   descs);
		b.dead = 1;
		return -1;
	}
	while (descs--)
		vq_consume(q);
	return 0;
}

static void inflate(unsigned t, uint32_t need)
{
	uint32_t n;

	if (need > BATCH_PFNS)
		need = BATCH_PFNS;
	n = zone_take(t, need, b.pfns);
	/*
	 * Out of free pages: move workload pages elsewhere and take theirs, one
	 * descriptor's worth per batch, so the device sees the balloon grow
	 * while pages migrate (as a kernel driver inflates 256 pages at a time).
	 */
	if (n < need) {
		uint32_t more = need - n, got = 0;

		if (more > VIRTIO_BALLOON_MAX_PFNS_PER_DESC)
			more = VIRTIO_BALLOON_MAX_PFNS_PER_DESC;
		if (wl_evict(t, more))
			got = zone_take(t, more, b.pfns + n);
		n += got;
		if (got < more && !b.stuck[t]) {
			b.stuck[t] = 1;
			con_printf("tg balloon tier=%u target=%u out of reach: %u ballooned, no page "
				   "left to take or move\n",
				   t, b.target[t], zones[t].ballooned + n);
		}
	}
	if (n)
		send_pfns(tg_queue_tier(b.stats, 0, t, 1), n);
}

static void deflate(unsigned t, uint32_t count)
{
	uint32_t n;

	if (count > BATCH_PFNS)
		count = BATCH_PFNS;
	n = zone_untake(t, count, b.pfns);
	if (!n || send_pfns(tg_queue_tier(b.stats, 0, t, 0), n))
		return;
	/* Usable again only once the device has seen them. */
	zone_release(t, b.pfns, n);
}

void balloon_poll(void)
{
	uint32_t tgt[VIRTIO_BALLOON_TIERS_MAX];
	uint8_t gen;

	if (!b.present || b.dead || b.deaf)
		return;
	if (b.stats && vq_pending(&b.q[tg_queue_stats(1)])) {
		vq_consume(&b.q[tg_queue_stats(1)]);
		b.stats_updates++;
		post_stats();
	}
	if (!b.tiers)
		return;
	do {
		gen = vdev_generation(&b.dev);
		for (unsigned t = 0; t < b.ntiers; t++)
			tgt[t] = vdev_cfg_r32(&b.dev,
					      tg_cfg_tier_field(t, VIRTIO_BALLOON_TIER_NUM_PAGES));
	} while (gen != vdev_generation(&b.dev));
	if (!b.legacy_logged && vdev_cfg_r32(&b.dev, VIRTIO_BALLOON_CFG_NUM_PAGES)) {
		b.legacy_logged = 1;
		con_puts("tg balloon legacy num_pages ignored: this driver serves per-tier targets\n");
	}
	for (unsigned t = 0; t < b.ntiers; t++) {
		if (tgt[t] == b.target[t])
			continue;
		con_printf("tg balloon tier=%u target=%u pages actual=%u\n", t, tgt[t],
			   zones[t].ballooned);
		b.target[t] = tgt[t];
		/* Any new target may free room elsewhere: retry the stuck ones. */
		for (unsigned u = 0; u < b.ntiers; u++)
			b.stuck[u] = 0;
	}
	for (unsigned t = 0; t < b.ntiers && !b.dead; t++) {
		unsigned k;

		for (k = 0; k < BATCHES_PER_POLL && !b.dead; k++) {
			uint32_t have = zones[t].ballooned;

			if (tgt[t] > have && !b.stuck[t])
				inflate(t, tgt[t] - have);
			else if (tgt[t] < have)
				deflate(t, have - tgt[t]);
			else
				break;
			vdev_cfg_w32(&b.dev, tg_cfg_tier_field(t, VIRTIO_BALLOON_TIER_ACTUAL),
				     zones[t].ballooned);
		}
		if (k && zones[t].ballooned == b.target[t])
			con_printf("tg balloon tier=%u reached=%u pages free=%u evicted=%lu "
				   "promoted=%lu\n",
				   t, b.target[t], zones[t].free, wl.evicted, wl.promoted);
	}
	/*
	 * Pages pushed out of their tier come back a descriptor's worth per
	 * poll once it has room again, after the actuals are written: the
	 * balloon answers first, migration follows (like NUMA balancing).
	 */
	for (unsigned t = 0; t < b.ntiers && !b.dead; t++)
		if (wl_promote(t, VIRTIO_BALLOON_MAX_PFNS_PER_DESC) && zones[t].free == 0)
			con_printf("tg balloon tier=%u promoted=%lu\n", t, wl.promoted);
}

void balloon_set_deaf(int on)
{
	b.deaf = on;
}

void balloon_set_lie(int on)
{
	b.lie = on;
}

uint32_t balloon_target(unsigned tier)
{
	return tier < VIRTIO_BALLOON_TIERS_MAX ? b.target[tier] : 0;
}

uint64_t balloon_stats_updates(void)
{
	return b.stats_updates;
}
