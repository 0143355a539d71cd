//! working_set mode, hand-computed rounds and a phase change in the
//! simulator: the hot set outgrows its DRAM, DRAM moves to it, and back
//! after the phase change.

use std::collections::HashMap;

use tier_controller::policy::ages::{Est, Horizon, TierAges};
use tier_controller::policy::{
    Config, Controller, HitEvidence, Mode, Reclaim, TierObs, Tuning, VmObs, VmOverride, WorkingSet,
};
use tier_proto::v1::{DecisionOutcome, DecisionReason};
use tier_sim::age_readings::AgeSampling;
use tier_sim::guest::{Balloon, Guest, SimVm};
use tier_sim::metrics::{converge, directions};
use tier_sim::workload::Phase;
use tier_sim::{Sim, SimConfig};

const M: u64 = 1 << 20;
const G: u64 = 1 << 30;

fn config(budget: u64) -> Config {
    Config {
        enabled: true,
        dry_run: false,
        default_target: 0.9,
        epsilon: 0.02,
        budget: Some(budget),
        max_step: 256 * M,
        cooldown_intervals: 1,
        idle_threshold: 0.5,
        vms: HashMap::new(),
        tuning: Tuning::default(),
        mode: Mode::WorkingSet,
        working_set: WorkingSet {
            hot_horizon: 10.0,
            promotion_slo: 0.0,
        },
        reclaim: Reclaim::Eager,
    }
}

/// Horizons 1, 10, 60 s; `ws` bytes within each (+-`w` relative), `cold`.
fn ages(ws: [u64; 3], w: f64, cold: u64) -> TierAges {
    let e = |b: u64| {
        let b = b as f64;
        Est::new(b, b * (1.0 - w), b * (1.0 + w)).unwrap()
    };
    TierAges {
        horizons: [1.0, 10.0, 60.0]
            .iter()
            .zip(ws)
            .map(|(&s, b)| Horizon {
                seconds: s,
                bytes: Some(e(b)),
                why: String::new(),
            })
            .collect(),
        cold: Some(e(cold)),
        promoted_per_s: Some(Est::exact(0.0)),
        history_seconds: 600.0,
        not_measured: String::new(),
    }
}

/// 2G tiers, `given` DRAM left to the guest, the rest of 2G as slow.
fn vm(id: &str, given: u64, dram: TierAges, slow: TierAges) -> VmObs {
    let tier = |name: &str, given: u64, a: TierAges| TierObs {
        name: name.into(),
        size: 2 * G,
        balloon_target: 2 * G - given,
        balloon_actual: 2 * G - given,
        accesses: 1000.0,
        accessed_bytes: given / 2,
        idle_bytes: given / 2,
        ages: Some(a),
        reach: None,
        granule: 0,
        resident: Some(0),
    };
    VmObs {
        id: id.into(),
        name: id.into(),
        dram: tier("dram", given, dram),
        slow: tier("slow", 2 * G - given, slow),
        balloon_ok: true,
        guest_accesses: None,
        hit: HitEvidence::default(),
    }
}

#[test]
fn cold_dram_goes_to_the_hot_set_that_outgrew_its_dram() {
    // a: 512M given, 10 s working set 512M in DRAM + 256M in slow (+-2 %):
    // low end 752.6M, short: need the point, 768M - 512M. b: 1.5G given, 10 s working set
    // 400M (high 408M), 900M cold (low 882M): cold reclaim of 882M, one
    // 256M step. Budget 2G, all handed out: a's grant comes from b.
    let a = vm(
        "a",
        512 * M,
        ages([400 * M, 512 * M, 512 * M], 0.02, 0),
        ages([100 * M, 256 * M, 300 * M], 0.02, 1200 * M),
    );
    let b = vm(
        "b",
        1536 * M,
        ages([300 * M, 400 * M, 636 * M], 0.02, 900 * M),
        ages([0, 0, 0], 0.02, 512 * M),
    );
    let mut c = Controller::new(config(2 * G));
    let p = c.decide(&[a, b], 1);
    let by = |id: &str| p.decisions.iter().find(|d| d.vm_id == id).unwrap();
    let (da, db) = (by("a"), by("b"));
    assert_eq!(db.reason(), DecisionReason::ColdReclaim, "{}", db.detail);
    assert_eq!(da.reason(), DecisionReason::HotSetDeficit, "{}", da.detail);
    assert_eq!(da.outcome(), DecisionOutcome::Applied);
    // b gives one step of cold DRAM; a, known short by its low end, gets
    // what its point says: 768M - 512M.
    assert_eq!(p.targets[1].dram, 2 * G - 1536 * M + 256 * M);
    assert_eq!(p.targets[0].dram, 2 * G - 768 * M);
    assert!(
        da.detail.starts_with("working set (10 s) 768.0M (752.6M-783.4M) = dram 512.0M + slow 256.0M > dram given 512.0M: low end short by 240.6M (min step 4.0M); need 768.0M - 512.0M = 256.0M cap 256.0M -> granted 256.0M of pool 256.0M"),
        "{}",
        da.detail
    );
    assert!(
        db.detail.contains("dram given 1.5G - high end 408.0M = 1.1G beyond the hot set; dram cold (> 60 s) 900.0M (882.0M-918.0M)"),
        "{}",
        db.detail
    );
    assert!(
        db.detail.contains("reclaim the cold 882.0M -> 256.0M"),
        "{}",
        db.detail
    );
}

