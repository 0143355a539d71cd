//! The tier map of a cloud-hypervisor VM, from its `vm.info`
//! `memory_zones` (vmm-patch 0003/0005) and the VMM's /proc files.
//!
//! Per zone (one tier each):
//! - name: the zone id; guest-physical ranges: `memory_zones[].ranges`;
//! - host virtual address of each range: `ranges[].host_address` (patch
//!   0005), checked against /proc/PID/maps; without it, the one read-write
//!   mapping of exactly the range's size, if exactly one exists (an
//!   unpatched-0005 VMM with `shared=on` or file-backed zones of distinct
//!   sizes); otherwise unknown (0), never guessed: anonymous zones of one
//!   VMM are usually merged into one VMA by the kernel, and equal-sized
//!   zones cannot be told apart by size;
//! - host NUMA nodes: the zone's `host_numa_node` and the `N<node>=` pages
//!   of its mappings in /proc/PID/numa_maps;
//! - kind: the `tier_kinds` override for the zone id; else, on a host with
//!   several memory tiers, the kernel's memory tier of the zone's node
//!   (the fastest tier is DRAM; a slower one keeps a non-DRAM kind from the
//!   name, else unknown); else the zone id when it names a kind.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

use tier_ch_api::{MemoryZone, VirtioMem, VmInfo, ZoneRange};
use tier_proto::v1::{GpaRange, Tier, TierHotplug, TierKind};

use crate::memtier::MemoryTiers;

/// One line of /proc/PID/maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapsVma {
    pub start: u64,
    pub end: u64,
    pub perms: String,
    /// Path or `[name]`; empty for anonymous memory.
    pub path: String,
}

impl MapsVma {
    fn writable(&self) -> bool {
        self.perms.starts_with("rw")
    }
}

/// Every VMA of a maps file, in address order.
pub fn parse_maps(maps: &str) -> Vec<MapsVma> {
    let mut out: Vec<MapsVma> = maps
        .lines()
        .filter_map(|l| {
            // range, perms, offset, dev, inode; the path is the rest.
            let mut fields = [""; 5];
            let mut rest = l;
            for f in fields.iter_mut() {
                rest = rest.trim_start();
                let (head, tail) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
                *f = head;
                rest = tail;
            }
            let (a, b) = fields[0].split_once('-')?;
            Some(MapsVma {
                start: u64::from_str_radix(a, 16).ok()?,
                end: u64::from_str_radix(b, 16).ok()?,
                perms: fields[1].to_string(),
                path: rest.trim().to_string(),
            })
        })
        .collect();
    out.sort_by_key(|v| v.start);
    out
}

/// True when [start, start+len) is covered, without gaps, by writable VMAs.
pub fn covered(vmas: &[MapsVma], start: u64, len: u64) -> bool {
    let Some(end) = start.checked_add(len) else {
        return false;
    };
    let mut at = start;
    for v in vmas.iter().filter(|v| v.end > start && v.start < end) {
        if v.start > at || !v.writable() {
            return false;
        }
        at = v.end;
        if at >= end {
            return true;
        }
    }
    len == 0
}

/// How the host address of one range was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hva {
    /// `host_address` from vm.info, inside the VMM's writable mappings.
    Reported(u64),
    /// The one writable mapping of the range's size (no `host_address`).
    BySize(u64),
    /// Unknown, with the reason.
    Unknown(String),
}

impl Hva {
    fn addr(&self) -> u64 {
        match self {
            Hva::Reported(a) | Hva::BySize(a) => *a,
            Hva::Unknown(_) => 0,
        }
    }
}

