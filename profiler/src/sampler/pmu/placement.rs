//! Where a vCPU runs, and so which tier a memory-source event counts in.
//!
//! Local and remote DRAM events are relative to the CPU the vCPU thread
//! runs on: "local" is the DRAM of that CPU's node. A VM whose DRAM tiers
//! sit on one node gets every DRAM event in that tier wherever its vCPUs
//! run; a VM with DRAM tiers on several nodes needs each vCPU's node. It
//! comes from the thread's affinity when that lies within one node (exact),
//! else from the CPU it was on at both ends of the interval (an assumption,
//! said in `SourceCount.attribution`), else the DRAM tiers are not measured
//! for that interval.
//!
//! Sub-NUMA clustering (several nodes with CPUs in one package) is detected
//! and reported: the DRAM events' "local" then covers only the CPU's own
//! cluster on some parts and the whole socket on others, so traffic between
//! clusters of one socket cannot be told apart from the events alone.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::events::TierKind;

/// CPUs, NUMA nodes and packages of the host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    cpu_node: BTreeMap<u32, u32>,
    /// Package (socket) of each node that has CPUs.
    node_packages: BTreeMap<u32, BTreeSet<u32>>,
}

impl Topology {
    /// This host's topology; one node 0 holding every CPU when sysfs
    /// does not say (no NUMA).
    pub fn read() -> Topology {
        Topology::from_sysfs(Path::new("/sys/devices/system")).unwrap_or_default()
    }

    /// From a sysfs tree (`node/nodeN/cpulist`,
    /// `cpu/cpuN/topology/physical_package_id`).
    pub fn from_sysfs(root: &Path) -> Result<Topology, String> {
        let mut t = Topology::default();
        let nodes = std::fs::read_dir(root.join("node"))
            .map_err(|e| format!("{}: {e}", root.join("node").display()))?;
        for entry in nodes.flatten() {
            let name = entry.file_name();
            let Some(node) = name
                .to_str()
                .and_then(|n| n.strip_prefix("node"))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let list = std::fs::read_to_string(entry.path().join("cpulist"))
                .map_err(|e| format!("{}: {e}", entry.path().display()))?;
            // Same list syntax as memory tiers' nodelist.
            let cpus = crate::memtier::parse_nodelist(&list)
                .ok_or_else(|| format!("{}: bad cpu list {list:?}", entry.path().display()))?;
            for cpu in cpus {
                t.cpu_node.insert(cpu, node);
                let pkg = std::fs::read_to_string(
                    root.join(format!("cpu/cpu{cpu}/topology/physical_package_id")),
                )
                .ok()
                .and_then(|p| p.trim().parse::<u32>().ok())
                .unwrap_or(0);
                t.node_packages.entry(node).or_default().insert(pkg);
            }
        }
        Ok(t)
    }

    /// Node of `cpu`; 0 on a host without NUMA information.
    pub fn node_of(&self, cpu: u32) -> Option<u32> {
        if self.cpu_node.is_empty() {
            return Some(0);
        }
        self.cpu_node.get(&cpu).copied()
    }

    /// Nodes of a CPU set (CPUs unknown to the topology are left out).
    pub fn nodes_of(&self, cpus: &BTreeSet<u32>) -> BTreeSet<u32> {
        cpus.iter().filter_map(|c| self.node_of(*c)).collect()
    }

    /// Nodes with CPUs.
    pub fn cpu_nodes(&self) -> usize {
        self.node_packages.len().max(1)
    }

    /// Sub-NUMA clustering: what it is and what it hides, if a package
    /// holds more than one node with CPUs.
    pub fn sub_numa_clustering(&self) -> Option<String> {
        let mut per_pkg: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
        for (node, pkgs) in &self.node_packages {
            for p in pkgs {
                per_pkg.entry(*p).or_default().insert(*node);
            }
        }
        let (pkg, nodes) = per_pkg.iter().find(|(_, n)| n.len() > 1)?;
        Some(format!(
            "sub-NUMA clustering: package {pkg} holds nodes {nodes:?}; local/remote DRAM events \
             cannot tell one cluster of a socket from another, so a tier on a sibling cluster \
             is attributed by the tiers' nodes only"
        ))
    }
}

