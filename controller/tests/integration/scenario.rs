//! Random scenarios for the property tests: a fleet, a policy, and a
//! sequence of observation rounds in which balloons follow, lag or refuse.

use std::collections::HashMap;

use proptest::prelude::*;
use tier_controller::policy::ages::{Est, Horizon, TierAges};
use tier_controller::policy::{
    ActOn, Config, Controller, HitEvidence, Limits, Mode, PAGE, Plan, Reclaim, Targets, TierObs,
    Tuning, VmObs, VmOverride, VmStatus, WorkingSet,
};
use tier_sim::rng::Rng;

const MIB: u64 = 1 << 20;

/// How a VM's balloon driver reacts to new targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    Follow,
    /// Halfway per round.
    Lag,
    Refuse,
}

#[derive(Debug, Clone)]
pub struct VmSpec {
    pub dram: u64,
    pub slow: u64,
    /// Initial balloon targets as a share of the tier size.
    pub init: (f64, f64),
    /// Initial actual = target + this (clamped to the size).
    pub init_lag: u64,
    pub behaviour: Behaviour,
    pub balloon_ok: bool,
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub config: Config,
    pub vms: Vec<VmSpec>,
    pub rounds: usize,
    pub seed: u64,
}

/// Whole pages, up to `max` bytes.
fn pages(rng: &mut Rng, max: u64) -> u64 {
    rng.below(max / PAGE + 1) * PAGE
}

fn chance(rng: &mut Rng, p: f64) -> bool {
    rng.unit() < p
}

/// Random limits for a tier of `size` bytes, or none.
fn limits(rng: &mut Rng, size: u64) -> Option<Limits> {
    if !chance(rng, 0.3) {
        return None;
    }
    let floor = (size as f64 * rng.unit()) as u64 / PAGE * PAGE;
    let ceiling = floor + ((size - floor) as f64 * rng.unit()) as u64 / PAGE * PAGE;
    let open = chance(rng, 0.5);
    Some(Limits {
        floor,
        ceiling: (!open).then_some(ceiling),
    })
}

/// A VM and its overrides (if any).
fn vm(rng: &mut Rng) -> (VmSpec, Option<VmOverride>) {
    let (dram, slow) = (pages(rng, 512 * MIB), pages(rng, 512 * MIB));
    let behaviour = match rng.below(9) {
        0..=5 => Behaviour::Follow,
        6 | 7 => Behaviour::Lag,
        _ => Behaviour::Refuse,
    };
    let spec = VmSpec {
        dram,
        slow,
        init: (rng.unit(), rng.unit()),
        init_lag: if chance(rng, 0.25) {
            pages(rng, 64 * MIB)
        } else {
            0
        },
        behaviour,
        balloon_ok: chance(rng, 0.97),
    };
    let mut lim = HashMap::new();
    for (name, size) in [("dram", dram), ("slow", slow)] {
        if let Some(l) = limits(rng, size) {
            lim.insert(name.to_string(), l);
        }
    }
    let excluded = chance(rng, 0.05);
    let target = chance(rng, 0.3).then(|| rng.unit());
    let o = (!lim.is_empty() || excluded || target.is_some()).then_some(VmOverride {
        target,
        limits: lim,
        excluded,
        mode: None,
    });
    (spec, o)
}

impl Scenario {
    /// `n` VMs, `rounds` rounds, everything else drawn from `seed`.
    pub fn random(n: usize, rounds: usize, seed: u64) -> Scenario {
        let mut rng = Rng::new(seed);
        let vms: Vec<_> = (0..n).map(|_| vm(&mut rng)).collect();
        let total: u64 = vms.iter().map(|(v, _)| v.dram).sum();
        let budget = chance(&mut rng, 0.7)
            .then(|| ((total as f64 * rng.range(0.2, 1.5)) as u64 / PAGE * PAGE).max(PAGE));
        let overrides = vms
            .iter()
            .enumerate()
            .filter_map(|(i, (_, o))| o.clone().map(|o| (format!("vm{i}"), o)))
            .collect();
        let tolerance = [0, MIB, 4 * MIB][rng.below(3) as usize];
        Scenario {
            config: Config {
                enabled: chance(&mut rng, 0.95),
                dry_run: false,
                default_target: rng.unit(),
                epsilon: rng.range(0.0, 0.5),
                budget,
                max_step: (rng.below(64 * MIB / PAGE) + 1) * PAGE,
                cooldown_intervals: rng.below(3) as u32,
                idle_threshold: rng.unit(),
                vms: overrides,
                tuning: Tuning {
                    hysteresis_window: rng.below(12) as u32,
                    balloon_tolerance: tolerance,
                    grace_intervals: rng.below(4) as u32,
                    min_step: None,
                    move_reserve: rng.unit(),
                    hold_band: rng.unit(),
                    new_load: rng.range(0.0, 2.0),
                    act_on: [ActOn::Interval, ActOn::Point, ActOn::Protective]
                        [rng.below(3) as usize],
                    fill_max_intervals: rng.below(30) as u32,
                },
                // Either mode; hot horizons the VMs report (0, 1, 10, 60)
                // or not (7); any SLO.
                mode: if chance(&mut rng, 0.5) {
                    Mode::WorkingSet
                } else {
                    Mode::Ratio
                },
                working_set: WorkingSet {
                    hot_horizon: [0.0, 1.0, 10.0, 60.0, 7.0][rng.below(5) as usize],
                    promotion_slo: if chance(&mut rng, 0.5) {
                        0.0
                    } else {
                        rng.range(0.0, 0.05)
                    },
                },
                reclaim: if chance(&mut rng, 0.5) {
                    Reclaim::OnDemand
                } else {
                    Reclaim::Eager
                },
            },
            vms: vms.into_iter().map(|(v, _)| v).collect(),
            rounds,
            seed,
        }
    }
}

