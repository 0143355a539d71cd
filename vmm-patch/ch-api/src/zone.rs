//! Per-tier reclaim through a virtio-mem memory zone (docs/virtio-mem.md): the
//! controller's balloon-style target ("bytes taken from the tier") mapped
//! onto cloud-hypervisor's `vm.resize-zone {"id", "desired_ram"}`.
//!
//! A zone declared with `hotplug_size` under `hotplug_method=virtio-mem`
//! has a boot part (`size`, never movable: `resize_zone` refuses a
//! `desired_ram` below it) and a hot-pluggable region of `hotplug_size`
//! bytes, of which the guest's virtio_mem driver plugs what is requested,
//! in device blocks (2 MiB by default; Linux onlines and offlines in
//! 128 MiB memory blocks, so a small unplug may wait for a whole one to
//! empty). As the controller sees it the tier is `boot + hotplug_size`
//! bytes, of which at most `hotplug_size` can be taken:
//! target = `hotplug_size - requested`, actual = `hotplug_size - plugged`.

use crate::ch::VmInfo;

/// virtio-mem block size when the VMM does not say (cloud-hypervisor's
/// default, `VIRTIO_MEM_DEFAULT_BLOCK_SIZE`).
pub const DEFAULT_BLOCK: u64 = 2 << 20;

/// Linux's memory block (x86_64 `memory_block_size_bytes()` on small
/// guests): hot-plugged memory is onlined and offlined in these.
pub const LINUX_MEMORY_BLOCK: u64 = 128 << 20;

/// One resizable zone as the controller drives it, bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResizableZone {
    pub id: String,
    /// Boot size (`--memory-zone size=`).
    pub boot: u64,
    /// The hot-pluggable region (`hotplug_size`).
    pub hotplug: u64,
    /// Device block size (plug/unplug granularity).
    pub block: u64,
    /// Requested now (last `vm.resize-zone` minus `boot`).
    pub requested: u64,
    /// What the guest has plugged: `None` from a VMM without vmm-patch
    /// 0009 (upstream `vm.info` does not say).
    pub plugged: Option<u64>,
    /// Upstream: what the guest has plugged as `memory_actual_size` tells
    /// it (boot sizes + every virtio-mem device's plugged size, so only
    /// with one hot-pluggable zone and no balloon); `None` otherwise. For
    /// the host DRAM budget: memory a guest never unplugs stays counted.
    pub plugged_total: Option<u64>,
}

impl ResizableZone {
    /// Zone `id` of a `vm.info`, if it has a hot-pluggable virtio-mem part:
    /// from `memory_zones[].virtio_mem` (vmm-patch 0009) when reported,
    /// else from `config.memory.zones[]` (`hotplug_size`,
    /// `hotplugged_size`: upstream; the plugged size is then unknown).
    pub fn of(info: &VmInfo, id: &str) -> Option<ResizableZone> {
        let cfg = info.zone_configs().iter().find(|z| z.id == id);
        let reported = info
            .memory_zones
            .as_deref()
            .and_then(|zs| zs.iter().find(|z| z.id == id));
        if let Some(z) = reported
            && let Some(vm) = z.virtio_mem
        {
            let ranges = z.ranges.iter().fold(0u64, |n, r| n.saturating_add(r.size));
            return Some(ResizableZone {
                id: id.to_string(),
                boot: cfg.map_or(ranges, |c| c.size),
                hotplug: vm.size,
                block: if vm.block_size == 0 {
                    DEFAULT_BLOCK
                } else {
                    vm.block_size
                },
                requested: vm.requested_size,
                plugged: Some(vm.plugged_size),
                plugged_total: None,
            });
        }
        let c = cfg?;
        let hotplug = c.hotplug_size.filter(|&h| h > 0)?;
        if !info.virtio_mem_hotplug() {
            return None;
        }
        Some(ResizableZone {
            id: id.to_string(),
            boot: c.size,
            hotplug,
            block: DEFAULT_BLOCK,
            requested: c.hotplugged_size.unwrap_or(0).min(hotplug),
            plugged: None,
            plugged_total: info.upstream_plugged().map(|p| p.min(hotplug)),
        })
    }

