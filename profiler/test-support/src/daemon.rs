//! Starting a server with its output in a log file, reading what it
//! announced there, and finding the tierd binary. tierd itself is started
//! through [`crate::Tierd`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::child::ChildGuard;

/// Spawns `cmd` with stdout and stderr appended to `log` (appended so a
/// restarted daemon keeps the earlier lines).
pub fn spawn_logged(cmd: &mut Command, log: &Path) -> ChildGuard {
    let (out, err) = log_stdio(log).unwrap();
    let child = cmd
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    ChildGuard::new(child)
}

/// Stdout and stderr for a child, both appended to `log`.
pub(crate) fn log_stdio(log: &Path) -> std::io::Result<(Stdio, Stdio)> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    Ok((Stdio::from(f.try_clone()?), Stdio::from(f)))
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
    crate::wait_until(
        &format!("{phrase:?} with bound= in the log"),
        Duration::from_secs(20),
        || {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            bound_in(&text, phrase).ok_or(text)
        },
    )
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
