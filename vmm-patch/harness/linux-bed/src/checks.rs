//! What the bed checks in a booted guest, each returning what it saw so
//! that a test can assert on it and `cargo xtask linux-bed` can print it.

use std::time::{Duration, Instant};

use crate::{Bed, BedError};

const MIB: u64 = 1 << 20;
const CMD: Duration = Duration::from_secs(60);

/// The guest's NUMA nodes and memory tiers.
#[derive(Debug, Clone, PartialEq)]
pub struct Tiers {
    /// HMAT read latency of each node from initiator 0, ns (node order).
    pub latency_ns: Vec<u64>,
    /// Memory tier of each node (`memory_tierN`'s N), node order.
    pub tier: Vec<Option<u64>>,
    /// MemTotal of each node, bytes.
    pub node_bytes: Vec<u64>,
}

impl Tiers {
    /// Two nodes, the slow one slower by HMAT.
    pub fn hmat_ok(&self) -> bool {
        self.latency_ns.len() == 2 && self.latency_ns[0] < self.latency_ns[1]
    }
    /// How many distinct memory tiers the kernel made of the nodes.
    pub fn kernel_tiers(&self) -> usize {
        let mut t: Vec<u64> = self.tier.iter().flatten().copied().collect();
        t.sort_unstable();
        t.dedup();
        t.len()
    }
}

/// Reads nodes, HMAT latencies and memory tiers.
pub fn tiers(bed: &mut Bed) -> Result<Tiers, BedError> {
    let out = bed.sh(
        "for n in /sys/devices/system/node/node[0-9]*; do \
           echo node ${n##*node} $(cat $n/access0/initiators/read_latency 2>/dev/null || echo -) \
           $(grep MemTotal $n/meminfo | awk '{print $4}'); done; \
         for t in /sys/devices/virtual/memory_tiering/memory_tier*; do \
           [ -e $t/nodelist ] && echo tier ${t##*memory_tier} $(cat $t/nodelist); done",
        CMD,
    )?;
    Ok(parse_tiers(&out))
}

/// Parses [`tiers`]' output: `node N LAT KB` and `tier T NODELIST` lines.
pub fn parse_tiers(out: &str) -> Tiers {
    let mut nodes: Vec<(usize, u64, u64)> = Vec::new();
    let mut tiers: Vec<(u64, Vec<usize>)> = Vec::new();
    for l in out.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.as_slice() {
            ["node", n, lat, kb] => {
                if let (Ok(n), Ok(kb)) = (n.parse(), kb.parse::<u64>()) {
                    nodes.push((n, lat.parse().unwrap_or(0), kb * 1024));
                }
            }
            ["tier", t, list] => {
                if let Ok(t) = t.parse() {
                    tiers.push((t, node_list(list)));
                }
            }
            _ => {}
        }
    }
    nodes.sort_unstable();
    Tiers {
        latency_ns: nodes.iter().map(|n| n.1).collect(),
        tier: nodes
            .iter()
            .map(|n| tiers.iter().find(|(_, l)| l.contains(&n.0)).map(|t| t.0))
            .collect(),
        node_bytes: nodes.iter().map(|n| n.2).collect(),
    }
}

/// `0-1,3` -> [0, 1, 3].
pub fn node_list(s: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                    out.extend(a..=b);
                }
            }
            None => out.extend(part.parse::<usize>().ok()),
        }
    }
    out
}

/// A node's MemTotal, bytes.
pub fn node_bytes(bed: &mut Bed, node: usize) -> Result<u64, BedError> {
    let out = bed.sh(
        &format!("grep MemTotal /sys/devices/system/node/node{node}/meminfo"),
        CMD,
    )?;
    out.split_whitespace()
        .nth(3)
        .and_then(|v| v.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| BedError::Missing(format!("node{node} MemTotal in {out:?}")))
}

/// One virtio-mem resize: what QEMU reported plugged and what the guest's
/// node grew or shrank by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resize {
    pub requested: u64,
    pub plugged_before: u64,
    pub plugged_after: u64,
    pub node_before: u64,
    pub node_after: u64,
    pub millis: u64,
}

