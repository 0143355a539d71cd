/*
 * The virtio-mem driver (vmem.h), polled from the main loop like the
 * balloon. Plugged blocks join the region's own zone (mem.c), where the
 * workload's set of the same index moves in (wl_promote); before a block
 * is unplugged its workload pages move out (wl_vacate), as Linux migrates
 * pages off a block with alloc_contig_range() before unplugging it.
 *
 * One request is in flight at a time, covering a run of up to RUN_BLOCKS
 * contiguous blocks; REQS_PER_POLL requests per poll keep the workload
 * running while a large resize is followed.
 */
#include "vmem.h"

#include "arch.h"
#include "console.h"
#include "paging.h"
#include "spec.h"
#include "virtio.h"
#include "workload.h"

#define RUN_BLOCKS 32
#define REQS_PER_POLL 4
/* Polls of the used ring before the device counts as dead (as balloon.c). */
#define WAIT_SPINS 20000000ULL
/* Workload pages moved off a block being unplugged per poll (as many as
 * the balloon moves back per poll). */
#define VACATE_PER_POLL 256
/* Seconds before a refused or impossible move is tried again (Linux
 * retries on a timer, too). */
#define RETRY_SECONDS 5
/* `tg vmem refused` lines printed at most (each refusal is counted). */
#define REFUSED_LOG_MAX 8

struct vmem_req {
	uint16_t type;
	uint16_t pad[3];
	uint64_t addr;
	uint16_t nb_blocks;
	uint16_t pad2[3];
};

struct vmem_resp {
	uint16_t type;
	uint16_t pad[3];
	uint16_t state;
};

static const char *const mode_name[] = {"on", "off", "mute", "error"};

static struct {
	int present, dead, mode;
	struct vdev dev;
	struct vq q;
	uint64_t features, acked;
	uint64_t block, addr, region, usable, requested;
	uint32_t node;
	uint32_t nblocks;
	uint64_t *map; /* bit i: block i plugged */
	uint64_t plugged; /* bytes, by our accounting */
	volatile struct vmem_req *req;
	volatile struct vmem_resp *resp;
	uint64_t retry_at; /* guest second before which nothing is retried */
	uint64_t requests, refused;
	int moving; /* a resize is being followed: say when it is reached */
	uint32_t drain; /* block being emptied for unplug, + 1; 0: none */
} v;

static uint64_t cfg_r64(uint32_t off)
{
	return (uint64_t)vdev_cfg_r32(&v.dev, off) |
	       (uint64_t)vdev_cfg_r32(&v.dev, off + 4) << 32;
}

/* requested_size alone: what every poll reads (each config read is an exit). */
static uint64_t read_requested(void)
{
	uint8_t gen;
	uint64_t req;

	do {
		gen = vdev_generation(&v.dev);
		req = cfg_r64(VIRTIO_MEM_CFG_REQUESTED_SIZE);
	} while (gen != vdev_generation(&v.dev));
	return req;
}

/* requested_size and plugged_size, consistent with each other. */
static void read_sizes(uint64_t *requested, uint64_t *plugged)
{
	uint8_t gen;

	do {
		gen = vdev_generation(&v.dev);
		*requested = cfg_r64(VIRTIO_MEM_CFG_REQUESTED_SIZE);
		*plugged = cfg_r64(VIRTIO_MEM_CFG_PLUGGED_SIZE);
	} while (gen != vdev_generation(&v.dev));
}

