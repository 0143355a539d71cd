/*
 * The guest's NUMA layout from ACPI, as Linux reads it: the SRAT's memory
 * affinity entries, reached through the RSDP that PVH's start_info carries.
 * Used when no per-tier balloon says where the tiers are (a stock VMM with
 * virtio-mem zones and `--numa`).
 */
#ifndef TG_ACPI_H
#define TG_ACPI_H

#include <stdint.h>

struct tg_numa_range {
	uint64_t base, size;
	uint32_t node;
	uint32_t hotpluggable;
};

/*
 * Up to `max` enabled memory affinity ranges of the SRAT under the RSDP at
 * `rsdp` (0: none) into `out`; their number, 0 without a RSDP or SRAT.
 */
unsigned acpi_srat_memory(uint64_t rsdp, struct tg_numa_range *out, unsigned max);

#endif
