//! tierctl's tests against a real tierd (tier-test-support's harness), in
//! one binary with a custom harness (libtest-mimic): a test whose need is
//! missing at run time (tmux, /dev/kvm, root, QEMU or the Linux bed's
//! kernels) is reported as ignored with the reason, never as passed. Each
//! module was a binary of its own and names its trials `MODULE::NAME`,
//! e.g. `cargo test -p tierctl --test gated top_tmux::`; the modules run
//! one after another, as their binaries did.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

mod cli_common;

mod cli;
mod qemu_bed;
mod top_tmux;

fn main() {
    let args = libtest_mimic::Arguments::from_args();
    let modules: [fn() -> Vec<libtest_mimic::Trial>; 3] =
        [cli::trials, top_tmux::trials, qemu_bed::trials];
    tier_test_support::run_in_turn(&args, modules).exit();
}
