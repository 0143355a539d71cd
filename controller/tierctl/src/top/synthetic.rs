//! A deterministic synthetic fleet for render tests and the render bench:
//! VMs with 2-4 tiers, hit ratios spread around the target, a controller
//! decision for every third VM.

use tier_proto::v1::{
    Backend, BalloonChange, Decision, DecisionOutcome, DecisionReason, SourceCount, StatsUpdate,
    Tier, TierKind, TierSample, Vm, VmSource, VmStats,
};

const S: u64 = 1_000_000_000;
/// Unix time of update 0 (arbitrary, fixed).
pub const T0: u64 = 1_700_000_000 * S;

/// VM `i` of a synthetic fleet.
pub fn vm(i: usize) -> Vm {
    let kinds = [
        TierKind::Dram,
        TierKind::Cxl,
        TierKind::Pmem,
        TierKind::Remote,
    ];
    let names = ["dram", "cxl", "pmem", "remote"];
    let n = 2 + i % 3;
    Vm {
        id: format!("kvm-fd:{}", 10_000 + i),
        name: format!("vm-{i:04}"),
        vmm_pid: 10_000 + i as u32,
        vcpus: 1 + (i % 8) as u32,
        tiers: (0..n)
            .map(|t| Tier {
                name: names[t].into(),
                kind: kinds[t] as i32,
                size_bytes: (4u64 << 30) >> (t % 2),
                ..Default::default()
            })
            .collect(),
        source: VmSource::KvmFd as i32,
        discovered_unix_ns: T0,
        ..Default::default()
    }
}

/// Update `seq` (1-based) for `n` VMs; the first carries the VM list.
/// Working-set ages of tier `t` of VM `i`: 1 s and 10 s measured, 60 s
/// not yet watched long enough.
fn ages(i: usize, t: usize) -> tier_proto::v1::TierAges {
    let base = ((16 + i % 32) << 20) as f64 * if t == 0 { 4.0 } else { 1.0 };
    let ws = |h: f64, k: f64, why: &str| tier_proto::v1::WorkingSet {
        horizon_seconds: h,
        bytes: base * k,
        bytes_low: base * k * 0.9,
        bytes_high: base * k * 1.1,
        not_measured: why.into(),
    };
    tier_proto::v1::TierAges {
        working_set: vec![
            ws(1.0, 1.0, ""),
            ws(10.0, 2.5, ""),
            ws(60.0, 0.0, "watched for 42 s of 60s"),
        ],
        history_seconds: 42.0,
        ..Default::default()
    }
}

