/* Zipf tables in fixed point; see zipf.h. */
#include "zipf.h"

#define TAB 256
#define ONE62 (1ULL << 62)
#define LN2_Q62 3196577161300663914ULL /* ln 2 x 2^62 */
#define WEIGHT_SHIFT 22		       /* Q62 -> Q40 weights: n x 2^40 fits in a u64 */

struct tables {
	uint64_t log2[TAB + 1]; /* log2(1 + i/256), Q32 */
	uint64_t exp2[TAB + 1]; /* 2^(-i/256), Q62 */
};

static uint64_t mul62(uint64_t a, uint64_t b)
{
	return (uint64_t)(((unsigned __int128)a * b) >> 62);
}

/* log2 of m / 2^30, m in [2^30, 2^31), as a Q32 fraction: square and halve. */
static uint64_t log2_frac(uint64_t m)
{
	uint64_t y = 0;

	for (uint64_t bit = 1ULL << 31; bit; bit >>= 1) {
		m = (m * m) >> 30;
		if (m >= 2ULL << 30) {
			m >>= 1;
			y |= bit;
		}
	}
	return y;
}

static void tables_init(struct tables *t)
{
	uint64_t y = LN2_Q62 / TAB, term = ONE62, q = ONE62;

	for (unsigned i = 0; i < TAB; i++)
		t->log2[i] = log2_frac((uint64_t)(TAB + i) << 22);
	t->log2[TAB] = 1ULL << 32;
	/* q = e^(-ln2/256): six terms of the series reach 2^-62 for y < 0.003. */
	for (unsigned n = 1; n <= 6; n++) {
		term = mul62(term, y) / n;
		q = n & 1 ? q - term : q + term;
	}
	t->exp2[0] = ONE62;
	for (unsigned i = 1; i <= TAB; i++)
		t->exp2[i] = mul62(t->exp2[i - 1], q);
}

/* rank^-s in Q40, rank >= 1, s = milli / 1000. */
static uint64_t weight(const struct tables *t, uint32_t rank, uint32_t milli)
{
	unsigned b = 63u - (unsigned)__builtin_clzll(rank);
	uint64_t f = (((uint64_t)rank << 32) >> b) - (1ULL << 32); /* mantissa - 1, Q32 */
	uint64_t i = f >> 24, r = f & 0xffffff;
	uint64_t lg = ((uint64_t)b << 32) + t->log2[i] + (((t->log2[i + 1] - t->log2[i]) * r) >> 24);
	uint64_t e = lg * milli / 1000; /* s x log2(rank), Q32 */
	uint64_t whole = e >> 32, frac = e & 0xffffffffULL;
	uint64_t j = frac >> 24, s = frac & 0xffffff;
	uint64_t w = t->exp2[j] - ((t->exp2[j] - t->exp2[j + 1]) >> 24) * s;

	if (whole >= 62)
		return 0;
	return (w >> whole) >> WEIGHT_SHIFT;
}

static uint32_t guide_bits(uint32_t n)
{
	uint32_t g = 0;

	while ((1u << g) < n)
		g++;
	return g;
}

uint64_t tg_zipf_mem(uint32_t n)
{
	return sizeof(struct tables) + 12ULL * n + 4ULL * (1ULL << guide_bits(n));
}

void tg_zipf_build(struct tg_zipf *z, uint32_t n, uint32_t milli, void *mem)
{
	struct tables *t = mem;
	uint64_t *sum = (uint64_t *)(t + 1); /* scratch: weight of ranks before r */
	uint32_t g = guide_bits(n), k = 0;
	uint64_t total, acc = 0;
	unsigned sh = 0;

	tables_init(t);
	for (uint32_t r = 0; r < n; r++) {
		sum[r] = acc;
		acc += weight(t, r + 1, milli);
	}
	total = acc;
	while ((total >> sh) > 0xffffffffULL)
		sh++;
	z->cdf = (uint32_t *)(sum + n);
	for (uint32_t r = 0; r < n; r++) {
		uint64_t c = ((sum[r] >> sh) << 32) / (total >> sh);

		z->cdf[r] = c > 0xffffffffULL ? 0xffffffffu : (uint32_t)c;
	}
	z->n = n;
	z->gshift = 32 - g;
	z->guide = z->cdf + n;
	for (uint64_t b = 0; b < 1ULL << g; b++) {
		while (k + 1 < n && z->cdf[k + 1] <= b << z->gshift)
			k++;
		z->guide[b] = k;
	}
}

uint32_t tg_zipf_pick_ext(const struct tg_zipf *z, uint32_t a, uint32_t r)
{
	return tg_zipf_pick(z, a, tg_zipf_total(z, a), r);
}
