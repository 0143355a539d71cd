//! The tier map of a QEMU VM: one tier per guest NUMA node (`node<N>`),
//! its boot memory backend plus the regions of its virtio-mem devices.
//!
//! - Which backend is node N's: QMP names no node's memdev, but QEMU lays
//!   the nodes' backends into the boot RAM container in node order, so the
//!   backends there, by offset, are the nodes with boot memory, in order;
//!   each must have the node's boot size (`info numa`) or nothing is built.
//! - Guest-physical: the container offset through the `ram-below-4g` /
//!   `ram-above-4g` aliases of `info mtree`; virtio-mem: `memaddr`.
//! - Host virtual: file backends by `mem-path` in /proc/PID/maps; memfd
//!   backends by `/memfd:ID`, else (QEMU 7.2 names them all
//!   `memory-backend-memfd`) by the one memfd mapping of the backend's
//!   size; anonymous `memory-backend-ram` is unknown (0, never guessed:
//!   maps shows it only by size, beside QEMU's other anonymous memory).
//! - Kind: a `tier_kinds` override for the tier name or any of its
//!   backends' ids; else as cloud-hypervisor zones (host memory tiers of
//!   the backends' `host-nodes` and numa_maps pages, then the name).

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

use tier_proto::v1::{GpaRange, Tier, TierHotplug, TierKind};

use super::answers::gpa_pieces;
use super::machine::{Backend, Machine};
use crate::ch::layout::{MapsVma, parse_maps, zone_kind};
use crate::memtier::MemoryTiers;

/// Host address of a backend, or why it is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hva {
    Found { addr: u64, how: &'static str },
    Unknown(String),
}

impl Hva {
    pub fn addr(&self) -> u64 {
        match self {
            Hva::Found { addr, .. } => *addr,
            Hva::Unknown(_) => 0,
        }
    }
}

/// Name of a memfd mapping (`/memfd:NAME (deleted)`).
fn memfd_name(path: &str) -> Option<&str> {
    let n = path.strip_prefix("/memfd:")?;
    Some(n.strip_suffix(" (deleted)").unwrap_or(n))
}

/// The one run of contiguous writable VMAs whose path satisfies `is` and
/// whose total length is `size`, if there is exactly one.
fn one_run(vmas: &[MapsVma], size: u64, is: impl Fn(&str) -> bool) -> Result<u64, usize> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for v in vmas
        .iter()
        .filter(|v| v.perms.starts_with("rw") && is(&v.path))
    {
        match runs.last_mut() {
            Some((_, end)) if *end == v.start => *end = v.end,
            _ => runs.push((v.start, v.end)),
        }
    }
    let same: Vec<u64> = runs
        .iter()
        .filter(|(a, b)| b - a == size)
        .map(|r| r.0)
        .collect();
    match same.as_slice() {
        [a] => Ok(*a),
        _ => Err(same.len()),
    }
}

/// Where `b` is mapped in QEMU, given every backend of the VM.
pub fn backend_hva(b: &Backend, all: &[Backend], vmas: &[MapsVma]) -> Hva {
    match b.ty.as_str() {
        "memory-backend-file" => {
            let Some(p) = b.mem_path.as_deref() else {
                return Hva::Unknown(format!("file backend {:?} without mem-path", b.id));
            };
            let deleted = format!("{p} (deleted)");
            one_run(vmas, b.size, |v| v == p || v == deleted)
                .map(|addr| Hva::Found {
                    addr,
                    how: "its mem-path",
                })
                .unwrap_or_else(|n| {
                    Hva::Unknown(format!(
                        "{n} writable mappings of {p} with the backend's size {} in /proc/PID/maps (needs exactly 1)",
                        b.size
                    ))
                })
        }
        "memory-backend-memfd" => {
            if let Ok(addr) = one_run(vmas, b.size, |v| memfd_name(v) == Some(&b.id)) {
                return Hva::Found {
                    addr,
                    how: "its /memfd:ID mapping",
                };
            }
            // QEMU 7.2 names every memfd backend `memory-backend-memfd`.
            let twins = all
                .iter()
                .filter(|o| o.ty == b.ty && o.size == b.size)
                .count();
            if twins > 1 {
                return Hva::Unknown(format!(
                    "{twins} memfd backends of {} bytes, and QEMU names their mappings alike: size cannot tell them apart",
                    b.size
                ));
            }
            one_run(vmas, b.size, |v| memfd_name(v) == Some("memory-backend-memfd"))
                .map(|addr| Hva::Found {
                    addr,
                    how: "the one /memfd:memory-backend-memfd mapping of its size",
                })
                .unwrap_or_else(|n| {
                    Hva::Unknown(format!(
                        "{n} /memfd:memory-backend-memfd mappings of {} bytes (needs exactly 1)",
                        b.size
                    ))
                })
        }
        "memory-backend-ram" => Hva::Unknown(
            "anonymous memory-backend-ram: /proc/PID/maps shows it only by size, beside QEMU's other anonymous memory, so it is not measured (use memory-backend-memfd or -file)".into(),
        ),
        other => Hva::Unknown(format!("{other} backends are not located by tierd")),
    }
}

/// Backends of the boot RAM container, by offset: the nodes' memory.
fn boot_backends(m: &Machine) -> Vec<&Backend> {
    let mut b: Vec<&Backend> = m
        .backends
        .iter()
        .filter(|b| {
            b.offset.is_some()
                && b.container
                    .as_deref()
                    .is_some_and(|c| !c.contains("device-memory"))
                && !m.devices.iter().any(|d| d.memdev == b.id)
        })
        .collect();
    b.sort_by_key(|b| b.offset);
    b
}

