//! Wire round trips of tier.v1 messages and the documentation rule for tier.proto.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use prost::Message;
use tier_proto::v1::*;
use tier_proto::{Endpoint, PROTOCOL_VERSION};

fn sample_vm() -> Vm {
    Vm {
        id: "demo:4242".into(),
        name: "demo".into(),
        vmm_pid: 4242,
        api_socket: String::new(),
        vcpus: 1,
        source: VmSource::Demo as i32,
        discovered_unix_ns: 1_700_000_000_000_000_000,
        tiers: vec![
            Tier {
                name: "dram".into(),
                kind: TierKind::Dram as i32,
                host_numa_nodes: vec![0],
                ranges: vec![GpaRange {
                    gpa_start: 0,
                    length: 16 << 20,
                    hva_start: 0x7f00_0000_0000,
                }],
                size_bytes: 16 << 20,
                derivation: "demo layout".into(),
                hotplug: Some(TierHotplug {
                    boot_bytes: 8 << 20,
                    region_bytes: 8 << 20,
                    block_bytes: 2 << 20,
                    region_attributed: true,
                }),
            },
            Tier {
                name: "slow".into(),
                kind: TierKind::Cxl as i32,
                host_numa_nodes: vec![1, 3],
                ranges: vec![GpaRange {
                    gpa_start: 0x1000_0000,
                    length: 16 << 20,
                    hva_start: u64::MAX,
                }],
                size_bytes: 16 << 20,
                derivation: "config override".into(),
                hotplug: None,
            },
        ],
    }
}

fn roundtrip<M: Message + Default + PartialEq + std::fmt::Debug>(m: &M) -> M {
    let bytes = m.encode_to_vec();
    let back = M::decode(bytes.as_slice()).expect("decodes");
    assert_eq!(&back, m, "round trip changed the message");
    back
}

#[test]
fn vm_and_tiers_roundtrip() {
    let vm = roundtrip(&sample_vm());
    assert_eq!(vm.tiers[1].kind(), TierKind::Cxl);
    assert_eq!(vm.tiers[1].ranges[0].hva_start, u64::MAX);
    assert_eq!(vm.source(), VmSource::Demo);
}