    /// The tier's size as the controller sees it: boot + hot-pluggable.
    pub fn size(&self) -> u64 {
        self.boot.saturating_add(self.hotplug)
    }

    /// The most that can be taken (the hot-pluggable part, whole blocks).
    pub fn reach(&self) -> u64 {
        self.hotplug / self.block.max(1) * self.block.max(1)
    }

    /// The target in force, balloon-style: bytes not requested.
    pub fn target(&self) -> u64 {
        self.hotplug.saturating_sub(self.requested)
    }

    /// Balloon-style actual: bytes not plugged (`None` when unknown).
    pub fn actual(&self) -> Option<u64> {
        self.plugged.map(|p| self.hotplug.saturating_sub(p))
    }

    /// [`ResizableZone::actual`], else from `plugged_total` (upstream).
    pub fn actual_or_total(&self) -> Option<u64> {
        self.actual()
            .or_else(|| self.plugged_total.map(|p| self.hotplug.saturating_sub(p)))
    }

    /// `desired_ram` (the zone's total) for a target of `taken` bytes:
    /// size - taken, clamped to [boot, boot + hotplug], its hot-plugged
    /// part rounded to the block toward the size requested now (a grant
    /// rounds down, a cut up), so rounding never gives more than the
    /// controller granted nor takes more than it asked.
    pub fn desired_ram(&self, taken: u64) -> u64 {
        let block = self.block.max(1);
        let want = self
            .size()
            .saturating_sub(taken)
            .clamp(self.boot, self.size());
        let plug = want - self.boot;
        let plug = if plug >= self.requested {
            plug / block * block
        } else {
            plug.div_ceil(block) * block
        };
        self.boot + plug.min(self.reach())
    }

    /// The balloon-style target that `desired_ram` amounts to.
    pub fn target_of(&self, desired_ram: u64) -> u64 {
        self.size().saturating_sub(desired_ram)
    }

