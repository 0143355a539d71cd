//! The Linux bed's QEMU as tierd's registry sees it: a tier map built
//! from the backend files' mappings in /proc/PID/maps (each file is one
//! guest-physical range, mapped linearly), registered as a tierd source
//! registers a VM. Node 0's backends are the `dram` tier, node 1's the
//! `slow` tier.

use std::path::{Path, PathBuf};

use tier_profiler::registry::TrackedVm;
use tier_proto::v1::{GpaRange, Tier, TierKind, Vm, VmSource};

use super::WorkloadError;

/// One backend: id (`m0`, `vm1`), guest-physical start, bytes, file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    pub id: String,
    pub gpa: u64,
    pub len: u64,
    pub file: PathBuf,
}

impl Backend {
    /// The NUMA node: the id's trailing digit (`m1`, `vm1` -> 1).
    pub fn node(&self) -> Option<usize> {
        self.id.chars().last()?.to_digit(10).map(|d| d as usize)
    }
}

/// Start and end of the mapping of `file` in maps text (the first one of
/// the file's full length; QEMU maps each backend once).
pub fn mapping_of(maps: &str, file: &Path, len: u64) -> Option<(u64, u64)> {
    let want = file.to_str()?;
    maps.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (a, b) = f.next()?.split_once('-')?;
        // perms, offset, dev, inode, then the path.
        let offset = f.nth(1)?;
        let path = f.nth(2)?;
        let (a, b) = (
            u64::from_str_radix(a, 16).ok()?,
            u64::from_str_radix(b, 16).ok()?,
        );
        (path == want && offset.trim_start_matches('0').is_empty() && b - a == len)
            .then_some((a, b))
    })
}

/// The `dram` (node 0) and `slow` (node 1) tiers of `backends` as
/// mapped in `maps`.
pub fn tiers(maps: &str, backends: &[Backend]) -> Result<Vec<Tier>, WorkloadError> {
    let mut out = Vec::new();
    for (node, name, kind) in [(0, "dram", TierKind::Dram), (1, "slow", TierKind::Cxl)] {
        let mut ranges = Vec::new();
        let mut ids = Vec::new();
        for b in backends.iter().filter(|b| b.node() == Some(node)) {
            let (start, _) = mapping_of(maps, &b.file, b.len).ok_or_else(|| {
                WorkloadError::Linux(format!(
                    "{} ({} bytes) is not mapped by QEMU",
                    b.file.display(),
                    b.len
                ))
            })?;
            ranges.push(GpaRange {
                gpa_start: b.gpa,
                length: b.len,
                hva_start: start,
            });
            ids.push(b.id.clone());
        }
        out.push(Tier {
            name: name.into(),
            kind: kind as i32,
            host_numa_nodes: vec![0],
            size_bytes: ranges.iter().map(|r| r.length).sum(),
            ranges,
            derivation: format!(
                "Linux bed: guest NUMA node {node} = backends {} (their /dev/shm files in QEMU's maps)",
                ids.join(", ")
            ),
            hotplug: None,
        });
    }
    Ok(out)
}

/// A TCG QEMU of the bed, with the tier map read from its maps.
#[derive(Debug)]
pub struct QemuVm {
    vm: Vm,
}

impl QemuVm {
    pub fn new(pid: u32, tiers: Vec<Tier>, vcpus: u32) -> QemuVm {
        QemuVm {
            vm: Vm {
                id: format!("qemu:{pid}"),
                name: "linux-bed".into(),
                vmm_pid: pid,
                api_socket: String::new(),
                vcpus,
                tiers,
                // No tierd source finds a TCG QEMU (no kvm-vm fd, no API
                // socket): the bench adds it itself.
                source: VmSource::Unspecified as i32,
                discovered_unix_ns: tier_profiler::unix_now_ns(),
            },
        }
    }
}

impl TrackedVm for QemuVm {
    fn vm(&self) -> &Vm {
        &self.vm
    }

    fn alive(&self) -> bool {
        Path::new(&format!("/proc/{}", self.vm.vmm_pid)).exists()
    }

    fn resident_bytes(&self) -> Result<Vec<u64>, String> {
        tier_profiler::discovery::resident_bytes(
            Path::new("/proc"),
            self.vm.vmm_pid,
            &self.vm.tiers,
        )
    }

    fn guest_reported_accesses(&self) -> Option<Vec<u64>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0000000-55d0c0100000 r-xp 00000000 fd:00 1234 /usr/bin/qemu-system-x86_64
7f0000000000-7f0010000000 rw-s 00000000 00:1a 11 /dev/shm/bed/m0
7f0010000000-7f0020000000 rw-s 00000000 00:1a 12 /dev/shm/bed/m1
7f0020000000-7f0040000000 rw-s 00000000 00:1a 13 /dev/shm/bed/vm0
7f0040000000-7f0060000000 rw-s 00000000 00:1a 14 /dev/shm/bed/vm1
7f0060000000-7f0060001000 rw-s 00001000 00:1a 14 /dev/shm/bed/vm1
";

    fn b(id: &str, gpa: u64, mib: u64) -> Backend {
        Backend {
            id: id.into(),
            gpa,
            len: mib << 20,
            file: PathBuf::from(format!("/dev/shm/bed/{id}")),
        }
    }

    #[test]
    fn node_zero_is_dram_and_node_one_slow_each_by_its_files() {
        let bs = [
            b("m0", 0, 256),
            b("m1", 256 << 20, 256),
            b("vm0", 1 << 32, 512),
            b("vm1", (1 << 32) + (512 << 20), 512),
        ];
        let t = tiers(MAPS, &bs).unwrap();
        assert_eq!(t[0].name, "dram");
        assert_eq!(t[0].ranges.len(), 2);
        assert_eq!(t[0].ranges[0].hva_start, 0x7f00_0000_0000);
        assert_eq!(t[0].ranges[1].gpa_start, 1 << 32);
        assert_eq!(t[1].name, "slow");
        let hvas: Vec<u64> = t[1].ranges.iter().map(|r| r.hva_start).collect();
        assert_eq!(hvas, vec![0x7f00_1000_0000, 0x7f00_4000_0000]);
        assert_eq!(t[1].size_bytes, 768 << 20);
        assert_eq!(t[1].kind, TierKind::Cxl as i32);
    }

    #[test]
    fn a_backend_not_mapped_at_its_length_is_an_error() {
        assert!(tiers(MAPS, &[b("m0", 0, 128)]).is_err());
        assert_eq!(b("vm1", 0, 1).node(), Some(1));
    }
}
