//! The Linux bed: Debian's own cloud kernels booted under QEMU TCG (no KVM
//! needed) with two NUMA nodes in two memory tiers (HMAT), virtio-mem per
//! node, virtio-balloon and QMP, running host-built programs from an
//! initramfs. docs/linux-bed.md says what it proves and what it cannot.
//!
//! [`Bed::start`] boots a guest and waits for its init to serve shell
//! commands on the console ([`Bed::sh`]); [`Bed::qmp`] talks to QEMU. QEMU
//! is ended by PID when the value drops.

pub mod checks;
pub mod initramfs;
pub mod kernel;
pub mod qemu;
pub mod qmp;
pub mod truth;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use tier_uml::{Console, UmlError, console};

pub use kernel::Kernel;
pub use qemu::{Machine, Node};
pub use qmp::{Qmp, VirtioMem};

/// Why the bed failed; each error carries what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum BedError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("kernel package: {0}")]
    Kernel(String),
    #[error("{0}")]
    Missing(String),
    #[error("QMP: {0}")]
    Qmp(String),
    #[error(transparent)]
    Guest(#[from] UmlError),
    #[error(
        "QEMU exited ({status}) before the guest was ready; stderr:\n{stderr}\nconsole:\n{console}"
    )]
    Exited {
        status: String,
        stderr: String,
        console: String,
    },
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BedError {
    let what = what.into();
    move |source| BedError::Io { what, source }
}

/// What this machine lacks to run the bed, if anything.
pub fn missing() -> Option<String> {
    let qemu = Command::new("qemu-system-x86_64").arg("--version").output();
    if !qemu.is_ok_and(|o| o.status.success()) {
        return Some("qemu-system-x86_64 not found (apt-get install qemu-system-x86)".into());
    }
    if !Path::new(initramfs::BUSYBOX).exists() {
        return Some(format!(
            "{} not found (apt-get install busybox-static)",
            initramfs::BUSYBOX
        ));
    }
    if Command::new("cpio").arg("--version").output().is_err() {
        return Some("cpio not found (apt-get install cpio)".into());
    }
    None
}

/// A running guest.
#[derive(Debug)]
pub struct Bed {
    child: Child,
    stdin: ChildStdin,
    console: Console,
    qmp: Qmp,
    stderr: PathBuf,
    ram: PathBuf,
    next: u64,
    booted: Duration,
}

impl Bed {
    /// Boots `machine` and waits (up to `timeout`) until init serves
    /// commands. QEMU's stderr goes to `stderr_log`.
    pub fn start(machine: &Machine, stderr_log: &Path, timeout: Duration) -> Result<Bed, BedError> {
        let _ = std::fs::remove_file(&machine.qmp);
        machine.create_backends().map_err(io(format!(
            "creating backend files in {}",
            machine.backends.display()
        )))?;
        let bed = Bed::boot(machine, stderr_log, timeout);
        if bed.is_err() {
            let _ = std::fs::remove_dir_all(&machine.backends);
        }
        bed
    }

    fn boot(machine: &Machine, stderr_log: &Path, timeout: Duration) -> Result<Bed, BedError> {
        let err = std::fs::File::create(stderr_log)
            .map_err(io(format!("creating {}", stderr_log.display())))?;
        let started = Instant::now();
        let mut child = Command::new(&machine.qemu)
            .args(machine.args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .map_err(io(format!("starting {}", machine.qemu.display())))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(BedError::Missing("QEMU's stdio pipes".into()));
        };
        let console = Console::spawn(stdout);
        let mut partial = Partial(Some(child));
        let ready = wait_ready(&console, partial.child(), stderr_log, timeout);
        ready?;
        let qmp = Qmp::connect(&machine.qmp, Duration::from_secs(30))?;
        let child = partial.take()?;
        Ok(Bed {
            child,
            stdin,
            console,
            qmp,
            stderr: stderr_log.into(),
            ram: machine.backends.clone(),
            next: 0,
            booted: started.elapsed(),
        })
    }

    /// QEMU's PID (the process whose mappings hold guest memory).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Wall time from QEMU's start to init's ready line.
    pub fn boot_time(&self) -> Duration {
        self.booted
    }

    pub fn console(&self) -> String {
        self.console.text()
    }

    pub fn qmp(&mut self) -> &mut Qmp {
        &mut self.qmp
    }

