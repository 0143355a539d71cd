//! vCPU threads of a VMM process: threads whose `comm` is `vcpuN`
//! (cloud-hypervisor names them so), found in `/proc/PID/task`, and
//! followed as they come and go ([`VcpuTracker::poll`]).
//!
//! Not done yet: the fallback for VMMs that do not name their threads
//! (threads of the process that issue KVM_RUN, e.g. by their
//! `/proc/PID/task/TID/syscall` or a `kvm:kvm_entry` tracepoint).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One vCPU thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VcpuThread {
    /// Thread id (the pid of perf_event_open).
    pub tid: u32,
    /// N of `vcpuN`.
    pub index: u32,
}

/// Why the vCPU threads of a process are not known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VcpuError {
    #[error("VMM process {pid} is gone")]
    ProcessGone { pid: u32 },
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    #[error(
        "process {pid}: no vcpuN threads (not a cloud-hypervisor VMM; the KVM_RUN fallback is not implemented)"
    )]
    NoVcpuThreads { pid: u32 },
}

/// `N` if `comm` is `vcpuN`.
pub fn vcpu_index(comm: &str) -> Option<u32> {
    let digits = comm.trim_end_matches('\n').strip_prefix("vcpu")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The vCPU threads of `pid`, by index.
pub fn discover(pid: u32) -> Result<Vec<VcpuThread>, VcpuError> {
    discover_in(Path::new("/proc"), pid)
}

/// [`discover`] under another procfs root (tests).
pub fn discover_in(proc_root: &Path, pid: u32) -> Result<Vec<VcpuThread>, VcpuError> {
    let found = scan(proc_root, pid)?;
    if found.is_empty() {
        return Err(VcpuError::NoVcpuThreads { pid });
    }
    Ok(found)
}

fn scan(proc_root: &Path, pid: u32) -> Result<Vec<VcpuThread>, VcpuError> {
    let task: PathBuf = proc_root.join(pid.to_string()).join("task");
    let dir = match std::fs::read_dir(&task) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(VcpuError::ProcessGone { pid });
        }
        Err(e) => {
            return Err(VcpuError::Io {
                path: task.display().to_string(),
                message: e.to_string(),
            });
        }
    };
    let mut out = Vec::new();
    for entry in dir {
        let entry = entry.map_err(|e| VcpuError::Io {
            path: task.display().to_string(),
            message: e.to_string(),
        })?;
        let Some(tid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let comm_path = entry.path().join("comm");
        let comm = match std::fs::read_to_string(&comm_path) {
            Ok(c) => c,
            // The thread exited between readdir and here.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => continue,
            Err(e) => {
                return Err(VcpuError::Io {
                    path: comm_path.display().to_string(),
                    message: e.to_string(),
                });
            }
        };
        if let Some(index) = vcpu_index(&comm) {
            out.push(VcpuThread { tid, index });
        }
    }
    out.sort_by_key(|v| (v.index, v.tid));
    Ok(out)
}

/// What changed since the previous [`VcpuTracker::poll`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VcpuChanges {
    /// New threads (open their events).
    pub added: Vec<VcpuThread>,
    /// Threads that went away (or were renamed, or reused as another
    /// vCPU index): drop their events.
    pub removed: Vec<VcpuThread>,
}

impl VcpuChanges {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }
}

/// Follows the vCPU threads of one VMM process.
#[derive(Debug, Clone)]
pub struct VcpuTracker {
    proc_root: PathBuf,
    pid: u32,
    known: BTreeMap<u32, VcpuThread>,
}

impl VcpuTracker {
    pub fn new(pid: u32) -> VcpuTracker {
        VcpuTracker::new_in(Path::new("/proc"), pid)
    }

    /// A tracker under another procfs root (tests).
    pub fn new_in(proc_root: &Path, pid: u32) -> VcpuTracker {
        VcpuTracker {
            proc_root: proc_root.to_path_buf(),
            pid,
            known: BTreeMap::new(),
        }
    }

    /// The threads known after the last poll, by index.
    pub fn current(&self) -> Vec<VcpuThread> {
        let mut v: Vec<VcpuThread> = self.known.values().cloned().collect();
        v.sort_by_key(|t| (t.index, t.tid));
        v
    }

