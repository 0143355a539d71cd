//! A real Linux guest for tier-balloon, without KVM: Debian's
//! `user-mode-linux` (Linux 6.1 as a process) on a hostfs root, attached to
//! a `tier-balloon` backend over vhost-user (`virtio_uml.device=SOCK:5`).
//!
//! [`Uml::start`] starts the backend and the guest, runs an init script
//! that answers shell commands on the console ([`Uml::sh`]), and talks to
//! the backend's control socket ([`Uml::control`]). Both processes are
//! ended by PID when the value drops. docs/linux-guest.md says what this
//! proves and what it does not.

pub mod console;
mod memfile;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use console::Console;
pub use memfile::allocated_bytes;

/// Debian's UML kernel.
pub const LINUX_UML: &str = "/usr/bin/linux.uml";
/// Where Debian's UML modules live (the guest sees the host's root).
pub const UML_MODULES: &str = "/usr/lib/uml/modules";
/// virtio device id of a balloon (virtio_uml.device=SOCKET:ID).
const BALLOON_ID: u32 = 5;

/// Why the harness failed; each error carries what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum UmlError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{what}: timed out after {secs:.1} s; guest console ends with:\n{tail}")]
    Timeout {
        what: String,
        secs: f64,
        tail: String,
    },
    #[error("control socket: {0}")]
    Control(String),
    #[error("guest command `{cmd}` exited {rc}:\n{output}")]
    Command {
        cmd: String,
        rc: i32,
        output: String,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> UmlError {
    let what = what.into();
    move |source| UmlError::Io { what, source }
}

/// What to boot.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `tier-balloon` binary.
    pub backend: PathBuf,
    /// `--tier` arguments of the backend (at least one).
    pub tiers: Vec<String>,
    /// Offer VIRTIO_BALLOON_F_DEFLATE_ON_OOM.
    pub deflate_on_oom: bool,
    /// Guest memory, MiB (`mem=`).
    pub mem_mib: u64,
    /// Modules to insmod in the guest, in order, before it reports ready
    /// (e.g. [`stock_virtio_balloon`]).
    pub modules: Vec<PathBuf>,
    /// The UML kernel.
    pub linux: PathBuf,
}

impl Options {
    /// Defaults: 128 MiB, one tier over the whole guest, the stock driver.
    pub fn new(backend: impl Into<PathBuf>) -> Options {
        Options {
            backend: backend.into(),
            tiers: vec!["name=all,ranges=0x0-0x8000000".into()],
            deflate_on_oom: false,
            mem_mib: 128,
            modules: vec![stock_virtio_balloon()],
            linux: PathBuf::from(LINUX_UML),
        }
    }
}

/// The kernel release of Debian's UML modules (one directory), if installed.
pub fn uml_release() -> Option<String> {
    let mut dirs = std::fs::read_dir(UML_MODULES).ok()?;
    dirs.next()?
        .ok()
        .and_then(|d| d.file_name().into_string().ok())
}

/// Linux's own virtio_balloon module for Debian's UML kernel.
pub fn stock_virtio_balloon() -> PathBuf {
    let release = uml_release().unwrap_or_else(|| "6.1.176".into());
    Path::new(UML_MODULES)
        .join(release)
        .join("kernel/drivers/virtio/virtio_balloon.ko")
}

/// Why this host cannot run the harness, if it cannot.
pub fn missing() -> Option<String> {
    if !Path::new(LINUX_UML).exists() {
        return Some(format!(
            "{LINUX_UML} missing: apt-get install user-mode-linux (cargo xtask deps)"
        ));
    }
    if !Path::new("/usr/sbin/insmod").exists() && !Path::new("/sbin/insmod").exists() {
        return Some("insmod missing: apt-get install kmod (cargo xtask deps)".into());
    }
    None
}

/// A guest shell command that holds `mib` MiB of memory for a moment and
/// prints the bytes it wrote: tmpfs pages, which nothing can reclaim
/// without swap (the guest has none), so they press on the balloon.
///
/// dd runs from copies of itself and its libraries in that tmpfs. Run from
/// hostfs, its text and libc were page cache that reclaim kept evicting and
/// dd kept faulting back (150 k major faults in one failed run): the guest
/// thrashed for minutes between OOM calls, each of which deflates only 1 MiB
/// (VIRTIO_BALLOON_OOM_NR_PAGES). From tmpfs nothing running is reclaimable,
/// so reclaim fails at once and the OOM notifier runs.
pub fn hog(mib: u64) -> String {
    format!(
        "mountpoint -q /mnt || mount -t tmpfs -o size=200M none /mnt; b=/mnt/.hogbin; \
         [ -x $b/dd ] || {{ mkdir -p $b && cp /bin/dd $(ldd /bin/dd | grep -o '/[^ ]*') $b/; }}; \
         $(ls $b/ld-linux* | head -n 1) --library-path $b $b/dd \
         if=/dev/zero of=/mnt/hog bs=1M count={mib} 2>/dev/null; rc=$?; \
         stat -c %s /mnt/hog; rm -f /mnt/hog; exit $rc"
    )
}

