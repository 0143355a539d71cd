//! VM discovery: any process holding a `kvm-vm` anon inode, with a tier map
//! from the names of its memfd-backed guest memory (`/memfd:dram` — QEMU
//! names memfd backends after their id; our demo VM names them per region).
//!
//! Per VM, derived from /proc only:
//! - tiers: one per memfd name; its ranges are the VMAs of that memfd (host
//!   virtual addresses; guest-physical placement is unknown without the VMM,
//!   so `gpa_start` is 0 and the derivation says so);
//! - host NUMA nodes: the `N<node>=pages` fields of /proc/PID/numa_maps;
//! - kind: a configured override for the name, else the name itself when it
//!   is a kind ("dram", "pmem", "cxl", "remote"), else unknown.
//!
//! cloud-hypervisor VMs reachable through their API socket are found by
//! `crate::ch` instead (tier map from `vm.info`); `Discoverer` runs both.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use tier_proto::v1::{GpaRange, Tier, TierKind, Vm, VmSource};

use crate::registry::{Registry, TrackedVm};

/// Where a kvm-vm file descriptor lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KvmFd {
    pub pid: u32,
    pub fd: u32,
}

/// Every (pid, fd) under `proc_root` whose fd is a kvm-vm anon inode.
/// Processes that vanish or deny access mid-scan are skipped.
pub fn scan(proc_root: &Path) -> Vec<KvmFd> {
    let mut found = Vec::new();
    let Ok(procs) = std::fs::read_dir(proc_root) else {
        return found;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for f in fds.flatten() {
            let is_vm =
                std::fs::read_link(f.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:kvm-vm");
            if let (true, Some(fd)) = (is_vm, f.file_name().to_str().and_then(|s| s.parse().ok())) {
                found.push(KvmFd { pid, fd });
            }
        }
    }
    found.sort();
    found
}

/// One VMA of /proc/PID/maps backed by a memfd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemfdVma {
    pub start: u64,
    pub end: u64,
    pub name: String,
}

/// The memfd-backed VMAs of a maps file (`/memfd:NAME (deleted)`).
pub fn memfd_vmas(maps: &str) -> Vec<MemfdVma> {
    maps.lines()
        .filter_map(|l| {
            let mut cols = l.split_whitespace();
            let range = cols.next()?;
            let path = l.split_once("/memfd:")?.1;
            let name = path
                .strip_suffix(" (deleted)")
                .unwrap_or(path)
                .trim()
                .to_string();
            let (a, b) = range.split_once('-')?;
            Some(MemfdVma {
                start: u64::from_str_radix(a, 16).ok()?,
                end: u64::from_str_radix(b, 16).ok()?,
                name,
            })
        })
        .collect()
}

