//! tierd as the e2e run and the soak start it: a config that drives the
//! run's cloud-hypervisor VMs, started through tier-test-support's one
//! tierd harness ([`Tierd`]), stopped by its PID.

use std::path::Path;

use anyhow::Context;
pub use tier_test_support::Tierd;

use crate::vmm::STOP_GRACE;

/// How often hostpte sweeps for the working-set ages in the e2e's tierd:
/// each sweep gives each VM's hot set about once.
pub const WS_SWEEP_EVERY_S: u64 = 10;

/// Starts `bin run` with a config that samples with `backend`, finds
/// cloud-hypervisor VMs through the API sockets in `ch_dir`, takes the
/// zone `slow` for CXL memory (this host has one memory tier) and runs
/// the controller. Only the VMMs in `ch_dir` are its to drive: other
/// cloud-hypervisor processes on the host (another test's) are not
/// looked up by their command line, and other KVM processes are not
/// tracked by their kvm-vm fd (one counted against the run's DRAM
/// budget once). `extra` is appended to the `[controller]` table
/// (e.g. `policy_file = "..."`). No sampler CPU budget: the scenarios
/// time the controller against every interval's estimate (a hostpte
/// pass of a cloud-hypervisor guest costs more than the default budget
/// pays for every interval; docs/config.md, "Sampler budget").
pub fn start(
    bin: &Path,
    dir: &Path,
    ch_dir: &Path,
    backend: &str,
    interval_ms: u64,
    passes: u32,
    extra: &str,
) -> anyhow::Result<Tierd> {
    let socket = dir.join("tierd.sock");
    let text = format!(
        "socket = {socket:?}\n\
         socket_mode = \"0600\"\n\
         interval_ms = {interval_ms}\n\
         passes_per_interval = {passes}\n\
         backend = {backend:?}\n\
         [sampler]\n\
         cpu_budget_pct = 0\n\
         ws_horizons_s = [1, 5]\n\
         ws_sweep_s = 5\n\
         ws_sweep_every_s = {WS_SWEEP_EVERY_S}\n\
         [tier_kinds]\n\
         slow = \"cxl\"\n\
         [metrics]\n\
         listen = \"\"\n\
         [discovery]\n\
         ch_api_dir = {ch_dir:?}\n\
         ch_cmdline = false\n\
         kvm_fd = false\n\
         [controller]\n\
         enabled = true\n\
         {extra}\n",
        socket = socket.display().to_string(),
        ch_dir = ch_dir.display().to_string(),
    );
    with_config(bin, dir, &text)
}

/// Starts `bin run` with `text` as its config file in `dir` (its `socket`
/// must be `dir/tierd.sock`), logging to `dir/tierd.log`, discovery and
/// metrics as `text` says; SIGKILLed [`STOP_GRACE`] after a SIGTERM.
/// Connect with [`Tierd::try_client`].
pub fn with_config(bin: &Path, dir: &Path, text: &str) -> anyhow::Result<Tierd> {
    Tierd::builder()
        .bin(bin)
        .dir(dir)
        .config(text)
        .discover()
        .metrics_from_config()
        .grace(STOP_GRACE)
        .try_spawn()
        .with_context(|| format!("starting {}", bin.display()))
}
