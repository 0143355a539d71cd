/* PCI configuration mechanism #1 (ports 0xcf8/0xcfc). */
#include "pci.h"

#include "arch.h"

static uint32_t addr(struct pci_fn f, uint8_t off)
{
	return 0x80000000u | (uint32_t)f.bus << 16 | (uint32_t)f.dev << 11 | (uint32_t)f.fn << 8 |
	       (off & 0xfc);
}

uint32_t pci_read32(struct pci_fn f, uint8_t off)
{
	outl(0xcf8, addr(f, off));
	return inl(0xcfc);
}

void pci_write32(struct pci_fn f, uint8_t off, uint32_t v)
{
	outl(0xcf8, addr(f, off));
	outl(0xcfc, v);
}

uint8_t pci_read8(struct pci_fn f, uint8_t off)
{
	return (uint8_t)(pci_read32(f, off) >> (8 * (off & 3)));
}

int pci_find(uint16_t vendor, uint16_t device, struct pci_fn *out)
{
	struct pci_fn f = {0, 0, 0};

	for (f.dev = 0; f.dev < 32; f.dev++) {
		uint32_t id = pci_read32(f, 0);

		if ((id & 0xffff) == vendor && (id >> 16) == device) {
			*out = f;
			return 0;
		}
	}
	return -1;
}

uint64_t pci_bar(struct pci_fn f, unsigned bar)
{
	uint8_t off = (uint8_t)(0x10 + 4 * bar);
	uint32_t lo = pci_read32(f, off);
	uint64_t a = lo & ~0xfu;

	if ((lo & 0x6) == 0x4)
		a |= (uint64_t)pci_read32(f, (uint8_t)(off + 4)) << 32;
	return a;
}

void pci_enable(struct pci_fn f)
{
	/* Command register (low half); writing 0 to the status half changes nothing. */
	pci_write32(f, 0x04, (pci_read32(f, 0x04) & 0xffff) | 0x6);
}