/// CPUs thread `tid` may run on.
pub fn affinity(tid: u32) -> std::io::Result<BTreeSet<u32>> {
    // SAFETY: cpu_set_t is plain data; all-zero is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe {
        libc::sched_getaffinity(
            tid as libc::pid_t,
            std::mem::size_of::<libc::cpu_set_t>(),
            &mut set,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: CPU_ISSET reads within `set` for indices below its bit size.
    Ok((0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .map(|c| c as u32)
        .collect())
}

/// The CPU thread `tid` of `pid` last ran on (`stat` field 39).
pub fn last_cpu(pid: u32, tid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    // Fields after the parenthesised comm, which may hold spaces.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    rest.split_whitespace().nth(36)?.parse().ok()
}

/// Where a vCPU ran over an interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Its affinity lies within this node.
    Pinned(u32),
    /// Not pinned, but on this node at both ends of the interval.
    Observed(u32),
    /// Not known, and why.
    Unknown(String),
}

/// A vCPU's placement from its affinity nodes and the nodes it was on at
/// the start and the end of the interval.
pub fn place(affinity_nodes: &BTreeSet<u32>, then: Option<u32>, now: Option<u32>) -> Placement {
    if let (1, Some(&n)) = (affinity_nodes.len(), affinity_nodes.first()) {
        return Placement::Pinned(n);
    }
    match (then, now) {
        (Some(a), Some(b)) if a == b => Placement::Observed(a),
        (Some(a), Some(b)) => Placement::Unknown(format!(
            "not pinned to one NUMA node and moved from node {a} to {b}"
        )),
        _ => Placement::Unknown("not pinned to one NUMA node, node not known".into()),
    }
}

/// Whether an event counts DRAM relative to the vCPU's node (local or
/// remote), as the table's `tier` says it.
pub fn is_dram_event(kind: TierKind) -> bool {
    matches!(kind, TierKind::Dram | TierKind::Remote)
}

/// A tier of a VM as attribution sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierPlace {
    pub kind: TierKind,
    /// Host nodes backing it (empty: not known).
    pub nodes: Vec<u32>,
}

/// Whether a tier is DRAM of some node (local or remote to a vCPU).
pub fn dram_backed(t: &TierPlace) -> bool {
    matches!(t.kind, TierKind::Dram | TierKind::Remote)
}

