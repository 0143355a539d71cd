//! `top`: the full-screen view on a terminal, batch output otherwise.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use tier_proto::Endpoint;
use tier_proto::v1::{
    DaemonInfo, Decision, GetPolicyRequest, Policy, StatsUpdate, WatchDecisionsRequest,
    WatchStatsRequest,
};
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
    let decisions = match output {
        Output::Table => last_decisions(&client).await,
        _ => Arc::default(),
    };
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
        if output == Output::Table {
            write_decisions(&mut out, &update, &decisions)?;
        }
        out.flush().context("writing to stdout")?;
        printed += 1;
        if limit.is_some_and(|l| printed >= l) {
            return Ok(());
        }
    }
    bail!("tierd closed the stats stream")
}

type Decisions = Arc<Mutex<HashMap<String, Decision>>>;

/// The controller's last decision per VM, kept up to date from
/// WatchDecisions (which sends the recent ones first); empty when tierd
/// runs no controller or the call fails: the table is printed all the same.
async fn last_decisions(client: &Client) -> Decisions {
    let last = Decisions::default();
    let Ok(r) = client
        .clone()
        .watch_decisions(WatchDecisionsRequest { vm_ids: Vec::new() })
        .await
    else {
        return last;
    };
    let mut stream = r.into_inner();
    let sink = last.clone();
    tokio::spawn(async move {
        while let Some(Ok(d)) = stream.next().await {
            if let Ok(mut m) = sink.lock() {
                m.insert(d.vm_id.clone(), d);
            }
        }
    });
    // The recent decisions arrive at once; give them that moment.
    tokio::time::sleep(Duration::from_millis(300)).await;
    last
}

/// Under the table, each VM's last decision: what the controller did and
/// which signal it used.
fn write_decisions(
    out: &mut impl Write,
    update: &StatsUpdate,
    decisions: &Decisions,
) -> anyhow::Result<()> {
    let Ok(m) = decisions.lock() else {
        return Ok(());
    };
    for vm in &update.vms {
        if let Some(d) = m.get(&vm.id) {
            writeln!(
                out,
                "{}: last decision: {}: {}",
                vm.name,
                tierctl::top::format::action(d, update.timestamp_unix_ns),
                d.detail
            )?;
        }
    }
    Ok(())
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
