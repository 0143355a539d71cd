//! The vcpu0 thread: KVM_RUN loop, round accounting, phase switches, kicks.

use super::Phase;
use super::counters::{Published, Snapshot};
use super::guest::{PARAM_GPA, ROUND_PORT, param_words};
use super::mem::HostMapping;
use super::phase_log::PhaseLog;
use kvm_ioctls::{VcpuExit, VcpuFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;

/// State shared between DemoVm and its vCPU thread.
#[derive(Debug)]
pub(crate) struct Shared {
    pub published: Published,
    pub pending: Mutex<Option<Phase>>,
    /// When each phase took effect (working-set truth).
    pub phases: Mutex<PhaseLog>,
    pub stop: AtomicBool,
    pub running: AtomicBool,
    pub error: Mutex<Option<String>>,
    pub tid: AtomicI32,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking holder cannot leave these plain values half-updated.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub(crate) fn new(phase: Phase) -> Self {
        Shared {
            published: Published::new(Snapshot {
                phase,
                ..Snapshot::default()
            }),
            pending: Mutex::new(None),
            phases: Mutex::new(PhaseLog::new(phase)),
            stop: AtomicBool::new(false),
            running: AtomicBool::new(true),
            error: Mutex::new(None),
            tid: AtomicI32::new(0),
        }
    }

    pub(crate) fn fail(&self, msg: String) {
        lock(&self.error).get_or_insert(msg);
    }
}

/// The signal used to knock vcpu0 out of KVM_RUN (EINTR) so it sees the
/// stop flag even in a long round. SIGRTMIN is free for applications.
fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN()
}

extern "C" fn on_kick(_: libc::c_int) {}

/// Installs a no-op handler once per process (the default action of a
/// real-time signal would kill the process). An existing handler is kept:
/// any handler makes KVM_RUN return EINTR.
pub(crate) fn install_kick_handler() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let sig = kick_signal();
        // SAFETY: sigaction structs are plain C data; zeroed is a valid
        // initial value and the kernel fills `old`.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: queries the current disposition only.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
            return Err(format!("sigaction: {}", std::io::Error::last_os_error()));
        }
        if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN {
            return Ok(());
        }
        // SAFETY: as above.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = on_kick as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: `act` is valid; on_kick is async-signal-safe (does nothing).
        let rc = unsafe {
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(format!("sigaction: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    })
    .clone()
}

/// Makes sure vcpu0 can receive kicks even if its creator blocked the signal.
fn unblock_kick_signal() {
    // SAFETY: set is a plain C value initialised by sigemptyset; only the
    // calling thread's mask changes.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, kick_signal());
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

/// Interrupts KVM_RUN on the thread. Only called before the handle is
/// joined, so the pthread_t is still valid.
pub(crate) fn kick(handle: &JoinHandle<()>) {
    use std::os::unix::thread::JoinHandleExt;
    // SAFETY: the thread is not joined yet (we hold its handle), and the
    // handler for this signal is installed before the thread is spawned.
    unsafe { libc::pthread_kill(handle.as_pthread_t(), kick_signal()) };
}

enum Exit {
    /// `out ROUND_PORT`: one round finished.
    Round,
    /// KVM_RUN interrupted by a kick (EINTR) or asked to retry (EAGAIN).
    Kicked,
    Fatal(String),
}

pub(crate) struct VcpuThread {
    pub vcpu: VcpuFd,
    pub shared: Arc<Shared>,
    pub dram: Arc<HostMapping>,
}

/// Clears `running` however the thread ends, including by panic.
struct RunningGuard<'a>(&'a Shared);

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail("vCPU thread panicked".to_string());
        }
        self.0.running.store(false, Ordering::Release);
    }
}

