// SPDX-License-Identifier: GPL-2.0-only
/*
 * tier_balloon: per-tier sub-balloons (vmm-patch/SPEC.md sections 2-4).
 * Included by the patched virtio_balloon.c after virtballoon_migratepage(),
 * so it uses that file's tell_host(), set_page_pfns(), release_pages_balloon()
 * and update_stat() and serialises on vb->balloon_lock like the stock code.
 */

static u32 tb_cread32(struct virtio_balloon *vb, unsigned int off)
{
	__le32 v;

	/* The balloon's config space is little-endian (virtio 1.x). */
	virtio_cread_bytes(vb->vdev, off, &v, sizeof(v));
	return le32_to_cpu(v);
}

static void tb_write_actual(struct tb_tier *t)
{
	__le32 v = cpu_to_le32(t->num_pages);

	t->vb->vdev->config->set(t->vb->vdev,
				 TB_CFG_TIER(t->index) + TB_CFG_ACTUAL,
				 &v, sizeof(v));
}

/*
 * guest_node is the firmware proximity domain of the zone (CH's --numa
 * guest_numa_id, written into the SRAT). Linux numbers nodes itself:
 * pxm_to_node() (drivers/acpi/numa/srat.c, exported) translates.
 */
static int tb_guest_nid(u32 guest_node)
{
	int nid = NUMA_NO_NODE;

	if (guest_node == TB_NO_NODE || num_online_nodes() < 2)
		return NUMA_NO_NODE;
#if defined(CONFIG_ACPI_NUMA)
	nid = pxm_to_node(guest_node);
#elif defined(CONFIG_NUMA)
	nid = guest_node < MAX_NUMNODES ? (int)guest_node : NUMA_NO_NODE;
#endif
	if (nid == NUMA_NO_NODE || nid < 0 || !node_online(nid))
		return NUMA_NO_NODE;
	return nid;
}

static bool tb_page_in_tier(struct tb_tier *t, struct page *page)
{
	u64 pfn = (u64)page_to_pfn(page) * VIRTIO_BALLOON_PAGES_PER_PAGE;

	return pfn >= t->pfn_start &&
	       pfn + VIRTIO_BALLOON_PAGES_PER_PAGE <= t->pfn_end;
}

#ifdef CONFIG_BALLOON_COMPACTION
/*
 * Compaction moved a ballooned page: the new page must be reported on the
 * same tier's queues, and must lie in that tier, else the device rejects
 * it. A target outside the tier is refused (-EAGAIN), the page stays.
 */
static int tb_migratepage(struct balloon_dev_info *bdi, struct page *newpage,
			  struct page *page, enum migrate_mode mode)
{
	struct tb_tier *t = container_of(bdi, struct tb_tier, bdi);
	struct virtio_balloon *vb = t->vb;
	unsigned long flags;

	if (!tb_page_in_tier(t, newpage) ||
	    (t->nid != NUMA_NO_NODE && page_to_nid(newpage) != t->nid))
		return -EAGAIN;
	if (!mutex_trylock(&vb->balloon_lock))
		return -EAGAIN;

	get_page(newpage); /* balloon reference */
	if (!virtio_has_feature(vb->vdev, VIRTIO_BALLOON_F_DEFLATE_ON_OOM) &&
	    page_zone(page) != page_zone(newpage)) {
		adjust_managed_page_count(page, 1);
		adjust_managed_page_count(newpage, -1);
	}
	spin_lock_irqsave(&bdi->pages_lock, flags);
	balloon_page_insert(bdi, newpage);
	bdi->isolated_pages--;
	__count_vm_event(BALLOON_MIGRATE);
	spin_unlock_irqrestore(&bdi->pages_lock, flags);
	vb->num_pfns = VIRTIO_BALLOON_PAGES_PER_PAGE;
	set_page_pfns(vb, vb->pfns, newpage);
	tell_host(vb, t->inflate_vq);

	vb->num_pfns = VIRTIO_BALLOON_PAGES_PER_PAGE;
	set_page_pfns(vb, vb->pfns, page);
	tell_host(vb, t->deflate_vq);
	mutex_unlock(&vb->balloon_lock);

	balloon_page_finalize(page);
	put_page(page); /* balloon reference */
	return MIGRATEPAGE_SUCCESS;
}
#endif