/// Scenarios of 1-5 VMs over 1-6 rounds; the seed draws the rest.
pub fn scenario() -> impl Strategy<Value = Scenario> {
    (1usize..6, 1usize..7, any::<u64>())
        .prop_map(|(n, rounds, seed)| Scenario::random(n, rounds, seed))
}

/// A tier's (floor, ceiling) in bytes given, as the controller resolves it.
pub fn bounds(cfg: &Config, o: &VmObs, t: &TierObs) -> (u64, u64) {
    let (lo, hi) = cfg
        .vm(&o.id, &o.name)
        .and_then(|v| v.limits.get(&t.name))
        .copied()
        .unwrap_or(Limits {
            floor: 0,
            ceiling: None,
        })
        .resolve(t.size);
    // What the actuator cannot take (a virtio-mem zone's boot part).
    let fixed = t.reach.map_or(0, |r| t.size.saturating_sub(r));
    (lo.max(fixed), hi.max(fixed))
}

/// DRAM held against the budget, before (`after` false) or after a plan.
pub fn committed(obs: &[VmObs], targets: &[Targets], after: bool) -> u64 {
    obs.iter()
        .zip(targets)
        .map(|(o, t)| {
            let target = if after { t.dram } else { o.dram.balloon_target };
            if t.status == VmStatus::Uncooperative {
                o.dram.size - target.min(o.dram.balloon_actual).min(o.dram.size)
            } else {
                o.dram.size.saturating_sub(target)
            }
        })
        .sum()
}

fn tier(name: &str, size: u64, share: f64, lag: u64) -> TierObs {
    let target = (size as f64 * share) as u64 / PAGE * PAGE;
    TierObs {
        name: name.into(),
        size,
        balloon_target: target,
        balloon_actual: (target + lag).min(size),
        ..Default::default()
    }
}

/// An estimate around `b` with a random interval (possibly exact).
fn est(rng: &mut Rng, b: f64) -> Est {
    let w = if chance(rng, 0.1) {
        0.0
    } else {
        rng.range(0.0, 0.5)
    };
    Est::new(b, b * (1.0 - w), b * (1.0 + w)).unwrap_or_default()
}

/// Random ages for a tier holding `held`: horizons 1, 10, 60 s with
/// growing working sets, some not measured; or none at all.
fn ages(rng: &mut Rng, held: u64) -> Option<TierAges> {
    if chance(rng, 0.15) {
        return None;
    }
    let mut ws = 0.0;
    let mut horizons = Vec::new();
    for h in [1.0, 10.0, 60.0] {
        ws += (held as f64 - ws) * rng.unit();
        let measured = !chance(rng, 0.1);
        horizons.push(Horizon {
            seconds: h,
            bytes: measured.then(|| est(rng, ws)),
            why: if measured {
                String::new()
            } else {
                "watched too briefly".into()
            },
        });
    }
    let long = !chance(rng, 0.2);
    Some(TierAges {
        horizons,
        cold: long.then(|| est(rng, held as f64 - ws)),
        promoted_per_s: long.then(|| {
            let r = rng_rate(rng);
            est(rng, r)
        }),
        history_seconds: 60.0,
        not_measured: if chance(rng, 0.05) {
            "no ages from this backend".into()
        } else {
            String::new()
        },
    })
}

fn rng_rate(rng: &mut Rng) -> f64 {
    if chance(rng, 0.5) {
        0.0
    } else {
        rng.range(0.0, 1e7)
    }
}

/// Random host samples for what the guest holds.
fn sample(rng: &mut Rng, t: &mut TierObs) {
    t.ages = ages(rng, t.held());
    let held = t.held();
    t.accesses = if rng.unit() < 0.15 {
        0.0
    } else {
        rng.range(0.0, 1e6)
    };
    t.accessed_bytes = (held as f64 * rng.unit()) as u64 / PAGE * PAGE;
    t.idle_bytes = held - t.accessed_bytes;
}

