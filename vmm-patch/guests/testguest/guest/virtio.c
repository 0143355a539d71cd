/*
 * virtio-pci modern transport (virtio 1.x, section 4.1) and split
 * virtqueues (section 2.7), polled: MSI-X vectors are NO_VECTOR, interrupts
 * stay off, the driver reads the used rings and the config space itself.
 */
#include "virtio.h"

#include "arch.h"
#include "console.h"
#include "paging.h"

#define CAP_VENDOR 0x09
#define CAP_COMMON 1
#define CAP_NOTIFY 2
#define CAP_ISR 3
#define CAP_DEVICE 4

/* Common configuration registers. */
#define C_DFSELECT 0x00
#define C_DF 0x04
#define C_GFSELECT 0x08
#define C_GF 0x0c
#define C_MSIX 0x10
#define C_NUMQ 0x12
#define C_STATUS 0x14
#define C_GEN 0x15
#define C_Q_SELECT 0x16
#define C_Q_SIZE 0x18
#define C_Q_MSIX 0x1a
#define C_Q_ENABLE 0x1c
#define C_Q_NOFF 0x1e
#define C_Q_DESCLO 0x20
#define C_Q_DESCHI 0x24
#define C_Q_AVAILLO 0x28
#define C_Q_AVAILHI 0x2c
#define C_Q_USEDLO 0x30
#define C_Q_USEDHI 0x34

#define VIRTQ_AVAIL_F_NO_INTERRUPT 1
#define VIRTQ_DESC_F_NEXT 1
#define VIRTQ_DESC_F_WRITE 2

int vdev_probe(struct vdev *d, struct pci_fn pci)
{
	uint8_t p;
	unsigned found = 0;

	d->pci = pci;
	if (!(pci_read32(pci, 0x04) & (1u << 20)))
		return -1; /* no capability list */
	for (p = pci_read8(pci, 0x34) & 0xfc; p; p = pci_read8(pci, (uint8_t)(p + 1)) & 0xfc) {
		uint32_t w0 = pci_read32(pci, p);
		uint8_t type = (uint8_t)(w0 >> 24);
		uint64_t base, off, len;

		if ((w0 & 0xff) != CAP_VENDOR || type < CAP_COMMON || type > CAP_DEVICE)
			continue;
		base = pci_bar(pci, pci_read8(pci, (uint8_t)(p + 4)));
		off = pci_read32(pci, (uint8_t)(p + 8));
		len = pci_read32(pci, (uint8_t)(p + 12));
		map_identity(base + off, len, 1);
		switch (type) {
		case CAP_COMMON:
			d->common = base + off;
			break;
		case CAP_NOTIFY:
			d->notify = base + off;
			d->notify_mult = pci_read32(pci, (uint8_t)(p + 16));
			break;
		case CAP_ISR:
			d->isr = base + off;
			break;
		case CAP_DEVICE:
			d->device = base + off;
			d->device_len = (uint32_t)len;
			break;
		}
		found |= 1u << type;
	}
	if ((found & 0x1e) != 0x1e)
		return -1;
	pci_enable(pci);
	return 0;
}

void vdev_status(struct vdev *d, uint8_t status)
{
	mmio_w8(d->common + C_STATUS, status);
}

uint8_t vdev_get_status(struct vdev *d)
{
	return mmio_r8(d->common + C_STATUS);
}

uint64_t vdev_features(struct vdev *d)
{
	uint64_t f;

	mmio_w32(d->common + C_DFSELECT, 0);
	f = mmio_r32(d->common + C_DF);
	mmio_w32(d->common + C_DFSELECT, 1);
	return f | (uint64_t)mmio_r32(d->common + C_DF) << 32;
}

void vdev_set_features(struct vdev *d, uint64_t f)
{
	mmio_w32(d->common + C_GFSELECT, 0);
	mmio_w32(d->common + C_GF, (uint32_t)f);
	mmio_w32(d->common + C_GFSELECT, 1);
	mmio_w32(d->common + C_GF, (uint32_t)(f >> 32));
}

uint8_t vdev_generation(struct vdev *d)
{
	return mmio_r8(d->common + C_GEN);
}

