//! tierctl: talk to tierd. `info`, `vms`, `vm ID`, `top`.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use tokio_stream::StreamExt;
use tonic::transport::Channel;

use tier_controller::view;
use tier_proto::v1::tier_service_client::TierServiceClient;
use tier_proto::v1::{
    GetInfoRequest, GetVmRequest, ListVmsRequest, StatsUpdate, TierKind, WatchStatsRequest,
};
use tier_proto::{Endpoint, PROTOCOL_VERSION};

#[derive(Debug, Parser)]
#[command(name = "tierctl", version, about = "Watch and steer tierd")]
struct Cli {
    /// tierd endpoint: unix:/path, /path or http://host:port.
    #[arg(long, global = true, env = "TIERD_ENDPOINT", default_value = tier_proto::DEFAULT_SOCKET)]
    endpoint: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
    Csv,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Daemon version and what this host can measure.
    Info,
    /// VMs tierd knows, with their tiers.
    Vms,
    /// One VM's identity and tier map (JSON).
    Vm { id: String },
    /// Per-VM, per-tier stats as they stream in.
    Top {
        /// Print one update and exit.
        #[arg(long, conflicts_with = "iterations")]
        once: bool,
        /// Print N updates and exit.
        #[arg(short = 'n', long = "iterations")]
        iterations: Option<u64>,
        /// Output format (batch mode).
        #[arg(long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tierctl: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tierctl: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let endpoint = Endpoint::parse(&cli.endpoint)?;
    let mut client = tier_proto::connect(&endpoint).await?;
    let info = client
        .get_info(GetInfoRequest {})
        .await
        .context("GetInfo")?
        .into_inner();
    if info.protocol_version != PROTOCOL_VERSION {
        bail!(
            "protocol version mismatch: tierd {} speaks tier.v1 version {}, this tierctl speaks {}; use matching versions",
            info.daemon_version,
            info.protocol_version,
            PROTOCOL_VERSION
        );
    }
    match cli.cmd {
        Cmd::Info => {
            println!(
                "tierd {} on {} (kernel {}), protocol {}, interval {} ms, controller {}",
                info.daemon_version,
                info.hostname,
                info.kernel,
                info.protocol_version,
                info.interval_ns / 1_000_000,
                if info.controller_enabled { "on" } else { "off" }
            );
            println!("capabilities:");
            let width = info
                .capabilities
                .iter()
                .map(|c| c.name.len())
                .max()
                .unwrap_or(0);
            for c in &info.capabilities {
                let state = match (c.available, c.selected) {
                    (true, true) => "selected   ",
                    (true, false) => "available  ",
                    _ => "unavailable",
                };
                println!("  {:width$}  {state}  {}", c.name, c.reason);
            }
        }
        Cmd::Vms => {
            let vms = client
                .list_vms(ListVmsRequest {})
                .await
                .context("ListVms")?
                .into_inner()
                .vms;
            println!(
                "{:<24} {:<12} {:>8} {:>5}  TIERS",
                "ID", "NAME", "PID", "VCPU"
            );
            for vm in vms {
                let tiers: Vec<String> = vm
                    .tiers
                    .iter()
                    .map(|t| {
                        let kind = TierKind::try_from(t.kind).unwrap_or(TierKind::Unknown);
                        format!(
                            "{}({}, {})",
                            t.name,
                            kind.short_name(),
                            view::human_bytes(t.size_bytes)
                        )
                    })
                    .collect();
                println!(
                    "{:<24} {:<12} {:>8} {:>5}  {}",
                    vm.id,
                    vm.name,
                    vm.vmm_pid,
                    vm.vcpus,
                    tiers.join(" ")
                );
            }
        }
        Cmd::Vm { id } => {
            let vm = client
                .get_vm(GetVmRequest { id })
                .await
                .context("GetVm")?
                .into_inner();
            println!("{}", vm_json(&vm));
        }
        Cmd::Top {
            once,
            iterations,
            output,
        } => {
            let batch = once || iterations.is_some() || !std::io::stdout().is_terminal();
            let limit = if once || (iterations.is_none() && batch) {
                Some(1)
            } else {
                iterations
            };
            top(&mut client, limit, output, !batch).await?;
        }
    }
    Ok(())
}

/// Streams updates; `live` redraws in place (a plain refreshing table until
/// the full TUI lands), batch prints `limit` updates.
async fn top(
    client: &mut TierServiceClient<Channel>,
    limit: Option<u64>,
    output: Output,
    live: bool,
) -> anyhow::Result<()> {
    let mut stream = client
        .watch_stats(WatchStatsRequest { vm_ids: Vec::new() })
        .await
        .context("WatchStats")?
        .into_inner();
    let mut printed = 0u64;
    let mut vms = Vec::new();
    while let Some(update) = stream.next().await {
        let mut update = update.context("stats stream")?;
        // The VM list travels only when it changes.
        if update.vms_unchanged {
            update.vms = vms.clone();
        } else {
            vms = update.vms.clone();
        }
        if live {
            print!("\x1b[H\x1b[2J");
        }
        print_update(&update, output);
        printed += 1;
        if limit.is_some_and(|l| printed >= l) {
            return Ok(());
        }
    }
    bail!("tierd closed the stats stream")
}

fn print_update(update: &StatsUpdate, output: Output) {
    let rows = view::rows(update);
    match output {
        Output::Table => {
            println!("update #{}  {} VM(s)", update.sequence, update.vms.len());
            print!("{}", view::table(&rows));
        }
        Output::Json => match serde_json::to_string(&serde_json::json!({
            "sequence": update.sequence,
            "timestamp_unix_ns": update.timestamp_unix_ns,
            "interval_ns": update.interval_ns,
            "rows": rows,
            "departed_vm_ids": update.departed_vm_ids,
        })) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("tierctl: encoding JSON: {e}"),
        },
        Output::Csv => print!("{}", view::csv(&rows)),
    }
}

fn vm_json(vm: &tier_proto::v1::Vm) -> String {
    let tiers: Vec<serde_json::Value> = vm
        .tiers
        .iter()
        .map(|t| {
            serde_json::json!({
                "name": t.name,
                "kind": TierKind::try_from(t.kind).unwrap_or(TierKind::Unknown).short_name(),
                "host_numa_nodes": t.host_numa_nodes,
                "size_bytes": t.size_bytes,
                "ranges": t.ranges.iter().map(|r| serde_json::json!({
                    "gpa_start": format!("{:#x}", r.gpa_start),
                    "length": r.length,
                    "hva_start": format!("{:#x}", r.hva_start),
                })).collect::<Vec<_>>(),
                "derivation": t.derivation,
            })
        })
        .collect();
    let v = serde_json::json!({
        "id": vm.id, "name": vm.name, "vmm_pid": vm.vmm_pid, "api_socket": vm.api_socket,
        "vcpus": vm.vcpus, "tiers": tiers,
    });
    serde_json::to_string_pretty(&v).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}
