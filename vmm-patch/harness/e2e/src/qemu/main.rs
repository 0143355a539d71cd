//! `tier-e2e-qemu`: the closed loop on the Linux bed (`cargo xtask e2e
//! --vmm qemu`). Two Debian 6.12 guests under QEMU TCG, each with a DRAM
//! node (boot memory and a virtio-mem device) and a slow node, their own
//! tiering on (demotion, NUMA-balancing promotion). tierd finds them
//! through QMP, samples them with hostpte and its controller resizes their
//! DRAM devices within one host DRAM budget. Guest b idles; guest a's hot
//! set grows in place past its DRAM. Judged on the guests' exact counts
//! (the tier_truth plugin), not tierd's estimate: DRAM moves from b to a,
//! QEMU's plugged sizes follow, a's accesses land in DRAM again, b's stay
//! there, no guest OOMs, the loop settles.

mod checks;
mod run;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(about = "Closed loop on the Linux bed: two QEMU guests, tierd and its controller")]
pub struct Args {
    /// The tierd binary.
    #[arg(long)]
    tierd: PathBuf,
    /// tier-bed-agent, built for the guest.
    #[arg(long)]
    agent: PathBuf,
    /// The tier_truth plugin (`cargo xtask linux-bed-plugin`).
    #[arg(long)]
    plugin: PathBuf,
    /// The unpacked 6.12 kernel package (its root directory).
    #[arg(long)]
    kernel: PathBuf,
    /// Keep tierd's config and log here (default: a temporary directory).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Controller mode: `ratio` or `working-set`.
    #[arg(long, default_value = "working-set")]
    mode: String,
    /// Seconds before a's hot set grows (a populates it meanwhile: about
    /// 7 MiB/s under the plugin).
    #[arg(long, default_value_t = 60)]
    phase_secs: u64,
    /// Seconds watched after a's hot set grew.
    #[arg(long, default_value_t = 120)]
    after_secs: u64,
    /// MiB a's hot set grows to (its DRAM node holds 192 MiB at first, at
    /// most 256 within the budget).
    #[arg(long, default_value_t = 200)]
    grow_mib: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let r = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(run::run(&args)));
    tier_e2e::run::exit("tier-e2e-qemu", "e2e", r)
}