uint32_t vdev_cfg_r32(struct vdev *d, uint32_t off)
{
	return mmio_r32(d->device + off);
}

void vdev_cfg_w32(struct vdev *d, uint32_t off, uint32_t v)
{
	mmio_w32(d->device + off, v);
}

int vq_setup(struct vdev *d, struct vq *q, uint16_t index, void *mem)
{
	uint64_t base = (uint64_t)mem;
	uint16_t max;

	mmio_w16(d->common + C_Q_SELECT, index);
	max = mmio_r16(d->common + C_Q_SIZE);
	if (max == 0)
		return -1;
	memset(mem, 0, PAGE_SIZE);
	q->index = index;
	q->size = max < VQ_SIZE ? max : VQ_SIZE;
	q->avail_idx = 0;
	q->last_used = 0;
	/* One page: descriptors at 0, avail ring at 512, used ring at 2048. */
	q->desc = (volatile struct vring_desc *)base;
	q->avail = (volatile uint16_t *)(base + 512);
	q->used = (volatile uint16_t *)(base + 2048);
	q->avail[0] = VIRTQ_AVAIL_F_NO_INTERRUPT;
	q->notify = d->notify + (uint64_t)mmio_r16(d->common + C_Q_NOFF) * d->notify_mult;
	mmio_w16(d->common + C_Q_SIZE, q->size);
	mmio_w16(d->common + C_Q_MSIX, VIRTIO_MSI_NO_VECTOR);
	mmio_w32(d->common + C_Q_DESCLO, (uint32_t)base);
	mmio_w32(d->common + C_Q_DESCHI, (uint32_t)(base >> 32));
	mmio_w32(d->common + C_Q_AVAILLO, (uint32_t)(base + 512));
	mmio_w32(d->common + C_Q_AVAILHI, (uint32_t)((base + 512) >> 32));
	mmio_w32(d->common + C_Q_USEDLO, (uint32_t)(base + 2048));
	mmio_w32(d->common + C_Q_USEDHI, (uint32_t)((base + 2048) >> 32));
	mmio_w16(d->common + C_Q_ENABLE, 1);
	return 0;
}

void vq_post(struct vq *q, uint16_t id, uint64_t addr, uint32_t len, int device_writes)
{
	q->desc[id].addr = addr;
	q->desc[id].len = len;
	q->desc[id].flags = device_writes ? VIRTQ_DESC_F_WRITE : 0;
	q->desc[id].next = 0;
	q->avail[2 + q->avail_idx % q->size] = id;
	mb();
	q->avail_idx++;
	q->avail[1] = q->avail_idx;
}

void vq_post_chain(struct vq *q, uint16_t id, uint64_t out, uint32_t olen, uint64_t in,
		   uint32_t ilen)
{
	q->desc[id].addr = out;
	q->desc[id].len = olen;
	q->desc[id].flags = VIRTQ_DESC_F_NEXT;
	q->desc[id].next = (uint16_t)(id + 1);
	q->desc[id + 1].addr = in;
	q->desc[id + 1].len = ilen;
	q->desc[id + 1].flags = VIRTQ_DESC_F_WRITE;
	q->desc[id + 1].next = 0;
	q->avail[2 + q->avail_idx % q->size] = id;
	mb();
	q->avail_idx++;
	q->avail[1] = q->avail_idx;
}

void vq_kick(struct vq *q)
{
	mb();
	mmio_w16(q->notify, q->index);
}

uint16_t vq_pending(struct vq *q)
{
	uint16_t idx = q->used[1];

	mb();
	return (uint16_t)(idx - q->last_used);
}

uint16_t vq_consume(struct vq *q)
{
	volatile uint32_t *ring = (volatile uint32_t *)(q->used + 2);
	uint16_t id = (uint16_t)ring[2 * (q->last_used % q->size)];

	q->last_used++;
	return id;
}

int vq_wait(struct vq *q, uint16_t n, uint64_t spins)
{
	while (vq_pending(q) < n) {
		if (spins-- == 0)
			return -1;
		cpu_relax();
	}
	return 0;
}