/* Reads the tier table; count stays 0 without F_TIERS (stock behaviour). */
static int tb_probe(struct virtio_balloon *vb)
{
	struct tb_tiers *tt = &vb->tb;
	unsigned int i, n;

	tt->count = 0;
	if (!virtio_has_feature(vb->vdev, VIRTIO_BALLOON_F_TIERS))
		return 0;
	n = tb_cread32(vb, TB_CFG_TIER_COUNT);
	if (n < 1 || n > TB_TIERS_MAX) {
		dev_err(&vb->vdev->dev, "tier_count %u out of range 1..%u\n",
			n, TB_TIERS_MAX);
		return -EINVAL;
	}
	for (i = 0; i < n; i++) {
		struct tb_tier *t = &tt->tier[i];
		unsigned int base = TB_CFG_TIER(i);
		u64 gpa;
		__le64 g;

		virtio_cread_bytes(vb->vdev, base + TB_CFG_GPA_START, &g,
				   sizeof(g));
		gpa = le64_to_cpu(g);
		t->index = i;
		t->vb = vb;
		t->num_pages = 0;
		t->pfn_start = gpa >> VIRTIO_BALLOON_PFN_SHIFT;
		t->pfn_end = t->pfn_start +
			     tb_cread32(vb, base + TB_CFG_SPAN_PAGES);
		t->nid = tb_guest_nid(tb_cread32(vb, base + TB_CFG_GUEST_NODE));
		balloon_devinfo_init(&t->bdi);
#ifdef CONFIG_BALLOON_COMPACTION
		t->bdi.migratepage = tb_migratepage;
#endif
		dev_info(&vb->vdev->dev,
			 "tier %u: pfns [%#llx, %#llx) node %d (%s)\n", i,
			 t->pfn_start, t->pfn_end, t->nid,
			 t->nid == NUMA_NO_NODE ? "span" : "numa");
	}
	tt->count = n;
	return 0;
}

/*
 * One block of 2^order pages for tier @t. On a NUMA node: the node only
 * (__GFP_THISNODE; without it the node is a preference and the device
 * rejects PFNs outside the tier). Otherwise anywhere, and the caller keeps
 * it only if it lies in the tier's span.
 */
static struct page *tb_alloc_block(struct tb_tier *t, unsigned int order)
{
	gfp_t gfp = balloon_mapping_gfp_mask() | __GFP_NOMEMALLOC |
		    __GFP_NORETRY | __GFP_NOWARN;

	if (t->nid != NUMA_NO_NODE)
		return alloc_pages_node(t->nid, gfp | __GFP_THISNODE, order);
	return alloc_pages(gfp, order);
}

static void tb_free_held(struct list_head *held)
{
	struct page *page, *next;

	list_for_each_entry_safe(page, next, held, lru) {
		unsigned int order = page_private(page);

		list_del(&page->lru);
		set_page_private(page, 0);
		__free_pages(page, order);
	}
}

/*
 * Allocates up to @num pages of tier @t onto @pages. The buddy allocator
 * hands out the most fragmented (often lowest) free pages first, so a tier
 * high in a span would rarely see an order-0 page: blocks of up to
 * 2^TB_BLOCK_ORDER pages are asked for first, a block in the tier is split
 * and kept, one outside it is held until the batch ends so the allocator
 * moves on, then freed. At most TB_SPAN_TRIES blocks are tried per order.
 */
static unsigned int tb_alloc(struct tb_tier *t, unsigned int num,
			     struct list_head *pages)
{
	unsigned int got = 0, order = TB_BLOCK_ORDER;
	unsigned long last = 0;
	LIST_HEAD(held);

	while (got < num) {
		unsigned int tries = TB_SPAN_TRIES, i;
		struct page *page = NULL;

		while (order && (1U << order) > num - got)
			order--;
		while (tries--) {
			page = tb_alloc_block(t, order);
			if (!page)
				break;
			if (tb_page_in_tier(t, page) &&
			    tb_page_in_tier(t, page + (1U << order) - 1))
				break;
			last = page_to_pfn(page);
			set_page_private(page, order);
			list_add(&page->lru, &held);
			page = NULL;
		}
		if (!page) {
			if (!order)
				break;
			order--;
			continue;
		}
		if (order)
			split_page(page, order);
		for (i = 0; i < (1U << order); i++)
			balloon_page_push(pages, page + i);
		got += 1U << order;
	}
	if (!got && last)
		dev_info_ratelimited(&t->vb->vdev->dev,
				     "tier %u: no free page in it (last tried: pfn %#lx)\n",
				     t->index, last);
	tb_free_held(&held);
	return got;
}

