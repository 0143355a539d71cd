//! tier-controller's integration tests, in one binary (one link of tokio,
//! proptest and the balloon backend instead of one per file). Each module
//! is what was a test file; a test's name is `module::test`, so
//! `cargo test -p tier-controller --test integration sim_skew::` runs one
//! file's tests. The live cloud-hypervisor test, which needs the patched
//! binary and /dev/kvm, is its own binary (controller/tests/ch_live.rs).
//! The simulator the closed-loop tests drive is tier-sim (controller/sim/).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

/// The cloud-hypervisor client against recorded VMM answers.
mod ch_contract;
/// Hand-computed rounds of the decision function.
mod decide;
/// Rounds with DRAM-hit intervals.
mod interval_decide;
/// Properties over random scenarios (both modes).
mod properties;
/// Properties of working_set mode.
mod properties_ws;
/// The random scenarios of the property tests.
mod scenario;
/// Simulated fleets: convergence, budget, uncooperative guests.
mod sim;
/// The closed loop through simulated accessed-bit passes.
mod sim_passes;
/// Simulated samples that read like accessed bits.
mod sim_skew;
/// The vhost-user balloon backend's client against the real backend.
mod vhost_control;
/// working_set mode: hand-computed rounds and a phase change.
mod working_set;