/// Each node with its boot backend (`None` for a node without boot
/// memory), or why the layout is not understood.
pub fn node_backends(m: &Machine) -> Result<Vec<(u32, Option<&Backend>)>, String> {
    let boot = boot_backends(m);
    if m.nodes.is_empty() {
        return match boot.as_slice() {
            [b] => Ok(vec![(0, Some(*b))]),
            [] => Err("no NUMA node and no boot memory backend (-machine memory-backend= or -numa node,memdev=): tierd cannot locate the guest's memory".into()),
            _ => Err(format!("no NUMA node but {} boot memory backends", boot.len())),
        };
    }
    let mut it = boot.iter();
    let mut out = Vec::new();
    for n in &m.nodes {
        if n.boot() == 0 {
            out.push((n.id, None));
            continue;
        }
        match it.next() {
            Some(b) if b.size == n.boot() => out.push((n.id, Some(*b))),
            Some(b) => {
                return Err(format!(
                    "node {} has {} bytes of boot memory but the next backend in the boot RAM container, {:?}, has {}",
                    n.id,
                    n.boot(),
                    b.id,
                    b.size
                ));
            }
            None => return Err(format!("no memory backend for node {}", n.id)),
        }
    }
    Ok(out)
}

/// The tiers of the VM: DRAM first, then node order.
pub fn tiers(
    m: &Machine,
    maps: &str,
    numa_maps: &str,
    overrides: &HashMap<String, TierKind>,
    memtiers: &MemoryTiers,
) -> Result<Vec<Tier>, String> {
    let vmas = parse_maps(maps);
    let mut out = Vec::new();
    for (node, boot) in node_backends(m)? {
        let devs: Vec<_> = m.devices.iter().filter(|d| d.node == node).collect();
        if boot.is_none() && devs.is_empty() {
            continue;
        }
        let name = format!("node{node}");
        let mut d = format!("guest NUMA node {node} (QMP)");
        let mut ranges = Vec::new();
        let mut nodes: BTreeSet<u32> = BTreeSet::new();
        let mut ids = Vec::new();
        let mut add = |b: &Backend, pieces: Vec<(u64, u64)>, d: &mut String| {
            ids.push(b.id.clone());
            nodes.extend(b.host_nodes.iter().copied());
            let hva = backend_hva(b, &m.backends, &vmas);
            match &hva {
                Hva::Found { addr, how } => {
                    let _ = write!(d, "; {:?} at host {addr:#x} by {how}", b.id);
                    let end = addr.saturating_add(b.size);
                    nodes.extend(
                        vmas.iter()
                            .filter(|v| v.start < end && v.end > *addr)
                            .flat_map(|v| crate::discovery::numa_nodes(numa_maps, v.start)),
                    );
                }
                Hva::Unknown(why) => {
                    let _ = write!(d, "; {:?} host address unknown: {why}", b.id);
                }
            }
            let mut at = 0u64;
            for (gpa, len) in pieces {
                ranges.push(GpaRange {
                    gpa_start: gpa,
                    length: len,
                    hva_start: if hva.addr() == 0 { 0 } else { hva.addr() + at },
                });
                at += len;
            }
        };
        let mut boot_bytes = 0;
        if let Some(b) = boot {
            boot_bytes = b.size;
            let off = b.offset.unwrap_or(0);
            let pieces = match gpa_pieces(&m.aliases, off, b.size) {
                Some(p) => {
                    let _ = write!(
                        d,
                        "; boot backend {:?} at RAM offset {off:#x} (info mtree aliases)",
                        b.id
                    );
                    p
                }
                None => {
                    let _ = write!(
                        d,
                        "; boot backend {:?}: info mtree shows no RAM alias over it, guest-physical taken as its RAM offset {off:#x}",
                        b.id
                    );
                    vec![(off, b.size)]
                }
            };
            add(b, pieces, &mut d);
        }
        let mut region = 0u64;
        for v in &devs {
            let Some(b) = m.backends.iter().find(|b| b.id == v.memdev) else {
                let _ = write!(
                    d,
                    "; virtio-mem {:?}: backend {:?} not found",
                    v.id, v.memdev
                );
                continue;
            };
            let _ = write!(
                d,
                "; virtio-mem {:?} region {:#x}+{:#x}: plugged memory counts for this tier",
                v.id, v.memaddr, v.max
            );
            add(b, vec![(v.memaddr, v.max)], &mut d);
            region += v.max;
        }
        let over = std::iter::once(&name)
            .chain(ids.iter())
            .find_map(|k| overrides.get(k).map(|kind| (k.clone(), *kind)));
        let (kind, why) = match over {
            Some((k, kind)) => (
                kind,
                format!(
                    "kind {} from the tier-kind override for {k:?}",
                    kind.short_name()
                ),
            ),
            None => zone_kind(&name, &nodes, overrides, memtiers),
        };
        ranges.sort_by_key(|r| r.gpa_start);
        out.push(Tier {
            name,
            kind: kind as i32,
            host_numa_nodes: nodes.into_iter().collect(),
            size_bytes: ranges.iter().fold(0u64, |n, r| n.saturating_add(r.length)),
            ranges,
            derivation: format!("{why}; {d}"),
            hotplug: (!devs.is_empty()).then(|| TierHotplug {
                boot_bytes,
                region_bytes: region,
                block_bytes: devs.first().map_or(0, |v| v.block),
                region_attributed: true,
            }),
        });
    }
    if out.is_empty() {
        return Err("no guest NUMA node with memory".into());
    }
    out.sort_by_key(|t| t.kind() != TierKind::Dram);
    Ok(out)
}

#[cfg(test)]
#[path = "layout_tests.rs"]
mod tests;