static unsigned int tb_fill(struct tb_tier *t, size_t num)
{
	struct virtio_balloon *vb = t->vb;
	unsigned int done;
	struct page *page;
	LIST_HEAD(pages);

	num = min(num, ARRAY_SIZE(vb->pfns));
	if (!tb_alloc(t, num, &pages)) {
		msleep(200);
		return 0;
	}
	mutex_lock(&vb->balloon_lock);
	vb->num_pfns = 0;
	while ((page = balloon_page_pop(&pages))) {
		balloon_page_enqueue(&t->bdi, page);
		set_page_pfns(vb, vb->pfns + vb->num_pfns, page);
		t->num_pages += VIRTIO_BALLOON_PAGES_PER_PAGE;
		if (!virtio_has_feature(vb->vdev,
					VIRTIO_BALLOON_F_DEFLATE_ON_OOM))
			adjust_managed_page_count(page, -1);
		vb->num_pfns += VIRTIO_BALLOON_PAGES_PER_PAGE;
	}
	done = vb->num_pfns;
	if (done)
		tell_host(vb, t->inflate_vq);
	mutex_unlock(&vb->balloon_lock);
	return done;
}

static unsigned int tb_leak(struct tb_tier *t, size_t num)
{
	struct virtio_balloon *vb = t->vb;
	unsigned int done;
	struct page *page;
	LIST_HEAD(pages);

	num = min(num, ARRAY_SIZE(vb->pfns));
	mutex_lock(&vb->balloon_lock);
	num = min(num, (size_t)t->num_pages);
	for (vb->num_pfns = 0; vb->num_pfns < num;
	     vb->num_pfns += VIRTIO_BALLOON_PAGES_PER_PAGE) {
		page = balloon_page_dequeue(&t->bdi);
		if (!page)
			break;
		set_page_pfns(vb, vb->pfns + vb->num_pfns, page);
		list_add(&page->lru, &pages);
		t->num_pages -= VIRTIO_BALLOON_PAGES_PER_PAGE;
	}
	done = vb->num_pfns;
	if (done)
		tell_host(vb, t->deflate_vq);
	release_pages_balloon(vb, &pages);
	mutex_unlock(&vb->balloon_lock);
	return done;
}

/* One step of every tier towards its target; true if more remains. */
static bool tb_update(struct virtio_balloon *vb)
{
	bool more = false;
	unsigned int i;

	for (i = 0; i < vb->tb.count; i++) {
		struct tb_tier *t = &vb->tb.tier[i];
		s64 diff = (s64)tb_cread32(vb, TB_CFG_TIER(i) +
					   TB_CFG_NUM_PAGES) -
			   t->num_pages;
		s64 left = diff;

		if (!diff)
			continue;
		if (diff > 0)
			left -= tb_fill(t, diff);
		else
			left += tb_leak(t, -diff);
		tb_write_actual(t);
		/* A tier that made no progress waits for the next change. */
		if (left && left != diff)
			more = true;
	}
	return more;
}

/* Deflate on OOM: after the legacy balloon, tiers give back pages too. */
static unsigned long tb_oom(struct virtio_balloon *vb, unsigned long want)
{
	unsigned long freed = 0;
	unsigned int i;

	for (i = 0; i < vb->tb.count && freed < want; i++) {
		struct tb_tier *t = &vb->tb.tier[i];
		unsigned int n = tb_leak(t, want - freed);

		if (n)
			tb_write_actual(t);
		freed += n;
	}
	return freed;
}

static void tb_remove(struct virtio_balloon *vb)
{
	unsigned int i;

	for (i = 0; i < vb->tb.count; i++) {
		struct tb_tier *t = &vb->tb.tier[i];

		while (t->num_pages)
			tb_leak(t, t->num_pages);
		tb_write_actual(t);
	}
}

/*
 * TIER_FREE/TIER_TOTAL for tiers on a NUMA node. si_meminfo_node() is not
 * exported, so free is the sum of the node's zones' NR_FREE_PAGES and
 * total their managed pages. A span tier has no cheap per-span count:
 * its tags are left out (unavailable), not sent as 0.
 */
static unsigned int tb_stats(struct virtio_balloon *vb, unsigned int idx)
{
	unsigned int i;

	for (i = 0; i < vb->tb.count; i++) {
		struct tb_tier *t = &vb->tb.tier[i];
		unsigned long free = 0, total = 0;
		pg_data_t *pgdat;
		int z;

		if (t->nid == NUMA_NO_NODE)
			continue;
		pgdat = NODE_DATA(t->nid);
		for (z = 0; z < MAX_NR_ZONES; z++) {
			struct zone *zone = &pgdat->node_zones[z];

			if (!populated_zone(zone))
				continue;
			free += zone_page_state(zone, NR_FREE_PAGES);
			total += zone_managed_pages(zone);
		}
		update_stat(vb, idx++, TB_TAG_FREE(i), pages_to_bytes(free));
		update_stat(vb, idx++, TB_TAG_TOTAL(i), pages_to_bytes(total));
	}
	return idx;
}
