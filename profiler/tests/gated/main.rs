//! tier-profiler's capability-gated integration tests, in one binary with
//! a custom harness (libtest-mimic): a test whose capability is missing at
//! run time (not root, BPF or fexit refused, no /dev/kvm, no patched
//! cloud-hypervisor, no grpcurl, no Linux bed kernels) is reported as
//! ignored with the reason, never as passed. Each module was a binary of
//! its own and names its trials `MODULE::NAME`, e.g.
//! `cargo test -p tier-profiler --test gated qemu_bed::`.
//!
//! The modules run one after another, each with its trials in parallel, as
//! their binaries did: the BPF, PMU and VM tests of different modules
//! never share the machine.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

#[path = "../ept_common/mod.rs"]
mod ept_common;

mod bpf_ept;
mod bpf_ept_attribution;
mod bpf_ept_modes;
mod ch_live;
mod grpcurl;
mod page_idle_ages;
mod pmu;
mod pmu_daemon;
mod probe_programs;
mod qemu_bed;

use std::path::Path;

use tier_test_support::{Tierd, TierdBuilder};

fn main() {
    let args = libtest_mimic::Arguments::from_args();
    // libbpf's own messages (e.g. the EPERM of a refused fexit) go to
    // tracing; each refusal is reported once, as the ignore reason.
    tier_profiler::bpf::route_libbpf_logs();
    let modules: [fn() -> Vec<libtest_mimic::Trial>; 10] = [
        bpf_ept::trials,
        bpf_ept_modes::trials,
        bpf_ept_attribution::trials,
        pmu::trials,
        pmu_daemon::trials,
        page_idle_ages::trials,
        probe_programs::trials,
        grpcurl::trials,
        ch_live::trials,
        qemu_bed::trials,
    ];
    tier_test_support::run_in_turn(&args, modules).exit();
}

/// tierd, this crate's binary, as the tests here start it.
fn tierd() -> TierdBuilder {
    Tierd::builder().bin(env!("CARGO_BIN_EXE_tierd"))
}

/// tierd in `dir` with `config`, discovery as the config says.
fn tierd_in(dir: &Path, config: &str) -> TierdBuilder {
    tierd().dir(dir).config(config).discover()
}