#[test]
fn warm_dram_goes_only_to_a_vm_short_of_it() {
    // b holds 1.5G, its 10 s working set 400M, nothing cold (all of it
    // touched within 60 s): spare, but kept while nobody needs it.
    let b = || {
        vm(
            "b",
            1536 * M,
            ages([300 * M, 400 * M, 1536 * M], 0.02, 0),
            ages([0, 0, 0], 0.02, 512 * M),
        )
    };
    let fits = vm(
        "a",
        512 * M,
        ages([300 * M, 400 * M, 512 * M], 0.02, 0),
        ages([0, 0, 0], 0.02, 1536 * M),
    );
    let p = Controller::new(config(2 * G)).decide(&[fits, b()], 1);
    assert!(p.decisions.is_empty(), "{:?}", p.decisions);
    // a short of 200M: b's warm DRAM goes, as much as a needs.
    let short = vm(
        "a",
        512 * M,
        ages([300 * M, 512 * M, 512 * M], 0.0, 0),
        ages([0, 200 * M, 200 * M], 0.0, 1336 * M),
    );
    let p = Controller::new(config(2 * G)).decide(&[short, b()], 1);
    let db = p.decisions.iter().find(|d| d.vm_id == "b").unwrap();
    assert_eq!(db.reason(), DecisionReason::ColdReclaim, "{}", db.detail);
    assert!(
        db.detail.contains("another VM is short of DRAM: -200.0M"),
        "{}",
        db.detail
    );
    assert_eq!(p.targets[0].dram, 2 * G - 712 * M);
    assert_eq!(p.targets[1].dram, 2 * G - 1336 * M);
}

#[test]
fn vms_without_ages_hold_and_with_a_pmu_count_stay_in_ratio_mode() {
    // Ratio 0.5 against target 0.9 (no interval: sampling error 0.01).
    let mut a = vm(
        "a",
        512 * M,
        ages([300 * M, 400 * M, 512 * M], 0.02, 0),
        ages([0, 0, 0], 0.02, 1536 * M),
    );
    a.slow.accesses = 1000.0;
    a.hit = HitEvidence::Sampling { error: 0.01 };
    a.dram.ages = None;
    // No ages and no count: nothing measured to decide on, held, said once.
    let mut c = Controller::new(config(4 * G));
    let p = c.decide(&[a.clone()], 1);
    let d = &p.decisions[0];
    assert_eq!(d.reason(), DecisionReason::NotMeasured, "{}", d.detail);
    assert_eq!(d.outcome(), DecisionOutcome::Skipped, "{}", d.detail);
    assert!(d.changes.is_empty() && p.targets[0].dram == a.dram.balloon_target);
    assert!(
        d.detail.starts_with(
            "working_set mode, not measured: tier dram has no ages (its sampler gives none); held"
        ),
        "{}",
        d.detail
    );
    let p = c.decide(&[a.clone()], 2);
    assert!(p.decisions.is_empty(), "{:?}", p.decisions);
    a.dram.ages = Some(ages([300 * M, 400 * M, 512 * M], 0.02, 0));
    a.hit = HitEvidence::Counted(0.5);
    let p = Controller::new(config(4 * G)).decide(&[a.clone()], 1);
    assert!(
        p.decisions[0]
            .detail
            .contains("its DRAM-hit ratio is PMU-counted (exact)"),
        "{}",
        p.decisions[0].detail
    );
    // A per-VM override to ratio mode: no note.
    let mut cfg = config(4 * G);
    cfg.vms.insert(
        "a".into(),
        VmOverride {
            mode: Some(Mode::Ratio),
            ..Default::default()
        },
    );
    let p = Controller::new(cfg).decide(&[a], 1);
    assert!(
        p.decisions[0].detail.starts_with("dram-hit"),
        "{}",
        p.decisions[0].detail
    );
}

