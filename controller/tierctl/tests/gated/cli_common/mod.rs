//! Shared by the tierctl tests that run real processes: a tierd on a
//! private socket, tierctl itself, and what the host must offer.
//! The harness itself (finding or building tierd, starting and stopping
//! it, host checks) is tier-test-support's.

// Each test file uses its own subset of these helpers.
#![allow(dead_code)]

use std::process::{Command, Output, Stdio};

pub use tier_test_support::Tierd;

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

/// tierd isolated from the host and other tests (no discovery, no
/// config file, an ephemeral metrics port) with `extra`, once it listens.
pub fn start_tierd(extra: &[&str]) -> Tierd {
    Tierd::builder().metrics("127.0.0.1:0").args(extra).start()
}