/// A running guest and its backend.
pub struct Uml {
    dir: tempfile::TempDir,
    backend: Child,
    guest: Child,
    stdin: ChildStdin,
    console: Console,
    control: PathBuf,
    next: u64,
}

impl std::fmt::Debug for Uml {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uml")
            .field("dir", &self.dir.path())
            .field("backend", &self.backend.id())
            .field("guest", &self.guest.id())
            .finish_non_exhaustive()
    }
}

/// How long the guest may take to boot and load its modules.
const BOOT: Duration = Duration::from_secs(60);

impl Uml {
    /// Starts the backend, then boots the guest against it and waits until
    /// its init script answers.
    pub fn start(opts: &Options) -> Result<Uml, UmlError> {
        let dir = tempfile::Builder::new()
            .prefix("tier-uml-")
            .tempdir()
            .map_err(io("temp dir"))?;
        let sock = dir.path().join("vu.sock");
        let control = dir.path().join("ctl.sock");
        let mut cmd = Command::new(&opts.backend);
        cmd.arg("--socket")
            .arg(&sock)
            .arg("--control")
            .arg(&control);
        for t in &opts.tiers {
            cmd.arg("--tier").arg(t);
        }
        if opts.deflate_on_oom {
            cmd.arg("--deflate-on-oom");
        }
        let log =
            std::fs::File::create(dir.path().join("backend.log")).map_err(io("backend log"))?;
        cmd.env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let backend = cmd
            .spawn()
            .map_err(io(format!("starting {}", opts.backend.display())))?;
        let mut partial = Partial {
            backend: Some(backend),
            guest: None,
        };
        wait_path(&control, Duration::from_secs(10)).map_err(|_| UmlError::Timeout {
            what: "tier-balloon's control socket".into(),
            secs: 10.0,
            tail: std::fs::read_to_string(dir.path().join("backend.log")).unwrap_or_default(),
        })?;
        let init = dir.path().join("init.sh");
        std::fs::write(&init, console::init_script(&opts.modules)).map_err(io("init script"))?;
        std::fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(io("init script mode"))?;
        let mut guest = Command::new(&opts.linux);
        guest
            .arg(format!("mem={}M", opts.mem_mib))
            .args(["root=/dev/root", "rootfstype=hostfs", "rootflags=/", "rw"])
            .arg(format!("init={}", init.display()))
            .args(["con=null", "con0=fd:0,fd:1"])
            .arg(format!("virtio_uml.device={}:{BALLOON_ID}", sock.display()))
            // UML's memory file goes here, where the harness finds it.
            .env("TMPDIR", dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        // UML runs guest processes as host processes of its own: a process
        // group of its own lets them all be ended with the kernel process.
        std::os::unix::process::CommandExt::process_group(&mut guest, 0);
        let mut child = guest
            .spawn()
            .map_err(io(format!("starting {}", opts.linux.display())))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        partial.guest = Some(child);
        let (Some(stdin), Some(stdout)) = (stdin, stdout) else {
            return Err(UmlError::Control("guest console pipes missing".into()));
        };
        let console = Console::spawn(stdout);
        let (backend, guest) = partial.take()?;
        let uml = Uml {
            dir,
            backend,
            guest,
            stdin,
            console,
            control,
            next: 0,
        };
        uml.console.wait_ready(BOOT)?;
        Ok(uml)
    }

    /// PID of the UML kernel process (holds the guest memory file).
    pub fn guest_pid(&self) -> u32 {
        self.guest.id()
    }

    /// The guest console so far.
    pub fn console(&self) -> String {
        self.console.text()
    }

    /// The backend's log so far.
    pub fn backend_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("backend.log")).unwrap_or_default()
    }

    /// Runs `cmd` with the guest's /bin/sh and returns its output; a
    /// non-zero exit is an error.
    pub fn sh(&mut self, cmd: &str, timeout: Duration) -> Result<String, UmlError> {
        console::succeeded(cmd, self.sh_rc(cmd, timeout)?)
    }

    /// Like [`Uml::sh`], returning the exit status instead of failing on it.
    pub fn sh_rc(&mut self, cmd: &str, timeout: Duration) -> Result<(i32, String), UmlError> {
        self.next += 1;
        let id = self.next;
        let line = console::command_line(id, cmd);
        self.stdin
            .write_all(line.as_bytes())
            .and_then(|()| self.stdin.flush())
            .map_err(io("guest console"))?;
        match self.console.answer(id, timeout, cmd) {
            // A guest stuck in a command is most often stuck on the device:
            // say what the backend saw.
            Err(UmlError::Timeout { what, secs, tail }) => Err(UmlError::Timeout {
                what: format!(
                    "{what}\nbackend state: {}\nbackend log ends with:\n{}",
                    self.state()
                        .map_or_else(|e| e.to_string(), |s| s.to_string()),
                    console::last_lines(&self.backend_log(), 20)
                ),
                secs,
                tail,
            }),
            r => r,
        }
    }

    /// One request on the backend's control socket (a JSON object); the
    /// answer, or the backend's error message.
    pub fn control(&self, request: &serde_json::Value) -> Result<serde_json::Value, UmlError> {
        let s = UnixStream::connect(&self.control)
            .map_err(|e| UmlError::Control(format!("{}: {e}", self.control.display())))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(io("control socket timeout"))?;
        (&s).write_all(format!("{request}\n").as_bytes())
            .map_err(io("control socket write"))?;
        let mut line = String::new();
        BufReader::new(&s)
            .read_line(&mut line)
            .map_err(io("control socket read"))?;
        let v: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| UmlError::Control(format!("{e}: {line}")))?;
        if v["ok"] != serde_json::Value::Bool(true) {
            return Err(UmlError::Control(line.trim().to_string()));
        }
        Ok(v)
    }

    /// The backend's state (`{"op":"state"}`).
    pub fn state(&self) -> Result<serde_json::Value, UmlError> {
        Ok(self.control(&serde_json::json!({"op": "state"}))?["state"].take())
    }

    /// Polls the backend's state until `done` holds.
    pub fn wait_state(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> Result<serde_json::Value, UmlError> {
        let start = Instant::now();
        loop {
            let st = self.state()?;
            if done(&st) {
                return Ok(st);
            }
            if start.elapsed() > timeout {
                return Err(UmlError::Timeout {
                    what: format!("{what}; last state {st}"),
                    secs: timeout.as_secs_f64(),
                    tail: self.console.tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Bytes of the guest's memory file that the host holds (allocated
    /// blocks): what ballooned pages must give back.
    pub fn host_bytes(&self) -> Result<u64, UmlError> {
        allocated_bytes(self.guest.id(), self.dir.path())
    }
}

/// Processes started before the [`Uml`] exists: ended on error.
struct Partial {
    backend: Option<Child>,
    guest: Option<Child>,
}

impl Partial {
    fn take(&mut self) -> Result<(Child, Child), UmlError> {
        match (self.backend.take(), self.guest.take()) {
            (Some(b), Some(g)) => Ok((b, g)),
            _ => Err(UmlError::Control("a process was not started".into())),
        }
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if let Some(g) = self.guest.as_mut() {
            stop_group(g);
        }
        if let Some(b) = self.backend.as_mut() {
            stop(b);
        }
    }
}

/// Ends a child we started, by its PID, and reaps it.
fn stop(c: &mut Child) {
    let _ = c.kill();
    let _ = c.wait();
}

/// Ends the guest's process group (its kernel process and the host
/// processes it runs guest processes in), then reaps the kernel process.
fn stop_group(c: &mut Child) {
    if let Ok(pid) = i32::try_from(c.id()) {
        // SAFETY: kill(2) with a negative pid signals the process group we
        // created for this child (`process_group(0)`), nothing else.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    }
    stop(c);
}

impl Drop for Uml {
    fn drop(&mut self) {
        // The guest first, with the host processes it runs guest code in.
        stop_group(&mut self.guest);
        stop(&mut self.backend);
    }
}

fn wait_path(p: &Path, timeout: Duration) -> Result<(), ()> {
    let start = Instant::now();
    while !p.exists() {
        if start.elapsed() > timeout {
            return Err(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Shared console text, appended by a reader thread.
type Text = Arc<Mutex<String>>;