    /// Rescans and diffs against the last poll. No vCPU threads at all is
    /// not an error here (a VM being created or torn down); a process
    /// that is gone is, and everything known is reported removed with it
    /// by the next successful poll of a new tracker.
    pub fn poll(&mut self) -> Result<VcpuChanges, VcpuError> {
        let now = scan(&self.proc_root, self.pid)?;
        let mut changes = VcpuChanges::default();
        let now_map: BTreeMap<u32, VcpuThread> = now.into_iter().map(|t| (t.tid, t)).collect();
        for (tid, old) in &self.known {
            if now_map.get(tid) != Some(old) {
                changes.removed.push(old.clone());
            }
        }
        for (tid, new) in &now_map {
            if self.known.get(tid) != Some(new) {
                changes.added.push(new.clone());
            }
        }
        changes.added.sort_by_key(|t| (t.index, t.tid));
        changes.removed.sort_by_key(|t| (t.index, t.tid));
        self.known = now_map;
        Ok(changes)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn comm_names() {
        assert_eq!(vcpu_index("vcpu0\n"), Some(0));
        assert_eq!(vcpu_index("vcpu17"), Some(17));
        for no in ["vcpu", "vcpu-1", "vcpux", "vmm", "xvcpu0", "vcpu0 "] {
            assert_eq!(vcpu_index(no), None, "{no}");
        }
    }

    fn thread(root: &Path, pid: u32, tid: u32, comm: &str) {
        let d = root.join(format!("{pid}/task/{tid}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("comm"), format!("{comm}\n")).unwrap();
    }

    fn gone(root: &Path, pid: u32, tid: u32) {
        std::fs::remove_dir_all(root.join(format!("{pid}/task/{tid}"))).unwrap();
    }

    fn v(tid: u32, index: u32) -> VcpuThread {
        VcpuThread { tid, index }
    }

    #[test]
    fn discovers_named_threads_only() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        thread(r, 100, 100, "cloud-hyperviso");
        thread(r, 100, 101, "vmm");
        thread(r, 100, 105, "vcpu1");
        thread(r, 100, 104, "vcpu0");
        thread(r, 100, 106, "http-server");
        assert_eq!(discover_in(r, 100).unwrap(), vec![v(104, 0), v(105, 1)]);
        thread(r, 200, 200, "qemu-system-x86");
        assert_eq!(
            discover_in(r, 200),
            Err(VcpuError::NoVcpuThreads { pid: 200 })
        );
        assert_eq!(
            discover_in(r, 300),
            Err(VcpuError::ProcessGone { pid: 300 })
        );
        assert!(
            VcpuError::NoVcpuThreads { pid: 200 }
                .to_string()
                .contains("no vcpuN threads")
        );
    }

    #[test]
    fn tracker_diffs_threads() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        thread(r, 7, 7, "vmm");
        let mut t = VcpuTracker::new_in(r, 7);
        assert!(t.poll().unwrap().is_empty());
        thread(r, 7, 10, "vcpu0");
        thread(r, 7, 11, "vcpu1");
        assert_eq!(
            t.poll().unwrap(),
            VcpuChanges {
                added: vec![v(10, 0), v(11, 1)],
                removed: vec![]
            }
        );
        assert!(t.poll().unwrap().is_empty());
        // vcpu1 goes, vcpu2 comes (hotplug), vcpu0's tid is reused as vcpu3.
        gone(r, 7, 11);
        thread(r, 7, 12, "vcpu2");
        thread(r, 7, 10, "vcpu3");
        assert_eq!(
            t.poll().unwrap(),
            VcpuChanges {
                added: vec![v(12, 2), v(10, 3)],
                removed: vec![v(10, 0), v(11, 1)]
            }
        );
        assert_eq!(t.current(), vec![v(12, 2), v(10, 3)]);
        std::fs::remove_dir_all(r.join("7")).unwrap();
        assert_eq!(t.poll(), Err(VcpuError::ProcessGone { pid: 7 }));
    }

    #[test]
    fn finds_real_named_threads_of_this_process() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::Builder::new()
            .name("vcpu93".into())
            .spawn(move || {
                // std names the thread before running this closure.
                started_tx.send(()).unwrap();
                let _ = rx.recv();
            })
            .unwrap();
        started_rx.recv().unwrap();
        let pid = std::process::id();
        let found = discover(pid).unwrap();
        assert!(found.iter().any(|t| t.index == 93), "{found:?}");
        drop(tx);
        h.join().unwrap();
    }
}
