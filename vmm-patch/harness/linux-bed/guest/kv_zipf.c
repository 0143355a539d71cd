/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kv_zipf: a skewed key-value workload for the Linux bed's fidelity rows
 * (benches/README.md, "Fidelity on real Linux"). An open-addressing hash
 * table of N keys with V-byte values; each operation picks a key by Zipf
 * popularity (exponent S, ranks scattered over the table by a hash so hot
 * keys do not share pages), then GETs it (reads the value, sums it) or,
 * one time in ten, SETs it (rewrites the value). Runs T seconds, then
 * prints ops and the sum. Debian's redis-benchmark and sysbench draw keys
 * uniformly; this is the skewed one. Static C, -O2: under TCG with the
 * truth plugin every guest instruction costs, so the loop stays small.
 *
 * usage: kv_zipf KEYS ZIPF_S SECONDS [VALUE_BYTES]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct slot {
	uint64_t key;
	unsigned char *val;
};

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return x;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: kv_zipf KEYS ZIPF_S SECONDS [VALUE_BYTES]\n");
		return 2;
	}
	size_t keys = strtoull(argv[1], NULL, 10);
	double s = strtod(argv[2], NULL);
	double secs = strtod(argv[3], NULL);
	size_t vbytes = argc > 4 ? strtoull(argv[4], NULL, 10) : 128;
	if (keys < 2 || vbytes < 8)
		return 2;
	size_t cap = 1;
	while (cap < keys * 2)
		cap <<= 1;
	struct slot *table = calloc(cap, sizeof *table);
	double *cdf = malloc(keys * sizeof *cdf);
	/* Values in one arena, in insertion order of a random permutation. */
	unsigned char *arena = malloc(keys * vbytes);
	if (!table || !cdf || !arena)
		return 1;
	double z = 0;
	for (size_t i = 0; i < keys; i++)
		z += pow((double)(i + 1), -s);
	double acc = 0;
	for (size_t i = 0; i < keys; i++) {
		acc += pow((double)(i + 1), -s) / z;
		cdf[i] = acc;
	}
	for (size_t i = 0; i < keys; i++) {
		uint64_t k = mix(i + 1);
		size_t h = k & (cap - 1);
		while (table[h].val)
			h = (h + 1) & (cap - 1);
		table[h].key = k;
		/* Rank i's value lands at a scattered place in the arena. */
		table[h].val = arena + (mix(i ^ 0x5bd1e995) % keys) * vbytes;
		memset(table[h].val, (int)i, vbytes);
	}
	uint64_t ops = 0, sum = 0;
	double end = now() + secs;
	while (1) {
		if ((ops & 1023) == 0 && now() >= end)
			break;
		double u = (double)(next() >> 11) * (1.0 / 9007199254740992.0);
		size_t lo = 0, hi = keys - 1;
		while (lo < hi) {
			size_t mid = (lo + hi) / 2;
			if (cdf[mid] < u)
				lo = mid + 1;
			else
				hi = mid;
		}
		uint64_t k = mix(lo + 1);
		size_t h = k & (cap - 1);
		while (table[h].key != k)
			h = (h + 1) & (cap - 1);
		unsigned char *v = table[h].val;
		if (next() % 10 == 0) {
			memset(v, (int)ops, vbytes);
		} else {
			for (size_t b = 0; b < vbytes; b += 8)
				sum += *(uint64_t *)(v + b);
		}
		ops++;
	}
	printf("kv_zipf keys=%zu s=%.2f ops=%llu sum=%llu\n", keys, s,
	       (unsigned long long)ops, (unsigned long long)sum);
	return 0;
}