    /// The size requested now, as `desired_ram`.
    pub fn requested_ram(&self) -> u64 {
        self.boot.saturating_add(self.requested)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_vm_info;

    const M: u64 = 1 << 20;

    fn zone(requested: u64) -> ResizableZone {
        ResizableZone {
            id: "dram".into(),
            boot: 64 * M,
            hotplug: 256 * M,
            block: 2 * M,
            requested,
            plugged: Some(requested),
            plugged_total: None,
        }
    }

    #[test]
    fn target_maps_to_desired_ram_clamped_and_rounded_toward_the_request() {
        let z = zone(128 * M);
        assert_eq!(
            (z.size(), z.reach(), z.target()),
            (320 * M, 256 * M, 128 * M)
        );
        // Exact: take 100M -> 220M total.
        assert_eq!(z.desired_ram(100 * M), 220 * M);
        // Taking more than the hot-pluggable part stops at the boot size.
        assert_eq!(z.desired_ram(300 * M), 64 * M);
        assert_eq!(z.desired_ram(u64::MAX), 64 * M);
        // Taking nothing plugs everything.
        assert_eq!(z.desired_ram(0), 320 * M);
        // A grant (more than the 192M requested now) rounds down ...
        assert_eq!(z.desired_ram(100 * M + 4096), 218 * M);
        // ... a cut rounds up: never more taken than asked.
        let z = zone(200 * M);
        assert_eq!(z.desired_ram(200 * M + 4096), 120 * M);
        assert_eq!(z.target_of(z.desired_ram(200 * M + 4096)), 200 * M);
        // Less than a block away from the request: nothing to send.
        assert_eq!(z.desired_ram(z.target() + 4096), z.requested_ram());
        assert_eq!(z.desired_ram(z.target() - 4096), z.requested_ram());
    }

    #[test]
    fn an_unaligned_region_is_driven_in_whole_blocks() {
        let z = ResizableZone {
            hotplug: 255 * M,
            plugged: None,
            ..zone(0)
        };
        assert_eq!(z.reach(), 254 * M);
        assert_eq!(z.desired_ram(0), 64 * M + 254 * M);
        assert_eq!(z.actual(), None);
    }

    #[test]
    fn zones_come_from_0009_or_from_the_config() {
        let patched = parse_vm_info(
            br#"{"state":"Running","memory_zones":[{"id":"dram","host_numa_node":0,"guest_numa_node":0,
            "ranges":[{"start":0,"size":67108864,"host_address":140000000000}],
            "virtio_mem":{"start":4294967296,"size":268435456,"host_address":140100000000,
            "requested_size":134217728,"plugged_size":131072000,"block_size":2097152}},
            {"id":"slow","host_numa_node":0,"guest_numa_node":1,"ranges":[{"start":67108864,"size":134217728}]}],
            "config":{"memory":{"size":0,"hotplug_method":"VirtioMem","zones":[
            {"id":"dram","size":67108864,"hotplug_size":268435456,"hotplugged_size":134217728},
            {"id":"slow","size":134217728}]}}}"#,
        )
        .unwrap();
        let z = ResizableZone::of(&patched, "dram").unwrap();
        assert_eq!((z.boot, z.hotplug, z.requested), (64 * M, 256 * M, 128 * M));
        assert_eq!(z.plugged, Some(131_072_000));
        assert_eq!(z.actual(), Some(256 * M - 131_072_000));
        assert!(ResizableZone::of(&patched, "slow").is_none());
        assert!(ResizableZone::of(&patched, "none").is_none());

        // Upstream: no memory_zones; the config's sizes, plugged unknown.
        let upstream = parse_vm_info(
            br#"{"state":"Running","config":{"memory":{"size":0,"hotplug_method":"VirtioMem","zones":[
            {"id":"dram","size":67108864,"hotplug_size":268435456,"hotplugged_size":33554432}]}}}"#,
        )
        .unwrap();
        let z = ResizableZone::of(&upstream, "dram").unwrap();
        assert_eq!(
            (z.requested, z.plugged, z.block),
            (32 * M, None, DEFAULT_BLOCK)
        );
        assert_eq!(z.target(), 224 * M);
        // No memory_actual_size: nothing known of the plugged size.
        assert_eq!((z.plugged_total, z.actual_or_total()), (None, None));
        // With it (boot 64M + 16M plugged of the 32M requested, no
        // balloon, one hot-pluggable zone), the budget sees 16M plugged.
        let upstream = parse_vm_info(
            br#"{"state":"Running","memory_actual_size":83886080,"config":{"memory":{"size":0,"hotplug_method":"VirtioMem","zones":[
            {"id":"dram","size":67108864,"hotplug_size":268435456,"hotplugged_size":33554432}]}}}"#,
        )
        .unwrap();
        let z = ResizableZone::of(&upstream, "dram").unwrap();
        assert_eq!(z.plugged, None);
        assert_eq!(z.plugged_total, Some(16 * M));
        assert_eq!(z.actual_or_total(), Some(240 * M));
        // A balloon beside it makes the sum ambiguous: unknown again.
        let ballooned = parse_vm_info(
            br#"{"state":"Running","memory_actual_size":83886080,"config":{"balloon":{"size":0},"memory":{"size":0,"hotplug_method":"VirtioMem","zones":[
            {"id":"dram","size":67108864,"hotplug_size":268435456,"hotplugged_size":33554432}]}}}"#,
        )
        .unwrap();
        assert_eq!(
            ResizableZone::of(&ballooned, "dram").unwrap().plugged_total,
            None
        );
        // ACPI hot-plug is not virtio-mem: no zone resize tierd drives.
        let acpi = parse_vm_info(
            br#"{"state":"Running","config":{"memory":{"hotplug_method":"Acpi","zones":[
            {"id":"dram","size":67108864,"hotplug_size":268435456}]}}}"#,
        )
        .unwrap();
        assert!(ResizableZone::of(&acpi, "dram").is_none());
    }
}
