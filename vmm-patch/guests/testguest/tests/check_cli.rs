//! The `tier-testguest check` subcommand: the guest's own parser on the
//! host, printing the normalised command line (deaf=/lie= windows included)
//! or the guest's error.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn check(cmdline: &str) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tier-testguest"))
        .args(["check", cmdline])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn check_prints_windows_and_rejects_overlap() {
    let (ok, out, _) = check("hot=64,64 deaf=30s+20s,120s+15s lie=0x5s+1s");
    assert!(ok);
    assert!(
        out.trim_end().ends_with(" deaf=30s+20s,120s+15s lie=5s+1s"),
        "{out}"
    );
    let (ok, _, err) = check("deaf=30s+20s,40s+1s");
    assert!(!ok);
    assert_eq!(
        err.trim_end(),
        "tier-testguest: guest command line: windows must be in order and not overlap: '40s+1s'"
    );
}
