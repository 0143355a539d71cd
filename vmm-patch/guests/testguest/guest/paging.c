/*
 * Identity mapping with 2 MiB pages. boot.S maps the low 4 GiB; this adds
 * mappings above it from a small pool of table pages.
 */
#include "paging.h"

#include "arch.h"
#include "console.h"

#define PTE_P 0x1ULL
#define PTE_W 0x2ULL
#define PTE_PWT 0x8ULL
#define PTE_PCD 0x10ULL
#define PTE_PS 0x80ULL
#define ADDR_MASK 0x000ffffffffff000ULL
#define HUGE (2ULL << 20)
#define POOL_PAGES 32

extern uint64_t boot_pml4[512];

static uint64_t pool[POOL_PAGES][512] __attribute__((aligned(4096)));
static unsigned pool_used;

static uint64_t *next_table(uint64_t *entry)
{
	if (!(*entry & PTE_P)) {
		uint64_t *t;

		if (pool_used == POOL_PAGES)
			die("paging: out of table pages");
		t = pool[pool_used++];
		memset(t, 0, PAGE_SIZE);
		*entry = (uint64_t)t | PTE_P | PTE_W;
	}
	return (uint64_t *)(*entry & ADDR_MASK);
}

void map_identity(uint64_t start, uint64_t len, int mmio)
{
	uint64_t a = start & ~(HUGE - 1);
	uint64_t end = start + len;

	for (; a < end; a += HUGE) {
		uint64_t *pdpt = next_table(&boot_pml4[(a >> 39) & 511]);
		uint64_t *pd = next_table(&pdpt[(a >> 30) & 511]);
		uint64_t *pde = &pd[(a >> 21) & 511];
		uint64_t flags = PTE_P | PTE_W | PTE_PS | (mmio ? PTE_PCD | PTE_PWT : 0);

		if ((*pde & PTE_P) && (*pde & ADDR_MASK) == a && (*pde & flags) == flags)
			continue;
		*pde = a | flags;
		__asm__ volatile("invlpg (%0)" : : "r"(a) : "memory");
	}
}
