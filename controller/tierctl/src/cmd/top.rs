//! `top`: the full-screen view on a terminal, batch output otherwise.

use std::io::{IsTerminal, Write};

use anyhow::{Context, bail};
use tier_proto::Endpoint;
use tier_proto::v1::{DaemonInfo, GetPolicyRequest, Policy, StatsUpdate, WatchStatsRequest};
use tierctl::cli::{Output, TopArgs};
use tierctl::conn::{Client, RpcError};
use tierctl::view;
use tokio_stream::StreamExt;

pub async fn top(
    endpoint: Endpoint,
    client: Client,
    info: DaemonInfo,
    args: TopArgs,
) -> anyhow::Result<()> {
    if args.interactive(std::io::stdout().is_terminal()) {
        return super::live::run(endpoint, client, info).await;
    }
    batch(client, args.batch_limit(), args.output).await
}

/// Prints `limit` updates (all of them for None).
async fn batch(mut client: Client, limit: Option<u64>, output: Output) -> anyhow::Result<()> {
    // Which signal steers each VM depends on the policy's mode; without it
    // (an older tierd) the column says `?` and JSON null.
    let policy = client
        .get_policy(GetPolicyRequest {})
        .await
        .ok()
        .map(|r| r.into_inner());
    let mut stream = client
        .watch_stats(WatchStatsRequest { vm_ids: Vec::new() })
        .await
        .map_err(|s| RpcError::new("WatchStats", s))?
        .into_inner();
    let mut printed = 0u64;
    let mut vms = Vec::new();
    let mut out = std::io::stdout().lock();
    while let Some(update) = stream.next().await {
        let mut update = update.map_err(|s| RpcError::new("WatchStats", s))?;
        // The VM list travels only when it changes.
        if update.vms_unchanged {
            update.vms = vms.clone();
        } else {
            vms = update.vms.clone();
        }
        write_update(&mut out, &update, policy.as_ref(), output, printed == 0)?;
        out.flush().context("writing to stdout")?;
        printed += 1;
        if limit.is_some_and(|l| printed >= l) {
            return Ok(());
        }
    }
    bail!("tierd closed the stats stream")
}

fn write_update(
    out: &mut impl Write,
    update: &StatsUpdate,
    policy: Option<&Policy>,
    output: Output,
    first: bool,
) -> anyhow::Result<()> {
    let rows = view::rows_for(update, policy);
    match output {
        Output::Table => {
            writeln!(
                out,
                "update #{}  {} VM(s)",
                update.sequence,
                update.vms.len()
            )?;
            write!(out, "{}", view::table(&rows))?;
        }
        Output::Json => {
            let line = serde_json::to_string(&view::update_json_for(update, policy))
                .context("encoding JSON")?;
            writeln!(out, "{line}")?;
        }
        Output::Csv => {
            let csv = view::csv(&rows);
            // One header for the whole stream.
            let body = if first {
                csv.as_str()
            } else {
                csv.split_once('\n').map_or("", |(_, b)| b)
            };
            write!(out, "{body}")?;
        }
    }
    Ok(())
}