pub fn update(n: usize, seq: u64) -> StatsUpdate {
    let vms: Vec<Vm> = (0..n).map(vm).collect();
    let stats = vms
        .iter()
        .enumerate()
        .map(|(i, v)| {
            // Ratios wander with time, differently per VM.
            let phase = ((i as u64 * 7 + seq) % 20) as f64 / 20.0;
            let hit = (0.5 + 0.45 * (phase * std::f64::consts::TAU).sin()).clamp(0.0, 1.0);
            // Intervals (docs/estimate.md): closed on every third VM, open above
            // (hot DRAM pages) on the next, none (an older tierd) on the
            // third.
            let (with, open) = (i % 3 != 2, i % 3 == 1);
            let est = |t: usize| if t == 0 { hit } else { 1.0 - hit } * 1e6;
            let (lo, hi) = if open {
                (hit * 0.8 / (hit * 0.8 + (1.0 - hit) * 1.3), 1.0)
            } else {
                (
                    hit * 0.8 / (hit * 0.8 + (1.0 - hit) * 1.3),
                    hit * 1.3 / (hit * 1.3 + (1.0 - hit) * 0.8),
                )
            };
            VmStats {
                vm_id: v.id.clone(),
                tiers: v
                    .tiers
                    .iter()
                    .enumerate()
                    .map(|(t, tier)| TierSample {
                        tier: tier.name.clone(),
                        sampled_pages: 4096,
                        young_pages: 100 + (i as u64 + t as u64 * 13) % 900,
                        estimated_accesses: if t == 0 { hit } else { 1.0 - hit } * 1e6,
                        coverage: 0.25,
                        resident_bytes: (1 << 30) + (i as u64 % 64) * (16 << 20),
                        balloon_target_bytes: if t == 0 { 0 } else { 256 << 20 },
                        balloon_actual_bytes: if t == 0 { 0 } else { 200 << 20 },
                        source: Backend::Hostpte as i32,
                        passes: 4,
                        sources: pmu(i, t, hit),
                        accesses_low: with.then_some(est(t) * 0.8),
                        accesses_high: with.then_some(est(t) * 1.3),
                        accesses_high_open: open && t == 0,
                        saturated_pages: if open && t == 0 { 120.0 } else { 0.0 },
                        fit_misfit: with.then_some(1.2),
                        // Ages (docs/working-set.md) on every other VM.
                        ages: i.is_multiple_of(2).then(|| ages(i, t)),
                        ..Default::default()
                    })
                    .collect(),
                dram_hit_ratio: hit,
                dram_hit_error: 0.01,
                has_accesses: i % 17 != 5,
                dram_hit_target: i.is_multiple_of(4).then_some(0.8),
                guest_reported_accesses: Vec::new(),
                not_measured: String::new(),
                dram_hit_low: with.then_some(lo),
                dram_hit_high: with.then_some(hi),
                dram_hit_high_open: open,
                ..Default::default()
            }
        })
        .collect();
    StatsUpdate {
        sequence: seq,
        timestamp_unix_ns: T0 + seq * S,
        interval_ns: S,
        vms_unchanged: seq > 1,
        vms: if seq > 1 { Vec::new() } else { vms },
        stats,
        ..Default::default()
    }
}

/// Odd VMs run the pmu source: it counts their DRAM tier (multiplexed on
/// every fourth VM) and cannot measure their cxl tier.
fn pmu(i: usize, t: usize, hit: f64) -> Vec<SourceCount> {
    if i.is_multiple_of(2) {
        return Vec::new();
    }
    let ratio = if i % 4 == 1 { 0.5 } else { 1.0 };
    let c = match t {
        1 => SourceCount {
            source: Backend::Pmu as i32,
            not_measured: "no event on GenuineIntel family 0x6 model 0x8f counts cxl memory".into(),
            ..Default::default()
        },
        _ => SourceCount {
            source: Backend::Pmu as i32,
            events: (hit * 2e7) as u64,
            raw_events: (hit * 2e7 * ratio) as u64,
            running_ratio: ratio,
            ..Default::default()
        },
    };
    vec![c]
}

/// The decision of VM `i`, if it has one.
pub fn decision(i: usize, seq: u64) -> Option<Decision> {
    i.is_multiple_of(3).then(|| Decision {
        sequence: i as u64,
        timestamp_unix_ns: T0 + seq * S,
        vm_id: vm(i).id,
        reason: DecisionReason::BelowTarget as i32,
        changes: vec![BalloonChange {
            tier: "dram".into(),
            old_target_bytes: 128 << 20,
            new_target_bytes: 64 << 20,
        }],
        observed_ratio: 0.6,
        target_ratio: 0.9,
        expected_ratio: 0.7,
        outcome: DecisionOutcome::Applied as i32,
        detail: "synthetic".into(),
        signal: 0,
    })
}

/// An app that has seen `updates` updates of `n` VMs and their decisions.
pub fn app(n: usize, updates: u64) -> super::App {
    let mut app = super::App::new();
    app.info = Some(tier_proto::v1::DaemonInfo {
        protocol_version: tier_proto::PROTOCOL_VERSION,
        daemon_version: "0.1.0".into(),
        hostname: "synthetic".into(),
        interval_ns: S,
        ..Default::default()
    });
    app.policy = Some(tier_proto::v1::Policy {
        enabled: true,
        default_target: 0.9,
        epsilon: 0.02,
        ..Default::default()
    });
    for seq in 1..=updates {
        app.on_update(update(n, seq), seq == 1);
    }
    for i in 0..n {
        if let Some(d) = decision(i, updates) {
            app.on_decision(d);
        }
    }
    app.now_ns = T0 + (updates + 3) * S;
    app
}