int vmem_probe(unsigned mode, struct tg_vmem_region *vr)
{
	struct pci_fn f;
	uint64_t want, plugged;
	uint8_t gen;

	*vr = (struct tg_vmem_region){0};
	v.mode = (int)mode;
	if (pci_find(VIRTIO_PCI_VENDOR_ID, VIRTIO_MEM_PCI_DEVICE_ID, &f)) {
		con_puts("tg vmem absent\n");
		return 0;
	}
	if (mode == TG_VMEM_OFF) {
		con_printf("tg vmem off pci=%02x:%02x.%u: device left alone\n", f.bus, f.dev, f.fn);
		return 0;
	}
	if (vdev_probe(&v.dev, f))
		die("vmem: %02x:%02x.%u has no usable virtio capabilities", f.bus, f.dev, f.fn);
	vdev_status(&v.dev, 0);
	vdev_status(&v.dev, VIRTIO_STATUS_ACKNOWLEDGE);
	vdev_status(&v.dev, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER);
	v.features = vdev_features(&v.dev);
	if (!(v.features & (1ULL << VIRTIO_F_VERSION_1)))
		die("vmem: device does not offer VERSION_1 (features %lx)", v.features);
	/* We never touch unplugged memory, so UNPLUGGED_INACCESSIBLE is fine too. */
	want = (1ULL << VIRTIO_F_VERSION_1) | (1ULL << VIRTIO_MEM_F_ACPI_PXM) |
	       (1ULL << VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE);
	v.acked = want & v.features;
	vdev_set_features(&v.dev, v.acked);
	vdev_status(&v.dev, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER |
				    VIRTIO_STATUS_FEATURES_OK);
	if (!(vdev_get_status(&v.dev) & VIRTIO_STATUS_FEATURES_OK))
		die("vmem: device refused features %lx", v.acked);
	do {
		gen = vdev_generation(&v.dev);
		v.block = cfg_r64(VIRTIO_MEM_CFG_BLOCK_SIZE);
		v.node = vdev_cfg_r32(&v.dev, VIRTIO_MEM_CFG_NODE_ID) & 0xffff;
		v.addr = cfg_r64(VIRTIO_MEM_CFG_ADDR);
		v.region = cfg_r64(VIRTIO_MEM_CFG_REGION_SIZE);
		v.usable = cfg_r64(VIRTIO_MEM_CFG_USABLE_REGION_SIZE);
	} while (gen != vdev_generation(&v.dev));
	read_sizes(&v.requested, &plugged);
	/* Blocks must be whole bitmap words of pages (mem.c works a word at a time). */
	if (v.block < (64 << PAGE_SHIFT) || v.block & (v.block - 1) || v.addr % v.block ||
	    v.region % v.block || v.usable > v.region)
		die("vmem: unusable geometry block=0x%lx addr=0x%lx region=0x%lx usable=0x%lx",
		    v.block, v.addr, v.region, v.usable);
	if (!(v.acked & (1ULL << VIRTIO_MEM_F_ACPI_PXM)))
		v.node = VIRTIO_BALLOON_TIER_NO_NODE;
	v.nblocks = (uint32_t)(v.region / v.block);
	v.present = 1;
	vr->addr = v.addr;
	vr->size = v.region;
	vr->node = v.node;
	con_printf("tg vmem pci=%02x:%02x.%u features=0x%lx acked=0x%lx block=%lu addr=0x%lx "
		   "region=%lu usable=%lu plugged=%lu requested=%lu node=%d mode=%s\n",
		   f.bus, f.dev, f.fn, v.features, v.acked, v.block, v.addr, v.region, v.usable,
		   plugged, v.requested, (int)v.node, mode_name[mode]);
	return 1;
}

uint64_t vmem_mem_need(void)
{
	if (!v.present)
		return 0;
	/* bump_alloc hands out whole pages. */
	return 2 * PAGE_SIZE + ((((uint64_t)v.nblocks + 63) / 64 * 8 + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1));
}

/* One request; returns the response type, or -1 (device dead). */
static int request(uint16_t type, uint64_t addr, uint16_t nb)
{
	v.req->type = type;
	v.req->addr = addr;
	v.req->nb_blocks = nb;
	v.resp->type = 0xffff;
	vq_post_chain(&v.q, 0, (uint64_t)v.req, sizeof(struct vmem_req), (uint64_t)v.resp,
		      sizeof(struct vmem_resp));
	vq_kick(&v.q);
	if (vq_wait(&v.q, 1, WAIT_SPINS)) {
		con_puts("tg error vmem: request not answered; driver off\n");
		v.dead = 1;
		return -1;
	}
	vq_consume(&v.q);
	v.requests++;
	return v.resp->type;
}

