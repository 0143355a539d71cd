//! vCPU threads of a VMM process: threads whose `comm` is `vcpuN`
//! (cloud-hypervisor names them so), found in `/proc/PID/task`, and
//! followed as they come and go ([`VcpuTracker::poll`]).
//!
//! Fallback for VMMs that do not name their threads: the threads the BPF
//! KVM_RUN watch (`kvm_entry` / `kvm_userspace_exit` raw tracepoints in
//! `bpf/pmu.bpf.c`) saw in the process ([`VcpuTracker::poll_with`]). Their
//! index is the `vcpu_id` `kvm_entry` read, else their rank by tid. A
//! thread that has exited (or whose tid now names a newer thread) is
//! dropped. `/proc/PID/task/TID/syscall` is no substitute: a thread in
//! guest mode reads `running`, and KVM's `kvm-nx-lpage-recovery` worker,
//! which lives in the VMM's thread group, shows its parent's `KVM_RUN`.

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
        "process {pid}: no vcpuN threads (not a cloud-hypervisor VMM; its vCPU threads are found once the KVM_RUN watch sees them)"
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

/// A thread the KVM_RUN watch saw (one `kvm_threads` map entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvmRunThread {
    pub tid: u32,
    /// Thread group (process) it belongs to.
    pub tgid: u32,
    /// `vcpu->vcpu_id` if `kvm_entry` fired for it.
    pub vcpu_id: Option<u32>,
    /// `task->start_boottime` in ns (0: unknown): tells a reused tid apart.
    pub start_boottime_ns: u64,
    /// `kvm_entry` and `kvm_userspace_exit` hits.
    pub entries: u64,
    pub exits: u64,
}

/// How the threads of the last poll were found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Found {
    /// No vCPU thread yet.
    #[default]
    Nothing,
    /// By their `vcpuN` names.
    Named,
    /// By the KVM_RUN watch.
    KvmRun,
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

/// The threads of `pid` in `seen` that still exist, indexed by `vcpu_id`
/// where `kvm_entry` gave one and by tid order otherwise (skipping the
/// indices taken); and the tids of `seen` entries of `pid` whose thread
/// is gone.
fn kvm_run_threads(
    proc_root: &Path,
    pid: u32,
    seen: &[KvmRunThread],
) -> Result<(Vec<VcpuThread>, Vec<u32>), VcpuError> {
    let task = proc_root.join(pid.to_string()).join("task");
    if !task.is_dir() {
        return Err(VcpuError::ProcessGone { pid });
    }
    let mut mine: Vec<&KvmRunThread> = seen.iter().filter(|t| t.tgid == pid).collect();
    mine.sort_by_key(|t| t.tid);
    let mut alive = Vec::new();
    let mut stale = Vec::new();
    for t in mine {
        if thread_is(&task, t) {
            alive.push(t);
        } else {
            stale.push(t.tid);
        }
    }
    let taken: std::collections::BTreeSet<u32> = alive.iter().filter_map(|t| t.vcpu_id).collect();
    let mut free = (0u32..).filter(|i| !taken.contains(i));
    let mut out: Vec<VcpuThread> = alive
        .iter()
        .map(|t| VcpuThread {
            tid: t.tid,
            index: match t.vcpu_id {
                Some(id) => id,
                None => free.next().unwrap_or(u32::MAX),
            },
        })
        .collect();
    out.sort_by_key(|v| (v.index, v.tid));
    Ok((out, stale))
}

/// Whether `/proc/PID/task/TID` is still the thread the watch saw: it
/// exists and, when the watch recorded it, started at the same time.
fn thread_is(task: &Path, t: &KvmRunThread) -> bool {
    let stat = match std::fs::read_to_string(task.join(t.tid.to_string()).join("stat")) {
        Ok(s) => s,
        Err(_) => return false,
    };
    if t.start_boottime_ns == 0 {
        return true;
    }
    match (start_ticks(&stat), clock_ticks_per_second()) {
        (Some(ticks), Some(hz)) if hz > 0 => t.start_boottime_ns / (1_000_000_000 / hz) == ticks,
        // Unreadable: trust the tid.
        _ => true,
    }
}

/// Field 22 (`starttime`, clock ticks since boot) of a `stat` line.
fn start_ticks(stat: &str) -> Option<u64> {
    // comm (field 2) may hold spaces and parentheses: count from its end.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn clock_ticks_per_second() -> Option<u64> {
    // SAFETY: sysconf has no memory side effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok()
}

/// What changed since the previous [`VcpuTracker::poll`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VcpuChanges {
    /// New threads (open their events).
    pub added: Vec<VcpuThread>,
    /// Threads that went away (or were renamed, or reused as another
    /// vCPU index): drop their events.
    pub removed: Vec<VcpuThread>,
    /// Tids of KVM_RUN watch entries whose thread has exited: delete them
    /// from the watch.
    pub stale: Vec<u32>,
}

