/*
 * Host-only: sizes and offsets of the structs the Rust crate mirrors
 * (src/wire.rs, src/params.rs), so that a layout mismatch fails a test
 * instead of corrupting memory.
 */
#include <stddef.h>

#include "../guest/cmdline.h"
#include "../guest/proto.h"
#include "../guest/zipf.h"

size_t tg_abi_layout(unsigned which)
{
	switch (which) {
	case 0:
		return sizeof(struct tg_tier_cfg);
	case 1:
		return sizeof(struct tg_balloon_cfg);
	case 2:
		return sizeof(struct tg_tier_stats);
	case 3:
		return sizeof(struct tg_phase);
	case 4:
		return sizeof(struct tg_params);
	case 5:
		return offsetof(struct tg_params, err);
	case 6:
		return offsetof(struct tg_params, seed);
	case 7:
		return offsetof(struct tg_balloon_cfg, tier);
	case 8:
		return sizeof(struct tg_truth);
	case 9:
		return offsetof(struct tg_truth, seconds);
	case 10:
		return offsetof(struct tg_truth, phase);
	case 11:
		return offsetof(struct tg_params, zipf);
	case 12:
		return sizeof(struct tg_zipf);
	case 13:
		return offsetof(struct tg_params, deaf);
	case 14:
		return offsetof(struct tg_params, lie);
	case 15:
		return offsetof(struct tg_truth, lost);
	case 16:
		return (size_t)TG_CANARY;
	case 17:
		return TG_CANARY_OFFSET;
	case 18:
		return offsetof(struct tg_truth, stamp_gpa);
	default:
		return 0;
	}
}