impl VcpuThread {
    pub(crate) fn run(mut self, ready: std::sync::mpsc::SyncSender<()>) {
        let shared = Arc::clone(&self.shared);
        let _guard = RunningGuard(&shared);
        // SAFETY: gettid has no preconditions.
        shared
            .tid
            .store(unsafe { libc::gettid() }, Ordering::Release);
        unblock_kick_signal();
        let _ = ready.send(());
        let mut snap = shared.published.read();
        while !shared.stop.load(Ordering::Acquire) {
            let exit = match self.vcpu.run() {
                Ok(VcpuExit::IoOut(ROUND_PORT, _)) => Exit::Round,
                Ok(VcpuExit::InternalError) => Exit::Fatal(self.internal_error()),
                Ok(other) => Exit::Fatal(describe_exit(&other)),
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => Exit::Kicked,
                Err(e) => Exit::Fatal(format!("KVM_RUN failed: {e}")),
            };
            snap.counters.exits += 1;
            match exit {
                Exit::Round => self.end_round(&mut snap),
                Exit::Kicked => {}
                Exit::Fatal(reason) => {
                    shared.published.publish(&snap);
                    shared.fail(self.with_registers(reason));
                    return;
                }
            }
            shared.published.publish(&snap);
        }
    }

    /// Credits the round just finished to the phase that ran it, then
    /// switches phase if one is pending (the guest is parked in the exit).
    fn end_round(&mut self, snap: &mut Snapshot) {
        let p = snap.phase;
        snap.counters.rounds += 1;
        snap.counters.accesses[0] += u64::from(p.dram_pages) * u64::from(p.dram_repeat);
        snap.counters.accesses[1] += u64::from(p.slow_pages) * u64::from(p.slow_repeat);
        if let Some(next) = lock(&self.shared.pending).take() {
            for (i, w) in param_words(next).into_iter().enumerate() {
                // Cannot fail: the param page is inside dram (validated >= 2 MiB).
                let _ = self.dram.write_u32(PARAM_GPA + 4 * i as u64, w);
            }
            snap.phase = next;
            lock(&self.shared.phases).record(std::time::Instant::now(), next);
        }
    }

    fn internal_error(&mut self) -> String {
        let run = self.vcpu.get_kvm_run();
        // SAFETY: exit_reason is KVM_EXIT_INTERNAL_ERROR, so the kernel
        // filled the `internal` member of the union.
        let suberror = unsafe { run.__bindgen_anon_1.internal.suberror };
        format!("unexpected KVM_EXIT_INTERNAL_ERROR (suberror {suberror})")
    }

    fn with_registers(&mut self, reason: String) -> String {
        match self.vcpu.get_regs() {
            Ok(r) => format!(
                "{reason} at RIP={:#x} (RAX={:#x} RBX={:#x} RCX={:#x} RDX={:#x} RSI={:#x} RFLAGS={:#x})",
                r.rip, r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rflags
            ),
            Err(e) => format!("{reason} (KVM_GET_REGS failed: {e})"),
        }
    }
}

fn describe_exit(exit: &VcpuExit<'_>) -> String {
    match exit {
        VcpuExit::IoOut(port, data) => {
            format!("unexpected KVM_EXIT_IO out port {port:#x} {data:?}")
        }
        VcpuExit::IoIn(port, _) => format!("unexpected KVM_EXIT_IO in port {port:#x}"),
        VcpuExit::MmioRead(a, _) => format!("unexpected KVM_EXIT_MMIO read at GPA {a:#x}"),
        VcpuExit::MmioWrite(a, _) => format!("unexpected KVM_EXIT_MMIO write at GPA {a:#x}"),
        VcpuExit::Shutdown => "unexpected KVM_EXIT_SHUTDOWN (triple fault?)".to_string(),
        VcpuExit::Hlt => "unexpected KVM_EXIT_HLT".to_string(),
        VcpuExit::FailEntry(reason, cpu) => {
            format!("unexpected KVM_EXIT_FAIL_ENTRY (hw reason {reason:#x}, cpu {cpu})")
        }
        other => format!("unexpected exit {other:?}"),
    }
}