/// Host addresses of every range of every zone, in zone and range order.
pub fn host_addresses(zones: &[MemoryZone], vmas: &[MapsVma]) -> Vec<Vec<Hva>> {
    let mut taken: BTreeSet<u64> = BTreeSet::new();
    // Sizes asked for by ranges without a reported address: a size asked
    // twice cannot be matched by size.
    let mut wanted: HashMap<u64, usize> = HashMap::new();
    for r in zones.iter().flat_map(|z| &z.ranges) {
        if r.host_address.is_none() {
            *wanted.entry(r.size).or_default() += 1;
        }
    }
    zones
        .iter()
        .map(|z| {
            z.ranges
                .iter()
                .map(|r| match r.host_address {
                    Some(a) if covered(vmas, a, r.size) => Hva::Reported(a),
                    Some(a) => Hva::Unknown(format!(
                        "vm.info host_address {a:#x} (+{:#x}) is not mapped writable in /proc/PID/maps",
                        r.size
                    )),
                    None => {
                        let same: Vec<&MapsVma> = vmas
                            .iter()
                            .filter(|v| v.writable() && v.end - v.start == r.size)
                            .collect();
                        if wanted.get(&r.size).copied().unwrap_or(0) > 1 {
                            Hva::Unknown(format!(
                                "no host_address in vm.info (VMM without vmm-patch 0005) and several ranges of {} bytes: size cannot tell them apart",
                                r.size
                            ))
                        } else if same.len() == 1 && taken.insert(same[0].start) {
                            Hva::BySize(same[0].start)
                        } else {
                            Hva::Unknown(format!(
                                "no host_address in vm.info (VMM without vmm-patch 0005) and {} writable mappings of {} bytes in /proc/PID/maps (needs exactly 1; anonymous zones are often merged into one mapping)",
                                same.len(),
                                r.size
                            ))
                        }
                    }
                })
                .collect()
        })
        .collect()
}

/// Host NUMA nodes with pages in the VMAs overlapping [start, start+len),
/// from /proc/PID/numa_maps (lines keyed by VMA start).
fn numa_nodes_in(numa_maps: &str, vmas: &[MapsVma], start: u64, len: u64) -> BTreeSet<u32> {
    let end = start.saturating_add(len);
    vmas.iter()
        .filter(|v| v.start < end && v.end > start)
        .flat_map(|v| crate::discovery::numa_nodes(numa_maps, v.start))
        .collect()
}

/// Kind of a zone and why.
pub(crate) fn zone_kind(
    id: &str,
    nodes: &BTreeSet<u32>,
    overrides: &HashMap<String, TierKind>,
    memtiers: &MemoryTiers,
) -> (TierKind, String) {
    if let Some(k) = overrides.get(id) {
        return (
            *k,
            format!("kind {} from the tier-kind override", k.short_name()),
        );
    }
    let by_name = TierKind::from_short_name(id);
    if memtiers.len() > 1 {
        let tiers: BTreeSet<u32> = nodes.iter().filter_map(|n| memtiers.tier_of(*n)).collect();
        if let (Some(fastest), Some(&slowest)) = (memtiers.fastest(), tiers.iter().max()) {
            if slowest == fastest {
                return (
                    TierKind::Dram,
                    format!("kind dram: its node(s) are in memory_tier{fastest}, the fastest"),
                );
            }
            return match by_name.filter(|k| *k != TierKind::Dram) {
                Some(k) => (
                    k,
                    format!(
                        "kind {} from its name; memory_tier{slowest} is slower than memory_tier{fastest}",
                        k.short_name()
                    ),
                ),
                None => (
                    TierKind::Unknown,
                    format!(
                        "kind unknown: its node(s) are in memory_tier{slowest}, slower than memory_tier{fastest} (set a tier-kind override)"
                    ),
                ),
            };
        }
    }
    match by_name {
        Some(k) => (k, format!("kind {} from its name", k.short_name())),
        None => (
            TierKind::Unknown,
            "kind unknown (no override; the id is not a kind; the host's memory tiers do not tell)"
                .into(),
        ),
    }
}

/// The zones with the ranges a guest-physical address can hold: a range
/// whose end is past 2^64 (`start + size` overflows; only a broken or
/// hostile VMM reports one) is dropped, so no sampler computes its end;
/// with how many were dropped per zone.
fn addressable(zones: &[MemoryZone]) -> (Vec<MemoryZone>, Vec<usize>) {
    zones
        .iter()
        .map(|z| {
            let mut z = z.clone();
            let before = z.ranges.len();
            z.ranges.retain(|r| r.start.checked_add(r.size).is_some());
            let dropped = before - z.ranges.len();
            (z, dropped)
        })
        .unzip()
}

/// The zone with its virtio-mem region (vmm-patch 0009) as one more
/// range: the region is not in `ranges`, but its plugged blocks are the
/// zone's memory, on the zone's guest node.
fn with_hotplug_region(z: &MemoryZone) -> MemoryZone {
    let mut z = z.clone();
    if let Some(v) = z.virtio_mem.filter(|v| v.size > 0) {
        z.ranges.push(ZoneRange {
            start: v.start,
            size: v.size,
            host_address: Some(v.host_address),
        });
    }
    z
}

