//! `info`, `vms`, `vm`.

use anyhow::Context;
use tier_proto::v1::{DaemonInfo, ListVmsRequest, TierKind};
use tierctl::cli::ListOutput;
use tierctl::conn::{Client, RpcError};
use tierctl::view;

pub fn info(info: &DaemonInfo) {
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

pub async fn vms(client: &mut Client, output: ListOutput) -> anyhow::Result<()> {
    let vms = client
        .list_vms(ListVmsRequest {})
        .await
        .map_err(|s| RpcError::new("ListVms", s))?
        .into_inner()
        .vms;
    if output == ListOutput::Json {
        let all: Vec<serde_json::Value> = vms.iter().map(view::vm_json).collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&all).context("encoding JSON")?
        );
        return Ok(());
    }
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
                    tier_proto::human_bytes(t.size_bytes)
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
    Ok(())
}

pub async fn vm(client: &mut Client, key: &str) -> anyhow::Result<()> {
    let vm = super::resolve_vm(client, key).await?;
    println!(
        "{}",
        serde_json::to_string_pretty(&view::vm_json(&vm)).context("encoding JSON")?
    );
    Ok(())
}
