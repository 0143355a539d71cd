//! What tierd's streams showed, recorded by a watcher that reconnects
//! whenever tierd goes away (as any client of a restarting daemon must).
//! Within one connection sequence numbers must only grow and every value
//! must be sane; gaps are allowed (a slow reader loses updates).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tier_proto::v1::{Decision, StatsUpdate, WatchDecisionsRequest, WatchStatsRequest};
use tier_proto::{Endpoint, connect};
use tokio_stream::StreamExt;

/// One update as the soak needs it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Instant,
    /// VMM PIDs of the VMs the update has stats for, with a DRAM tier.
    pub vms: Vec<u32>,
}

#[derive(Debug, Default)]
pub struct Log {
    pub seen: Vec<Seen>,
    pub decisions: Vec<(Instant, Decision)>,
    /// Data a watcher must never see (sequence going back, a ratio outside
    /// [0, 1], an interval that does not hold its point).
    pub wrong: Vec<String>,
    pub connections: u64,
    /// tierd's VM id for each VMM PID it has reported.
    pub ids: std::collections::BTreeMap<u32, String>,
}

pub type Shared = Arc<Mutex<Log>>;

/// Watches stats and decisions until the runtime ends.
pub fn spawn(socket: PathBuf) -> Shared {
    let log: Shared = Arc::default();
    let l = log.clone();
    tokio::spawn(async move {
        loop {
            let _ = watch_once(&socket, &l).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    log
}

async fn watch_once(socket: &std::path::Path, log: &Shared) -> anyhow::Result<()> {
    let endpoint = Endpoint::Unix(socket.to_path_buf());
    let mut client = connect(&endpoint).await?;
    let mut stats = client
        .watch_stats(WatchStatsRequest::default())
        .await?
        .into_inner();
    let mut decisions = client
        .watch_decisions(WatchDecisionsRequest::default())
        .await?
        .into_inner();
    lock(log).connections += 1;
    let mut last_seq = None;
    let mut pids = std::collections::BTreeMap::new();
    loop {
        tokio::select! {
            u = stats.next() => {
                let Some(u) = u else { return Ok(()) };
                let u = u?;
                record(log, &mut last_seq, &mut pids, &u);
            }
            d = decisions.next() => {
                let Some(d) = d else { return Ok(()) };
                lock(log).decisions.push((Instant::now(), d?));
            }
        }
    }
}

fn record(
    log: &Shared,
    last_seq: &mut Option<u64>,
    pids: &mut std::collections::BTreeMap<String, u32>,
    u: &StatsUpdate,
) {
    let mut l = lock(log);
    if let Some(prev) = *last_seq
        && u.sequence <= prev
    {
        l.wrong.push(format!(
            "sequence {} after {prev} on one stream",
            u.sequence
        ));
    }
    *last_seq = Some(u.sequence);
    for v in &u.vms {
        pids.insert(v.id.clone(), v.vmm_pid);
        l.ids.insert(v.vmm_pid, v.id.clone());
    }
    for id in &u.departed_vm_ids {
        pids.remove(id);
    }
    let mut vms = Vec::new();
    for s in &u.stats {
        if let Some(why) = insane(s) {
            l.wrong
                .push(format!("seq {} vm {}: {why}", u.sequence, s.vm_id));
        }
        let has_dram = s.tiers.iter().any(|t| t.tier == "dram");
        if has_dram && let Some(pid) = pids.get(&s.vm_id) {
            vms.push(*pid);
        }
    }
    l.seen.push(Seen {
        at: Instant::now(),
        vms,
    });
}

/// Why a VM's numbers cannot be right, if they cannot.
pub fn insane(s: &tier_proto::v1::VmStats) -> Option<String> {
    let unit = |v: f64| v.is_finite() && (0.0..=1.0).contains(&v);
    if s.has_accesses && !unit(s.dram_hit_ratio) {
        return Some(format!("dram_hit_ratio {}", s.dram_hit_ratio));
    }
    if let (Some(lo), Some(hi)) = (s.dram_hit_low, s.dram_hit_high)
        && (!unit(lo) || !unit(hi) || lo > hi + 1e-9)
    {
        return Some(format!("interval {lo}-{hi}"));
    }
    None
}

pub fn lock(l: &Shared) -> std::sync::MutexGuard<'_, Log> {
    l.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
