/* Minimal polled virtio-pci (modern) transport and split virtqueues. */
#ifndef TG_VIRTIO_H
#define TG_VIRTIO_H

#include <stdint.h>

#include "pci.h"

#define VIRTIO_STATUS_ACKNOWLEDGE 1
#define VIRTIO_STATUS_DRIVER 2
#define VIRTIO_STATUS_DRIVER_OK 4
#define VIRTIO_STATUS_FEATURES_OK 8
#define VIRTIO_STATUS_NEEDS_RESET 0x40
#define VIRTIO_STATUS_FAILED 0x80
#define VIRTIO_MSI_NO_VECTOR 0xffff

/* Entries per queue we use (the device offers 128; we never need more). */
#define VQ_SIZE 32
/* vq_setup's one-page layout: descriptors at 0, avail at 512, used at 2048. */
_Static_assert(VQ_SIZE * 16 <= 512 && 6 + 2 * VQ_SIZE <= 1536 && 6 + 8 * VQ_SIZE <= 2048,
	       "VQ_SIZE does not fit the one-page ring layout");

struct vring_desc {
	uint64_t addr;
	uint32_t len;
	uint16_t flags;
	uint16_t next;
};

struct vq {
	uint16_t index;
	uint16_t size;
	uint16_t avail_idx; /* next avail slot we publish */
	uint16_t last_used; /* used entries consumed so far */
	volatile struct vring_desc *desc;
	volatile uint16_t *avail; /* flags, idx, ring[size] */
	volatile uint16_t *used;  /* flags, idx, then {u32 id, u32 len}[size] */
	uint64_t notify;
};

struct vdev {
	struct pci_fn pci;
	uint64_t common;
	uint64_t notify;
	uint32_t notify_mult;
	uint64_t isr;
	uint64_t device;
	uint32_t device_len;
};

/* Find the virtio capabilities of `pci`, map them; 0 on success. */
int vdev_probe(struct vdev *d, struct pci_fn pci);
void vdev_status(struct vdev *d, uint8_t status);
uint8_t vdev_get_status(struct vdev *d);
uint64_t vdev_features(struct vdev *d);
void vdev_set_features(struct vdev *d, uint64_t f);
uint8_t vdev_generation(struct vdev *d);
uint32_t vdev_cfg_r32(struct vdev *d, uint32_t off);
void vdev_cfg_w32(struct vdev *d, uint32_t off, uint32_t v);
/* Set up and enable queue `index` in the page at `mem` (zeroed here). */
int vq_setup(struct vdev *d, struct vq *q, uint16_t index, void *mem);
/* Put buffer [addr, addr+len) in descriptor `id` and make it available. */
void vq_post(struct vq *q, uint16_t id, uint64_t addr, uint32_t len, int device_writes);
/* A two-descriptor chain in descriptors `id` and `id + 1`: [out, out+olen)
 * for the device to read, then [in, in+ilen) for it to write. */
void vq_post_chain(struct vq *q, uint16_t id, uint64_t out, uint32_t olen, uint64_t in,
		   uint32_t ilen);
void vq_kick(struct vq *q);
/* Used entries not consumed yet; vq_consume() takes one, returns its id. */
uint16_t vq_pending(struct vq *q);
uint16_t vq_consume(struct vq *q);
/* Spin until `n` used entries are pending; 0, or -1 after ~`spins` polls. */
int vq_wait(struct vq *q, uint16_t n, uint64_t spins);

#endif
