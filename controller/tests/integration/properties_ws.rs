//! Properties of working_set mode (docs/working-set.md). The invariants of both modes
//! (floors, ceilings, budget, step, conservation) run in `properties.rs`
//! over scenarios that draw either mode, random ages (intervals of any
//! width, horizons not measured, no ages) and hot horizons the VMs do or
//! do not report. Here: what working_set mode may move on, no oscillation
//! on a steady simulated workload with sampled ages, and DRAM flowing to
//! the VM whose hot set outgrew its DRAM.

use proptest::prelude::*;
use tier_controller::policy::working_set::view;
use tier_controller::policy::{Config, Controller, HitEvidence, Mode, PAGE, Tuning, WorkingSet};
use tier_proto::v1::DecisionReason;
use tier_sim::age_readings::AgeSampling;
use tier_sim::fleet::{FleetSpec, fleet};
use tier_sim::guest::{Balloon, Guest, SimVm};
use tier_sim::metrics::{assessed_while_moving, directions, flip_backs, flip_backs_within};
use tier_sim::workload::Phase;
use tier_sim::{Sim, SimConfig};

use crate::scenario::{run, scenario};

const CASES_MOVES: u32 = 20_000;
const CASES_STEADY: u32 = 3_000;
const CASES_FLOW: u32 = 2_000;
const INTERVALS: u64 = 40;
const G: u64 = 1 << 30;
const M: u64 = 1 << 20;

fn pages_up(b: f64) -> u64 {
    (b / PAGE as f64).ceil() as u64 * PAGE
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES_MOVES))]

    /// A VM decided in working_set mode gets DRAM for its hot set only
    /// while the low end of its hot set exceeds the DRAM given, and never
    /// loses DRAM by cold reclaim below the high end of its hot set; a VM
    /// configured for working_set mode but decided in ratio mode says why,
    /// one decided on its last view (this interval did not measure the
    /// hot horizon) says that.
    #[test]
    fn working_set_moves_only_on_what_the_interval_shows(mut s in scenario()) {
        s.config.mode = Mode::WorkingSet;
        let cfg = s.config.clone();
        let mut c = Controller::new(s.config.clone());
        run(&s, &mut c, |obs, plan| {
            for (o, t) in obs.iter().zip(&plan.targets) {
                let (g0, g1) = (o.dram.given(), o.dram.size.saturating_sub(t.dram));
                let ds = plan.decisions.iter().filter(|d| d.vm_id == o.id && !d.changes.is_empty());
                match view(o, &cfg) {
                    Ok(v) => for d in ds {
                        match d.reason() {
                            DecisionReason::HotSetDeficit => prop_assert!(
                                v.hot.low > g0 as f64 && g1 > g0,
                                "{}: {:?} given {} -> {}: {}", o.id, v.hot, g0, g1, d.detail
                            ),
                            DecisionReason::ColdReclaim => prop_assert!(
                                g1 >= pages_up(v.hot.high) && g1 < g0,
                                "{}: {:?} given {} -> {}: {}", o.id, v.hot, g0, g1, d.detail
                            ),
                            DecisionReason::BelowTarget
                            | DecisionReason::AboveTarget
                            | DecisionReason::IdleReclaim => {
                                prop_assert!(false, "ratio reason in working_set mode: {}", d.detail)
                            }
                            _ => {}
                        }
                    },
                    Err(why) => for d in ds {
                        if d.reason() == DecisionReason::Uncooperative {
                            continue;
                        }
                        // Or the last view within the hysteresis window,
                        // said so (decide::ws_view).
                        let stale = d.detail.contains("; not measured since]");
                        if matches!(o.hit, HitEvidence::Counted(_)) {
                            // An exact count: ratio mode, said why.
                            prop_assert!(
                                stale || (d.detail.contains("decided in ratio mode") && d.detail.contains(&why)),
                                "{}: {}", why, d.detail
                            );
                        } else {
                            // Nothing measured: held; only limits and the
                            // budget move it (reason BUDGET).
                            prop_assert!(
                                stale || d.reason() == DecisionReason::Budget,
                                "{}: {:?}: {}", why, d.reason(), d.detail
                            );
                        }
                    },
                }
            }
            Ok(())
        })?;
    }
}

