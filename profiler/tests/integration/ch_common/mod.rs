//! Shared by the tests of the in-process controller against a stand-in
//! cloud-hypervisor (ch_control, ch_resize_zone): the stats update that
//! makes the policy give DRAM away, and the controller whose decisions are
//! collected.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tier_profiler::ch::Fleet;
use tier_profiler::control::InProcess;
use tier_proto::v1::{Decision, Policy, StatsUpdate, TierSample, VmStats};

const M: u64 = 1 << 20;

/// An interval in which every VM hits DRAM 99 % of the time and touches
/// 16 MiB of it: far above target, mostly idle, so the policy gives DRAM
/// away.
pub fn update(ids: &[&str], seq: u64) -> StatsUpdate {
    let sample = |tier: &str, acc: f64| TierSample {
        tier: tier.into(),
        sampled_pages: 65536,
        young_pages: 4096,
        estimated_accessed_bytes: 16 * M,
        estimated_accesses: acc,
        coverage: 1.0,
        passes: 4,
        ..Default::default()
    };
    StatsUpdate {
        sequence: seq,
        timestamp_unix_ns: seq,
        stats: ids
            .iter()
            .map(|id| VmStats {
                vm_id: id.to_string(),
                tiers: vec![sample("dram", 990.0), sample("slow", 10.0)],
                has_accesses: true,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// Decisions the controller's actuation reported.
pub type Sunk = Arc<Mutex<Vec<Decision>>>;

/// The controller under `policy`, actuating through `fleet`.
pub fn controller(fleet: &Fleet, policy: &Policy) -> (InProcess, Sunk) {
    let sunk: Sunk = Arc::new(Mutex::new(Vec::new()));
    let s = sunk.clone();
    let c = InProcess::new(policy).unwrap().with_actuation(
        fleet.clone(),
        Arc::new(move |d| s.lock().unwrap().push(d)),
        Duration::from_secs(10),
    );
    (c, sunk)
}

/// The decisions reported once there are `n` of them (or after 5 s).
pub async fn wait_sunk(sunk: &Sunk, n: usize) -> Vec<Decision> {
    // Fewer after 5 s are returned as they are: the caller's asserts say
    // what is missing.
    let _ = tier_test_support::try_wait_until_async("decisions", Duration::from_secs(5), || {
        let enough = sunk.lock().unwrap().len() >= n;
        async move { enough.then_some(()) }
    })
    .await;
    sunk.lock().unwrap().clone()
}
