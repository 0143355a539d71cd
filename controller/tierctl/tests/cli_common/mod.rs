//! Shared by the tierctl tests that run real processes: a tierd on a
//! private socket, tierctl itself, and what the host must offer.
//! The harness itself (finding or building tierd, starting and stopping
//! it, host checks) is tier-test-support's.

// Each test file uses its own subset of these helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use tier_test_support::{ChildGuard, tierd_bin};

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

/// A tierd on a private socket; terminated on drop.
pub struct Tierd {
    child: ChildGuard,
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
        Tierd {
            child,
            socket,
            dir,
            args,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("unix:{}", self.socket.display())
    }

    /// SIGTERM, then wait: tierd removes its socket and exits.
    pub fn stop(&mut self) {
        assert!(self.child.terminate().is_some(), "tierd ignored SIGTERM");
    }

    /// Starts it again on the same socket, with the same arguments.
    pub fn restart(&mut self) {
        self.child = spawn(&self.socket, self.dir.path(), &self.args);
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("tierd.log")).unwrap_or_default()
    }
}

/// tierd isolated from the host and other tests, logging into
/// `dir/tierd.log` (appended across restarts), once it listens.
fn spawn(socket: &Path, dir: &Path, extra: &[String]) -> ChildGuard {
    let log = dir.join("tierd.log");
    let mut cmd = tier_test_support::tierd_isolated(tierd_bin(), socket);
    tier_test_support::spawn_listening(cmd.args(extra), socket, &log, Duration::from_secs(20))
}