#[test]
fn stats_update_roundtrip_with_optional_and_departures() {
    let update = StatsUpdate {
        sequence: u64::MAX - 1,
        timestamp_unix_ns: 1,
        interval_ns: 1_000_000_000,
        vms: vec![sample_vm()],
        stats: vec![VmStats {
            vm_id: "demo:4242".into(),
            tiers: vec![TierSample {
                tier: "dram".into(),
                sampled_pages: 4096,
                young_pages: 50,
                estimated_accessed_bytes: 50 * 4096,
                estimated_accesses: 123.5,
                coverage: 1.0,
                resident_bytes: 3 << 20,
                balloon_target_bytes: 0,
                balloon_actual_bytes: 0,
                source: Backend::Hostpte as i32,
                passes: 4,
                sources: vec![
                    SourceCount {
                        source: Backend::Pmu as i32,
                        events: 20_014,
                        samples: 0,
                        not_measured: String::new(),
                        running_ratio: 0.5,
                        raw_events: 10_007,
                        attribution: "vCPU 1: taken as on node 0".into(),
                        seconds: 0.5,
                    },
                    SourceCount {
                        source: Backend::Pmu as i32,
                        not_measured: "no event on X counts cxl memory".into(),
                        ..Default::default()
                    },
                ],
                saturation: Some(0.42),
                pass_seconds: vec![0.025, 0.1, 0.375],
                pass_young_pages: vec![40, 120, 300],
                accesses_low: Some(100.0),
                accesses_high: None,
                accesses_high_open: true,
                saturated_pages: 12.5,
                fit_misfit: Some(1.3),
                ages: Some(TierAges {
                    working_set: vec![
                        WorkingSet {
                            horizon_seconds: 1.0,
                            bytes: 40.0 * 4096.0,
                            bytes_low: 30.0 * 4096.0,
                            bytes_high: 52.0 * 4096.0,
                            not_measured: String::new(),
                        },
                        WorkingSet {
                            horizon_seconds: 600.0,
                            not_measured: "watched for 8 s of 600".into(),
                            ..Default::default()
                        },
                    ],
                    cold_bytes: None,
                    promoted_bytes_per_s: Some(4096.0),
                    promoted_bytes_per_s_low: Some(0.0),
                    promoted_bytes_per_s_high: Some(3.0 * 4096.0),
                    history_seconds: 8.0,
                    ..Default::default()
                }),
                fit_age: 3,
                fit_deferred: true,
                hotplug_requested_bytes: Some(6 << 20),
                hotplug_plugged_bytes: Some(4 << 20),
                resident_not_measured: "/proc/1/smaps unreadable".into(),
            }],
            dram_hit_ratio: 0.75,
            dram_hit_error: 0.01,
            has_accesses: true,
            dram_hit_target: Some(0.9),
            guest_reported_accesses: vec![192, 96],
            not_measured: "ept-tracepoint: guest memory is hugetlbfs-backed".into(),
            dram_hit_low: Some(0.4),
            dram_hit_high: Some(1.0),
            dram_hit_low_open: false,
            dram_hit_high_open: true,
            counted_dram_hit_ratio: Some(0.71),
            sampler_budget: Some(SamplerBudget {
                coverage: 1.0 / 64.0,
                stride: 64,
                passes: 3,
                slots: 5,
                passes_allowed: 3.5,
                budget_pct: 0.25,
                spent_pct: 0.2,
                limited: "stride 64 (configured 1) to fit the sampler CPU budget".into(),
            }),
            actuator: Actuator::ResizeZone as i32,
            actuator_detail: "zone resize (vm.resize-zone)".into(),
            dram_hit_not_measured: "hostpte: DRAM-hit interval 0-100 %".into(),
            hot_set_dram: Some(HotSetShare {
                horizon_seconds: 1.0,
                share: 0.25,
                share_low: 0.2,
                share_high: 0.3,
                hot_bytes: 4096.0 * 40.0,
                dram_bytes: 4096.0 * 10.0,
                tier_bytes: vec![4096.0 * 10.0, 4096.0 * 30.0],
                from_pass: true,
            }),
        }],
        departed_vm_ids: vec!["ch:1".into()],
        vms_unchanged: false,
        health: vec![SamplerHealth {
            backend: Backend::Hostpte as i32,
            active: true,
            error: String::new(),
            events: 10,
            lost: 0,
            scan_cost_ns: 5_000,
            unattributed_pages: 3,
            foreign_young_pages: 2,
            unmapped_pages: 1,
            cpu_budget_pct: 1.0,
            cpu_spent_pct: 0.93,
        }],
    };
    let back = roundtrip(&update);
    assert_eq!(back.stats[0].dram_hit_target, Some(0.9));
    // An unset optional stays unset (distinct from 0.0).
    let mut none = back.stats[0].clone();
    none.dram_hit_target = None;
    assert_eq!(roundtrip(&none).dram_hit_target, None);
}

#[test]
fn policy_and_decision_roundtrip() {
    let policy = Policy {
        enabled: true,
        dry_run: true,
        default_target: 0.9,
        epsilon: 0.02,
        host_dram_budget_bytes: 8 << 30,
        max_step_bytes: 64 << 20,
        cooldown_intervals: 3,
        idle_threshold: 0.3,
        vms: vec![VmPolicy {
            vm: "demo".into(),
            target: Some(0.95),
            limits: vec![TierLimits {
                tier: "dram".into(),
                floor_bytes: 1 << 20,
                ceiling_bytes: 0,
            }],
            excluded: false,
            mode: Some(PolicyMode::WorkingSet as i32),
        }],
        mode: PolicyMode::Ratio as i32,
        hot_horizon_seconds: 10.0,
        promotion_slo: 0.002,
        reclaim: ReclaimMode::OnDemand as i32,
    };
    roundtrip(&SetPolicyRequest {
        policy: Some(policy),
    });
    let d = roundtrip(&Decision {
        sequence: 7,
        timestamp_unix_ns: 9,
        vm_id: "demo:1".into(),
        reason: DecisionReason::BelowTarget as i32,
        changes: vec![BalloonChange {
            tier: "dram".into(),
            old_target_bytes: 64 << 20,
            new_target_bytes: 0,
        }],
        observed_ratio: 0.5,
        target_ratio: 0.9,
        expected_ratio: 0.7,
        outcome: DecisionOutcome::DryRun as i32,
        detail: "deficit 0.4".into(),
        signal: SteeringSignal::HotSet as i32,
    });
    assert_eq!(d.signal(), SteeringSignal::HotSet);
    assert_eq!(d.reason(), DecisionReason::BelowTarget);
    assert_eq!(d.outcome(), DecisionOutcome::DryRun);
}