void vmem_start(void)
{
	uint8_t *page;
	uint64_t req, plugged;

	if (!v.present)
		return;
	page = bump_alloc(2 * PAGE_SIZE);
	v.req = (volatile struct vmem_req *)(page + PAGE_SIZE);
	v.resp = (volatile struct vmem_resp *)(page + PAGE_SIZE + 64);
	v.map = bump_alloc(((uint64_t)v.nblocks + 63) / 64 * 8);
	map_identity(v.addr, v.region, 0);
	if (vq_setup(&v.dev, &v.q, 0, page))
		die("vmem: queue 0 has size 0");
	vdev_status(&v.dev, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER |
				    VIRTIO_STATUS_FEATURES_OK | VIRTIO_STATUS_DRIVER_OK);
	if (vdev_get_status(&v.dev) & (VIRTIO_STATUS_NEEDS_RESET | VIRTIO_STATUS_FAILED))
		die("vmem: device status %x after DRIVER_OK", vdev_get_status(&v.dev));
	read_sizes(&req, &plugged);
	/* Blocks an earlier boot plugged are not ours to know: start clean. */
	if (plugged && v.mode == TG_VMEM_ON) {
		int r = request(VIRTIO_MEM_REQ_UNPLUG_ALL, 0, 0);

		read_sizes(&req, &plugged);
		con_printf("tg vmem unplug_all resp=%d plugged=%lu\n", r, plugged);
	}
	v.moving = v.requested != 0;
}

static int bit(uint32_t i)
{
	return (int)((v.map[i / 64] >> (i % 64)) & 1);
}

static void set_bits(uint32_t first, uint32_t n, int on)
{
	for (uint32_t i = first; i < first + n; i++) {
		if (on)
			v.map[i / 64] |= 1ULL << (i % 64);
		else
			v.map[i / 64] &= ~(1ULL << (i % 64));
	}
}

static const char *resp_name(int r)
{
	static const char *const n[] = {"ACK", "NACK", "BUSY", "ERROR"};

	return r >= 0 && r <= 3 ? n[r] : "DEAD";
}

static void refused(const char *op, int r, uint64_t addr, uint32_t n, uint64_t sec)
{
	v.refused++;
	v.retry_at = sec + RETRY_SECONDS;
	if (v.refused <= REFUSED_LOG_MAX)
		con_printf("tg vmem refused op=%s resp=%s addr=0x%lx blocks=%u plugged=%lu "
			   "requested=%lu refusals=%lu\n",
			   op, resp_name(r), addr, n, v.plugged, v.requested, v.refused);
}

static uint32_t block_pages(void)
{
	return (uint32_t)(v.block >> PAGE_SHIFT);
}

/* Plug the lowest run of unplugged usable blocks, up to `want`. */
static void plug(uint32_t want, uint64_t sec)
{
	uint32_t usable = (uint32_t)(v.usable / v.block), first = 0, n = 0;
	uint64_t addr;
	int r;

	while (first < usable && bit(first))
		first++;
	while (first + n < usable && !bit(first + n) && n < want && n < RUN_BLOCKS)
		n++;
	if (!n) {
		refused("plug", VIRTIO_MEM_RESP_NACK, v.addr, 0, sec); /* region full */
		return;
	}
	addr = v.addr + (uint64_t)first * v.block;
	r = request(VIRTIO_MEM_REQ_PLUG, addr, (uint16_t)n);
	if (r != VIRTIO_MEM_RESP_ACK) {
		if (r >= 0)
			refused("plug", r, addr, n, sec);
		return;
	}
	set_bits(first, n, 1);
	v.plugged += (uint64_t)n * v.block;
	if (vmem_zone >= 0)
		zone_plug((unsigned)vmem_zone, addr >> PAGE_SHIFT, n * block_pages());
}

/*
 * One poll's share of draining block `v.drain - 1`: move up to
 * VACATE_PER_POLL workload pages out (its free pages were isolated when the
 * drain began, so nothing moves in), and unplug it once it is empty. A
 * block no longer to be unplugged by then goes back to the zone.
 */
static void drain_step(uint64_t sec)
{
	uint32_t b = v.drain - 1, pages = block_pages();
	uint64_t addr = v.addr + (uint64_t)b * v.block, pfn = addr >> PAGE_SHIFT;
	unsigned z = (unsigned)vmem_zone;
	int r;

	if (wl_vacate(z, pfn, pfn + pages, VACATE_PER_POLL) == VACATE_PER_POLL)
		return; /* maybe more: the next poll goes on */
	v.drain = 0;
	if (v.plugged <= v.requested) {
		zone_plug(z, pfn, pages);
		return;
	}
	r = request(VIRTIO_MEM_REQ_UNPLUG, addr, 1);
	if (r != VIRTIO_MEM_RESP_ACK) {
		zone_plug(z, pfn, pages);
		if (r >= 0)
			refused("unplug", r, addr, 1, sec);
		return;
	}
	set_bits(b, 1, 0);
	v.plugged -= v.block;
}