/// Host NUMA nodes with pages in the VMA starting at `start`, from
/// /proc/PID/numa_maps (`7f.. default file=... N0=12 N1=3`).
pub fn numa_nodes(numa_maps: &str, start: u64) -> BTreeSet<u32> {
    let head = format!("{start:x} ");
    numa_maps
        .lines()
        .find(|l| l.starts_with(&head))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|f| f.strip_prefix('N')?.split_once('=')?.0.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Kind of a tier named `name`: override, else the name if it is a kind.
pub fn kind_for(name: &str, overrides: &HashMap<String, TierKind>) -> (TierKind, String) {
    if let Some(k) = overrides.get(name) {
        return (
            *k,
            format!(
                "memfd {name:?}: kind {} from the tier-kind override",
                k.short_name()
            ),
        );
    }
    match TierKind::from_short_name(name) {
        Some(k) => (k, format!("memfd {name:?}: kind from its name")),
        None => (
            TierKind::Unknown,
            format!("memfd {name:?}: kind unknown (no override; name is not a kind)"),
        ),
    }
}

/// Tiers from the memfd VMAs of a process: DRAM first, then by name.
pub fn tiers(maps: &str, numa_maps: &str, overrides: &HashMap<String, TierKind>) -> Vec<Tier> {
    let mut by_name: BTreeMap<String, Vec<MemfdVma>> = BTreeMap::new();
    for v in memfd_vmas(maps) {
        by_name.entry(v.name.clone()).or_default().push(v);
    }
    let mut out: Vec<Tier> = by_name
        .into_iter()
        .map(|(name, vmas)| {
            let (kind, why) = kind_for(&name, overrides);
            let nodes: BTreeSet<u32> = vmas.iter().flat_map(|v| numa_nodes(numa_maps, v.start)).collect();
            Tier {
                kind: kind as i32,
                host_numa_nodes: nodes.into_iter().collect(),
                ranges: vmas
                    .iter()
                    .map(|v| GpaRange {
                        gpa_start: 0,
                        length: v.end - v.start,
                        hva_start: v.start,
                    })
                    .collect(),
                size_bytes: vmas.iter().map(|v| v.end - v.start).sum(),
                derivation: format!("{why}; host ranges from /proc/PID/maps; guest-physical placement unknown (no VMM API)"),
                hotplug: None,
                name,
            }
        })
        .collect();
    out.sort_by_key(|t| (t.kind() != TierKind::Dram, t.name.clone()));
    out
}

/// Number of `anon_inode:kvm-vcpu:N` fds of the process at `dir`.
pub fn vcpu_count(dir: &Path) -> u32 {
    std::fs::read_dir(dir.join("fd"))
        .map(|d| {
            d.flatten()
                .filter(|f| {
                    std::fs::read_link(f.path())
                        .is_ok_and(|l| l.to_string_lossy().starts_with("anon_inode:kvm-vcpu"))
                })
                .count() as u32
        })
        .unwrap_or(0)
}

/// Whether the kvm-vm fd is still open.
pub fn kvm_fd_alive(proc_root: &Path, key: KvmFd) -> bool {
    let fd = proc_root
        .join(key.pid.to_string())
        .join("fd")
        .join(key.fd.to_string());
    std::fs::read_link(fd).is_ok_and(|l| l.as_os_str() == "anon_inode:kvm-vm")
}

/// `Rss:` of each tier's host ranges in /proc/PID/smaps (0 for ranges
/// whose host address is unknown); `Err` with the reason when smaps is
/// unreadable: unknown, which the controller must not read as 0.
pub fn resident_bytes(proc_root: &Path, pid: u32, tiers: &[Tier]) -> Result<Vec<u64>, String> {
    let path = proc_root.join(pid.to_string()).join("smaps");
    let smaps = std::fs::read_to_string(&path)
        .map_err(|e| format!("{} unreadable: {e}", path.display()))?;
    let rss = crate::sampler::hostpte::parse_smaps_field(&smaps, "Rss:");
    Ok(tiers
        .iter()
        .map(|t| {
            t.ranges
                .iter()
                .filter(|r| r.hva_start != 0)
                .map(|r| crate::sampler::hostpte::bytes_in(&rss, r.hva_start, r.length))
                .sum()
        })
        .collect())
}

/// A VM found by its kvm-vm fd.
#[derive(Debug)]
pub struct ProcessVm {
    key: KvmFd,
    proc_root: PathBuf,
    vm: Vm,
}

impl ProcessVm {
    /// Reads the process's maps and builds the VM; `None` if it holds no
    /// memfd-backed memory (nothing tierd could attribute) or is gone.
    pub fn probe(
        proc_root: &Path,
        key: KvmFd,
        overrides: &HashMap<String, TierKind>,
    ) -> Option<ProcessVm> {
        let dir = proc_root.join(key.pid.to_string());
        let maps = std::fs::read_to_string(dir.join("maps")).ok()?;
        let numa = std::fs::read_to_string(dir.join("numa_maps")).unwrap_or_default();
        let tiers = tiers(&maps, &numa, overrides);
        if tiers.is_empty() {
            return None;
        }
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let vcpus = vcpu_count(&dir);
        Some(ProcessVm {
            key,
            proc_root: proc_root.to_path_buf(),
            vm: Vm {
                id: format!("kvm:{}:{}", key.pid, key.fd),
                name: format!("{}-{}", comm.trim(), key.pid),
                vmm_pid: key.pid,
                api_socket: String::new(),
                vcpus,
                tiers,
                source: VmSource::KvmFd as i32,
                discovered_unix_ns: crate::unix_now_ns(),
            },
        })
    }

    pub fn key(&self) -> KvmFd {
        self.key
    }
}

impl TrackedVm for ProcessVm {
    fn vm(&self) -> &Vm {
        &self.vm
    }

    fn alive(&self) -> bool {
        kvm_fd_alive(&self.proc_root, self.key)
    }

    fn resident_bytes(&self) -> Result<Vec<u64>, String> {
        resident_bytes(&self.proc_root, self.key.pid, &self.vm.tiers)
    }

    fn guest_reported_accesses(&self) -> Option<Vec<u64>> {
        None
    }
}

/// Finds VMs in other processes each interval and adds the new ones:
/// cloud-hypervisor VMs by their API sockets (`crate::ch`) and QEMU VMs by
/// their QMP sockets (`crate::qemu`) when enabled, then every other process holding a kvm-vm fd.
#[derive(Debug)]
pub struct Discoverer {
    proc_root: PathBuf,
    overrides: HashMap<String, TierKind>,
    /// kvm-vm fds that hold no memfd memory: reported once, not re-read.
    skipped: HashSet<KvmFd>,
    ch: Option<crate::ch::ChDiscovery>,
    qemu: Option<crate::qemu::QemuDiscovery>,
    /// Track processes by their kvm-vm fd (`[discovery] kvm_fd`).
    kvm_fd: bool,
}

impl Discoverer {
    pub fn new(proc_root: &Path, overrides: HashMap<String, TierKind>) -> Discoverer {
        Discoverer {
            proc_root: proc_root.to_path_buf(),
            overrides,
            skipped: HashSet::new(),
            ch: None,
            qemu: None,
            kvm_fd: true,
        }
    }

    /// Whether processes other than cloud-hypervisor VMs with a usable API
    /// are tracked by their kvm-vm fd (on by default).
    pub fn with_kvm_fd(mut self, on: bool) -> Discoverer {
        self.kvm_fd = on;
        self
    }

    /// Also finds cloud-hypervisor VMs through their API sockets; their
    /// handles go to `fleet`.
    pub fn with_cloud_hypervisor(
        mut self,
        cfg: crate::ch::ChConfig,
        fleet: crate::ch::Fleet,
    ) -> Discoverer {
        self.ch = Some(crate::ch::ChDiscovery::new(
            cfg,
            &self.proc_root,
            self.overrides.clone(),
            fleet,
        ));
        self
    }

    /// Also finds QEMU VMs through their QMP sockets; their handles go to
    /// `fleet`.
    pub fn with_qemu(
        mut self,
        cfg: crate::qemu::QemuConfig,
        fleet: crate::qemu::Fleet,
    ) -> Discoverer {
        self.qemu = Some(crate::qemu::QemuDiscovery::new(
            cfg,
            &self.proc_root,
            self.overrides.clone(),
            fleet,
        ));
        self
    }

    /// Adds VMs not yet in `reg`; tierd's own process is skipped (its demo
    /// VM is registered directly), and so are processes whose VM is
    /// tracked through its cloud-hypervisor API.
    pub fn run(&mut self, reg: &mut Registry) {
        let me = std::process::id();
        let found = scan(&self.proc_root);
        let mut claimed = match self.ch.as_mut() {
            Some(ch) => {
                ch.run(reg, &found);
                ch.claimed_pids()
            }
            None => HashSet::new(),
        };
        if let Some(q) = self.qemu.as_mut() {
            q.run(reg);
            claimed.extend(q.claimed_pids());
        }
        self.skipped.retain(|k| found.contains(k));
        if !self.kvm_fd {
            return;
        }
        for key in found {
            let id = format!("kvm:{}:{}", key.pid, key.fd);
            if key.pid == me
                || reg.contains(&id)
                || self.skipped.contains(&key)
                || claimed.contains(&key.pid)
            {
                continue;
            }
            match ProcessVm::probe(&self.proc_root, key, &self.overrides) {
                Some(vm) => {
                    tracing::info!(vm = %id, tiers = vm.vm().tiers.len(), "VM discovered");
                    reg.insert(Box::new(vm));
                }
                None => {
                    tracing::info!(vm = %id, "kvm-vm fd without memfd-backed memory: not tracked");
                    self.skipped.insert(key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d4c0000000-55d4c0100000 r-xp 00000000 08:01 123   /usr/bin/tier-demo-vm
7fd53f7a1000-7fd5407a1000 rw-s 00000000 00:01 171                        /memfd:slow (deleted)
7fd5407a3000-7fd5417a3000 rw-s 00000000 00:01 170                        /memfd:dram (deleted)
7fd5417a3000-7fd5417a4000 rw-s 00000000 00:01 172                        /memfd:ch_ram (deleted)
7fff00000000-7fff00021000 rw-p 00000000 00:00 0                          [stack]
";
    const NUMA: &str = "\
7fd53f7a1000 default file=/memfd:slow\\040(deleted) dirty=96 N1=96 kernelpagesize_kB=4
7fd5407a3000 bind:0 file=/memfd:dram\\040(deleted) dirty=50 N0=50 kernelpagesize_kB=4
";

    #[test]
    fn memfd_vmas_are_named_ranges() {
        let v = memfd_vmas(MAPS);
        assert_eq!(v.len(), 3);
        assert_eq!(
            v[0],
            MemfdVma {
                start: 0x7fd5_3f7a_1000,
                end: 0x7fd5_407a_1000,
                name: "slow".into()
            }
        );
        assert_eq!(v[2].name, "ch_ram");
    }

    #[test]
    fn tiers_dram_first_with_nodes_kinds_and_ranges() {
        let overrides = HashMap::from([("slow".to_string(), TierKind::Cxl)]);
        let t = tiers(MAPS, NUMA, &overrides);
        let names: Vec<&str> = t.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["dram", "ch_ram", "slow"]);
        assert_eq!(t[0].kind(), TierKind::Dram);
        assert_eq!(t[0].host_numa_nodes, vec![0]);
        assert_eq!(t[0].size_bytes, 16 << 20);
        assert_eq!(t[0].ranges[0].hva_start, 0x7fd5_407a_3000);
        assert_eq!(t[1].kind(), TierKind::Unknown);
        assert!(t[1].derivation.contains("kind unknown"));
        assert_eq!(t[2].kind(), TierKind::Cxl);
        assert_eq!(t[2].host_numa_nodes, vec![1]);
        assert!(t[2].derivation.contains("override"));
    }

    #[test]
    fn scan_of_a_fake_proc_tree_finds_only_kvm_vm_fds() {
        let root = tempfile::tempdir().unwrap();
        let mk = |pid: &str, fd: &str, target: &str| {
            let d = root.path().join(pid).join("fd");
            std::fs::create_dir_all(&d).unwrap();
            std::os::unix::fs::symlink(target, d.join(fd)).unwrap();
        };
        mk("10", "4", "anon_inode:kvm-vm");
        mk("10", "5", "anon_inode:kvm-vcpu:0");
        mk("11", "3", "/dev/kvm");
        mk("12", "9", "anon_inode:kvm-vm");
        std::fs::create_dir_all(root.path().join("self")).unwrap();
        assert_eq!(
            scan(root.path()),
            vec![KvmFd { pid: 10, fd: 4 }, KvmFd { pid: 12, fd: 9 }]
        );
    }

    #[test]
    fn resident_bytes_are_unknown_without_smaps_never_zero() {
        let root = tempfile::tempdir().unwrap();
        let tiers = [Tier {
            name: "dram".into(),
            ranges: vec![tier_proto::v1::GpaRange {
                gpa_start: 0,
                length: 8192,
                hva_start: 0x7f00_0000_0000,
            }],
            ..Default::default()
        }];
        let err = resident_bytes(root.path(), 42, &tiers).unwrap_err();
        assert!(err.contains("42/smaps unreadable"), "{err}");
        let d = root.path().join("42");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("smaps"),
            "7f0000000000-7f0000002000 rw-s 00000000 00:01 5 /memfd:dram (deleted)\nRss:                   4 kB\n",
        )
        .unwrap();
        assert_eq!(resident_bytes(root.path(), 42, &tiers), Ok(vec![4096]));
    }
}