#[test]
fn a_horizon_measured_one_interval_in_a_few_does_not_flap_modes() {
    // hostpte measures short horizons only in its long pass: the interval
    // after, the hot horizon says not measured. The last view (within the
    // hysteresis window) decides, marked stale; after the window, ratio.
    let short = || {
        vm(
            "a",
            512 * M,
            ages([400 * M, 768 * M, 768 * M], 0.02, 0),
            ages([0, 0, 0], 0.02, 1536 * M),
        )
    };
    let mut cfg = config(4 * G);
    cfg.cooldown_intervals = 0;
    cfg.working_set.hot_horizon = 10.0;
    let mut c = Controller::new(cfg);
    let p = c.decide(&[short()], 1);
    assert_eq!(p.decisions[0].reason(), DecisionReason::HotSetDeficit);
    let mut blind = short();
    blind.dram.balloon_target = p.targets[0].dram;
    blind.dram.balloon_actual = p.targets[0].dram;
    blind.slow.balloon_target = p.targets[0].slow;
    blind.slow.balloon_actual = p.targets[0].slow;
    if let Some(a) = blind.dram.ages.as_mut() {
        a.horizons[1].bytes = None;
        a.horizons[1].why = "hostpte measures 10s in its long pass; not this one".into();
    }
    blind.slow.accesses = 1000.0;
    let p = c.decide(&[blind.clone()], 2);
    for d in &p.decisions {
        assert!(!d.detail.contains("decided in ratio mode"), "{}", d.detail);
        assert!(
            d.detail
                .contains("[measured in round 1; not measured since]"),
            "{}",
            d.detail
        );
    }
    // Past the hysteresis window (10 intervals after round 1): not
    // measured, held, saying why once; never the ratio. (`decide`'s second
    // argument is a timestamp; rounds count calls.)
    for round in 3..=11 {
        let p = c.decide(&[blind.clone()], round);
        assert!(p.decisions.is_empty(), "round {round}: {:?}", p.decisions);
    }
    let p = c.decide(&[blind.clone()], 12);
    assert_eq!(p.decisions.len(), 1, "{:?}", p.decisions);
    let d = &p.decisions[0];
    assert_eq!(d.reason(), DecisionReason::NotMeasured, "{}", d.detail);
    assert!(d.changes.is_empty(), "{}", d.detail);
    assert!(
        d.detail
            .contains("not measured: tier dram, horizon 10 s: hostpte measures"),
        "{}",
        d.detail
    );
    assert!(c.decide(&[blind], 13).decisions.is_empty());
}

fn sim_vm(id: &str, given: u64, phases: Vec<Phase>) -> SimVm {
    let b = |x| Balloon {
        target: x,
        actual: x,
    };
    SimVm {
        id: id.into(),
        dram_size: 4 * G,
        slow_size: 4 * G,
        dram: b(4 * G - given),
        slow: b(given),
        phases,
        guest: Guest::Cooperative,
    }
}