/// The zones of a `vm.info` to build a tier map from, with what changes
/// every interval (requested and plugged sizes) left out so they compare
/// equal while the layout is the same: `memory_zones` (vmm-patch 0003);
/// without it (upstream cloud-hypervisor) `config.memory.zones`, placed as
/// cloud-hypervisor v53.0 places boot memory (in order from guest-physical
/// 0, a range crossing the 32-bit hole at 3 GiB continuing at 4 GiB) and
/// without host addresses, which are then found by size or left unknown.
pub fn zones_of(info: &VmInfo) -> Option<Vec<MemoryZone>> {
    if let Some(zones) = &info.memory_zones {
        return Some(
            zones
                .iter()
                .map(|z| MemoryZone {
                    virtio_mem: z.virtio_mem.map(|v| VirtioMem {
                        requested_size: 0,
                        plugged_size: 0,
                        ..v
                    }),
                    ..z.clone()
                })
                .collect(),
        );
    }
    let configs = info.zone_configs();
    if configs.is_empty() {
        return None;
    }
    const HOLE_START: u64 = 0xc000_0000;
    const HIGH_START: u64 = 0x1_0000_0000;
    let mut at = 0u64;
    let mut out = Vec::new();
    for c in configs {
        let mut ranges = Vec::new();
        let mut left = c.size;
        while left > 0 {
            if at < HOLE_START && at.saturating_add(left) > HOLE_START {
                let low = HOLE_START - at;
                ranges.push(ZoneRange {
                    start: at,
                    size: low,
                    host_address: None,
                });
                left -= low;
                at = HIGH_START;
                continue;
            }
            ranges.push(ZoneRange {
                start: at,
                size: left,
                host_address: None,
            });
            at = at.saturating_add(left);
            left = 0;
        }
        out.push(MemoryZone {
            id: c.id.clone(),
            host_numa_node: c.host_numa_node,
            guest_numa_node: None,
            ranges,
            virtio_mem: None,
        });
    }
    Some(out)
}

/// What the tier map says of a zone's virtio-mem part a VMM does not
/// report (upstream cloud-hypervisor): its size from the configuration,
/// and plainly that plugged memory is not attributed to the tier.
pub fn unreported_hotplug(tiers: &mut [Tier], info: &VmInfo) {
    if info.memory_zones.is_some() || !info.virtio_mem_hotplug() {
        return;
    }
    for t in tiers.iter_mut() {
        let Some(c) = info.zone_configs().iter().find(|c| c.id == t.name) else {
            continue;
        };
        let Some(h) = c.hotplug_size.filter(|&h| h > 0) else {
            continue;
        };
        t.hotplug = Some(TierHotplug {
            boot_bytes: c.size,
            region_bytes: h,
            block_bytes: tier_ch_api::DEFAULT_BLOCK,
            region_attributed: false,
        });
        let _ = write!(
            t.derivation,
            "; guest-physical ranges placed as cloud-hypervisor v53.0 lays out boot memory (this VMM's vm.info has no memory_zones); a hot-pluggable virtio-mem part of {h} bytes (config hotplug_size) whose region this VMM does not report: plugged memory is not attributed to this tier (size_bytes is the boot part)"
        );
    }
}

