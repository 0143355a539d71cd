//! Shared by the tierctl tests that run real processes: a tierd on a
//! private socket, tierctl itself, and what the host must offer.
//!
//! tierd is found next to the test binary's directory
//! (`<target>/<profile>/deps/<test>` -> `<target>/<profile>/tierd`), where a
//! workspace build (`cargo test --workspace`, `cargo xtask test`) puts it.
//! When it is not there (e.g. `cargo test -p tierctl` on a fresh
//! target dir) it is built once with `cargo build -p tier-profiler --bin
//! tierd` into that same target dir.

// Each test file uses its own subset of these helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The tierctl under test.
pub fn tierctl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tierctl"))
}

/// Runs tierctl with `args` against `endpoint`; stdout and stderr as text.
pub fn run_tierctl(endpoint: &str, args: &[&str]) -> (Output, String, String) {
    let out = tierctl()
        .arg("--endpoint")
        .arg(endpoint)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

/// `<target>/<profile>` of the running test binary.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap()
}

/// The tierd binary, built if missing.
pub fn tierd_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = profile_dir();
        let bin = dir.join("tierd");
        if bin.exists() {
            return bin;
        }
        let target = dir.parent().unwrap();
        let mut build = Command::new(env!("CARGO"));
        build.args([
            "build",
            "-p",
            "tier-profiler",
            "--bin",
            "tierd",
            "--target-dir",
        ]);
        build.arg(target);
        if dir.file_name().is_some_and(|n| n == "release") {
            build.arg("--release");
        }
        let st = build.status().unwrap();
        assert!(st.success() && bin.exists(), "building tierd: {st}");
        bin
    })
}

/// Why the demo VM cannot run here, if it cannot.
pub fn kvm_missing() -> Option<String> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => None,
        Err(e) => Some(format!("needs a usable /dev/kvm for the demo VM: {e}")),
    }
}

/// Why tmux cannot run here, if it cannot.
pub fn tmux_missing() -> Option<String> {
    match Command::new("tmux").arg("-V").output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!("tmux -V failed: {}", o.status)),
        Err(e) => Some(format!(
            "needs tmux for a real terminal (apt-get install tmux): {e}"
        )),
    }
}

/// A tierd on a private socket; killed on drop.
pub struct Tierd {
    child: Child,
    pub socket: PathBuf,
    pub dir: tempfile::TempDir,
    args: Vec<String>,
}

impl Tierd {
    /// Starts tierd with test defaults plus `extra`, and waits for its socket.
    pub fn start(extra: &[&str]) -> Tierd {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("tierd.sock");
        let args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let child = spawn(&socket, dir.path(), &args);
        let mut t = Tierd {
            child,
            socket,
            dir,
            args,
        };
        t.wait_ready();
        t
    }

    pub fn endpoint(&self) -> String {
        format!("unix:{}", self.socket.display())
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            if let Some(st) = self.child.try_wait().unwrap() {
                panic!("tierd exited early: {st}\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("tierd did not listen on {}", self.socket.display());
    }

    /// SIGTERM, then wait: tierd removes its socket and exits.
    pub fn stop(&mut self) {
        // SAFETY: kill(2) on our own child's PID, which is not reaped yet.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "tierd ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts it again on the same socket, with the same arguments.
    pub fn restart(&mut self) {
        self.child = spawn(&self.socket, self.dir.path(), &self.args);
        self.wait_ready();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("tierd.log")).unwrap_or_default()
    }
}

fn spawn(socket: &Path, dir: &Path, extra: &[String]) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("tierd.log"))
        .unwrap();
    Command::new(tierd_bin())
        .arg("run")
        .arg("--socket")
        .arg(socket)
        // Other tests' VMs, the host's config and metrics port are not
        // this test's business.
        .args([
            "--no-discover",
            "--config",
            "/dev/null",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap()
}

impl Drop for Tierd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