/// What came with the sample: no interval (sampling error only), an
/// estimator interval (any width, ends open or not) or a PMU count.
fn evidence(rng: &mut Rng) -> HitEvidence {
    match rng.below(4) {
        0 => HitEvidence::Sampling {
            error: rng.range(0.0, 0.1),
        },
        1 => HitEvidence::Counted(rng.unit()),
        _ => {
            let (a, b) = (rng.unit(), rng.unit());
            let (low_open, high_open) = (chance(rng, 0.2), chance(rng, 0.3));
            HitEvidence::Interval {
                low: if low_open { 0.0 } else { a.min(b) },
                high: if high_open { 1.0 } else { a.max(b) },
                low_open,
                high_open,
            }
        }
    }
}

fn moved(b: Behaviour, actual: u64, target: u64) -> u64 {
    match b {
        Behaviour::Follow => target,
        Behaviour::Lag => actual / 2 + target / 2,
        Behaviour::Refuse => actual,
    }
}

impl Scenario {
    /// Round 0's observations (samples from the scenario's seed).
    pub fn first_round(&self) -> Vec<VmObs> {
        let mut rng = Rng::new(self.seed ^ 0xf125);
        let mut obs: Vec<VmObs> = self
            .vms
            .iter()
            .enumerate()
            .map(|(i, v)| VmObs {
                id: format!("vm{i}"),
                name: format!("name{i}"),
                dram: tier("dram", v.dram, v.init.0, v.init_lag),
                slow: tier("slow", v.slow, v.init.1, v.init_lag),
                balloon_ok: v.balloon_ok,
                guest_accesses: None,
                hit: Default::default(),
            })
            .collect();
        for o in &mut obs {
            sample(&mut rng, &mut o.dram);
            sample(&mut rng, &mut o.slow);
            o.hit = evidence(&mut rng);
        }
        // A quarter of the VMs are driven by virtio-mem zone resize: only
        // part of the DRAM tier can be taken, the slow tier none or part
        // (docs/virtio-mem.md). Own generator: the other draws stay as they were.
        let mut rr = Rng::new(self.seed ^ 0x7e5c);
        for o in &mut obs {
            if chance(&mut rr, 0.25) {
                // At least the target in force: an actuator reports what
                // it took, so the target is always within its reach.
                let part = |rr: &mut Rng, t: &TierObs| {
                    let room = t.size.saturating_sub(t.balloon_target);
                    t.balloon_target + (room as f64 * rr.unit()) as u64 / PAGE * PAGE
                };
                o.dram.reach = Some(part(&mut rr, &o.dram));
                o.slow.reach = Some(if chance(&mut rr, 0.5) {
                    o.slow.balloon_target
                } else {
                    part(&mut rr, &o.slow)
                });
            }
        }
        obs
    }

    /// Lagging guests refuse instead (for the uncooperative property).
    pub fn refuse_all_lagging(&mut self) {
        for v in &mut self.vms {
            if v.behaviour == Behaviour::Lag {
                v.behaviour = Behaviour::Refuse;
            }
        }
    }

    /// VMs that the controller must have marked uncooperative by the end.
    pub fn must_be_marked(&self) -> Vec<String> {
        let t = &self.config.tuning;
        let obs = self.first_round();
        self.vms
            .iter()
            .zip(&obs)
            .filter(|(v, o)| {
                let excluded = self.config.vm(&o.id, &o.name).is_some_and(|x| x.excluded);
                let stuck = v.behaviour == Behaviour::Refuse
                    && [&o.dram, &o.slow].iter().any(|t2| {
                        t2.balloon_actual.abs_diff(t2.balloon_target) > t.balloon_tolerance
                    })
                    && self.rounds > t.grace_intervals as usize;
                !excluded && (!v.balloon_ok || stuck)
            })
            .map(|(_, o)| o.id.clone())
            .collect()
    }
}

/// Runs the scenario's rounds; `check` sees each round's input and plan.
pub fn run(
    s: &Scenario,
    c: &mut Controller,
    mut check: impl FnMut(&[VmObs], &Plan) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    let mut obs = s.first_round();
    let mut rng = Rng::new(s.seed ^ 0x5eed);
    for round in 0..s.rounds {
        let plan = c.decide(&obs, round as u64);
        check(&obs, &plan)?;
        for ((o, t), v) in obs.iter_mut().zip(&plan.targets).zip(&s.vms) {
            for (tier, target) in [(&mut o.dram, t.dram), (&mut o.slow, t.slow)] {
                tier.balloon_target = target;
                tier.balloon_actual = moved(v.behaviour, tier.balloon_actual, target);
                sample(&mut rng, tier);
            }
            o.hit = evidence(&mut rng);
        }
    }
    Ok(())
}
