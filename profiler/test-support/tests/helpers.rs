//! The helpers against real processes and sockets.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::{Duration, Instant};

use tier_test_support::{ChildGuard, bound_in, spawn_ready_line, tool_missing, wait_bound};

#[test]
fn terminate_ends_a_child_with_sigterm() {
    let mut g = ChildGuard::new(Command::new("sleep").arg("60").spawn().unwrap());
    let started = Instant::now();
    let st = g.terminate().expect("sleep ignores no SIGTERM");
    assert_eq!(st.signal(), Some(libc::SIGTERM));
    assert!(started.elapsed() < Duration::from_secs(5));
    // Reaped: terminating again reports the same status, sends nothing.
    assert_eq!(g.terminate().unwrap().signal(), Some(libc::SIGTERM));
}

#[test]
fn a_child_ignoring_sigterm_is_killed_after_the_grace() {
    // The shell ignores TERM and announces it is ready before sleeping.
    let (mut g, line) = spawn_ready_line(
        Command::new("sh").args(["-c", "trap '' TERM; echo ready; exec sleep 60"]),
    );
    assert_eq!(line, "ready\n");
    assert!(g.terminate().is_none(), "SIGTERM was ignored");
    assert!(g.child_mut().try_wait().unwrap().is_some());
}

#[test]
fn a_guard_with_a_short_grace_kills_sooner() {
    use std::io::BufRead;
    let mut child = Command::new("sh")
        .args(["-c", "trap '' TERM; echo ready; exec sleep 60"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    let mut g = ChildGuard::with_grace(child, Duration::from_millis(300));
    assert!(g.try_wait().unwrap().is_none(), "still running");
    let started = Instant::now();
    assert!(g.terminate().is_none(), "SIGTERM was ignored");
    assert!(started.elapsed() < tier_test_support::child::GRACE);
    let st = g.try_wait().unwrap().unwrap();
    assert_eq!(st.signal(), Some(libc::SIGKILL));
}

#[test]
fn the_bound_address_of_a_phrase_is_read_from_the_log() {
    let log = "INFO grpc on bound=unix:/x\nINFO metrics on bound=127.0.0.1:9464 path=/metrics\n";
    assert_eq!(
        bound_in(log, "metrics on"),
        Some("127.0.0.1:9464".parse().unwrap())
    );
    assert_eq!(bound_in(log, "tcp on"), None);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.log");
    std::fs::write(&path, log).unwrap();
    assert_eq!(wait_bound(&path, "metrics on").port(), 9464);
}

#[test]
fn a_missing_tool_is_named_with_the_reason() {
    assert_eq!(tool_missing("sh", "a shell"), None);
    let why = tool_missing("no-such-tool-tierd", "for nothing").unwrap();
    assert!(
        why.starts_with("no-such-tool-tierd (for nothing):"),
        "{why}"
    );
}
