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
/* Last target read per tier and stats buffers handed back so far. */
uint32_t balloon_target(unsigned tier);
uint64_t balloon_stats_updates(void);

#endif
