/* SRAT memory affinity (acpi.h), ACPI 6.x layouts. */
#include "acpi.h"

#include "console.h"

#define SDT_HEADER 36
#define SRAT_ENTRIES 48 /* header + revision (4) + reserved (8) */
#define SRAT_MEMORY 1
#define SRAT_MEMORY_LEN 40
#define SRAT_MEM_ENABLED 1u
#define SRAT_MEM_HOTPLUGGABLE 2u

/* Tables are byte-packed: read fields a byte at a time. */
static uint64_t rd(uint64_t addr, unsigned bytes)
{
	uint64_t v = 0;

	for (unsigned i = bytes; i-- > 0;)
		v = v << 8 | *(const volatile uint8_t *)(addr + i);
	return v;
}

static int sig_is(uint64_t addr, const char *sig, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		if (*(const volatile uint8_t *)(addr + i) != (uint8_t)sig[i])
			return 0;
	return 1;
}

/* The SRAT's address from the XSDT (revision >= 2) or RSDT, 0 if none. */
static uint64_t find_srat(uint64_t rsdp)
{
	uint64_t sdt, len;
	unsigned entry;

	if (!sig_is(rsdp, "RSD PTR ", 8))
		return 0;
	if (rd(rsdp + 15, 1) >= 2 && rd(rsdp + 24, 8)) {
		sdt = rd(rsdp + 24, 8);
		entry = 8;
	} else {
		sdt = rd(rsdp + 16, 4);
		entry = 4;
	}
	if (!sdt)
		return 0;
	len = rd(sdt + 4, 4);
	for (uint64_t off = SDT_HEADER; off + entry <= len; off += entry) {
		uint64_t t = rd(sdt + off, entry);

		if (t && sig_is(t, "SRAT", 4))
			return t;
	}
	return 0;
}

unsigned acpi_srat_memory(uint64_t rsdp, struct tg_numa_range *out, unsigned max)
{
	uint64_t srat, len;
	unsigned n = 0;

	if (!rsdp || !(srat = find_srat(rsdp)))
		return 0;
	len = rd(srat + 4, 4);
	for (uint64_t off = SRAT_ENTRIES; off + 2 <= len;) {
		unsigned type = (unsigned)rd(srat + off, 1), elen = (unsigned)rd(srat + off + 1, 1);
		uint32_t flags;

		if (elen < 2 || off + elen > len)
			break; /* malformed: stop rather than loop */
		if (type == SRAT_MEMORY && elen >= SRAT_MEMORY_LEN) {
			flags = (uint32_t)rd(srat + off + 28, 4);
			if ((flags & SRAT_MEM_ENABLED) && rd(srat + off + 16, 8)) {
				if (n == max) {
					con_printf("tg acpi srat: more than %u memory ranges, the rest ignored\n",
						   max);
					break;
				}
				out[n].node = (uint32_t)rd(srat + off + 2, 4);
				out[n].base = rd(srat + off + 8, 8);
				out[n].size = rd(srat + off + 16, 8);
				out[n].hotpluggable = !!(flags & SRAT_MEM_HOTPLUGGABLE);
				n++;
			}
		}
		off += elen;
	}
	return n;
}