/*
 * Unplug the highest run of plugged blocks, up to `want`. A run holding
 * workload pages is drained a block at a time over several polls
 * (drain_step), as Linux migrates pages off a block in the background
 * while the guest runs; nothing when there is no room for its pages.
 */
static void unplug(uint32_t want, uint64_t sec)
{
	uint32_t last = v.nblocks, n = 0, pages;
	uint64_t addr, pfn;
	int r;

	while (last > 0 && !bit(last - 1))
		last--;
	while (last > n && bit(last - 1 - n) && n < want && n < RUN_BLOCKS)
		n++;
	if (!n)
		return;
	addr = v.addr + (uint64_t)(last - n) * v.block;
	pfn = addr >> PAGE_SHIFT;
	pages = n * block_pages();
	if (vmem_zone >= 0) {
		unsigned z = (unsigned)vmem_zone;

		if (zone_used_in(z, pfn, pages)) {
			uint64_t top = (v.addr + (uint64_t)(last - 1) * v.block) >> PAGE_SHIFT;
			uint32_t busy = zone_used_in(z, top, block_pages());
			uint64_t room = zones[z].free - (block_pages() - busy);

			for (unsigned i = 0; i < nzones; i++)
				if (i != z)
					room += zones[i].free;
			if (busy > room) {
				/* Linux: alloc_contig_range() fails, -EBUSY, retried later. */
				refused("unplug", VIRTIO_MEM_RESP_BUSY, top << PAGE_SHIFT, 1, sec);
				return;
			}
			zone_isolate(z, top, block_pages());
			v.drain = last;
			drain_step(sec);
			return;
		}
		zone_isolate(z, pfn, pages);
	}
	r = request(VIRTIO_MEM_REQ_UNPLUG, addr, (uint16_t)n);
	if (r != VIRTIO_MEM_RESP_ACK) {
		if (vmem_zone >= 0)
			zone_plug((unsigned)vmem_zone, pfn, pages);
		if (r >= 0)
			refused("unplug", r, addr, n, sec);
		return;
	}
	set_bits(last - n, n, 0);
	v.plugged -= (uint64_t)n * v.block;
}

/* ERROR mode: a request for blocks outside the usable region. */
static void bad_request(uint64_t sec)
{
	int grow = v.requested > v.plugged;
	uint64_t addr = v.addr + v.region;
	int r = request(grow ? VIRTIO_MEM_REQ_PLUG : VIRTIO_MEM_REQ_UNPLUG, addr, 1);

	if (r >= 0)
		refused(grow ? "plug" : "unplug", r, addr, 1, sec);
}

void vmem_poll(uint64_t sec)
{
	uint64_t req, dev_plugged;

	if (!v.present || v.dead)
		return;
	req = read_requested();
	if (req != v.requested) {
		con_printf("tg vmem requested=%lu plugged=%lu was=%lu mode=%s\n", req, v.plugged,
			   v.requested, mode_name[v.mode]);
		v.requested = req;
		v.retry_at = 0;
		v.moving = 1;
	}
	if (v.mode == TG_VMEM_MUTE || sec < v.retry_at)
		return;
	if (v.mode == TG_VMEM_ERROR) {
		if (v.requested != v.plugged)
			bad_request(sec);
		return;
	}
	for (unsigned i = 0; i < REQS_PER_POLL && !v.dead && sec >= v.retry_at; i++) {
		if (v.drain) {
			drain_step(sec); /* one step a poll, whatever was asked since */
			break;
		}
		if (v.plugged < v.requested)
			plug((uint32_t)((v.requested - v.plugged) / v.block), sec);
		else if (v.plugged > v.requested)
			unplug((uint32_t)((v.plugged - v.requested) / v.block), sec);
		else
			break;
	}
	/* Set vmem_zone's pages back home a descriptor's worth per poll. */
	if (vmem_zone >= 0)
		wl_promote((unsigned)vmem_zone, 256);
	if (v.moving && v.plugged == v.requested && !v.dead) {
		read_sizes(&req, &dev_plugged);
		v.moving = 0;
		con_printf("tg vmem reached plugged=%lu requested=%lu device_plugged=%lu blocks=%lu "
			   "requests=%lu\n",
			   v.plugged, v.requested, dev_plugged, v.plugged / v.block, v.requests);
	}
}

uint64_t vmem_plugged(void)
{
	return v.plugged;
}
