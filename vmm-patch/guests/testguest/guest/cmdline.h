/*
 * The test guest's kernel command line (docs/testguest.md):
 *
 *   hot=P0,P1,...          hot-set pages of set i (set i prefers tier i)
 *   phases=PH,PH,...       PH = W0/W1/...@LEN[:A0/A1/...]: percent of accesses
 *                          to set i (sum 100) for LEN accesses (k = 1e3,
 *                          m = 1e6) or LENs seconds (RTC ticks); LEN 0 =
 *                          forever (last only); Ai = pages of set i touched
 *                          in this phase, its first ones (0 or absent = all)
 *   loop=0|1               after the last phase start again at phase 0
 *   accesses=N             stop touching memory after N accesses (0 = never)
 *   report=N|Ns            progress line every N accesses or N seconds (0 = off)
 *   poll=N                 accesses between two balloon polls
 *   seed=N                 PRNG seed
 *   rate=N                 accesses per second, paced on the TSC (0 = as fast
 *                          as it runs); missed slots are dropped, not caught up
 *   quiet=0|1              no `tg phase` lines (the host reads the phase from
 *                          the truth block instead; serial output stalls the
 *                          guest for about a millisecond per character)
 *   zipf=S0,S1,...         Zipf exponent of set i's page popularity (up to
 *                          3 decimals, at most 4; 0 = uniform): rank 1 = the
 *                          set's first page. `+` for set i: set i continues
 *                          set i-1's ranking (one popularity order over both,
 *                          set i-1 holding the head); it takes no weight of
 *                          its own, the chain draws its first set's weight
 *   deaf=W,W,...           W = STARTs+LENs: from second START of the guest's
 *                          clock (tick `s=`) for LEN seconds the balloon
 *                          driver does nothing (no target read, no inflate or
 *                          deflate, no actual written, stats queue not served)
 *   lie=W,W,...            same windows: the stats the driver returns are
 *                          false (proto.h tg_stats_lie)
 *   virtio_mem=on|off|mute|error
 *                          the virtio-mem driver (vmem.h): on follows the
 *                          device's requested size (default); off leaves the
 *                          device alone; mute sets it up but never sends a
 *                          request; error sends only requests the device
 *                          answers with ERROR (nothing is ever plugged)
 *
 * Pure parsing, no guest dependencies: tested on the host by the crate.
 */
#ifndef TG_CMDLINE_H
#define TG_CMDLINE_H

#include <stdint.h>

#include "spec.h"

#define TG_MAX_SETS VIRTIO_BALLOON_TIERS_MAX
#define TG_MAX_PHASES 16
#define TG_ERR_LEN 120
#define TG_MAX_WINDOWS 8

/* Seconds [start, start + len) of the guest's clock (deaf=, lie=). */
struct tg_window {
	uint32_t start;
	uint32_t len;
};

struct tg_phase {
	uint8_t weight[TG_MAX_SETS]; /* percent of accesses to set i */
	uint64_t len;		     /* accesses, or seconds when `seconds` */
	uint8_t seconds;
	uint32_t active[TG_MAX_SETS]; /* pages of set i touched; 0 = all */
};

struct tg_params {
	unsigned nsets; /* entries given in hot= */
	uint32_t hot[TG_MAX_SETS];
	unsigned nphases;
	struct tg_phase phase[TG_MAX_PHASES];
	uint8_t loop;
	uint64_t accesses;
	uint64_t report;
	uint8_t report_seconds;
	uint32_t poll;
	uint64_t seed;
	uint64_t rate;
	uint8_t quiet;
	uint8_t zipf_cont[TG_MAX_SETS]; /* set i continues set i-1's ranking */
	unsigned nzipf;			/* entries given in zipf= */
	uint32_t zipf[TG_MAX_SETS];	/* exponent x 1000 of set i (of its chain) */
	unsigned ndeaf, nlie;		/* windows given in deaf=, lie= */
	struct tg_window deaf[TG_MAX_WINDOWS];
	struct tg_window lie[TG_MAX_WINDOWS];
	uint8_t vmem;	      /* virtio_mem=: TG_VMEM_ON (0), OFF, MUTE, ERROR (vmem.h) */
	char err[TG_ERR_LEN]; /* why tg_params_parse failed */
};

/* Defaults: hot=256,256 phases=80/20@100k,20/80@100k loop=1 report=1s poll=2048 seed=1
 * rate=0 quiet=0. */
void tg_params_default(struct tg_params *p);
/* Parse `cmdline` over the defaults. Returns 0, or -1 with p->err set. */
int tg_params_parse(const char *cmdline, struct tg_params *p);
/* 1 when second `sec` lies in one of the `n` windows `w`. */
int tg_window_in(const struct tg_window *w, unsigned n, uint64_t sec);

#endif
