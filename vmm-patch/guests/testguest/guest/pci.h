/* PCI configuration access through ports 0xcf8/0xcfc (bus 0 is enough here). */
#ifndef TG_PCI_H
#define TG_PCI_H

#include <stdint.h>

struct pci_fn {
	uint8_t bus, dev, fn;
};

uint32_t pci_read32(struct pci_fn f, uint8_t off);
void pci_write32(struct pci_fn f, uint8_t off, uint32_t v);
uint8_t pci_read8(struct pci_fn f, uint8_t off);
/* Scan bus 0 for vendor:device; 0 when found. */
int pci_find(uint16_t vendor, uint16_t device, struct pci_fn *out);
/* Address of memory BAR `bar` (64-bit BARs span two slots). */
uint64_t pci_bar(struct pci_fn f, unsigned bar);
/* Enable memory decoding and bus mastering. */
void pci_enable(struct pci_fn f);

#endif
