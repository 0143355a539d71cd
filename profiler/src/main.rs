//! tierd: the host daemon. `tierd run` (the default) serves tier.v1 on a
//! unix socket; `tierd probe` prints what this host can measure.

mod daemon;
mod listen;
mod metrics;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tier_profiler::config::{self, Config, ConfigError, Settings};

/// Every interval builds and drops thousands of per-VM strings and vectors
/// (the update, the controller's view): under glibc malloc their
/// allocation and freeing was about a third of tierd's CPU at 1000 VMs
/// (`bench tierd-scale`).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    Run(Box<RunArgs>),
    /// Print which sampler backends this host supports, and why not the others;
    /// with --programs, whether each BPF program tierd ships loads and attaches.
    Probe {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Instead: load every BPF program tierd ships (ept.bpf.o,
        /// pmu.bpf.o, probe.bpf.o) alone, attach it and detach it at once,
        /// and print the kernel's verdict per program (load, attach, the
        /// error and the verifier log's last lines). Exits 0 when programs
        /// are refused; non-zero only when bpf() itself is unusable.
        #[arg(long)]
        programs: bool,
    },
    /// Print a shell completion script (`cargo xtask package` ships them).
    #[command(hide = true)]
    Completions { shell: clap_complete::Shell },
    /// Print the man page, roff (`cargo xtask package` ships it).
    #[command(hide = true)]
    Man,
}

/// Flags override the config file (docs/config.md has every key).
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Config file; without it /etc/tierd/tierd.toml is read if it exists.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Unix socket to serve on [socket].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Permissions of the socket, octal [socket_mode].
    #[arg(long)]
    pub socket_mode: Option<String>,
    /// Group owning the socket [socket_group].
    #[arg(long)]
    pub socket_group: Option<String>,
    /// Sampling interval in milliseconds [interval_ms].
    #[arg(long)]
    pub interval_ms: Option<u64>,
    /// Ageing passes per interval [passes_per_interval].
    #[arg(long)]
    pub passes: Option<u32>,
    /// Sampler backend: auto, ept-fexit, ept-tracepoint, hostpte or none [backend].
    #[arg(long)]
    pub backend: Option<String>,
    /// CPU the sampler may use, % of one core; 0 = no budget [sampler.cpu_budget_pct].
    #[arg(long)]
    pub cpu_budget_pct: Option<f64>,
    /// Working-set horizons, seconds, comma-separated, ascending [sampler.ws_horizons_s].
    #[arg(long, value_delimiter = ',')]
    pub ws_horizons_s: Option<Vec<f64>>,
    /// Do not look for VMs in other processes [discover = false].
    #[arg(long)]
    pub no_discover: bool,
    /// A QEMU VM's QMP socket, repeatable; added to [discovery.qemu_qmp].
    #[arg(long = "qmp", value_name = "PATH")]
    pub qmp: Vec<PathBuf>,
    /// Kind of a tier by name, e.g. `--tier-kind slow=cxl`, repeatable [tier_kinds].
    #[arg(long = "tier-kind", value_parser = parse_pair)]
    pub tier_kinds: Vec<(String, String)>,
    /// Run the demo VM (a real KVM VM with a dram and a slow region) inside tierd [demo_vm].
    #[arg(long)]
    pub demo_vm: bool,
    /// Tier kind of the demo VM's "slow" region [demo_slow_kind].
    #[arg(long)]
    pub demo_slow_kind: Option<String>,
    /// Alternate the demo VM between two hot sets every N seconds; 0: one
    /// fixed phase [demo_cycle_s].
    #[arg(long)]
    pub demo_cycle_s: Option<u64>,
    /// Log format: text or json [log_format].
    #[arg(long)]
    pub log_format: Option<String>,
    /// Prometheus endpoint, loopback address:port, "" for none [metrics.listen].
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// Do not run the in-process controller [controller.enabled = false].
    #[arg(long)]
    pub no_controller: bool,
    /// Benchmarks only: add N synthetic VM sources (ids `synthetic:N`).
    #[arg(long, default_value_t = 0, hide_short_help = true)]
    pub synthetic_vms: u32,
    /// Benchmarks only: tiers per synthetic VM.
    #[arg(long, default_value_t = 4, hide_short_help = true, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub synthetic_tiers: u32,
}

fn parse_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?}: expected NAME=KIND")),
    }
}

