//! The run: boot, work, start tierd, watch every interval.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use tier_e2e::tierd;
use tier_linux_bed::Kernel;
use tier_proto::v1::*;
use tokio_stream::StreamExt;

use crate::Args;
use crate::checks;
use tier_e2e::bed::{self, Guest, Split};

pub use tier_e2e::bed::MIB;
use tier_e2e::bed::{BOOT_MIB, HOT_HORIZON_S, IDLE_MIB, PLUGGED_MIB};

/// One guest in one interval.
#[derive(Debug, Clone, Default)]
pub struct GuestRow {
    pub truth: Split,
    /// The DRAM device's (requested, plugged) bytes, as QEMU reports them.
    pub dram_device: Option<(u64, u64)>,
    /// tierd's hot set (working set within the hot horizon), bytes (low,
    /// high), where it measured one this interval.
    pub hot: Option<(f64, f64)>,
    pub actuator: String,
}

#[derive(Debug, Clone)]
pub struct Row {
    pub t: f64,
    pub guests: [GuestRow; 2],
}

/// What the run saw.
#[derive(Debug)]
pub struct Outcome {
    pub rows: Vec<Row>,
    /// Row index at which a's hot set grew.
    pub grew_at: usize,
    pub decisions: Vec<Decision>,
    /// Each guest's tiering counters at the start and the end.
    pub vmstat: [(BTreeMap<String, u64>, BTreeMap<String, u64>); 2],
    /// Whether each guest's workloads still run at the end.
    pub alive: [bool; 2],
    pub mode: String,
    /// Each guest's VM id in tierd's stream, once seen.
    pub vm_ids: [Option<String>; 2],
}

pub async fn run(args: &Args) -> anyhow::Result<bool> {
    tier_e2e::run::require_files(&[
        ("--tierd", &args.tierd),
        ("--agent", &args.agent),
        ("--plugin", &args.plugin),
    ])?;
    let kernel = Kernel::unpacked(&args.kernel).context("--kernel")?;
    let (work, _tmp) = tier_e2e::run::work_dir(args.work_dir.as_deref())?;
    let qmp_dir = work.join("qmp");
    let guests = bed::boot_pair(&kernel, &args.agent, &args.plugin, &work)?;
    for g in &guests {
        println!(
            "{}: QEMU pid {} booted in {:.1?}",
            g.name,
            g.bed.pid(),
            g.bed.boot_time()
        );
    }
    let [mut a, mut b]: [Guest; 2] = guests
        .try_into()
        .map_err(|_| anyhow::anyhow!("two guests"))?;
    for g in [&mut a, &mut b] {
        g.enable_tiering()?;
    }
    let vm0 = (a.vmstat()?, b.vmstat()?);
    // a populates its whole set now (a minute's allocation under the
    // plugin is not the controller's to wait for), touches a small part,
    // and all of it from phase_secs on; b idles throughout.
    a.touch(args.grow_mib, Some((IDLE_MIB, args.phase_secs)))?;
    b.touch(IDLE_MIB, None)?;

    let mut tierd = tierd::with_config(&args.tierd, &work, &bed::tierd_config(&work, &qmp_dir))?;
    let mut client = tierd.try_client(Duration::from_secs(30)).await?;
    println!(
        "tierd: pid {}, log {}",
        tierd.pid(),
        tierd.log_path().display()
    );
    client
        .set_policy(SetPolicyRequest {
            policy: Some(bed::policy(
                &args.mode,
                &["a", "b"],
                2 * (BOOT_MIB + PLUGGED_MIB) * MIB,
            )?),
        })
        .await
        .context("SetPolicy")?;
    let mut decisions_stream = client
        .watch_decisions(WatchDecisionsRequest { vm_ids: vec![] })
        .await
        .context("WatchDecisions")?
        .into_inner();
    let mut stats = client
        .watch_stats(WatchStatsRequest { vm_ids: vec![] })
        .await
        .context("WatchStats")?
        .into_inner();

    let pids = [a.bed.pid(), b.bed.pid()];
    let start = Instant::now();
    let (grow_at, end) = (
        args.phase_secs as f64,
        (args.phase_secs + args.after_secs) as f64,
    );
    let mut grew_at = None;
    let mut rows = Vec::new();
    let mut decisions = Vec::new();
    let mut vm_ids: [Option<String>; 2] = Default::default();
    checks::print_header();
    while start.elapsed().as_secs_f64() < end {
        let update: StatsUpdate = tokio::select! {
            u = stats.next() => match u {
                Some(u) => u.context("WatchStats stream")?,
                None => anyhow::bail!("tierd closed the stats stream; log {}", tierd.log_path().display()),
            },
            d = decisions_stream.next() => {
                if let Some(d) = d {
                    decisions.push(d.context("WatchDecisions stream")?);
                }
                continue;
            }
        };
        let t = start.elapsed().as_secs_f64();
        if grew_at.is_none() && t >= grow_at {
            grew_at = Some(rows.len());
        }
        let mut row = Row {
            t,
            guests: Default::default(),
        };
        for (i, g) in [&mut a, &mut b].into_iter().enumerate() {
            let r = &mut row.guests[i];
            r.truth = g.interval()?;
            r.dram_device = g
                .devices()?
                .into_iter()
                .find(|d| d.node == 0)
                .map(|d| (d.requested, d.size));
            let vm = update.vms.iter().find(|v| v.vmm_pid == pids[i]);
            if let Some(v) = vm {
                vm_ids[i] = Some(v.id.clone());
            }
            if let Some(s) = vm.and_then(|v| update.stats.iter().find(|s| s.vm_id == v.id)) {
                r.hot = hot_set(s);
                r.actuator = s.actuator_detail.clone();
            }
        }
        checks::print_row(&row);
        rows.push(row);
    }
    let alive = [a.workload_alive()?, b.workload_alive()?];
    let vm1 = (a.vmstat()?, b.vmstat()?);
    tierd.stop();
    let outcome = Outcome {
        rows,
        grew_at: grew_at.unwrap_or(0),
        decisions,
        vmstat: [(vm0.0, vm1.0), (vm0.1, vm1.1)],
        alive,
        mode: args.mode.clone(),
        vm_ids,
    };
    Ok(checks::report(&outcome))
}

/// tierd's hot set of a VM: the working set within [`HOT_HORIZON_S`]
/// over its tiers; `None` where a tier has not measured it.
fn hot_set(s: &VmStats) -> Option<(f64, f64)> {
    let mut sum = (0.0, 0.0);
    for t in &s.tiers {
        let a = t.ages.as_ref().filter(|a| a.not_measured.is_empty())?;
        let w = a
            .working_set
            .iter()
            .find(|w| (w.horizon_seconds - HOT_HORIZON_S).abs() < 1e-9)
            .filter(|w| w.not_measured.is_empty())?;
        sum = (sum.0 + w.bytes_low, sum.1 + w.bytes_high);
    }
    (!s.tiers.is_empty()).then_some(sum)
}
