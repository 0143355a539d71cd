//! Starting a daemon (tierd or another server) with its output in a log
//! file, waiting until it listens, and reading what it announced there.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::child::ChildGuard;

/// Spawns `cmd` with stdout and stderr appended to `log` (appended so a
/// restarted daemon keeps the earlier lines).
pub fn spawn_logged(cmd: &mut Command, log: &Path) -> ChildGuard {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let child = cmd
        .stdout(Stdio::from(f.try_clone().unwrap()))
        .stderr(Stdio::from(f))
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    ChildGuard::new(child)
}

/// Waits until `socket` accepts a connection; panics with the log if the
/// child exits first or `timeout` passes.
pub fn wait_listening(child: &mut ChildGuard, socket: &Path, log: &Path, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        if let Some(st) = child.child_mut().try_wait().unwrap() {
            panic!("exited early: {st}\n{}", read_log(log));
        }
        assert!(
            Instant::now() < deadline,
            "did not listen on {} within {timeout:?}\n{}",
            socket.display(),
            read_log(log)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn read_log(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// [`spawn_logged`], then [`wait_listening`] on `socket`.
pub fn spawn_listening(
    cmd: &mut Command,
    socket: &Path,
    log: &Path,
    timeout: Duration,
) -> ChildGuard {
    let mut child = spawn_logged(cmd, log);
    wait_listening(&mut child, socket, log, timeout);
    child
}

/// `tierd run` on `socket`, isolated from the host and from tests running
/// in parallel: no discovery of other VMs, no config file, an ephemeral
/// metrics port.
pub fn tierd_isolated(bin: &Path, socket: &Path) -> Command {
    let mut c = Command::new(bin);
    c.arg("run").arg("--socket").arg(socket).args([
        "--no-discover",
        "--config",
        "/dev/null",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    c
}

/// `tierd run` with `config` written to `dir/tierd.toml`, on
/// `dir/tierd.sock`, no metrics endpoint, then `extra`; logging to
/// `dir/tierd.log`, waited for until it listens. (socket, log, child).
pub fn tierd_with_config(
    bin: &Path,
    dir: &Path,
    config: &str,
    extra: &[&str],
) -> (PathBuf, PathBuf, ChildGuard) {
    let (socket, log, cfg) = (
        dir.join("tierd.sock"),
        dir.join("tierd.log"),
        dir.join("tierd.toml"),
    );
    std::fs::write(&cfg, config).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("run")
        .arg("--config")
        .arg(&cfg)
        .arg("--socket")
        .arg(&socket)
        .args(["--metrics-listen", ""])
        .args(extra);
    let child = spawn_listening(&mut cmd, &socket, &log, Duration::from_secs(30));
    (socket, log, child)
}

/// `tierd run` on `socket` with no config file and no metrics endpoint:
/// for runs that are expected to stop at start-up.
pub fn tierd_no_metrics(bin: &Path, socket: &Path) -> Command {
    let mut c = Command::new(bin);
    c.args(["run", "--config", "/dev/null", "--metrics-listen", ""])
        .arg("--socket")
        .arg(socket);
    c
}

/// The `bound=ADDR` of the first log line containing `phrase` (e.g.
/// "metrics on"), if there is one yet.
pub fn bound_in(log: &str, phrase: &str) -> Option<SocketAddr> {
    log.lines()
        .find(|l| l.contains(phrase))
        .and_then(|l| l.split("bound=").nth(1))
        .and_then(|a| a.split_whitespace().next())
        .map(|a| a.parse().unwrap_or_else(|e| panic!("bound={a}: {e}")))
}

/// Waits up to 20 s for the log file to announce `phrase ... bound=ADDR`.
pub fn wait_bound(log: &Path, phrase: &str) -> SocketAddr {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = read_log(log);
        if let Some(addr) = bound_in(&text, phrase) {
            return addr;
        }
        assert!(
            Instant::now() < deadline,
            "no {phrase:?} with bound= in the log:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The tierd binary for tests of other crates (tier-profiler's own tests
/// use `CARGO_BIN_EXE_tierd`). Found next to the test binary's directory
/// (`<target>/<profile>/deps/<test>` -> `<target>/<profile>/tierd`), where
/// a workspace build puts it; built once with cargo into that target dir
/// when it is not there.
pub fn tierd_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
        let bin = dir.join("tierd");
        if bin.exists() {
            return bin;
        }
        let target = dir.parent().unwrap();
        let mut build = Command::new(env!("CARGO"));
        build.args(["build", "-p", "tier-profiler", "--bin", "tierd"]);
        build.arg("--target-dir").arg(target);
        if dir.file_name().is_some_and(|n| n == "release") {
            build.arg("--release");
        }
        let st = build.status().unwrap();
        assert!(st.success() && bin.exists(), "building tierd: {st}");
        bin
    })
}
