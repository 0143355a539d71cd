/* Polled driver for the per-tier virtio balloon of vmm-patch/SPEC.md. */
#ifndef TG_BALLOON_H
#define TG_BALLOON_H

#include <stdint.h>

#include "proto.h"

/*
 * Find the balloon, negotiate VERSION_1 + STATS_VQ + TIERS and read the
 * config space into *cfg (tier_count 0 when there is no balloon or it has
 * no tiers). Returns 1 when a balloon was found.
 */
int balloon_probe(struct tg_balloon_cfg *cfg);
/* Reserved memory balloon_start needs. */
uint64_t balloon_mem_need(void);
/* Set up the queues in SPEC order, DRIVER_OK, post the stats buffer. */
void balloon_start(void);
/* Follow the per-tier targets (one batch per tier) and serve the stats queue. */
void balloon_poll(void);
/*
 * deaf=: while set, balloon_poll does nothing at all (no target read, no
 * inflate/deflate or migration, no actual written, stats queue not served).
 * lie=: while set, the stats returned are tg_stats_lie's.
 */
void balloon_set_deaf(int on);
void balloon_set_lie(int on);
/* Last target read per tier and stats buffers handed back so far. */
uint32_t balloon_target(unsigned tier);
uint64_t balloon_stats_updates(void);

#endif
