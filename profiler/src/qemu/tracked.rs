//! A QEMU VM as the registry tracks it: the tier map built from QMP, alive
//! while its process is (same PID, same start time), plugged sizes from
//! the handle's last read.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tier_proto::v1::Vm;

use super::handle::QemuHandle;
use crate::registry::{TierHotplugBytes, TrackedVm};

/// Start time of process `pid` (`/proc/PID/stat` field 22, clock ticks
/// since boot): tells a PID reused by another process apart.
pub fn start_time(proc_root: &Path, pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    // comm may hold spaces and parentheses: fields follow the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[derive(Debug)]
pub struct QemuVm {
    vm: Vm,
    proc_root: PathBuf,
    started: Option<u64>,
    handle: Arc<QemuHandle>,
    /// Device of each tier in `vm.tiers` order, if it has one.
    tier_devices: Vec<bool>,
}

impl QemuVm {
    pub fn new(vm: Vm, proc_root: PathBuf, handle: Arc<QemuHandle>) -> QemuVm {
        let started = start_time(&proc_root, vm.vmm_pid);
        let tier_devices = vm.tiers.iter().map(|t| t.hotplug.is_some()).collect();
        QemuVm {
            vm,
            proc_root,
            started,
            handle,
            tier_devices,
        }
    }
}

impl TrackedVm for QemuVm {
    fn vm(&self) -> &Vm {
        &self.vm
    }

    fn alive(&self) -> bool {
        let now = start_time(&self.proc_root, self.vm.vmm_pid);
        now.is_some() && now == self.started
    }

    fn resident_bytes(&self) -> Result<Vec<u64>, String> {
        crate::discovery::resident_bytes(&self.proc_root, self.vm.vmm_pid, &self.vm.tiers)
    }

    fn guest_reported_accesses(&self) -> Option<Vec<u64>> {
        None
    }

    /// Requested and plugged bytes of each tier's virtio-mem device.
    fn hotplug_bytes(&self) -> Option<Vec<TierHotplugBytes>> {
        if !self.tier_devices.iter().any(|d| *d) {
            return None;
        }
        let snap = self.handle.snapshot();
        Some(
            self.vm
                .tiers
                .iter()
                .map(|t| {
                    let z = self.handle.resizable(&snap, &t.name)?;
                    Some((z.requested, z.plugged))
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_reads_field_22_past_a_comm_with_spaces() {
        let root = tempfile::tempdir().unwrap();
        let d = root.path().join("42");
        std::fs::create_dir(&d).unwrap();
        let mut f: Vec<String> = (3..=25).map(|i| i.to_string()).collect();
        f[19] = "987654".into();
        std::fs::write(d.join("stat"), format!("42 (qemu (x) y) {}", f.join(" "))).unwrap();
        assert_eq!(start_time(root.path(), 42), Some(987654));
        assert_eq!(start_time(root.path(), 43), None);
        assert!(start_time(Path::new("/proc"), std::process::id()).is_some());
    }
}