impl RunArgs {
    /// The config file with these flags on top, validated.
    fn settings(&self) -> Result<Settings, ConfigError> {
        let mut c = match &self.config {
            Some(p) => Config::load(p, true)?,
            None => Config::load(std::path::Path::new(config::DEFAULT_PATH), false)?,
        };
        if let Some(v) = &self.socket {
            c.socket = v.clone();
        }
        if let Some(v) = &self.socket_mode {
            c.socket_mode = v.clone();
        }
        if let Some(v) = &self.socket_group {
            c.socket_group = Some(v.clone());
        }
        if let Some(v) = self.interval_ms {
            c.interval_ms = v;
        }
        if let Some(v) = self.passes {
            c.passes_per_interval = v;
        }
        if let Some(v) = &self.backend {
            c.backend = v.clone();
        }
        if let Some(v) = self.cpu_budget_pct {
            c.sampler.cpu_budget_pct = v;
        }
        if let Some(v) = &self.ws_horizons_s {
            c.sampler.ws_horizons_s = v.clone();
        }
        c.discover &= !self.no_discover;
        c.tier_kinds.extend(self.tier_kinds.iter().cloned());
        // Relative paths are the caller's: made absolute here.
        let cwd = std::env::current_dir().unwrap_or_default();
        c.discovery
            .qemu_qmp
            .extend(self.qmp.iter().map(|p| cwd.join(p).display().to_string()));
        c.demo_vm |= self.demo_vm;
        if let Some(v) = &self.demo_slow_kind {
            c.demo_slow_kind = v.clone();
        }
        if let Some(v) = self.demo_cycle_s {
            c.demo_cycle_s = v;
        }
        if let Some(v) = &self.log_format {
            c.log_format = v.clone();
        }
        if let Some(v) = &self.metrics_listen {
            c.metrics.listen = v.clone();
        }
        c.controller.enabled &= !self.no_controller;
        c.validate()
    }
}

fn init_logs(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TIERD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only for a person at a terminal, never into files or journald.
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if json {
        logs.json().init();
    } else {
        logs.init();
    }
    tier_profiler::bpf::route_libbpf_logs();
}

fn main() -> ExitCode {
    no_huge_pages();
    let cli = Cli::parse();
    let run = match cli.cmd {
        Some(Cmd::Probe { json, programs }) => {
            init_logs(false);
            if programs {
                return report(probe_programs(json));
            }
            return report(probe(json));
        }
        Some(Cmd::Completions { shell }) => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "tierd", &mut std::io::stdout());
            return ExitCode::SUCCESS;
        }
        Some(Cmd::Man) => return report(man_page()),
        Some(Cmd::Run(args)) => *args,
        None => cli.run,
    };
    let settings = match run.settings() {
        Ok(s) => s,
        Err(e) => {
            // Status 2: the configuration, not the host, is wrong.
            eprintln!("tierd: {e}");
            return ExitCode::from(2);
        }
    };
    init_logs(settings.json_logs);
    purge_after(settings.interval);
    report(daemon::run(
        settings,
        (run.synthetic_vms, run.synthetic_tiers),
    ))
}

/// No transparent huge pages for tierd's own memory: its per-interval
/// buffers (the update, its encoding, the controller's view) land in
/// fresh pages now and then (a buffer freed on another thread than the one
/// that allocated it), and the kernel zeroed a whole 2 MiB page for each:
/// 15 % of tierd's CPU with 10 watchers (perf, `bench tierd-scale`; 1.8-1.9 % of a
/// core without, 1.9-2.5 % with). tierd's memory is small; it gains
/// nothing from them. The guests' memory is the VMM's, untouched.
fn no_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments and changes only
    // this process's own memory policy; failure leaves THP as it was.
    let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

/// mimalloc returns freed memory to the OS a while after it is freed (its
/// `purge_delay`: 1 s in the v3 it builds), and tierd frees its
/// per-interval buffers every interval to allocate them again at the next:
/// at an interval of 1 s they were faulted in anew (`bench tierd-scale`). Two
/// intervals' delay keeps what the next interval reuses and still returns
/// what it does not.
fn purge_after(interval: std::time::Duration) {
    // `mi_option_purge_delay` of mimalloc.h (v2 and v3 alike, as
    // libmimalloc-sys 0.1.49 bundles them); the bindings name no constant.
    const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    let ms = std::ffi::c_long::try_from(interval.as_millis().saturating_mul(2))
        .unwrap_or(60_000)
        .clamp(1_000, 60_000);
    // SAFETY: sets one integer option, which mimalloc reads atomically.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, ms) };
}

fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tierd: {e:#}");
            // A damaged policy file is the operator's to fix, like a bad
            // config: status 2, which systemd does not restart on.
            if e.chain()
                .any(|c| c.is::<tier_profiler::policy_store::PolicyStoreError>())
            {
                return ExitCode::from(2);
            }
            ExitCode::FAILURE
        }
    }
}

fn man_page() -> anyhow::Result<()> {
    clap_mangen::Man::new(<Cli as clap::CommandFactory>::command())
        .render(&mut std::io::stdout())
        .context("writing the man page")
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

fn probe_programs(json: bool) -> anyhow::Result<()> {
    let report = tier_profiler::probe::programs::run(daemon::kernel_release())
        .context("probing the BPF programs")?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).context("encoding the report")?
        );
    } else {
        println!("tierd BPF programs (kernel {}):", report.kernel);
        print!("{}", report.render());
    }
    Ok(())
}