    /// Runs `cmd` with the guest's sh; a non-zero exit is an error.
    pub fn sh(&mut self, cmd: &str, timeout: Duration) -> Result<String, BedError> {
        Ok(console::succeeded(cmd, self.sh_rc(cmd, timeout)?)?)
    }

    /// Like [`Bed::sh`], returning the exit status instead of failing on it.
    pub fn sh_rc(&mut self, cmd: &str, timeout: Duration) -> Result<(i32, String), BedError> {
        self.next += 1;
        let id = self.next;
        let line = console::command_line(id, cmd);
        // The console is a tty in canonical mode: longer lines are cut.
        if line.len() >= 4096 {
            return Err(BedError::Missing(format!(
                "guest command of {} bytes: the console takes lines under 4096; put it in a file",
                line.len()
            )));
        }
        self.stdin
            .write_all(line.as_bytes())
            .and_then(|()| self.stdin.flush())
            .map_err(io("guest console"))?;
        Ok(self.console.answer(id, timeout, cmd)?)
    }

    /// The last lines of QEMU's stderr.
    pub fn stderr_tail(&self) -> String {
        let t = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        console::last_lines(&t, 20)
    }

    /// Powers the guest off (sysrq) and waits up to `timeout` for QEMU to
    /// exit; kills it after that.
    pub fn shutdown(mut self, timeout: Duration) -> Result<(), BedError> {
        let _ = self
            .stdin
            .write_all(b"0 ZWNobyBvID4gL3Byb2Mvc3lzcnEtdHJpZ2dlcgo=\n");
        let _ = self.stdin.flush();
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(_)) = self.child.try_wait() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.ram);
    }
}

/// QEMU before init is ready: killed if the boot fails.
struct Partial(Option<Child>);

impl Partial {
    fn child(&mut self) -> Option<&mut Child> {
        self.0.as_mut()
    }
    fn take(&mut self) -> Result<Child, BedError> {
        self.0
            .take()
            .ok_or_else(|| BedError::Missing("QEMU child".into()))
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_ready(
    console: &Console,
    child: Option<&mut Child>,
    stderr_log: &Path,
    timeout: Duration,
) -> Result<(), BedError> {
    let Some(child) = child else {
        return Err(BedError::Missing("QEMU child".into()));
    };
    let start = Instant::now();
    loop {
        // Short waits, so that a QEMU that exits is reported at once.
        match console.wait_ready(Duration::from_millis(200)) {
            Ok(()) => return Ok(()),
            Err(UmlError::Timeout { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(BedError::Exited {
                status: status.to_string(),
                stderr: std::fs::read_to_string(stderr_log).unwrap_or_default(),
                console: console.tail(),
            });
        }
        if start.elapsed() > timeout {
            return Err(UmlError::Timeout {
                what: "guest boot".into(),
                secs: timeout.as_secs_f64(),
                tail: console.tail(),
            }
            .into());
        }
    }
}

/// A guest of `kernel` with the bed's modules and `programs` (under
/// `/opt/bin`), its files in `work` (guest RAM too, as files: put `work`
/// on a tmpfs such as /dev/shm): the machine to start (change it before
/// [`Bed::start`]) and the QEMU stderr log's path.
pub fn prepare(
    kernel: &Kernel,
    programs: &[PathBuf],
    work: &Path,
) -> Result<(Machine, PathBuf), BedError> {
    std::fs::create_dir_all(work.join("mod"))
        .map_err(io(format!("creating {}", work.display())))?;
    let mut modules = Vec::new();
    for (name, file) in kernel.with_dependencies(kernel::MODULES)? {
        let ko = work.join("mod").join(format!("{name}.ko"));
        kernel::decompress_module(&file, &ko)?;
        modules.push((name, ko));
    }
    let root = work.join("root.cpio");
    initramfs::build(
        &initramfs::Contents {
            modules,
            programs: programs.to_vec(),
            files: Vec::new(),
        },
        &root,
    )?;
    let machine = Machine::new(&kernel.vmlinuz, &root, &work.join("qmp.sock"), &ram_dir());
    Ok((machine, work.join("qemu.stderr")))
}

/// A fresh directory for a guest's RAM files on /dev/shm (a tmpfs: on a
/// disk, QEMU's shared file mappings would be written back), removed with
/// the [`Bed`].
pub fn ram_dir() -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    PathBuf::from(format!("/dev/shm/tierd-bed-{}-{n}", std::process::id()))
}

/// How long a boot may take: TCG on a loaded 2-core machine boots in
/// 5-15 s, 5-10x more with the truth plugin.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(300);