impl VcpuChanges {
    /// No thread added or removed.
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
    found: Found,
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
            found: Found::Nothing,
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
        self.poll_with(None)
    }

    /// How the threads of the last poll were found.
    pub fn found(&self) -> Found {
        self.found
    }

    /// [`VcpuTracker::poll`], falling back to the threads of this process
    /// in `kvm_run` (the KVM_RUN watch's entries) when none is named
    /// `vcpuN`. Watch entries of threads that have exited come back in
    /// [`VcpuChanges::stale`].
    pub fn poll_with(
        &mut self,
        kvm_run: Option<&[KvmRunThread]>,
    ) -> Result<VcpuChanges, VcpuError> {
        let mut now = scan(&self.proc_root, self.pid)?;
        let mut changes = VcpuChanges::default();
        self.found = if !now.is_empty() {
            Found::Named
        } else if let Some(seen) = kvm_run {
            let (alive, stale) = kvm_run_threads(&self.proc_root, self.pid, seen)?;
            now = alive;
            changes.stale = stale;
            if now.is_empty() {
                Found::Nothing
            } else {
                Found::KvmRun
            }
        } else {
            Found::Nothing
        };
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
                ..VcpuChanges::default()
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
                removed: vec![v(10, 0), v(11, 1)],
                ..VcpuChanges::default()
            }
        );
        assert_eq!(t.current(), vec![v(12, 2), v(10, 3)]);
        std::fs::remove_dir_all(r.join("7")).unwrap();
        assert_eq!(t.poll(), Err(VcpuError::ProcessGone { pid: 7 }));
    }

    /// A thread with a `stat` whose starttime is `ticks`.
    fn thread_started(root: &Path, pid: u32, tid: u32, comm: &str, ticks: u64) {
        thread(root, pid, tid, comm);
        // pid (comm) state ppid ... field 22 starttime; comm with a space
        // and a parenthesis, as real ones can be.
        let mut fields = vec!["0".to_string(); 19];
        fields[0] = "S".into();
        fields.push(ticks.to_string());
        fields.push("0".into());
        std::fs::write(
            root.join(format!("{pid}/task/{tid}/stat")),
            format!("{tid} ({comm}) x) {}\n", fields.join(" ")),
        )
        .unwrap();
    }

    fn seen(tid: u32, tgid: u32, vcpu_id: Option<u32>, ticks: u64) -> KvmRunThread {
        let hz = clock_ticks_per_second().unwrap();
        KvmRunThread {
            tid,
            tgid,
            vcpu_id,
            start_boottime_ns: ticks * (1_000_000_000 / hz) + 1234,
            entries: u64::from(vcpu_id.is_some()),
            exits: 1,
        }
    }

    #[test]
    fn start_ticks_reads_field_22() {
        let line = "42 (a) b) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 19\n";
        assert_eq!(start_ticks(line), Some(777));
        assert_eq!(start_ticks("42 (x) S 1"), None);
    }

    #[test]
    fn kvm_run_fallback_indexes_and_drops_threads() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        thread_started(r, 50, 50, "qemu-system-x86", 1000);
        thread_started(r, 50, 51, "CPU 0/KVM", 1001);
        thread_started(r, 50, 52, "CPU 1/KVM", 1002);
        thread_started(r, 50, 53, "worker", 1003);
        // Only kvm_userspace_exit seen: indices by tid order. tid 60 of
        // this process exited; tid 70 is another process's.
        let watch = [
            seen(52, 50, None, 1002),
            seen(51, 50, None, 1001),
            seen(60, 50, None, 900),
            seen(70, 99, None, 1),
        ];
        let mut t = VcpuTracker::new_in(r, 50);
        assert!(t.poll().unwrap().is_empty());
        assert_eq!(t.found(), Found::Nothing);
        let c = t.poll_with(Some(&watch)).unwrap();
        assert_eq!(t.found(), Found::KvmRun);
        assert_eq!(c.added, vec![v(51, 0), v(52, 1)]);
        assert_eq!((c.removed.len(), c.stale.clone()), (0, vec![60]));
        // kvm_entry gave vcpu ids (here the reverse of tid order): a
        // thread whose index changed is removed and added again.
        let watch = [seen(51, 50, Some(1), 1001), seen(52, 50, Some(0), 1002)];
        let c = t.poll_with(Some(&watch)).unwrap();
        assert_eq!(c.added, vec![v(52, 0), v(51, 1)]);
        assert_eq!(c.removed, vec![v(51, 0), v(52, 1)]);
        // Mixed: the thread without an id takes the lowest free index.
        let watch = [seen(51, 50, Some(0), 1001), seen(52, 50, None, 1002)];
        t.poll_with(Some(&watch)).unwrap();
        assert_eq!(t.current(), vec![v(51, 0), v(52, 1)]);
        // tid 52 now names a thread that started later: not the one seen.
        thread_started(r, 50, 52, "CPU 1/KVM", 5000);
        let c = t.poll_with(Some(&watch)).unwrap();
        assert_eq!(
            (c.removed.clone(), c.stale.clone()),
            (vec![v(52, 1)], vec![52])
        );
        assert!(c.added.is_empty());
        // Named threads win over the watch.
        thread_started(r, 50, 54, "vcpu0", 6000);
        t.poll_with(Some(&watch)).unwrap();
        assert_eq!((t.found(), t.current()), (Found::Named, vec![v(54, 0)]));
        std::fs::remove_dir_all(r.join("50")).unwrap();
        assert_eq!(
            t.poll_with(Some(&watch)),
            Err(VcpuError::ProcessGone { pid: 50 })
        );
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
