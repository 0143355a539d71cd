/* SPDX-License-Identifier: GPL-2.0 */
/*
 * union perf_mem_data_src (PERF_SAMPLE_DATA_SRC of a precise sample) ->
 * where the access was served from. The same rules as
 * profiler/src/sampler/pmu/data_src.rs; the Rust tests read the constants
 * below from this file and compare them with data_src.rs, and run this
 * decoder (through pmu_account_test, BPF_PROG_TEST_RUN) against
 * data_src::decode over a sweep of encodings.
 *
 * mem_lvl_num wins: RAM -> dram (remote bit or hops >= HOPS_1 -> remote),
 * PMEM -> pmem, CXL -> cxl, caches -> cache, IO, UNC; NA or 0 falls back to
 * the old mem_lvl HIT bits.
 */
#ifndef PMU_DATA_SRC_H
#define PMU_DATA_SRC_H

/* Field positions (include/uapi/linux/perf_event.h). */
#define PMU_DS_LVL_SHIFT 5
#define PMU_DS_LVL_BITS 14
#define PMU_DS_LVLNUM_SHIFT 33
#define PMU_DS_LVLNUM_BITS 4
#define PMU_DS_REMOTE_SHIFT 37
#define PMU_DS_HOPS_SHIFT 43
#define PMU_DS_HOPS_BITS 3

/* mem_lvl (legacy). */
#define PMU_DS_LVL_HIT 0x02
#define PMU_DS_LVL_L1 0x08
#define PMU_DS_LVL_LFB 0x10
#define PMU_DS_LVL_L2 0x20
#define PMU_DS_LVL_L3 0x40
#define PMU_DS_LVL_LOC_RAM 0x80
#define PMU_DS_LVL_REM_RAM1 0x100
#define PMU_DS_LVL_REM_RAM2 0x200
#define PMU_DS_LVL_REM_CCE1 0x400
#define PMU_DS_LVL_REM_CCE2 0x800
#define PMU_DS_LVL_IO 0x1000
#define PMU_DS_LVL_UNC 0x2000

/* mem_lvl_num. */
#define PMU_DS_LVLNUM_L1 0x01
#define PMU_DS_LVLNUM_L2 0x02
#define PMU_DS_LVLNUM_L3 0x03
#define PMU_DS_LVLNUM_L4 0x04
#define PMU_DS_LVLNUM_L2_MHB 0x05
#define PMU_DS_LVLNUM_MSC 0x06
#define PMU_DS_LVLNUM_UNC 0x08
#define PMU_DS_LVLNUM_CXL 0x09
#define PMU_DS_LVLNUM_IO 0x0a
#define PMU_DS_LVLNUM_ANY_CACHE 0x0b
#define PMU_DS_LVLNUM_LFB 0x0c
#define PMU_DS_LVLNUM_RAM 0x0d
#define PMU_DS_LVLNUM_PMEM 0x0e
#define PMU_DS_LVLNUM_NA 0x0f

#define PMU_DS_HOPS_1 0x02

/*
 * Decoded source. 1..4 are tier kinds and equal tier.v1 TierKind
 * (DRAM 1, PMEM 2, CXL 3, REMOTE 4), so they index per-VM kind maps.
 */
#define PMU_SRC_UNKNOWN 0
#define PMU_SRC_DRAM 1
#define PMU_SRC_PMEM 2
#define PMU_SRC_CXL 3
#define PMU_SRC_REMOTE 4
#define PMU_SRC_CACHE 5
#define PMU_SRC_IO 6
#define PMU_SRC_UNCACHED 7
/* Number of PMU_SRC_* values. */
#define PMU_SRC_COUNT 8

static __always_inline __u32 pmu_legacy_source(__u64 ds)
{
	__u64 lvl = (ds >> PMU_DS_LVL_SHIFT) & ((1ULL << PMU_DS_LVL_BITS) - 1);

	if (!(lvl & PMU_DS_LVL_HIT))
		return PMU_SRC_UNKNOWN;
	if (lvl & PMU_DS_LVL_LOC_RAM)
		return PMU_SRC_DRAM;
	if (lvl & (PMU_DS_LVL_REM_RAM1 | PMU_DS_LVL_REM_RAM2))
		return PMU_SRC_REMOTE;
	if (lvl & (PMU_DS_LVL_L1 | PMU_DS_LVL_LFB | PMU_DS_LVL_L2 | PMU_DS_LVL_L3 |
		   PMU_DS_LVL_REM_CCE1 | PMU_DS_LVL_REM_CCE2))
		return PMU_SRC_CACHE;
	if (lvl & PMU_DS_LVL_IO)
		return PMU_SRC_IO;
	if (lvl & PMU_DS_LVL_UNC)
		return PMU_SRC_UNCACHED;
	return PMU_SRC_UNKNOWN;
}

/* One of PMU_SRC_*. */
static __always_inline __u32 pmu_data_src_source(__u64 ds)
{
	__u64 lvl_num = (ds >> PMU_DS_LVLNUM_SHIFT) & ((1ULL << PMU_DS_LVLNUM_BITS) - 1);
	__u64 hops = (ds >> PMU_DS_HOPS_SHIFT) & ((1ULL << PMU_DS_HOPS_BITS) - 1);
	int other_node = ((ds >> PMU_DS_REMOTE_SHIFT) & 1) || hops >= PMU_DS_HOPS_1;

	switch (lvl_num) {
	case PMU_DS_LVLNUM_RAM:
		return other_node ? PMU_SRC_REMOTE : PMU_SRC_DRAM;
	case PMU_DS_LVLNUM_PMEM:
		return PMU_SRC_PMEM;
	case PMU_DS_LVLNUM_CXL:
		return PMU_SRC_CXL;
	case PMU_DS_LVLNUM_L1:
	case PMU_DS_LVLNUM_L2:
	case PMU_DS_LVLNUM_L3:
	case PMU_DS_LVLNUM_L4:
	case PMU_DS_LVLNUM_L2_MHB:
	case PMU_DS_LVLNUM_MSC:
	case PMU_DS_LVLNUM_ANY_CACHE:
	case PMU_DS_LVLNUM_LFB:
		return PMU_SRC_CACHE;
	case PMU_DS_LVLNUM_IO:
		return PMU_SRC_IO;
	case PMU_DS_LVLNUM_UNC:
		return PMU_SRC_UNCACHED;
	case 0:
	case PMU_DS_LVLNUM_NA:
		return pmu_legacy_source(ds);
	default:
		return PMU_SRC_UNKNOWN;
	}
}

#endif /* PMU_DATA_SRC_H */
