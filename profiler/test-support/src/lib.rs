//! One job: the harness code that tests share for running real processes
//! (tierd through [`Tierd`], and others), waiting with a deadline
//! ([`wait_until`]), reading what they announce, opening tierd's stats
//! stream, and checking what the host offers. A dev-dependency of tests and
//! benches; it depends on no crate whose tests use it (tier-profiler's own
//! tests use it), so tests pass it binary paths. Only tier-proto, below
//! every crate here, for the [`stream`] client.
//!
//! Helpers panic on failure: they run inside tests, where a loud failure
//! with the process's log is the wanted outcome. The exceptions are
//! [`ChildGuard`] and the `try_` functions of [`Tierd`] and [`wait`], which
//! return errors: the e2e run (`tier-e2e`, a test run as a binary) and the
//! benches start tierd through them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test harness: fail loudly

pub mod caps;
pub mod child;
pub mod daemon;
pub mod fake_http;
pub mod http;
pub mod stream;
pub mod tierd;
pub mod tmux;
pub mod wait;

pub use caps::{
    ch_bin, ch_kvm, gated, grpcurl, kvm_missing, run_in_turn, tmux_missing, tool, tool_missing,
};
pub use child::{ChildGuard, spawn_ready_line};
pub use daemon::{bound_in, spawn_logged, tierd_bin, wait_bound};
pub use http::{http_get, http_get_with};
pub use stream::{open_watch_stats, watch_stats};
pub use tierd::{Tierd, TierdBuilder, TierdError};
pub use tmux::Tmux;
pub use wait::{
    Check, TimedOut, try_wait_until, try_wait_until_async, try_within, wait_until,
    wait_until_async, within,
};