/// Resizes device `id` (on `node`) to `bytes` and waits up to `timeout`
/// for the plugged size to reach it.
pub fn resize(
    bed: &mut Bed,
    id: &str,
    node: usize,
    bytes: u64,
    timeout: Duration,
) -> Result<Resize, BedError> {
    let plugged = |bed: &mut Bed| -> Result<u64, BedError> {
        bed.qmp()
            .virtio_mem()?
            .into_iter()
            .find(|d| d.id == id)
            .map(|d| d.size)
            .ok_or_else(|| BedError::Qmp(format!("no virtio-mem device {id}")))
    };
    let plugged_before = plugged(bed)?;
    let node_before = node_bytes(bed, node)?;
    let start = Instant::now();
    bed.qmp().resize(id, bytes)?;
    let mut plugged_after = plugged(bed)?;
    while plugged_after != bytes && start.elapsed() < timeout {
        std::thread::sleep(Duration::from_millis(200));
        plugged_after = plugged(bed)?;
    }
    let millis = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    // The guest onlines (or offlines) plugged memory block by block after
    // the device reports it: wait until the node has moved by nearly all
    // of it (memmap overhead aside), not only begun to.
    let moved = plugged_after.abs_diff(plugged_before);
    let mut node_after = node_bytes(bed, node)?;
    let settle = Instant::now();
    while node_after.abs_diff(node_before) < moved - moved / 16
        && settle.elapsed() < Duration::from_secs(20)
    {
        std::thread::sleep(Duration::from_millis(200));
        node_after = node_bytes(bed, node)?;
    }
    Ok(Resize {
        requested: bytes,
        plugged_before,
        plugged_after,
        node_before,
        node_after,
        millis,
    })
}

/// One balloon inflation: QEMU's `actual` and the guest's MemTotal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Balloon {
    pub target: u64,
    pub actual_before: u64,
    pub actual_after: u64,
    pub total_before: u64,
    pub total_after: u64,
}

/// Inflates the balloon by `by` bytes, waits up to `timeout`, and deflates
/// it again.
pub fn balloon(bed: &mut Bed, by: u64, timeout: Duration) -> Result<Balloon, BedError> {
    let total = |bed: &mut Bed| -> Result<u64, BedError> {
        let out = bed.sh("grep MemTotal /proc/meminfo", CMD)?;
        out.split_whitespace()
            .nth(1)
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .ok_or_else(|| BedError::Missing(format!("MemTotal in {out:?}")))
    };
    let actual_before = bed.qmp().balloon_actual()?;
    let total_before = total(bed)?;
    let target = actual_before.saturating_sub(by);
    bed.qmp().balloon(target)?;
    let start = Instant::now();
    let mut actual_after = bed.qmp().balloon_actual()?;
    while actual_after > target && start.elapsed() < timeout {
        std::thread::sleep(Duration::from_millis(200));
        actual_after = bed.qmp().balloon_actual()?;
    }
    let total_after = total(bed)?;
    bed.qmp().balloon(actual_before)?;
    Ok(Balloon {
        target,
        actual_before,
        actual_after,
        total_before,
        total_after,
    })
}

/// Whole MiB, for reports.
pub fn mib(bytes: u64) -> u64 {
    bytes / MIB
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_lists_expand_ranges() {
        assert_eq!(node_list("0-1"), vec![0, 1]);
        assert_eq!(node_list("0,2-3"), vec![0, 2, 3]);
        assert_eq!(node_list(""), Vec::<usize>::new());
    }

    #[test]
    fn tiers_parse_per_node_in_order() {
        let t = parse_tiers("node 1 250 283808\nnode 0 80 256308\ntier 4 0\ntier 46 1\n");
        assert_eq!(t.latency_ns, vec![80, 250]);
        assert_eq!(t.tier, vec![Some(4), Some(46)]);
        assert_eq!(t.node_bytes, vec![256308 * 1024, 283808 * 1024]);
        assert!(t.hmat_ok());
        assert_eq!(t.kernel_tiers(), 2);
        let one = parse_tiers("node 0 80 1\nnode 1 250 1\ntier 4 0-1\n");
        assert_eq!(one.kernel_tiers(), 1);
        let none = parse_tiers("node 0 - 1\n");
        assert!(!none.hmat_ok());
    }
}