/// The tier an event of `event` kind counts in for a vCPU at `placement`,
/// and an attribution note when the answer rests on an assumption; `Err`
/// says why the event counts in no tier.
pub fn tier_for(
    event: TierKind,
    placement: &Placement,
    tiers: &[TierPlace],
) -> Result<(usize, Option<String>), String> {
    if !is_dram_event(event) {
        let name = event.short_name();
        return tiers
            .iter()
            .position(|t| t.kind == event)
            .map(|i| (i, None))
            .ok_or_else(|| format!("the VM has no {name} tier"));
    }
    let dram: Vec<usize> = (0..tiers.len())
        .filter(|&i| dram_backed(&tiers[i]))
        .collect();
    match dram.as_slice() {
        [] => return Err("the VM has no DRAM tier".into()),
        // One DRAM tier: every DRAM access, local or remote, is its.
        [only] => return Ok((*only, None)),
        _ => {}
    }
    let local_kind = event == TierKind::Dram;
    let what = if local_kind { "local" } else { "remote" };
    let known = dram.iter().filter(|&&i| !tiers[i].nodes.is_empty()).count();
    if known == 0 {
        // No tier says its node: the discovered kinds (dram = the vCPUs'
        // node, remote = another) are all there is, said as an assumption.
        let want = if local_kind {
            TierKind::Dram
        } else {
            TierKind::Remote
        };
        return dram
            .iter()
            .copied()
            .find(|&i| tiers[i].kind == want)
            .map(|i| {
                (
                    i,
                    Some(format!(
                        "the DRAM tiers' host nodes are unknown: {what} DRAM taken as the {} tier",
                        want.short_name()
                    )),
                )
            })
            .ok_or_else(|| format!("no {} tier for {what} DRAM", want.short_name()));
    }
    if known < dram.len() {
        return Err(
            "some DRAM tiers' host nodes are unknown: local and remote DRAM cannot be told apart"
                .into(),
        );
    }
    let (node, assumed) = match placement {
        Placement::Pinned(n) => (*n, None),
        Placement::Observed(n) => (
            *n,
            Some(format!(
                "vCPU not pinned to one NUMA node: taken as on node {n}, where it was at both ends of the interval"
            )),
        ),
        Placement::Unknown(why) => {
            return Err(format!(
                "the VM has DRAM tiers on several nodes and a vCPU is {why}: pin vCPUs to one node"
            ));
        }
    };
    let found: Vec<usize> = dram
        .iter()
        .copied()
        .filter(|&i| tiers[i].nodes.contains(&node) == local_kind)
        .collect();
    match found.as_slice() {
        [one] => Ok((*one, assumed)),
        [] => Err(format!("no DRAM tier {what} to node {node}")),
        many => Err(format!(
            "{what} DRAM of a vCPU on node {node} cannot be split between {} DRAM tiers",
            many.len()
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn sysfs(nodes: &[(u32, &str)], packages: &[(u32, u32)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (n, list) in nodes {
            let p = d.path().join(format!("node/node{n}"));
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("cpulist"), format!("{list}\n")).unwrap();
        }
        for (cpu, pkg) in packages {
            let p = d.path().join(format!("cpu/cpu{cpu}/topology"));
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("physical_package_id"), format!("{pkg}\n")).unwrap();
        }
        d
    }

    #[test]
    fn two_sockets_and_sub_numa_clustering() {
        // Two packages, one node each: no SNC.
        let d = sysfs(&[(0, "0-1"), (1, "2-3")], &[(0, 0), (1, 0), (2, 1), (3, 1)]);
        let t = Topology::from_sysfs(d.path()).unwrap();
        assert_eq!((t.node_of(3), t.cpu_nodes()), (Some(1), 2));
        assert_eq!(t.nodes_of(&BTreeSet::from([0, 3])), BTreeSet::from([0, 1]));
        assert!(t.sub_numa_clustering().is_none());
        // One package split in two nodes, plus a CPU-less (CXL) node 2.
        let d = sysfs(
            &[(0, "0-1"), (1, "2-3"), (2, "")],
            &[(0, 0), (1, 0), (2, 0), (3, 0)],
        );
        let t = Topology::from_sysfs(d.path()).unwrap();
        let snc = t.sub_numa_clustering().unwrap();
        assert!(snc.contains("package 0 holds nodes {0, 1}"), "{snc}");
        assert_eq!(t.cpu_nodes(), 2);
        // No NUMA information: everything is node 0.
        assert_eq!(Topology::default().node_of(7), Some(0));
        // A cpulist that does not parse is an error naming the file.
        let d = sysfs(&[(0, "0-x")], &[]);
        let e = Topology::from_sysfs(d.path()).unwrap_err();
        assert!(e.contains("node0: bad cpu list"), "{e}");
    }

    #[test]
    fn this_hosts_topology_and_this_threads_affinity() {
        let t = Topology::read();
        let cpus = affinity(0).unwrap();
        assert!(!cpus.is_empty());
        assert!(!t.nodes_of(&cpus).is_empty(), "{t:?} {cpus:?}");
        let pid = std::process::id();
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        let cpu = last_cpu(pid, tid).unwrap();
        assert!(cpus.contains(&cpu), "{cpu} not in {cpus:?}");
    }

    fn tiers(list: &[(TierKind, &[u32])]) -> Vec<TierPlace> {
        list.iter()
            .map(|(kind, nodes)| TierPlace {
                kind: *kind,
                nodes: nodes.to_vec(),
            })
            .collect()
    }

    #[test]
    fn placement_from_affinity_then_observation() {
        assert_eq!(
            place(&BTreeSet::from([1]), None, None),
            Placement::Pinned(1)
        );
        assert_eq!(
            place(&BTreeSet::from([0, 1]), Some(1), Some(1)),
            Placement::Observed(1)
        );
        assert!(matches!(
            place(&BTreeSet::from([0, 1]), Some(0), Some(1)),
            Placement::Unknown(w) if w.contains("moved from node 0 to 1")
        ));
    }

    #[test]
    fn local_and_remote_dram_follow_the_vcpu() {
        use TierKind::*;
        // dram on node 0, a second DRAM zone on node 1 (discovered "dram"
        // too: the other socket), cxl on node 2.
        let t = tiers(&[(Dram, &[0]), (Dram, &[1]), (Cxl, &[2])]);
        assert_eq!(tier_for(Dram, &Placement::Pinned(0), &t), Ok((0, None)));
        assert_eq!(tier_for(Remote, &Placement::Pinned(0), &t), Ok((1, None)));
        // Re-pinned to the other socket: local and remote swap.
        assert_eq!(tier_for(Dram, &Placement::Pinned(1), &t), Ok((1, None)));
        assert_eq!(tier_for(Remote, &Placement::Pinned(1), &t), Ok((0, None)));
        // CXL does not depend on placement.
        assert_eq!(
            tier_for(Cxl, &Placement::Unknown("x".into()), &t),
            Ok((2, None))
        );
        // Observed: counted, with the assumption said.
        let (i, note) = tier_for(Remote, &Placement::Observed(1), &t).unwrap();
        assert!(i == 0 && note.unwrap().contains("not pinned"));
        // Unknown: not measured, with why and the fix.
        let e = tier_for(Dram, &Placement::Unknown("moved".into()), &t).unwrap_err();
        assert!(e.contains("pin vCPUs"), "{e}");
        // Three DRAM tiers: local is one, remote cannot be split.
        let three = tiers(&[(Dram, &[0]), (Dram, &[1]), (Dram, &[2])]);
        assert_eq!(tier_for(Dram, &Placement::Pinned(2), &three), Ok((2, None)));
        let e = tier_for(Remote, &Placement::Pinned(0), &three).unwrap_err();
        assert!(e.contains("cannot be split between 2 DRAM tiers"), "{e}");
        // No pmem tier: the event counts nowhere, said.
        assert_eq!(
            tier_for(Pmem, &Placement::Pinned(0), &t),
            Err("the VM has no pmem tier".into())
        );
    }

    #[test]
    fn one_dram_tier_takes_local_and_remote_wherever_the_vcpu_runs() {
        use TierKind::*;
        let t = tiers(&[(Dram, &[0]), (Cxl, &[2])]);
        let unknown = Placement::Unknown("moved".into());
        assert_eq!(tier_for(Dram, &unknown, &t), Ok((0, None)));
        assert_eq!(tier_for(Remote, &unknown, &t), Ok((0, None)));
        // A VM whose only DRAM is the other socket's (kind remote).
        let t = tiers(&[(Remote, &[1]), (Cxl, &[2])]);
        assert_eq!(tier_for(Dram, &Placement::Pinned(1), &t), Ok((0, None)));
        // Tiers without node information keep their discovered kinds,
        // as a stated assumption, wherever the vCPU runs.
        let t = tiers(&[(Dram, &[]), (Remote, &[])]);
        let moved = Placement::Unknown("moved".into());
        let (i, note) = tier_for(Dram, &moved, &t).unwrap();
        assert!(i == 0 && note.unwrap().contains("host nodes are unknown"));
        assert_eq!(tier_for(Remote, &Placement::Pinned(0), &t).unwrap().0, 1);
        // Some nodes known, some not: cannot tell.
        let t = tiers(&[(Dram, &[]), (Dram, &[1])]);
        assert!(tier_for(Dram, &Placement::Pinned(1), &t).is_err());
        assert_eq!(
            tier_for(Dram, &Placement::Pinned(0), &tiers(&[(Cxl, &[2])])),
            Err("the VM has no DRAM tier".into())
        );
    }
}
