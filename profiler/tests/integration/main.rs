//! tier-profiler's integration tests under the standard harness, in one
//! binary: each module was a binary of its own, each linking tonic, tokio
//! and libbpf. A test keeps its file's name as its module path, e.g.
//! `cargo test -p tier-profiler --test integration daemon::`. Tests that
//! need a capability are compiled as ignored with the reason where it is
//! missing (build.rs's `has_kvm`, `has_page_idle`). The tests with a
//! custom harness, whose capability is checked at run time, are in
//! tests/gated/.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

mod ch_common;
#[path = "../ept_common/mod.rs"]
mod ept_common;

mod ch_control;
mod ch_layout;
mod ch_resize_zone;
mod daemon;
mod deploy;
mod discovery;
mod ept_ageing;
mod ept_host_mode;
mod hostpte;
mod hostpte_ages;
mod operations;
mod policy_file;
mod prometheus;

use tier_test_support::{Tierd, TierdBuilder};

/// tierd, this crate's binary, as the tests here start it.
fn tierd() -> TierdBuilder {
    Tierd::builder().bin(env!("CARGO_BIN_EXE_tierd"))
}
