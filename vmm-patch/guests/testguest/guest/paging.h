/* Identity mapping beyond the boot-time low 4 GiB (high RAM, 64-bit BARs). */
#ifndef TG_PAGING_H
#define TG_PAGING_H

#include <stdint.h>

/* Identity-map [start, start + len) with 2 MiB pages; `mmio` = uncached. */
void map_identity(uint64_t start, uint64_t len, int mmio);

#endif
