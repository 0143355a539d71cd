//! The host's memory tiers as the kernel ranks them:
//! `/sys/devices/virtual/memory_tiering/memory_tierN/nodelist`. A lower N
//! is a lower abstract distance, i.e. faster memory; DRAM nodes sit in the
//! lowest tier unless a driver (dax/kmem, CXL) placed slower nodes below.

use std::path::Path;

/// Where the kernel publishes the tiers.
pub const SYSFS: &str = "/sys/devices/virtual/memory_tiering";

/// Memory tiers by id, fastest first, each with its NUMA nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryTiers {
    tiers: Vec<(u32, Vec<u32>)>,
}

/// A node list like `0-2,5` (the kernel's `%*pbl` format); `None` if it
/// is not one.
pub fn parse_nodelist(text: &str) -> Option<Vec<u32>> {
    let text = text.trim();
    let mut nodes = Vec::new();
    if text.is_empty() {
        return Some(nodes);
    }
    for part in text.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if a > b || b - a > 4096 {
                    return None;
                }
                nodes.extend(a..=b);
            }
            None => nodes.push(part.parse().ok()?),
        }
    }
    nodes.sort_unstable();
    nodes.dedup();
    Some(nodes)
}

impl MemoryTiers {
    /// Reads the tiers under `root` (normally [`SYSFS`]); a missing
    /// directory (kernel without memory tiering) gives no tiers, and
    /// entries that do not parse are left out.
    pub fn read(root: &Path) -> MemoryTiers {
        let mut tiers = Vec::new();
        if let Ok(dir) = std::fs::read_dir(root) {
            for e in dir.flatten() {
                let name = e.file_name();
                let Some(id) = name
                    .to_str()
                    .and_then(|n| n.strip_prefix("memory_tier"))
                    .and_then(|n| n.parse::<u32>().ok())
                else {
                    continue;
                };
                let nodes = std::fs::read_to_string(e.path().join("nodelist"))
                    .ok()
                    .and_then(|t| parse_nodelist(&t));
                if let Some(nodes) = nodes {
                    tiers.push((id, nodes));
                }
            }
        }
        tiers.sort();
        MemoryTiers { tiers }
    }

    pub fn from_tiers(mut tiers: Vec<(u32, Vec<u32>)>) -> MemoryTiers {
        tiers.sort();
        MemoryTiers { tiers }
    }

    /// Number of tiers that hold at least one node.
    pub fn len(&self) -> usize {
        self.tiers.iter().filter(|(_, n)| !n.is_empty()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The tier id of `node`.
    pub fn tier_of(&self, node: u32) -> Option<u32> {
        self.tiers
            .iter()
            .find(|(_, nodes)| nodes.contains(&node))
            .map(|(id, _)| *id)
    }

    /// The fastest tier that holds a node.
    pub fn fastest(&self) -> Option<u32> {
        self.tiers
            .iter()
            .find(|(_, n)| !n.is_empty())
            .map(|(id, _)| *id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodelists_parse_like_the_kernel_prints_them() {
        assert_eq!(parse_nodelist("0\n"), Some(vec![0]));
        assert_eq!(parse_nodelist("0-2,5"), Some(vec![0, 1, 2, 5]));
        assert_eq!(parse_nodelist(""), Some(vec![]));
        assert_eq!(parse_nodelist("2-1"), None);
        assert_eq!(parse_nodelist("x"), None);
    }

    #[test]
    fn reads_a_sysfs_tree_fastest_first() {
        let root = tempfile::tempdir().unwrap();
        for (dir, list) in [
            ("memory_tier22", "2-3"),
            ("memory_tier4", "0-1"),
            ("power", ""),
        ] {
            std::fs::create_dir_all(root.path().join(dir)).unwrap();
            if dir.starts_with("memory_tier") {
                std::fs::write(root.path().join(dir).join("nodelist"), list).unwrap();
            }
        }
        let t = MemoryTiers::read(root.path());
        assert_eq!(t.len(), 2);
        assert_eq!(t.fastest(), Some(4));
        assert_eq!(t.tier_of(3), Some(22));
        assert_eq!(t.tier_of(1), Some(4));
        assert_eq!(t.tier_of(7), None);
        assert!(MemoryTiers::read(&root.path().join("absent")).is_empty());
    }
}
