//! `tier-e2e`: the closed loop against the patched cloud-hypervisor (issue
//! 10). Two test guests with dram and slow zones and per-tier balloons,
//! tierd sampling them with its controller on, and checks that DRAM moves to
//! the guest that needs it, balloons follow their targets, host memory is
//! freed, and the DRAM-hit ratios come back within epsilon after the
//! guests' needs swap. `cargo xtask e2e` builds everything and runs it.

mod checks;
mod scenario;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    about = "Closed-loop run: test guests, patched cloud-hypervisor, tierd and its controller"
)]
struct Args {
    /// The patched cloud-hypervisor binary.
    #[arg(long)]
    ch_bin: PathBuf,
    /// The tierd binary.
    #[arg(long)]
    tierd: PathBuf,
    /// The test guest ELF (default: the one this build compiled).
    #[arg(long)]
    guest: Option<PathBuf>,
    /// Keep sockets, serial logs and tierd's log here (default: a temporary
    /// directory, removed at the end).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Seconds of the first phase (from guest boot).
    #[arg(long, default_value_t = 45)]
    phase_secs: u64,
    /// Seconds watched after the later guest's phase change.
    #[arg(long, default_value_t = 40)]
    after_secs: u64,
    /// tierd sampler backend.
    #[arg(long, default_value = "hostpte")]
    backend: String,
    /// What the controller keeps the guests at: the DRAM-hit ratio, or the
    /// hot working set in DRAM (docs/e2e.md, "working_set mode").
    #[arg(long, value_enum, default_value = "ratio")]
    mode: scenario::Mode,
}

fn main() -> ExitCode {
    tier_e2e::run::exit("tier-e2e", "e2e", run())
}

fn run() -> anyhow::Result<bool> {
    let args = Args::parse();
    tier_e2e::run::require_files(&[
        ("--ch-bin", args.ch_bin.as_path()),
        ("--tierd", args.tierd.as_path()),
    ])?;
    let (work, _tmp) = tier_e2e::run::work_dir(args.work_dir.as_deref())?;
    let paths = scenario::Paths {
        ch_bin: args.ch_bin.clone(),
        tierd: args.tierd.clone(),
        guest: args
            .guest
            .clone()
            .unwrap_or_else(|| tier_testguest::elf_path().to_path_buf()),
        work,
    };
    let plan = scenario::Plan {
        phase_secs: args.phase_secs,
        after_secs: args.after_secs,
        backend: args.backend.clone(),
        mode: args.mode,
        ..scenario::Plan::default()
    };
    for s in plan.specs() {
        println!("guest {}: {}", s.name, s.cmdline);
    }
    let rt = tokio::runtime::Runtime::new().context("tokio runtime")?;
    let outcome = rt.block_on(scenario::run(&plan, &paths))?;
    println!();
    let verdicts = checks::all(&outcome);
    let mut pass = true;
    for v in &verdicts {
        println!(
            "{} {:<36} {}",
            if v.pass { "PASS" } else { "FAIL" },
            v.name,
            v.detail
        );
        pass &= v.pass;
    }
    let later = outcome.phase_change.iter().copied().flatten().max();
    let conv = later.and_then(|l| checks::converge(&outcome, l, outcome.rows.len()));
    println!(
        "RESULT e2e={} converge_intervals={} intervals={} decisions={} mode={}",
        if pass { "pass" } else { "fail" },
        conv.map_or_else(|| "none".into(), |k| k.to_string()),
        outcome.rows.len(),
        outcome.decisions.len(),
        match args.mode {
            scenario::Mode::Ratio => "ratio",
            scenario::Mode::WorkingSet => "working_set",
        }
    );
    Ok(pass)
}
