/*
 * The per-tier balloon contract of vmm-patch/SPEC.md, as the test guest's
 * driver uses it. Names follow SPEC.md so that the crate's tests
 * (tests/spec_agreement.rs) can compare every value with the SPEC tables.
 * Plain integer constants only: this header is parsed by those tests.
 */
#ifndef TG_SPEC_H
#define TG_SPEC_H

/* PCI identity: virtio-pci modern, device type 5 (balloon). */
#define VIRTIO_PCI_VENDOR_ID 0x1af4
#define VIRTIO_BALLOON_PCI_DEVICE_ID 0x1045

/* Section 1: feature bits. */
#define VIRTIO_BALLOON_F_STATS_VQ 1
#define VIRTIO_BALLOON_F_DEFLATE_ON_OOM 2
#define VIRTIO_BALLOON_F_REPORTING 5
#define VIRTIO_BALLOON_F_TIERS 23
#define VIRTIO_F_VERSION_1 32

/* Section 2: config space. */
#define VIRTIO_BALLOON_CFG_NUM_PAGES 0x00
#define VIRTIO_BALLOON_CFG_ACTUAL 0x04
#define VIRTIO_BALLOON_CFG_FREE_PAGE_HINT_CMD_ID 0x08
#define VIRTIO_BALLOON_CFG_POISON_VAL 0x0c
#define VIRTIO_BALLOON_CFG_TIER_COUNT 0x10
#define VIRTIO_BALLOON_CFG_RESERVED 0x14
#define VIRTIO_BALLOON_CFG_TIERS 0x18
#define VIRTIO_BALLOON_CFG_TIER_SIZE 32
/* Per-tier entry, relative to VIRTIO_BALLOON_CFG_TIERS + 32 * i. */
#define VIRTIO_BALLOON_TIER_NUM_PAGES 0x00
#define VIRTIO_BALLOON_TIER_ACTUAL 0x04
#define VIRTIO_BALLOON_TIER_GUEST_NODE 0x08
#define VIRTIO_BALLOON_TIER_RESERVED 0x0c
#define VIRTIO_BALLOON_TIER_GPA_START 0x10
#define VIRTIO_BALLOON_TIER_ZONE_PAGES 0x18
#define VIRTIO_BALLOON_TIER_SPAN_PAGES 0x1c
#define VIRTIO_BALLOON_TIER_NO_NODE 0xffffffff
#define VIRTIO_BALLOON_TIERS_MAX 8

/* Section 3: queues. */
#define VIRTIO_BALLOON_QUEUE_INFLATE 0
#define VIRTIO_BALLOON_QUEUE_DEFLATE 1
#define VIRTIO_BALLOON_PFN_SHIFT 12
#define VIRTIO_BALLOON_PFN_SIZE 4
#define VIRTIO_BALLOON_MAX_PFNS_PER_DESC 256

/* Section 4: stats. Standard tags 0-9 (virtio spec). */
#define VIRTIO_BALLOON_S_SWAP_IN 0
#define VIRTIO_BALLOON_S_SWAP_OUT 1
#define VIRTIO_BALLOON_S_MAJFLT 2
#define VIRTIO_BALLOON_S_MINFLT 3
#define VIRTIO_BALLOON_S_MEMFREE 4
#define VIRTIO_BALLOON_S_MEMTOT 5
#define VIRTIO_BALLOON_S_AVAIL 6
#define VIRTIO_BALLOON_S_CACHES 7
#define VIRTIO_BALLOON_S_HTLB_PGALLOC 8
#define VIRTIO_BALLOON_S_HTLB_PGFAIL 9
#define VIRTIO_BALLOON_S_ENTRY_SIZE 10
/* Ours: tag = BASE + STRIDE * tier + kind. */
#define VIRTIO_BALLOON_S_TIER_BASE 0x8000
#define VIRTIO_BALLOON_S_TIER_STRIDE 0x10
#define VIRTIO_BALLOON_S_TIER_ACCESSES 0
#define VIRTIO_BALLOON_S_TIER_FREE 1
#define VIRTIO_BALLOON_S_TIER_TOTAL 2

#endif