fn ws_policy(budget: u64, eps: f64, step: u64, cooldown: u32) -> Config {
    Config {
        enabled: true,
        dry_run: false,
        default_target: 0.9,
        epsilon: eps,
        budget: Some(budget),
        max_step: step,
        cooldown_intervals: cooldown,
        idle_threshold: 0.5,
        vms: Default::default(),
        tuning: Tuning::default(),
        mode: Mode::WorkingSet,
        working_set: WorkingSet::default(),
        reclaim: tier_controller::policy::Reclaim::Eager,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES_STEADY))]

    /// Under constant load (one phase, hot and warm pages, ages sampled
    /// with binomial noise at any coverage) no VM's DRAM flips back and
    /// forth, and no decision but a continuing step rests on a sample
    /// taken while a balloon moved.
    #[test]
    fn no_oscillation_on_a_steady_workload(
        n in 1usize..5,
        seed in any::<u64>(),
        cooldown in 0u32..3,
        step_mib in 16u64..2048,
        coverage in prop_oneof![Just(1.0), 0.002..1.0f64],
        slack in 0.7..1.3f64,
    ) {
        let f = fleet(&FleetSpec {
            vms: n,
            seed,
            budget_slack: slack,
            warm_share: (0.0, 0.3),
            budget_for_hot_set: true,
            ..Default::default()
        });
        let cfg = ws_policy(f.budget, 0.02, step_mib << 20, cooldown);
        let window = cfg.tuning.hysteresis_window as usize;
        let sim_cfg = SimConfig {
            seed,
            ages: Some(AgeSampling { coverage, ..AgeSampling::default() }),
            ..SimConfig::default()
        };
        let mut sim = Sim::new(f.vms, sim_cfg, cfg);
        let steps = sim.run(INTERVALS);
        for i in 0..n {
            let d = directions(&steps, i, 0, steps.len());
            prop_assert_eq!(flip_backs(&d), 0, "vm{} directions {:?}", i, d);
            prop_assert_eq!(flip_backs_within(&steps, i, window), 0, "vm{} directions {:?}", i, d);
        }
        let mixed = assessed_while_moving(&sim.vms, &steps, sim.controller.config().tuning.balloon_tolerance);
        prop_assert!(mixed.is_empty(), "assessed while moving: {:?}", mixed);
    }
}

fn vm(id: &str, size: u64, given: u64, phases: Vec<Phase>) -> SimVm {
    let b = |x| Balloon {
        target: x,
        actual: x,
    };
    SimVm {
        id: id.into(),
        dram_size: size,
        slow_size: size,
        dram: b(size - given),
        slow: b(given),
        phases,
        guest: Guest::Cooperative,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES_FLOW))]

    /// Two VMs sharing a budget that is all handed out: "a" holds less DRAM
    /// than its hot set, "b" more than its hot and warm set. DRAM flows from
    /// b to a (a gives back at most what a rise sized on a sampled point
    /// overshot: 2 % of its hot set and a minimum step), until a's hot set
    /// fits (within the sampling) or b has nothing beyond its own hot set
    /// left; b keeps its hot set.
    #[test]
    fn dram_flows_to_the_deficit_vm(
        a_hot_mib in 600u64..1800,
        a_given_mib in 128u64..512,
        b_hot_mib in 64u64..600,
        b_warm_mib in 0u64..400,
        step_mib in 32u64..512,
        cooldown in 0u32..3,
        seed in any::<u64>(),
    ) {
        let size = 2 * G;
        let b_given = (size - a_given_mib * M).min(size);
        let a = vm("a", size, a_given_mib * M, vec![Phase::hot(0, a_hot_mib * M, 5.0, 1e6)]);
        let b = vm("b", size, b_given, vec![Phase {
            warm_bytes: b_warm_mib * M,
            warm_period_s: 30.0,
            ..Phase::hot(0, b_hot_mib * M, 5.0, 1e6)
        }]);
        let budget = a_given_mib * M + b_given;
        let cfg = ws_policy(budget, 0.02, step_mib * M, cooldown);
        let sim_cfg = SimConfig {
            seed,
            ages: Some(AgeSampling::default()),
            ..SimConfig::default()
        };
        let mut sim = Sim::new(vec![a, b], sim_cfg, cfg);
        // Long enough for the step (a donor in cooldown gives every few
        // intervals until its cold pages show, after the longest horizon).
        let steps = sim.run(30 + 4 * (a_hot_mib - a_given_mib).div_ceil(step_mib));
        prop_assert!(directions(&steps, 1, 0, steps.len()).iter().all(|&d| d == -1));
        let last = &steps[steps.len() - 1];
        // a may give back what a rise sized on a sampled point overshot
        // (cold DRAM beyond its hot set), nothing more.
        let (mut up, mut down) = (0u64, 0u64);
        for w in steps.windows(2) {
            let (t0, t1) = (w[0].vms[0].dram_target, w[1].vms[0].dram_target);
            up += t0.saturating_sub(t1);
            down += t1.saturating_sub(t0);
        }
        let a_hot = last.vms[0].hot.unwrap();
        prop_assert!(
            down <= a_hot / 50 + step_mib * M / 64,
            "a gave back {} of {} received (hot set {})", down, up, a_hot
        );
        let (ga, gb) = (last.vms[0].dram_held, last.vms[1].dram_held);
        let a_need = last.vms[0].hot.unwrap();
        let b_need = last.vms[1].hot.unwrap();
        // b never gives up its own hot set (1 s working set, with its warm
        // pages touched within that second).
        prop_assert!(gb as f64 >= b_need as f64 * 0.97, "b {} < its hot set {}", gb, b_need);
        // a's hot set fits within the sampling error and the minimum step,
        // or b is down to its hot set plus the same margins.
        let margin = (0.05 * a_need as f64) as u64 + step_mib * M / 64 + 2 * M;
        prop_assert!(
            ga + margin >= a_need || gb <= b_need + b_need / 10 + 2 * margin,
            "a holds {} of {} hot, b holds {} of {} hot", ga, a_need, gb, b_need
        );
    }
}
