//! The simulator with samples that read like accessed bits (docs/estimate.md): hot
//! DRAM pages under-read, so the point estimate reads low, and an interval
//! that covers the truth. Acting on the interval the controller never hands
//! DRAM to a VM whose settled truth is at its target and makes no ratio
//! move the interval cannot place; acting on the point it does. The price
//! (printed, see docs/controller.md): a VM whose DRAM holds pages too hot
//! to count has an interval open above and is never known to be below.

use tier_controller::policy::model::Load;
use tier_controller::policy::{ActOn, Config, Hit, HitKind, Tuning};
use tier_proto::v1::DecisionReason;
use tier_sim::fleet::{FleetSpec, fleet};
use tier_sim::{Sim, SimConfig};

const INTERVALS: u64 = 40;

fn policy(budget: u64, act_on: ActOn) -> Config {
    Config {
        enabled: true,
        dry_run: false,
        default_target: 0.9,
        epsilon: 0.02,
        budget: Some(budget),
        max_step: 1 << 30,
        cooldown_intervals: 1,
        idle_threshold: 0.5,
        vms: Default::default(),
        tuning: Tuning {
            act_on,
            ..Tuning::default()
        },
        mode: Default::default(),
        working_set: Default::default(),
        reclaim: tier_controller::policy::Reclaim::OnDemand,
    }
}

/// What one run shows.
#[derive(Debug, Default)]
struct Seen {
    /// Settled samples with an interval, and those whose interval held the
    /// truth.
    settled: usize,
    covered: usize,
    /// Settled samples whose point read more than 5 points low.
    under_read: usize,
    /// BELOW_TARGET grants to a VM whose settled truth was at or above its
    /// target.
    wrong_grants: usize,
    /// Ratio-driven decisions taken while the interval straddled the band.
    straddled_moves: usize,
    decisions: usize,
    /// Settled samples of the last ten intervals whose truth is below the
    /// band (the price of not acting on an interval open above).
    starved_late: usize,
}

fn run(seed: u64, act_on: ActOn) -> Seen {
    let spec = FleetSpec {
        vms: 24,
        skew: (20.0, 200.0),
        seed,
        ..Default::default()
    };
    let f = fleet(&spec);
    let cfg = policy(f.budget, act_on);
    let band = cfg.hold_epsilon();
    let sim_cfg = SimConfig {
        noise: 0.02,
        seed,
        hot_cap: Some(3.0),
        ..SimConfig::default()
    };
    let mut sim = Sim::new(f.vms, sim_cfg, cfg);
    let mut seen = Seen::default();
    let mut held: Vec<Option<u64>> = vec![None; sim.vms.len()];
    for k in 0..INTERVALS {
        let step = sim.step();
        let obs = sim.observations();
        for (i, (o, v)) in obs.iter().zip(&step.vms).enumerate() {
            let before = held[i].replace(v.dram_held);
            let settled = before == Some(v.dram_held)
                && o.dram.balloon_actual == o.dram.balloon_target
                && o.slow.balloon_actual == o.slow.balloon_target;
            let (Some(h), Some(truth)) = (Hit::of(o.hit, Load::of(o).ratio()), v.ratio) else {
                continue;
            };
            assert_eq!(h.kind, HitKind::Estimate);
            let straddles = h.low <= v.target - band && h.high >= v.target + band;
            for d in step.decisions.iter().filter(|d| d.vm_id == o.id) {
                seen.decisions += 1;
                // Not the skipped note of a hold (no change).
                let ratio_move = !d.changes.is_empty()
                    && matches!(
                        d.reason(),
                        DecisionReason::BelowTarget | DecisionReason::AboveTarget
                    );
                if ratio_move && straddles {
                    seen.straddled_moves += 1;
                }
                let grant = d.reason() == DecisionReason::BelowTarget && !d.changes.is_empty();
                if settled && grant && truth >= v.target {
                    seen.wrong_grants += 1;
                }
            }
            if settled {
                seen.settled += 1;
                if h.low - 1e-9 <= truth && truth <= h.high + 1e-9 {
                    seen.covered += 1;
                }
                if h.point < truth - 0.05 {
                    seen.under_read += 1;
                }
                if k >= INTERVALS - 10 && truth < v.target - band {
                    seen.starved_late += 1;
                }
            }
        }
    }
    seen
}

#[test]
fn intervals_cover_the_truth_and_moves_wait_for_them() {
    let (mut point_wrong, mut point_straddled) = (0, 0);
    for seed in 1..4 {
        let s = run(seed, ActOn::Interval);
        let p = run(seed, ActOn::Point);
        let c = run(seed, ActOn::Protective);
        // The numbers docs/controller.md quotes (--nocapture).
        eprintln!("seed {seed}:\n interval   {s:?}\n point      {p:?}\n protective {c:?}");
        assert!(s.settled > 100, "seed {seed}: {s:?}");
        // The skew is real: the point reads low on many settled samples...
        assert!(s.under_read * 5 > s.settled, "seed {seed}: {s:?}");
        // ... and the interval covers the truth on every one.
        assert_eq!(s.covered, s.settled, "seed {seed}: {s:?}");
        assert_eq!(s.straddled_moves, 0, "seed {seed}: {s:?}");
        assert_eq!(s.wrong_grants, 0, "seed {seed}: {s:?}");
        assert!(s.decisions > 0, "seed {seed}: the fleet is managed: {s:?}");
        // The VM-protective bound leaves no VM below its band at the end:
        // it grants whenever the truth may be below.
        assert_eq!(c.starved_late, 0, "seed {seed}: {c:?}");
        point_wrong += p.wrong_grants;
        point_straddled += p.straddled_moves;
    }
    // The point alone believes the under-read and moves on ratios the
    // interval cannot place.
    assert!(
        point_wrong + point_straddled > 0,
        "{point_wrong} {point_straddled}"
    );
}