/// The e2e's scenario in the simulator: "a" needs DRAM first, then "b"
/// (their hot sets swap at interval 30 and back at 60), under a budget that
/// covers the larger hot set plus the smaller one, all of it handed out.
#[test]
fn dram_follows_the_hot_set_and_back() {
    let phase = |start, hot| Phase {
        warm_bytes: 256 * M,
        warm_period_s: 30.0,
        ..Phase::hot(start, hot, 10.0, 1e6)
    };
    let a = sim_vm(
        "a",
        2 * G,
        vec![phase(0, 3 * G), phase(30, G / 2), phase(60, 3 * G)],
    );
    let b = sim_vm(
        "b",
        2 * G,
        vec![phase(0, G / 2), phase(30, 3 * G), phase(60, G / 2)],
    );
    let mut cfg = config(4 * G);
    cfg.working_set.hot_horizon = 0.0;
    cfg.max_step = 512 * M;
    let sim_cfg = SimConfig {
        noise: 0.02,
        ages: Some(AgeSampling::default()),
        ..SimConfig::default()
    };
    let mut sim = Sim::new(vec![a, b], sim_cfg, cfg);
    let steps = sim.run(90);
    let counted = [true, true];
    for (from, to) in [(0, 30), (30, 60), (60, 90)] {
        let k = converge(&steps, from, to, 0.02, &counted);
        assert!(
            k.is_some_and(|k| k <= 10),
            "phase from {from}: converged after {k:?}; a holds {} of {:?}, b {} of {:?}",
            steps[to - 1].vms[0].dram_held,
            steps[to - 1].vms[0].hot,
            steps[to - 1].vms[1].dram_held,
            steps[to - 1].vms[1].hot
        );
    }
    // DRAM went a's way first, b's after the swap, a's again after it.
    let dirs = |i, from, to| directions(&steps, i, from, to);
    assert!(
        dirs(0, 0, 30).iter().all(|&d| d == 1),
        "{:?}",
        dirs(0, 0, 30)
    );
    assert!(
        dirs(0, 30, 60).iter().all(|&d| d == -1),
        "{:?}",
        dirs(0, 30, 60)
    );
    assert!(
        dirs(1, 30, 60).iter().all(|&d| d == 1),
        "{:?}",
        dirs(1, 30, 60)
    );
    assert!(
        dirs(0, 60, 90).iter().all(|&d| d == 1),
        "{:?}",
        dirs(0, 60, 90)
    );
    assert!(
        dirs(1, 60, 90).iter().all(|&d| d == -1),
        "{:?}",
        dirs(1, 60, 90)
    );
    let reasons: Vec<_> = steps
        .iter()
        .flat_map(|s| s.decisions.iter().map(|d| d.reason()))
        .collect();
    assert!(reasons.contains(&DecisionReason::HotSetDeficit));
    assert!(reasons.contains(&DecisionReason::ColdReclaim));
}

#[test]
fn the_default_mode_follows_each_vm_s_signal() {
    use tier_proto::v1::SteeringSignal;
    // a: hot set beyond its DRAM (as above); ratio 0.5 against 0.9.
    let mut a = vm(
        "a",
        512 * M,
        ages([400 * M, 512 * M, 512 * M], 0.02, 0),
        ages([100 * M, 256 * M, 300 * M], 0.02, 1200 * M),
    );
    a.hit = HitEvidence::Sampling { error: 0.01 };
    let auto = || {
        let mut c = config(4 * G);
        c.mode = Mode::Auto;
        c
    };
    let first = |cfg: Config, a: &VmObs| {
        let p = Controller::new(cfg).decide(std::slice::from_ref(a), 1);
        p.decisions.into_iter().next().expect("a decision")
    };
    // Accessed bits only: working_set mode, on the hot set.
    let d = first(auto(), &a);
    assert_eq!(d.reason(), DecisionReason::HotSetDeficit, "{}", d.detail);
    assert_eq!(d.signal(), SteeringSignal::HotSet);
    assert!(
        d.detail.ends_with(
            "; signal: accessed-bit hot set (mode auto: ratio on a PMU count, else working_set)"
        ),
        "{}",
        d.detail
    );
    // A PMU count: ratio mode on it, no working_set note.
    a.hit = HitEvidence::Counted(0.5);
    let d = first(auto(), &a);
    assert_eq!(d.reason(), DecisionReason::BelowTarget, "{}", d.detail);
    assert_eq!(d.signal(), SteeringSignal::CountedRatio);
    assert!(!d.detail.contains("working_set mode"), "{}", d.detail);
    assert!(d.detail.ends_with(
        "; signal: PMU-counted ratio (mode auto: ratio on a PMU count, else working_set)"
    ));
    // An explicit mode wins over the signal, either way.
    a.hit = HitEvidence::Sampling { error: 0.01 };
    let mut cfg = auto();
    cfg.mode = Mode::Ratio;
    let d = first(cfg, &a);
    assert_eq!(d.signal(), SteeringSignal::AccessedBitRatio, "{}", d.detail);
    assert!(
        d.detail
            .ends_with("; signal: accessed-bit ratio interval (mode ratio)")
    );
    a.hit = HitEvidence::Counted(0.5);
    let mut cfg = auto();
    cfg.vms.insert(
        "a".into(),
        VmOverride {
            mode: Some(Mode::WorkingSet),
            ..Default::default()
        },
    );
    let d = first(cfg, &a);
    // working_set mode configured; the PMU count sends it to ratio mode
    // (as before), and the decision says which signal it used.
    assert!(
        d.detail
            .starts_with("working_set mode, decided in ratio mode"),
        "{}",
        d.detail
    );
    assert_eq!(d.signal(), SteeringSignal::CountedRatio);
}