#[test]
fn unknown_enum_values_survive_and_read_as_default() {
    // A newer daemon may send a kind this client does not know.
    let t = Tier {
        kind: 99,
        ..Default::default()
    };
    let back = roundtrip(&t);
    assert_eq!(back.kind, 99);
    assert_eq!(back.kind(), TierKind::Unknown);
}

#[test]
fn daemon_info_carries_version_and_capabilities() {
    let info = roundtrip(&DaemonInfo {
        protocol_version: PROTOCOL_VERSION,
        daemon_version: "0.1.0".into(),
        hostname: "h".into(),
        kernel: "6.18".into(),
        capabilities: vec![Capability {
            name: "ept-fexit".into(),
            backend: Backend::EptFexit as i32,
            available: false,
            reason: "fexit: EPERM at program load".into(),
            selected: false,
        }],
        interval_ns: 1_000_000_000,
        controller_enabled: true,
    });
    assert_eq!(info.protocol_version, 1);
    assert_eq!(info.capabilities[0].backend(), Backend::EptFexit);
}

#[test]
fn short_names_roundtrip() {
    for k in [
        TierKind::Unknown,
        TierKind::Dram,
        TierKind::Pmem,
        TierKind::Cxl,
        TierKind::Remote,
    ] {
        assert_eq!(TierKind::from_short_name(k.short_name()), Some(k));
    }
    assert_eq!(TierKind::from_short_name("hbm"), None);
    assert!(TierKind::Dram.is_fast() && !TierKind::Cxl.is_fast());
    assert_eq!(Backend::EptTracepoint.short_name(), "ept-tracepoint");
}

#[test]
fn endpoint_parsing() {
    assert_eq!(
        Endpoint::parse("unix:/run/tierd/tierd.sock").unwrap(),
        Endpoint::Unix("/run/tierd/tierd.sock".into())
    );
    assert_eq!(
        Endpoint::parse("/tmp/x.sock").unwrap(),
        Endpoint::Unix("/tmp/x.sock".into())
    );
    assert_eq!(
        Endpoint::parse("http://127.0.0.1:7070").unwrap(),
        Endpoint::Tcp("http://127.0.0.1:7070".into())
    );
    let err = Endpoint::parse("tierd.sock").unwrap_err().to_string();
    assert!(err.contains("unix:/path"), "{err}");
}

#[tokio::test]
async fn connect_to_missing_socket_says_not_running() {
    let dir = tempfile::tempdir().unwrap();
    let ep = Endpoint::Unix(dir.path().join("nope.sock"));
    let err = tier_proto::connect(&ep).await.unwrap_err().to_string();
    assert!(err.contains("tierd is not running"), "{err}");
}

/// "Document every field": every message, field, enum value and RPC in
/// tier.proto carries its own comment.
#[test]
fn every_field_of_tier_proto_is_documented() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"));
    let fds = protox::Compiler::new([dir])
        .unwrap()
        .include_source_info(true)
        .open_file("tier.proto")
        .unwrap()
        .file_descriptor_set();
    let file = fds.file.iter().find(|f| f.name() == "tier.proto").unwrap();
    let info = file.source_code_info.as_ref().unwrap();
    let documented = |path: &[i32]| {
        info.location.iter().any(|l| {
            l.path == path
                && (l
                    .leading_comments
                    .as_deref()
                    .is_some_and(|c| !c.trim().is_empty())
                    || l.trailing_comments
                        .as_deref()
                        .is_some_and(|c| !c.trim().is_empty()))
        })
    };
    let mut missing = Vec::new();
    for (mi, m) in file.message_type.iter().enumerate() {
        for (fi, f) in m.field.iter().enumerate() {
            let path = [4, mi as i32, 2, fi as i32];
            if !documented(&path) {
                missing.push(format!("{}.{}", m.name(), f.name()));
            }
        }
    }
    for (ei, e) in file.enum_type.iter().enumerate() {
        if !documented(&[5, ei as i32]) {
            missing.push(format!("enum {}", e.name()));
        }
        for (vi, v) in e.value.iter().enumerate() {
            if !documented(&[5, ei as i32, 2, vi as i32]) {
                missing.push(format!("{}::{}", e.name(), v.name()));
            }
        }
    }
    for (si, s) in file.service.iter().enumerate() {
        for (mi, m) in s.method.iter().enumerate() {
            if !documented(&[6, si as i32, 2, mi as i32]) {
                missing.push(format!("rpc {}", m.name()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "undocumented in tier.proto: {missing:?}"
    );
    assert_eq!(file.package(), "tier.v1");
}