/// The tiers of a VM from its zones and the VMM's maps and numa_maps:
/// DRAM first, then zone order. Zones without (addressable) ranges are
/// left out.
pub fn tiers(
    zones: &[MemoryZone],
    maps: &str,
    numa_maps: &str,
    overrides: &HashMap<String, TierKind>,
    memtiers: &MemoryTiers,
) -> Vec<Tier> {
    let vmas = parse_maps(maps);
    let zones: Vec<MemoryZone> = zones.iter().map(with_hotplug_region).collect();
    let (zones, dropped) = addressable(&zones);
    let hvas = host_addresses(&zones, &vmas);
    let mut out: Vec<Tier> = zones
        .iter()
        .zip(hvas)
        .zip(dropped)
        .filter(|((z, _), _)| !z.ranges.is_empty())
        .map(|((z, hvas), dropped)| {
            let mut nodes: BTreeSet<u32> = z.host_numa_node.into_iter().collect();
            let mut backing = BTreeSet::new();
            for (r, h) in z.ranges.iter().zip(&hvas) {
                if h.addr() != 0 {
                    backing.extend(numa_nodes_in(numa_maps, &vmas, h.addr(), r.size));
                }
            }
            nodes.extend(backing.iter().copied());
            let (kind, why) = zone_kind(&z.id, &nodes, overrides, memtiers);
            let mut d = format!("vm.info zone {:?}", z.id);
            if let Some(g) = z.guest_numa_node {
                let _ = write!(d, " (guest node {g})");
            }
            let _ = write!(d, ": {why}; {} guest-physical range(s) from memory_zones", z.ranges.len());
            if dropped > 0 {
                let _ = write!(d, "; {dropped} range(s) ending past 2^64 ignored");
            }
            let reported = hvas.iter().filter(|h| matches!(h, Hva::Reported(_))).count();
            let by_size = hvas.iter().filter(|h| matches!(h, Hva::BySize(_))).count();
            if reported > 0 {
                let _ = write!(d, "; host address of {reported} from vm.info host_address, checked in /proc/PID/maps");
            }
            if by_size > 0 {
                let _ = write!(d, "; host address of {by_size} by the one mapping of its size in /proc/PID/maps");
            }
            for h in &hvas {
                if let Hva::Unknown(why) = h {
                    let _ = write!(d, "; host address unknown: {why}");
                }
            }
            if let Some(v) = z.virtio_mem {
                let _ = write!(
                    d,
                    "; its virtio-mem region {:#x}+{:#x} (vm.info virtio_mem, vmm-patch 0009) is the last range: plugged memory counts for this tier",
                    v.start, v.size
                );
            }
            if let Some(n) = z.host_numa_node {
                let _ = write!(d, "; bound to host node {n}");
            }
            if !backing.is_empty() {
                let list: Vec<String> = backing.iter().map(|n| n.to_string()).collect();
                let _ = write!(d, "; pages on node(s) {} (numa_maps)", list.join(","));
            }
            // smaps-based samplers see whole VMAs: say when one is shared.
            let shared_vma = z.ranges.iter().zip(&hvas).any(|(r, h)| {
                let a = h.addr();
                a != 0
                    && vmas
                        .iter()
                        .any(|v| v.start < a + r.size && v.end > a && (v.start < a || v.end > a + r.size))
            });
            if shared_vma {
                d.push_str("; its mapping is part of a larger VMA (e.g. merged anonymous zones): per-VMA counters (smaps) are split by size");
            }
            Tier {
                name: z.id.clone(),
                kind: kind as i32,
                host_numa_nodes: nodes.into_iter().collect(),
                ranges: z
                    .ranges
                    .iter()
                    .zip(&hvas)
                    .map(|(r, h)| GpaRange {
                        gpa_start: r.start,
                        length: r.size,
                        hva_start: h.addr(),
                    })
                    .collect(),
                // Saturating: ranges the VMM reports may add up past 2^64.
                size_bytes: z.ranges.iter().fold(0u64, |n, r| n.saturating_add(r.size)),
                derivation: d,
                hotplug: z.virtio_mem.map(|v| TierHotplug {
                    boot_bytes: z
                        .ranges
                        .iter()
                        .fold(0u64, |n, r| n.saturating_add(r.size))
                        .saturating_sub(v.size),
                    region_bytes: v.size,
                    block_bytes: v.block_size,
                    region_attributed: true,
                }),
            }
        })
        .collect();
    out.sort_by_key(|t| t.kind() != TierKind::Dram);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    fn zone(id: &str, node: Option<u32>, ranges: &[(u64, u64, Option<u64>)]) -> MemoryZone {
        MemoryZone {
            id: id.into(),
            host_numa_node: node,
            guest_numa_node: Some(0),
            ranges: ranges
                .iter()
                .map(|&(start, size, host_address)| ZoneRange {
                    start,
                    size,
                    host_address,
                })
                .collect(),
            virtio_mem: None,
        }
    }

    // cloud-hypervisor v53.0 with two zones, `shared=on` (one memfd each),
    // as /proc/PID/maps showed it on this machine (dram 128M, slow 256M):
    // the later zone is mapped below the earlier one.
    const MAPS_SHARED: &str = "\
55d4c0000000-55d4c0100000 r-xp 00000000 08:01 123   /usr/bin/cloud-hypervisor
7f7d90021000-7f7d94000000 ---p 00000000 00:00 0 
7f7d98000000-7f7da8000000 rw-s 00000000 00:01 15415                      /memfd:ch_ram (deleted)
7f7da8000000-7f7db0000000 rw-s 00000000 00:01 15414                      /memfd:ch_ram (deleted)
7f7db0000000-7f7db0021000 rw-p 00000000 00:00 0 
";
    // The same with anonymous zones: the kernel merged them into one VMA.
    const MAPS_ANON: &str = "\
7fdc88021000-7fdc8c000000 ---p 00000000 00:00 0 
7fdc90000000-7fdca8000000 rw-p 00000000 00:00 0 
";
    const NUMA: &str = "\
7f7d98000000 default file=/memfd:ch_ram\\040(deleted) dirty=3 N1=3 kernelpagesize_kB=4
7f7da8000000 default file=/memfd:ch_ram\\040(deleted) dirty=9 N0=9 kernelpagesize_kB=4
";

    #[test]
    fn maps_lines_keep_paths_with_spaces() {
        let v = parse_maps(MAPS_SHARED);
        assert_eq!(v.len(), 5);
        assert_eq!(v[2].path, "/memfd:ch_ram (deleted)");
        assert_eq!(v[2].perms, "rw-s");
        assert_eq!(v[1].path, "");
        assert!(covered(&v, 0x7f7d_9800_0000, 384 * M));
        assert!(!covered(&v, 0x7f7d_9000_0000, 4096), "---p is not writable");
        assert!(
            !covered(&v, 0x7f7d_a800_0000, 256 * M),
            "runs past the mapping"
        );
    }

    #[test]
    fn reported_host_addresses_are_used_when_mapped() {
        let zones = [
            zone("dram", Some(0), &[(0, 128 * M, Some(0x7fdc_a000_0000))]),
            zone(
                "slow",
                Some(0),
                &[(128 * M, 256 * M, Some(0x7fdc_9000_0000))],
            ),
        ];
        let t = tiers(
            &zones,
            MAPS_ANON,
            "",
            &HashMap::new(),
            &MemoryTiers::default(),
        );
        assert_eq!(t[0].name, "dram");
        assert_eq!(t[0].kind(), TierKind::Dram);
        assert_eq!(
            t[0].ranges,
            vec![GpaRange {
                gpa_start: 0,
                length: 128 * M,
                hva_start: 0x7fdc_a000_0000
            }]
        );
        assert_eq!(t[1].ranges[0].gpa_start, 128 * M);
        assert_eq!(t[1].ranges[0].hva_start, 0x7fdc_9000_0000);
        assert_eq!(t[1].kind(), TierKind::Unknown);
        assert!(
            t[1].derivation.contains("from vm.info host_address"),
            "{}",
            t[1].derivation
        );
        assert!(
            t[1].derivation.contains("part of a larger VMA"),
            "{}",
            t[1].derivation
        );
        assert_eq!(t[0].host_numa_nodes, vec![0]);
    }

    #[test]
    fn an_unmapped_reported_address_is_not_trusted() {
        let zones = [zone("dram", None, &[(0, 128 * M, Some(0x1000))])];
        let t = tiers(
            &zones,
            MAPS_ANON,
            "",
            &HashMap::new(),
            &MemoryTiers::default(),
        );
        assert_eq!(t[0].ranges[0].hva_start, 0);
        assert!(
            t[0].derivation.contains("not mapped writable"),
            "{}",
            t[0].derivation
        );
    }

    #[test]
    fn without_host_address_a_unique_size_matches() {
        let zones = [
            zone("dram", None, &[(0, 128 * M, None)]),
            zone("slow", None, &[(128 * M, 256 * M, None)]),
        ];
        let overrides = HashMap::from([("slow".to_string(), TierKind::Cxl)]);
        let t = tiers(
            &zones,
            MAPS_SHARED,
            NUMA,
            &overrides,
            &MemoryTiers::default(),
        );
        assert_eq!(t[0].ranges[0].hva_start, 0x7f7d_a800_0000);
        assert_eq!(t[1].ranges[0].hva_start, 0x7f7d_9800_0000);
        assert_eq!(t[1].kind(), TierKind::Cxl);
        assert_eq!(t[1].host_numa_nodes, vec![1]);
        assert_eq!(t[0].host_numa_nodes, vec![0]);
        assert!(t[0].derivation.contains("one mapping of its size"));
        assert!(t[1].derivation.contains("override"));
    }

    #[test]
    fn without_host_address_equal_sizes_and_merged_vmas_stay_unknown() {
        let equal = [
            zone("dram", None, &[(0, 256 * M, None)]),
            zone("slow", None, &[(256 * M, 256 * M, None)]),
        ];
        let maps = "\
7f0000000000-7f0010000000 rw-s 00000000 00:01 1 /memfd:ch_ram (deleted)
7f0010000000-7f0020000000 rw-s 00000000 00:01 2 /memfd:ch_ram (deleted)
";
        let t = tiers(&equal, maps, "", &HashMap::new(), &MemoryTiers::default());
        assert!(t.iter().all(|t| t.ranges[0].hva_start == 0));
        assert!(
            t[0].derivation.contains("cannot tell them apart"),
            "{}",
            t[0].derivation
        );
        let distinct = [
            zone("dram", None, &[(0, 128 * M, None)]),
            zone("slow", None, &[(128 * M, 256 * M, None)]),
        ];
        let t = tiers(
            &distinct,
            MAPS_ANON,
            "",
            &HashMap::new(),
            &MemoryTiers::default(),
        );
        assert!(t.iter().all(|t| t.ranges[0].hva_start == 0));
        assert!(
            t[1].derivation.contains("0 writable mappings"),
            "{}",
            t[1].derivation
        );
    }

    #[test]
    fn memory_tiers_decide_the_kind_when_the_host_has_several() {
        let memtiers = MemoryTiers::from_tiers(vec![(4, vec![0]), (22, vec![1])]);
        let zones = [
            zone("a", Some(0), &[(0, 128 * M, None)]),
            zone("b", Some(1), &[(128 * M, 256 * M, None)]),
            zone("cxl", Some(1), &[(384 * M, 64 * M, None)]),
            zone("dram", Some(1), &[(448 * M, 32 * M, None)]),
        ];
        let t = tiers(&zones, "", "", &HashMap::new(), &memtiers);
        let kinds: Vec<(&str, TierKind)> = t.iter().map(|t| (t.name.as_str(), t.kind())).collect();
        assert_eq!(
            kinds,
            vec![
                ("a", TierKind::Dram),
                ("b", TierKind::Unknown),
                ("cxl", TierKind::Cxl),
                // Named dram but on a slower node: the node wins.
                ("dram", TierKind::Unknown),
            ]
        );
        assert!(
            t[1].derivation.contains("memory_tier22"),
            "{}",
            t[1].derivation
        );
        // One memory tier (this host): names decide.
        let one = MemoryTiers::from_tiers(vec![(4, vec![0, 1])]);
        let t = tiers(&zones, "", "", &HashMap::new(), &one);
        assert_eq!(t[0].name, "dram");
        assert_eq!(t[0].kind(), TierKind::Dram);
    }

    #[test]
    fn zones_without_ranges_are_left_out() {
        let zones = [
            zone("dram", None, &[(0, 128 * M, None)]),
            zone("hotplug", None, &[]),
        ];
        assert_eq!(
            tiers(&zones, "", "", &HashMap::new(), &MemoryTiers::default()).len(),
            1
        );
    }

    /// Found by the `fuzz` bench: ranges whose sizes add up past 2^64
    /// panicked (debug) or wrapped `size_bytes` (release), and a range
    /// ending past 2^64 reached the samplers, which compute its end.
    #[test]
    fn ranges_past_2_64_are_dropped_and_sizes_saturate() {
        let top = u64::MAX - 4095;
        let zones = [
            zone(
                "dram",
                None,
                &[(0, u64::MAX, None), (1 << 32, u64::MAX - (1 << 32), None)],
            ),
            zone("slow", None, &[(top, 8192, None), (1 << 40, 128 * M, None)]),
            zone("cxl", None, &[(u64::MAX, 1, Some(0x1000))]),
        ];
        let t = tiers(
            &zones,
            MAPS_ANON,
            "",
            &HashMap::new(),
            &MemoryTiers::default(),
        );
        assert_eq!(t.len(), 2, "{t:?}");
        assert_eq!(t[0].name, "dram");
        assert_eq!(t[0].size_bytes, u64::MAX);
        assert_eq!(t[0].ranges.len(), 2);
        assert_eq!(t[1].name, "slow");
        assert_eq!(t[1].size_bytes, 128 * M);
        assert_eq!(
            t[1].ranges
                .iter()
                .map(|r| (r.gpa_start, r.length))
                .collect::<Vec<_>>(),
            vec![(1 << 40, 128 * M)]
        );
        assert!(
            t[1].derivation
                .contains("1 range(s) ending past 2^64 ignored"),
            "{}",
            t[1].derivation
        );
        assert!(!t[0].derivation.contains("ignored"), "{}", t[0].derivation);
    }
}
