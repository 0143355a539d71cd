//! Hand-built rounds of the decision function with DRAM-hit intervals
//! (docs/estimate.md): target 0.75, epsilon 1/16 (band 0.703-0.797), 2G zones.

use std::collections::HashMap;

use tier_controller::policy::{
    ActOn, Config, Controller, HitEvidence, Limits, Plan, TierObs, Tuning, VmObs, VmOverride,
};
use tier_proto::v1::{Decision, DecisionOutcome, DecisionReason, VmStats};

const M: u64 = 1 << 20;
const G: u64 = 1 << 30;

fn config(act_on: ActOn) -> Config {
    Config {
        enabled: true,
        dry_run: false,
        default_target: 0.75,
        epsilon: 0.0625,
        budget: Some(4 * G),
        max_step: G,
        cooldown_intervals: 1,
        idle_threshold: 0.5,
        vms: HashMap::new(),
        tuning: Tuning {
            act_on,
            ..Tuning::default()
        },
        mode: Default::default(),
        working_set: Default::default(),
        reclaim: tier_controller::policy::Reclaim::Eager,
    }
}

/// 512M DRAM given, all of it hot with `dram_acc` accesses; 512M hot in
/// slow with `slow_acc`: the point is dram_acc / (dram_acc + slow_acc).
fn vm(id: &str, dram_acc: f64, slow_acc: f64, hit: HitEvidence) -> VmObs {
    let tier = |name: &str, given: u64, acc: f64| TierObs {
        name: name.into(),
        size: 2 * G,
        balloon_target: 2 * G - given,
        balloon_actual: 2 * G - given,
        accesses: acc,
        accessed_bytes: 512 * M,
        idle_bytes: given - 512 * M,
        reach: None,
        granule: 0,
        ages: None,
        resident: Some(0),
    };
    VmObs {
        id: id.into(),
        name: id.into(),
        dram: tier("dram", 512 * M, dram_acc),
        slow: tier("slow", G, slow_acc),
        balloon_ok: true,
        guest_accesses: None,
        hit,
    }
}

fn interval(low: f64, high: f64, low_open: bool, high_open: bool) -> HitEvidence {
    HitEvidence::Interval {
        low,
        high,
        low_open,
        high_open,
    }
}

fn decide(act_on: ActOn, vms: &[VmObs]) -> Plan {
    Controller::new(config(act_on)).decide(vms, 1)
}

fn decision<'a>(p: &'a Plan, id: &str) -> Option<&'a Decision> {
    p.decisions.iter().find(|d| d.vm_id == id)
}

#[test]
fn no_move_while_the_interval_straddles_the_band() {
    // Point 0.5, far below the band, but the interval (hot DRAM pages
    // under-read) reaches above it: held; the point alone would grant.
    let v = vm("a", 500.0, 500.0, interval(0.45, 1.0, false, true));
    let mut c = Controller::new(config(ActOn::Interval));
    let p = c.decide(std::slice::from_ref(&v), 1);
    assert_eq!(p.targets[0].dram, v.dram.balloon_target);
    // Said once per episode: skipped, nothing changed, why.
    let d = decision(&p, "a").unwrap();
    assert_eq!(
        (d.reason(), d.outcome()),
        (DecisionReason::BelowTarget, DecisionOutcome::Skipped)
    );
    assert!(d.changes.is_empty());
    assert!(
        d.detail.starts_with(
            "dram-hit 45-100 % (open above; point 50 %) straddles the band 70.3-79.7 %: the point alone says below, the interval cannot place it below the band; held"
        ),
        "{}",
        d.detail
    );
    assert!(c.decide(std::slice::from_ref(&v), 2).decisions.is_empty());
    let p = decide(ActOn::Point, std::slice::from_ref(&v));
    let d = decision(&p, "a").unwrap();
    assert_eq!(d.reason(), DecisionReason::BelowTarget);
    assert!(
        d.detail.starts_with(
            "dram-hit 45-100 % (open above; point 50 %) [acting on the point] below the band 70.3-79.7 %"
        ),
        "{}",
        d.detail
    );
    // Protective acts on the low end: 0.45 may be below, so it grants.
    let p = decide(ActOn::Protective, std::slice::from_ref(&v));
    assert_eq!(
        decision(&p, "a").unwrap().reason(),
        DecisionReason::BelowTarget
    );
}

