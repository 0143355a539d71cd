//! The Linux bed: Debian's own cloud kernels booted under QEMU TCG (no KVM
//! needed) with two NUMA nodes in two memory tiers (HMAT), virtio-mem per
//! node, virtio-balloon and QMP, running host-built programs from an
//! initramfs. docs/linux-bed.md says what it proves and what it cannot.

pub mod truth;
