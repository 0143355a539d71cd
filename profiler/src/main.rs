//! tierd: the host daemon. `tierd run` (the default) serves tier.v1 on a
//! unix socket; `tierd probe` prints what this host can measure.

mod daemon;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tier_proto::v1::TierKind;

#[derive(Debug, Parser)]
#[command(
    name = "tierd",
    version,
    about = "Per-VM, per-memory-tier access sampling daemon"
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Serve tier.v1 (the default).
    Run(RunArgs),
    /// Print which sampler backends this host supports, and why not the others.
    Probe {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Unix socket to serve on.
    #[arg(long, default_value = tier_proto::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Permissions of the socket (octal).
    #[arg(long, default_value = "660", value_parser = parse_mode)]
    pub socket_mode: u32,
    /// Sampling interval in milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    pub interval_ms: u64,
    /// Sampler backend: auto (best available), hostpte, or none.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Do not look for VMs in other processes (kvm-vm file descriptors).
    #[arg(long)]
    pub no_discover: bool,
    /// Kind of a tier by name, e.g. `--tier-kind slow=cxl` (repeatable).
    #[arg(long = "tier-kind", value_parser = parse_tier_kind)]
    pub tier_kinds: Vec<(String, TierKind)>,
    /// Run the demo VM (a real KVM VM with a dram and a slow region) inside tierd.
    #[arg(long)]
    pub demo_vm: bool,
    /// Tier kind the demo VM's "slow" region is labelled with.
    #[arg(long, default_value = "cxl", value_parser = ["pmem", "cxl", "remote", "unknown"])]
    pub demo_slow_kind: String,
}

fn parse_tier_kind(s: &str) -> Result<(String, TierKind), String> {
    let (name, kind) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=KIND"))?;
    let kind = TierKind::from_short_name(kind)
        .ok_or_else(|| format!("{kind:?}: not a tier kind (dram, pmem, cxl, remote, unknown)"))?;
    if name.is_empty() {
        return Err(format!("{s:?}: empty tier name"));
    }
    Ok((name.to_string(), kind))
}

fn parse_mode(s: &str) -> Result<u32, String> {
    match u32::from_str_radix(s, 8) {
        Ok(m) if m <= 0o777 => Ok(m),
        _ => Err(format!("{s:?} is not an octal mode like 660")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TIERD_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    tier_profiler::bpf::route_libbpf_logs();
    let result = match cli.cmd {
        Some(Cmd::Probe { json }) => probe(json),
        Some(Cmd::Run(args)) => daemon::run(args),
        None => daemon::run(cli.run),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tierd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn probe(json: bool) -> anyhow::Result<()> {
    let report = tier_profiler::probe::run();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).context("encoding the report")?
        );
    } else {
        println!(
            "tierd capability probe (kernel {}):",
            daemon::kernel_release()
        );
        print!("{}", report.render());
    }
    Ok(())
}
