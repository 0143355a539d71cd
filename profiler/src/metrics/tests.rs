//! Series tierd exports for one update: values, and absence where there is no value.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use tier_proto::v1::{SourceCount, Tier, TierSample, Vm, VmStats};

fn update(sources: [Vec<SourceCount>; 2]) -> StatsUpdate {
    let tier = |name: &str, kind: TierKind| Tier {
        name: name.into(),
        kind: kind as i32,
        ..Default::default()
    };
    let [a, b] = sources;
    StatsUpdate {
        interval_ns: 500_000_000,
        vms: vec![Vm {
            id: "v".into(),
            name: "v".into(),
            tiers: vec![tier("dram", TierKind::Dram), tier("slow", TierKind::Cxl)],
            ..Default::default()
        }],
        stats: vec![VmStats {
            vm_id: "v".into(),
            tiers: vec![
                TierSample {
                    tier: "dram".into(),
                    sources: a,
                    ..Default::default()
                },
                TierSample {
                    tier: "slow".into(),
                    sources: b,
                    ..Default::default()
                },
            ],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn value(body: &str, key: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| v.trim().parse().unwrap())
}

/// A tier the pmu source cannot measure exports measured 0 and no
/// rate, never a rate of 0; a measured one exports its rate and
/// running ratio; without the source, no pmu series at all.
#[test]
fn pmu_series_say_not_measured_instead_of_zero() {
    let counted = SourceCount {
        source: Backend::Pmu as i32,
        events: 1_000,
        raw_events: 500,
        running_ratio: 0.5,
        ..Default::default()
    };
    let not = SourceCount {
        source: Backend::Pmu as i32,
        not_measured: "no event on X counts cxl memory".into(),
        ..Default::default()
    };
    let mut m = Metrics::new();
    m.update(&update([vec![counted], vec![not]]));
    let body = m.encode();
    let dram = "{vm=\"v\",tier=\"dram\",kind=\"dram\"} ";
    let slow = "{vm=\"v\",tier=\"slow\",kind=\"cxl\"} ";
    assert_eq!(
        value(&body, &format!("tierd_tier_pmu_measured{dram}")),
        Some(1.0)
    );
    assert_eq!(
        value(&body, &format!("tierd_tier_pmu_events_per_second{dram}")),
        Some(2_000.0)
    );
    assert_eq!(
        value(&body, &format!("tierd_tier_pmu_running_ratio{dram}")),
        Some(0.5)
    );
    assert_eq!(
        value(&body, &format!("tierd_tier_pmu_measured{slow}")),
        Some(0.0)
    );
    assert_eq!(
        value(&body, &format!("tierd_tier_pmu_events_per_second{slow}")),
        None
    );
    // The source stops: its series go.
    m.update(&update([vec![], vec![]]));
    let body = m.encode();
    assert!(!body.contains("tierd_tier_pmu_measured{"), "{body}");
    assert!(
        !body.contains("tierd_tier_pmu_events_per_second{"),
        "{body}"
    );
}

/// A VM the sampler cannot read exports measured 0 and no hit ratio,
/// not the ratio of an earlier interval.
#[test]
fn an_unmeasured_vm_says_so_and_keeps_no_stale_ratio() {
    let vm = "{vm=\"v\",name=\"v\"} ";
    let mut m = Metrics::new();
    let mut u = update([vec![], vec![]]);
    u.stats[0].has_accesses = true;
    u.stats[0].dram_hit_ratio = 0.7;
    m.update(&u);
    let body = m.encode();
    assert_eq!(value(&body, &format!("tierd_vm_measured{vm}")), Some(1.0));
    assert_eq!(
        value(&body, &format!("tierd_vm_dram_hit_ratio{vm}")),
        Some(0.7)
    );
    u.stats[0].not_measured = "ept-tracepoint: guest memory is hugetlbfs-backed".into();
    m.update(&u);
    let body = m.encode();
    assert_eq!(value(&body, &format!("tierd_vm_measured{vm}")), Some(0.0));
    assert_eq!(value(&body, &format!("tierd_vm_dram_hit_ratio{vm}")), None);
}

/// An update with every optional series present: PMU counts, intervals,
/// saturation, sampler health.
fn ages() -> tier_proto::v1::TierAges {
    use tier_proto::v1::WorkingSet;
    tier_proto::v1::TierAges {
        working_set: vec![
            WorkingSet {
                horizon_seconds: 1.0,
                bytes: 4096.0,
                bytes_low: 2048.0,
                bytes_high: 8192.0,
                not_measured: String::new(),
            },
            WorkingSet {
                horizon_seconds: 600.0,
                bytes: 0.0,
                bytes_low: 0.0,
                bytes_high: 0.0,
                not_measured: "watched for 3 s of 600s".into(),
            },
        ],
        cold_bytes: Some(1e6),
        cold_bytes_low: Some(0.9e6),
        cold_bytes_high: Some(1.1e6),
        promoted_bytes_per_s: Some(100.0),
        promoted_bytes_per_s_low: Some(50.0),
        promoted_bytes_per_s_high: Some(150.0),
        history_seconds: 3.0,
        not_measured: String::new(),
    }
}

/// A measured horizon has its three series; one not measured has none;
/// the ages leave with the tier.
#[test]
fn working_set_series_per_horizon() {
    let mut m = Metrics::new();
    let mut u = everything();
    m.update(&u);
    let body = m.encode();
    let tier = &u.stats[0].tiers[0].tier;
    let key = |name: &str, h: &str| {
        format!("{name}{{vm=\"{}\",tier=\"{tier}\",kind=", u.stats[0].vm_id)
            + &format!("\"dram\",horizon=\"{h}\"}}")
    };
    let line = |k: &str| body.lines().find(|l| l.starts_with(k)).map(str::to_string);
    assert!(
        line(&key("tierd_tier_working_set_bytes_low", "1s"))
            .is_some_and(|l| l.ends_with(" 2048.0")),
        "{body}"
    );
    assert!(
        line(&key("tierd_tier_working_set_bytes", "600s")).is_none(),
        "{body}"
    );
    assert!(
        body.contains("tierd_tier_promoted_bytes_per_second_high{"),
        "{body}"
    );
    assert!(body.contains("tierd_tier_ages_history_seconds{"), "{body}");
    for t in &mut u.stats[0].tiers {
        t.ages = None;
    }
    m.update(&u);
    let body = m.encode();
    assert!(!body.contains("tierd_tier_working_set_bytes{"), "{body}");
    assert!(!body.contains("tierd_tier_cold_bytes{"), "{body}");
}

fn everything() -> StatsUpdate {
    let pmu = SourceCount {
        source: Backend::Pmu as i32,
        events: 10,
        running_ratio: 1.0,
        ..Default::default()
    };
    let mut u = update([vec![pmu.clone()], vec![pmu]]);
    for t in &mut u.stats[0].tiers {
        t.accesses_low = Some(1.0);
        t.accesses_high = Some(2.0);
        t.saturation = Some(0.5);
        t.fit_misfit = Some(0.1);
        t.ages = Some(ages());
    }
    u.vms[0].tiers[0].hotplug = Some(tier_proto::v1::TierHotplug {
        boot_bytes: 64 << 20,
        region_bytes: 256 << 20,
        block_bytes: 2 << 20,
        region_attributed: true,
    });
    u.stats[0].tiers[0].hotplug_requested_bytes = Some(128 << 20);
    u.stats[0].tiers[0].hotplug_plugged_bytes = Some(126 << 20);
    let st = &mut u.stats[0];
    st.actuator = tier_proto::v1::Actuator::ResizeZone as i32;
    st.has_accesses = true;
    st.dram_hit_low = Some(0.2);
    st.dram_hit_high = Some(0.6);
    st.counted_dram_hit_ratio = Some(0.4);
    st.hot_set_dram = Some(tier_proto::v1::HotSetShare {
        horizon_seconds: 1.0,
        share: 0.25,
        share_low: 0.24,
        share_high: 0.26,
        hot_bytes: 4e6,
        dram_bytes: 1e6,
        ..Default::default()
    });
    st.sampler_budget = Some(tier_proto::v1::SamplerBudget {
        coverage: 0.25,
        stride: 4,
        passes: 3,
        slots: 5,
        passes_allowed: 3.2,
        budget_pct: 0.5,
        spent_pct: 0.4,
        limited: "stride 4 (configured 1) to fit the sampler CPU budget".into(),
    });
    u.health = vec![tier_proto::v1::SamplerHealth {
        backend: Backend::Hostpte as i32,
        active: true,
        cpu_budget_pct: 1.0,
        cpu_spent_pct: 0.8,
        ..Default::default()
    }];
    u
}

/// A virtio-mem tier's region, requested and plugged sizes; the actuator
/// as one series at 1; plugged absent when not reported; nothing for a
/// tier without a virtio-mem part (docs/virtio-mem.md).
#[test]
fn hotplug_and_actuator_series() {
    let mut m = Metrics::new();
    let mut u = everything();
    m.update(&u);
    let body = m.encode();
    let dram = "{vm=\"v\",tier=\"dram\",kind=\"dram\"} ";
    let slow = "{vm=\"v\",tier=\"slow\",kind=\"cxl\"} ";
    let v = |b: &str, k: &str| value(b, k);
    assert_eq!(
        v(&body, &format!("tierd_tier_hotplug_region_bytes{dram}")),
        Some(268435456.0)
    );
    assert_eq!(
        v(&body, &format!("tierd_tier_hotplug_requested_bytes{dram}")),
        Some(134217728.0)
    );
    assert_eq!(
        v(&body, &format!("tierd_tier_hotplug_plugged_bytes{dram}")),
        Some(132120576.0)
    );
    assert_eq!(
        v(&body, &format!("tierd_tier_hotplug_attributed{dram}")),
        Some(1.0)
    );
    assert_eq!(
        v(&body, &format!("tierd_tier_hotplug_region_bytes{slow}")),
        None
    );
    assert_eq!(
        v(
            &body,
            "tierd_vm_actuator_info{vm=\"v\",name=\"v\",actuator=\"resize_zone\"} "
        ),
        Some(1.0)
    );
    // Upstream: plugged unknown, so absent; another actuator replaces it.
    u.stats[0].tiers[0].hotplug_plugged_bytes = None;
    u.stats[0].actuator = tier_proto::v1::Actuator::None as i32;
    u.vms_unchanged = true;
    m.update(&u);
    let body = m.encode();
    assert_eq!(
        v(&body, &format!("tierd_tier_hotplug_plugged_bytes{dram}")),
        None
    );
    assert!(!body.contains("actuator=\"resize_zone\""), "{body}");
    assert_eq!(
        v(
            &body,
            "tierd_vm_actuator_info{vm=\"v\",name=\"v\",actuator=\"none\"} "
        ),
        Some(1.0)
    );
}

/// The budget's choice and spend per VM and per backend, in cores and
/// CPU seconds; a VM without a budget report has no budget series.
#[test]
fn sampler_budget_series() {
    let mut m = Metrics::new();
    let u = everything();
    m.update(&u);
    let body = m.encode();
    let vm = "{vm=\"v\",name=\"v\"}";
    assert_eq!(
        value(&body, &format!("tierd_vm_sampler_coverage_ratio{vm}")),
        Some(0.25)
    );
    assert_eq!(
        value(&body, &format!("tierd_vm_sampler_passes{vm}")),
        Some(3.0)
    );
    assert_eq!(
        value(&body, &format!("tierd_vm_sampler_passes_allowed{vm}")),
        Some(3.2)
    );
    assert_eq!(
        value(&body, &format!("tierd_vm_sampler_cpu_budget_ratio{vm}")),
        Some(0.005)
    );
    assert_eq!(
        value(&body, &format!("tierd_vm_sampler_limited{vm}")),
        Some(1.0)
    );
    // 0.4 % of a core over a 0.5 s interval: 2 ms.
    let spent = value(&body, &format!("tierd_vm_sampler_cpu_seconds_total{vm}")).unwrap();
    assert!((spent - 0.002).abs() < 1e-12, "{spent}");
    let b = "{backend=\"hostpte\"}";
    assert_eq!(
        value(&body, &format!("tierd_sampler_cpu_budget_ratio{b}")),
        Some(0.01)
    );
    let host = value(&body, &format!("tierd_sampler_cpu_seconds_total{b}")).unwrap();
    assert!((host - 0.004).abs() < 1e-12, "{host}");
    let mut none = u.clone();
    none.vms_unchanged = true;
    none.stats[0].sampler_budget = None;
    m.update(&none);
    let body = m.encode();
    assert_eq!(value(&body, &format!("tierd_vm_sampler_passes{vm}")), None);
}

/// Names a query can use for every family tierd can export (a counter's
/// samples are `name_total`).
fn exported() -> std::collections::BTreeSet<String> {
    let mut m = Metrics::new();
    m.update(&everything());
    let c =
        tier_profiler::control::InProcess::new(&tier_controller::policy::default_policy()).unwrap();
    m.controller(Some(&c));
    m.decision(&tier_proto::v1::Decision::default());
    m.encode()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| match l.split_once(' ') {
            Some((name, "counter")) => format!("{name}_total"),
            Some((name, _)) => name.to_string(),
            None => l.to_string(),
        })
        .collect()
}

/// Identifiers in PromQL text that name series: tierd's and the process
/// series, and recording rules (`level:metric:ops`). Strings and range
/// selectors are cut first, so label values and `$__rate_interval` never
/// count.
fn series_names(text: &str) -> Vec<String> {
    let mut plain = String::new();
    let mut skip: Option<char> = None;
    for ch in text.chars() {
        match (skip, ch) {
            (None, '"') => skip = Some('"'),
            (None, '[') => skip = Some(']'),
            (Some(end), c) if c == end => skip = None,
            (None, c) => plain.push(c),
            _ => {}
        }
    }
    plain
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| {
            w.starts_with("tierd_")
                || w.starts_with("process_")
                || (w.split(':').count() == 3 && w.split(':').all(|p| !p.is_empty()))
        })
        .map(str::to_string)
        .collect()
}

fn repo_file(rel: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Recording rules defined in the rules file.
fn recorded(rules: &str) -> std::collections::BTreeSet<String> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- record:"))
        .map(|n| n.trim().to_string())
        .collect()
}

/// The `expr` of every rule: inline, or a `|` block of deeper lines.
fn rule_exprs(rules: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = rules.lines().peekable();
    while let Some(l) = lines.next() {
        let Some(rest) = l.trim_start().strip_prefix("expr:") else {
            continue;
        };
        if rest.trim() != "|" {
            out.push(rest.trim().to_string());
            continue;
        }
        let indent = l.len() - l.trim_start().len();
        let mut block = String::new();
        while let Some(next) = lines.peek() {
            if !next.trim().is_empty() && next.len() - next.trim_start().len() <= indent {
                break;
            }
            block.push_str(next);
            block.push('\n');
            lines.next();
        }
        out.push(block);
    }
    out
}

/// Every `expr` and query string in the dashboard.
fn dashboard_queries(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(o) => {
            for (k, v) in o {
                match (k.as_str(), v) {
                    ("expr" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    ("query", serde_json::Value::String(s)) if s.contains('(') => {
                        out.push(s.clone())
                    }
                    _ => dashboard_queries(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| dashboard_queries(v, out)),
        _ => {}
    }
}

#[test]
fn rules_and_dashboard_name_only_series_tierd_exports() {
    let exported = exported();
    let rules = repo_file("deploy/prometheus/tierd.rules.yml");
    let recorded = recorded(&rules);
    assert!(recorded.len() >= 4, "{recorded:?}");
    let known = |n: &str| exported.contains(n) || recorded.contains(n);
    let exprs = rule_exprs(&rules);
    assert_eq!(exprs.len(), rules.matches("expr:").count());
    for e in &exprs {
        let names = series_names(e);
        assert!(!names.is_empty(), "rule names no tierd series: {e}");
        for n in names {
            assert!(
                known(&n),
                "rule {e:?} names {n}, which tierd does not export: {exported:?}"
            );
        }
    }
    let dash: serde_json::Value =
        serde_json::from_str(&repo_file("deploy/grafana/tierd.json")).unwrap();
    let mut queries = Vec::new();
    dashboard_queries(&dash, &mut queries);
    assert!(queries.len() >= 20, "{queries:?}");
    for q in &queries {
        let names = series_names(q);
        assert!(
            !names.is_empty(),
            "dashboard query names no tierd series: {q}"
        );
        for n in names {
            assert!(
                known(&n),
                "dashboard query {q:?} names {n}, which tierd does not export"
            );
        }
    }
    // A misspelled name is caught (the check is not vacuous).
    assert!(!known("tierd_vm_dram_hit_ration"));
}

#[test]
fn every_family_is_in_the_metric_table_of_the_docs() {
    let doc = repo_file("../docs/config.md");
    for n in exported() {
        assert!(
            doc.contains(&format!("`{n}`")),
            "docs/config.md does not list `{n}`"
        );
    }
}

/// The controller's target band per VM; a VM without a balloon to drive
/// is not drivable and not "uncooperative"; nothing when the policy is off.
#[test]
fn controller_series_follow_the_policy_in_force() {
    let vm = "{vm=\"v\",name=\"v\"} ";
    let mut policy = tier_controller::policy::default_policy();
    let mut c = tier_profiler::control::InProcess::new(&policy).unwrap();
    let mut m = Metrics::new();
    let mut u = update([vec![], vec![]]);
    u.stats[0].has_accesses = true;
    m.update(&u);
    for d in c.step(&u.vms, &u) {
        m.decision(&d);
    }
    m.controller(Some(&c));
    let body = m.encode();
    let v = |name: &str| value(&body, &format!("tierd_{name}{vm}"));
    let target = v("vm_dram_hit_target_ratio").unwrap();
    let (low, high) = (
        v("vm_dram_hit_target_low_ratio").unwrap(),
        v("vm_dram_hit_target_high_ratio").unwrap(),
    );
    assert_eq!(target, policy.default_target);
    assert!(low < target && target < high, "{low} {target} {high}");
    assert!((high - low) <= 2.0 * policy.epsilon + 1e-12);
    assert_eq!(v("vm_balloon_drivable"), Some(0.0), "{body}");
    assert_eq!(v("vm_balloon_uncooperative"), Some(0.0), "{body}");
    assert!(
        body.contains(
            "tierd_controller_decisions_total{reason=\"uncooperative\",outcome=\"skipped\"} 1"
        ),
        "{body}"
    );
    policy.enabled = false;
    c.set_policy(&policy).unwrap();
    m.controller(Some(&c));
    let body = m.encode();
    for name in [
        "vm_dram_hit_target_ratio",
        "vm_balloon_drivable",
        "vm_balloon_uncooperative",
    ] {
        assert!(!body.contains(&format!("tierd_{name}{{")), "{name}: {body}");
    }
}

/// A 0-100 % interval exports no ratio, no bounds and no sampling error,
/// `dram_hit_measured 0` instead; the hot-set share stands beside it. An
/// unknown resident size has no series, not 0.
#[test]
fn a_vacuous_ratio_is_not_exported_and_the_hot_set_is() {
    let mut u = update([vec![], vec![]]);
    let st = &mut u.stats[0];
    st.has_accesses = true;
    st.dram_hit_ratio = 0.34;
    st.dram_hit_error = 0.0;
    (st.dram_hit_low, st.dram_hit_high) = (Some(0.0), Some(1.0));
    (st.dram_hit_low_open, st.dram_hit_high_open) = (true, true);
    st.dram_hit_not_measured = "hostpte: DRAM-hit interval 0-100 %".into();
    st.hot_set_dram = Some(tier_proto::v1::HotSetShare {
        horizon_seconds: 1.0,
        share: 0.25,
        share_low: 0.24,
        share_high: 0.26,
        hot_bytes: 4e6,
        dram_bytes: 1e6,
        ..Default::default()
    });
    st.tiers[0].resident_not_measured = "/proc/1/smaps unreadable".into();
    let mut m = Metrics::new();
    m.update(&u);
    let body = m.encode();
    let vm = "{vm=\"v\",name=\"v\"} ";
    for gone in [
        "tierd_vm_dram_hit_ratio{",
        "tierd_vm_dram_hit_sampling_error_ratio{",
        "tierd_vm_dram_hit_ratio_low{",
        "tierd_vm_dram_hit_ratio_high{",
        "tierd_tier_resident_bytes{vm=\"v\",tier=\"dram\"",
    ] {
        assert!(!body.contains(gone), "{gone} in\n{body}");
    }
    assert_eq!(
        value(&body, &format!("tierd_vm_dram_hit_measured{vm}")),
        Some(0.0)
    );
    assert_eq!(
        value(&body, &format!("tierd_vm_hot_set_dram_ratio{vm}")),
        Some(0.25)
    );
    assert_eq!(
        value(&body, &format!("tierd_vm_hot_set_dram_ratio_low{vm}")),
        Some(0.24)
    );
    assert_eq!(
        value(&body, &format!("tierd_vm_hot_set_horizon_seconds{vm}")),
        Some(1.0)
    );
    // A measured interval: the ratio and its bounds, still no zero error.
    let st = &mut u.stats[0];
    st.dram_hit_not_measured.clear();
    st.dram_hit_low = Some(0.3);
    m.update(&u);
    let body = m.encode();
    assert_eq!(
        value(&body, &format!("tierd_vm_dram_hit_ratio{vm}")),
        Some(0.34)
    );
    assert_eq!(
        value(&body, &format!("tierd_vm_dram_hit_measured{vm}")),
        Some(1.0)
    );
    assert!(!body.contains("tierd_vm_dram_hit_sampling_error_ratio{"));
}
