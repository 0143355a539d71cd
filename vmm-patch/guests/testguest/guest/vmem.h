/*
 * Polled driver for a virtio-mem device (virtio 1.2, section 5.15 "Memory
 * Device"), as cloud-hypervisor v53.0 offers one per memory zone with
 * `hotplug_size` and `hotplug_method=virtio-mem`.
 */
#ifndef TG_VMEM_H
#define TG_VMEM_H

#include <stdint.h>

#include "mem.h"

/* PCI identity: virtio-pci modern, device type 24 (memory device). */
#define VIRTIO_MEM_PCI_DEVICE_ID 0x1058

/* Feature bits. */
#define VIRTIO_MEM_F_ACPI_PXM 0
#define VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE 1

/* Config space (all little-endian). */
#define VIRTIO_MEM_CFG_BLOCK_SIZE 0x00
#define VIRTIO_MEM_CFG_NODE_ID 0x08
#define VIRTIO_MEM_CFG_ADDR 0x10
#define VIRTIO_MEM_CFG_REGION_SIZE 0x18
#define VIRTIO_MEM_CFG_USABLE_REGION_SIZE 0x20
#define VIRTIO_MEM_CFG_PLUGGED_SIZE 0x28
#define VIRTIO_MEM_CFG_REQUESTED_SIZE 0x30
#define VIRTIO_MEM_CFG_SIZE 0x38

/* Requests and responses on the one queue. */
#define VIRTIO_MEM_REQ_PLUG 0
#define VIRTIO_MEM_REQ_UNPLUG 1
#define VIRTIO_MEM_REQ_UNPLUG_ALL 2
#define VIRTIO_MEM_REQ_STATE 3
#define VIRTIO_MEM_RESP_ACK 0
#define VIRTIO_MEM_RESP_NACK 1
#define VIRTIO_MEM_RESP_BUSY 2
#define VIRTIO_MEM_RESP_ERROR 3
#define VIRTIO_MEM_STATE_PLUGGED 0
#define VIRTIO_MEM_STATE_UNPLUGGED 1
#define VIRTIO_MEM_STATE_MIXED 2

/*
 * Driver behaviour (`virtio_mem=` on the command line):
 * ON follows requested_size; OFF leaves the device alone (as a guest
 * without the driver); MUTE initialises the device but never sends a
 * request; ERROR sends malformed plug/unplug requests (outside the usable
 * region), which the device answers with ERROR, so nothing is ever plugged.
 */
enum tg_vmem_mode { TG_VMEM_ON = 0, TG_VMEM_OFF = 1, TG_VMEM_MUTE = 2, TG_VMEM_ERROR = 3 };

/* Find and initialise the device up to FEATURES_OK, fill *vr (size 0 when
 * there is no device or mode is OFF). Returns 1 when a device is driven. */
int vmem_probe(unsigned mode, struct tg_vmem_region *vr);
/* Reserved memory vmem_start needs. */
uint64_t vmem_mem_need(void);
/* Set up the queue, DRIVER_OK, unplug what an earlier boot left plugged. */
void vmem_start(void);
/* Follow requested_size (bounded work per call); `sec`: guest seconds. */
void vmem_poll(uint64_t sec);
/* Bytes plugged by the driver's own accounting. */
uint64_t vmem_plugged(void);

#endif
