/*
 * Zipf popularity over the ranked pages of a hot set (or of a chain of
 * sets, `zipf=` in docs/testguest.md): of the first `a` ranks, rank r
 * (1-based) is drawn with probability r^-s / sum_{q<=a} q^-s.
 *
 * Fixed point only: the guest is built without SSE and no x87 code is
 * wanted in it, and under kvm_pvm every guest instruction is emulated
 * (about 1.5-2 us), so
 * - a weight comes from two 257-entry tables (log2 and exp2 of a fraction,
 *   linearly interpolated; relative error below 1e-6) in ~40 instructions;
 * - a draw is one guide-table lookup plus a short forward walk over the
 *   u32 CDF (2^ceil(log2 n) buckets: under two steps expected, the
 *   indexed search of Chen and Asau 1974), not a binary search of 13 steps.
 * Probabilities are quantised to 2^-32 of the whole table: a rank whose
 * share is below that (s >= ~2.5 far in the tail) is never drawn.
 *
 * Pure code: also compiled for the host and tested there.
 */
#ifndef TG_ZIPF_H
#define TG_ZIPF_H

#include <stdint.h>

/* Largest exponent (x 1000) and most ranks of one table. */
#define TG_ZIPF_MAX_MILLI 4000
#define TG_ZIPF_MAX_RANKS (1u << 22)

struct tg_zipf {
	uint32_t n;	 /* ranks */
	uint32_t gshift; /* bucket of a draw u: u >> gshift */
	uint32_t *cdf;	 /* cdf[k] = 2^32 x (weight of ranks 0..k-1) / total, k < n */
	uint32_t *guide; /* guide[b] = largest k < n with cdf[k] <= b << gshift */
};

/* Bytes of 8-byte aligned memory tg_zipf_build needs for `n` ranks. */
uint64_t tg_zipf_mem(uint32_t n);
/* Build the table for `n` (1..TG_ZIPF_MAX_RANKS) ranks and exponent
 * `milli` / 1000 (0..TG_ZIPF_MAX_MILLI) in `mem`. */
void tg_zipf_build(struct tg_zipf *z, uint32_t n, uint32_t milli, void *mem);

/* Weight of the first `a` ranks in units of 2^-32 of the whole (2^32 for all). */
static inline uint64_t tg_zipf_total(const struct tg_zipf *z, uint32_t a)
{
	return a >= z->n ? 1ULL << 32 : z->cdf[a];
}

/* 0-based rank among the first `a` (>= 1) ranks, whose weight is `tot` =
 * tg_zipf_total(z, a), for a uniform random 32-bit `r`. */
static inline uint32_t tg_zipf_pick(const struct tg_zipf *z, uint32_t a, uint64_t tot, uint32_t r)
{
	uint64_t u = ((uint64_t)r * tot) >> 32; /* < tot */
	uint32_t k = z->guide[u >> z->gshift];

	while (k + 1 < a && z->cdf[k + 1] <= u)
		k++;
	return k;
}

/* Out-of-line tg_zipf_pick, for the host tests. */
uint32_t tg_zipf_pick_ext(const struct tg_zipf *z, uint32_t a, uint32_t r);

#endif