#[test]
fn a_move_once_the_interval_is_outside_the_band_quotes_it() {
    let below = vm("a", 500.0, 500.0, interval(0.4, 0.6, false, false));
    let p = decide(ActOn::Interval, &[below]);
    let d = decision(&p, "a").unwrap();
    assert_eq!(d.reason(), DecisionReason::BelowTarget);
    assert!(
        d.detail
            .starts_with("dram-hit 40-60 % (point 50 %) below the band 70.3-79.7 %"),
        "{}",
        d.detail
    );
    assert_eq!(d.observed_ratio, 0.5);
    // Above: the low end over the band's upper edge.
    let above = vm("b", 900.0, 100.0, interval(0.85, 0.95, false, false));
    let p = decide(ActOn::Interval, &[above]);
    let d = decision(&p, "b").unwrap();
    assert_eq!(d.reason(), DecisionReason::AboveTarget);
    assert!(
        d.detail
            .starts_with("dram-hit 85-95 % (point 90 %) above the band 70.3-79.7 %"),
        "{}",
        d.detail
    );
}

#[test]
fn a_pmu_count_is_acted_on_not_the_accessed_bits() {
    // Accessed bits read 0.3; the PMU counted 0.95 on every tier: above
    // the band, DRAM goes, and the decision says it was counted.
    let v = vm("a", 300.0, 700.0, HitEvidence::Counted(0.95));
    let p = decide(ActOn::Interval, &[v]);
    let d = decision(&p, "a").unwrap();
    assert_eq!(d.reason(), DecisionReason::AboveTarget);
    assert!((d.observed_ratio - 0.95).abs() < 1e-12);
    assert!(
        d.detail
            .starts_with("dram-hit 95 % (PMU-counted) above the band"),
        "{}",
        d.detail
    );
}

#[test]
fn an_older_sender_falls_back_to_the_sampling_error_and_says_so() {
    // Point 0.69 +- 0.02 reaches into the band (0.703): held, and said.
    let near = vm("a", 690.0, 310.0, HitEvidence::Sampling { error: 0.02 });
    let p = decide(ActOn::Interval, &[near]);
    let d = decision(&p, "a").unwrap();
    assert!(d.changes.is_empty());
    assert!(
        d.detail.starts_with("dram-hit 69 % +-2.0 (no interval from the sampler: sampling error only) straddles the band"),
        "{}",
        d.detail
    );
    let far = vm("b", 500.0, 500.0, HitEvidence::Sampling { error: 0.012 });
    let p = decide(ActOn::Interval, &[far]);
    let d = decision(&p, "b").unwrap();
    assert!(
        d.detail.starts_with(
            "dram-hit 50 % +-1.2 (no interval from the sampler: sampling error only) below the band"
        ),
        "{}",
        d.detail
    );
    // No error at all: a point, said as such, never "+-0.0".
    let exact = vm("c", 500.0, 500.0, HitEvidence::Sampling { error: 0.0 });
    let d = decide(ActOn::Interval, &[exact]).decisions[0].clone();
    assert!(
        d.detail
            .starts_with("dram-hit 50 % (no interval from the sampler) below the band"),
        "{}",
        d.detail
    );
}

#[test]
fn limit_moves_quote_the_interval_too() {
    // A 1G floor on DRAM: raised whatever the ratio; the record still
    // says what the ratio was.
    let mut cfg = config(ActOn::Interval);
    cfg.vms.insert(
        "a".into(),
        VmOverride {
            limits: HashMap::from([(
                "dram".to_string(),
                Limits {
                    floor: G,
                    ceiling: None,
                },
            )]),
            ..Default::default()
        },
    );
    let v = vm("a", 500.0, 500.0, interval(0.0, 1.0, true, true));
    let p = Controller::new(cfg).decide(&[v], 1);
    let d = decision(&p, "a").unwrap();
    assert!(d.detail.starts_with("dram given 512.0M below floor 1.0G"));
    assert!(
        d.detail
            .contains("dram-hit 0-100 % (open both ends; point 50 %)"),
        "{}",
        d.detail
    );
}

#[test]
fn the_stream_s_fields_become_the_evidence() {
    use tier_controller::policy::input::evidence;
    let mut s = VmStats {
        dram_hit_error: 0.01,
        ..Default::default()
    };
    assert_eq!(evidence(&s), HitEvidence::Sampling { error: 0.01 });
    (s.dram_hit_low, s.dram_hit_high, s.dram_hit_high_open) = (Some(0.3), Some(1.0), true);
    assert_eq!(evidence(&s), interval(0.3, 1.0, false, true));
    // Only one end, or nonsense: no interval.
    s.dram_hit_high = None;
    assert_eq!(evidence(&s), HitEvidence::Sampling { error: 0.01 });
    (s.dram_hit_low, s.dram_hit_high) = (Some(0.8), Some(0.2));
    assert_eq!(evidence(&s), HitEvidence::Sampling { error: 0.01 });
    // A PMU count wins.
    s.counted_dram_hit_ratio = Some(0.66);
    assert_eq!(evidence(&s), HitEvidence::Counted(0.66));
}
