//! The controller's decision function on simulated fleets of 8, 64 and 1000
//! VMs (tier_sim: Zipf-like hot sets, 2 % sampling noise, 2 % of
//! guests refusing their balloon, a third of the VMs changing phase at
//! interval 20, balloons at 1 GiB/s, samples of an interval in which a
//! balloon moved mix before and after): intervals until every cooperative
//! VM is within epsilon of its target, after the start and after the phase
//! change, against an oracle that knows each VM's need and is bound only by
//! the same step (the baseline; also shown bound by step and cooldown after
//! every change, as a controller that re-assesses before each step is);
//! reversals under constant load and flip-backs; DRAM utilisation; wall
//! time of one decision round, against a trivial proportional split of the
//! same budget over the same observations (the baseline), and 1000 VMs
//! against 8. Then ratio and working_set mode side by side (`modes`).

mod modes;

use std::time::Instant;

use anyhow::Context;
use tier_benches::{Row, Summary, print_table, result_line};
use tier_controller::policy::{Config, Mode, Tuning, VmObs};
use tier_sim::fleet::{FleetSpec, fleet};
use tier_sim::metrics::{
    converge, cooperative, oracle_converge, oscillations, reversals, utilisation,
};
use tier_sim::{Sim, SimConfig};

const RUNS: u64 = 5;
const PHASE: u64 = 20;
const INTERVALS: u64 = 40;
const EPSILON: f64 = 0.02;
/// What a 1 GiB/s balloon moves in one 1 s interval.
const STEP: u64 = 1 << 30;
const COOLDOWN: u32 = 1;

fn policy(budget: u64) -> Config {
    Config {
        enabled: true,
        dry_run: false,
        default_target: 0.9,
        epsilon: EPSILON,
        budget: Some(budget),
        max_step: STEP,
        cooldown_intervals: COOLDOWN,
        idle_threshold: 0.5,
        vms: Default::default(),
        tuning: Tuning::default(),
        mode: Default::default(),
        working_set: Default::default(),
        reclaim: tier_controller::policy::Reclaim::OnDemand,
    }
}

/// The baseline: DRAM in proportion to each VM's accesses, capped at the
/// tier size; balloon targets out.
fn proportional(obs: &[VmObs], budget: u64) -> Vec<u64> {
    let total: f64 = obs
        .iter()
        .map(|o| o.dram.accesses() + o.slow.accesses())
        .sum();
    obs.iter()
        .map(|o| {
            let share = if total > 0.0 {
                (o.dram.accesses() + o.slow.accesses()) / total
            } else {
                0.0
            };
            let given = ((budget as f64 * share) as u64).min(o.dram.size);
            o.dram.size - given
        })
        .collect()
}

/// Everything measured for one fleet size.
#[derive(Debug, Default)]
struct Sample {
    converge: Vec<f64>,
    converge_phase: Vec<f64>,
    /// The same for an oracle bound only by the step.
    oracle: Vec<f64>,
    oracle_phase: Vec<f64>,
    /// ... and for one that also waits out the cooldown after each change.
    oracle_cd: Vec<f64>,
    oracle_cd_phase: Vec<f64>,
    not_converged: usize,
    /// Reversals before the phase change (constant load).
    reversals: Vec<f64>,
    flips: Vec<f64>,
    util: Vec<f64>,
    decide_ms: Vec<f64>,
    baseline_ms: Vec<f64>,
}

fn measure(vms: usize) -> Sample {
    let mut m = Sample::default();
    for seed in 1..=RUNS {
        let spec = FleetSpec {
            vms,
            phase_change: Some((PHASE, 0.3)),
            uncooperative: 0.02,
            seed,
            ..Default::default()
        };
        let f = fleet(&spec);
        let counted = cooperative(&f.vms);
        let sim_cfg = SimConfig {
            noise: 0.02,
            seed,
            ..SimConfig::default()
        };
        let mut sim = Sim::new(f.vms, sim_cfg, policy(f.budget));
        let mut steps = Vec::new();
        for _ in 0..INTERVALS {
            let s = sim.step();
            m.decide_ms.push(s.decide_ns as f64 / 1e6);
            let t = Instant::now();
            let targets = proportional(sim.observations(), f.budget);
            m.baseline_ms.push(t.elapsed().as_secs_f64() * 1e3);
            std::hint::black_box(targets);
            steps.push(s);
        }
        let (p, n) = (PHASE as usize, INTERVALS as usize);
        for (from, to, out) in [(0, p, &mut m.converge), (p, n, &mut m.converge_phase)] {
            match converge(&steps, from, to, EPSILON, &counted) {
                Some(k) => out.push(k as f64),
                None => {
                    m.not_converged += 1;
                    out.push((to - from) as f64);
                }
            }
        }
        for (from, cd, out) in [
            (0, 0, &mut m.oracle),
            (p, 0, &mut m.oracle_phase),
            (0, COOLDOWN, &mut m.oracle_cd),
            (p, COOLDOWN, &mut m.oracle_cd_phase),
        ] {
            let o = oracle_converge(&sim.vms, &steps, from, EPSILON, STEP, cd, &counted);
            out.extend(o.map(|k| k as f64));
        }
        m.reversals.push(reversals(&steps, 0, p) as f64);
        m.flips.push(oscillations(&steps, 0, n) as f64);
        for k in [p - 1, n - 1] {
            m.util.extend(utilisation(&steps, k).map(|u| u * 100.0));
        }
    }
    m
}

type Side = (modes::ModeSample, modes::ModeSample);

/// Largest intervals-to-target of one mode over all fleet sizes.
fn side_max(side: &[Side], f: impl Fn(&Side) -> &modes::ModeSample) -> f64 {
    side.iter().map(|p| f(p).converge_max()).fold(0.0, f64::max)
}

/// Median of one measure of one mode at the largest fleet.
fn last_median(side: &[Side], f: impl Fn(&Side) -> &Vec<f64>) -> f64 {
    side.last()
        .and_then(|p| Summary::of(f(p)))
        .map_or(f64::NAN, |s| s.median)
}

fn main() -> anyhow::Result<()> {
    let s = |v: &[f64]| Summary::of(v).context("empty sample");
    let mut converge_max = 0.0f64;
    let mut medians = Vec::new();
    for vms in [8usize, 64, 1000] {
        let m = measure(vms);
        let (d, b) = (s(&m.decide_ms)?, s(&m.baseline_ms)?);
        let (c, cp) = (s(&m.converge)?, s(&m.converge_phase)?);
        let (o, op) = (s(&m.oracle)?, s(&m.oracle_phase)?);
        let (ocd, ocdp) = (s(&m.oracle_cd)?, s(&m.oracle_cd_phase)?);
        converge_max = converge_max.max(c.max).max(cp.max);
        medians.push((vms, d.median));
        print_table(
            &format!(
                "{vms} VMs: {RUNS} runs x {INTERVALS} intervals, target 0.9 +- {EPSILON}, step 1 GiB, cooldown 1 ({} runs x phases not converged)",
                m.not_converged
            ),
            &[
                Row {
                    name: "oracle after start, baseline".into(),
                    unit: "intervals",
                    summary: o,
                    ratio: None,
                },
                Row {
                    name: "oracle + cooldown, after start".into(),
                    unit: "intervals",
                    summary: ocd,
                    ratio: None,
                },
                Row {
                    name: "converge after start".into(),
                    unit: "intervals",
                    summary: c,
                    ratio: Some(c.median / o.median),
                },
                Row {
                    name: "oracle after phase, baseline".into(),
                    unit: "intervals",
                    summary: op,
                    ratio: None,
                },
                Row {
                    name: "oracle + cooldown, after phase".into(),
                    unit: "intervals",
                    summary: ocdp,
                    ratio: None,
                },
                Row {
                    name: "converge after phase change".into(),
                    unit: "intervals",
                    summary: cp,
                    ratio: Some(cp.median / op.median),
                },
                Row {
                    name: "reversals before phase change".into(),
                    unit: "per run",
                    summary: s(&m.reversals)?,
                    ratio: None,
                },
                Row {
                    name: "flip-backs (+-+ / -+-)".into(),
                    unit: "per run",
                    summary: s(&m.flips)?,
                    ratio: None,
                },
                Row {
                    name: "DRAM held / budget".into(),
                    unit: "%",
                    summary: s(&m.util)?,
                    ratio: None,
                },
                Row {
                    name: "proportional split, baseline".into(),
                    unit: "ms/interval",
                    summary: b,
                    ratio: None,
                },
                Row {
                    name: "decide (controller)".into(),
                    unit: "ms/interval",
                    summary: d,
                    ratio: Some(d.median / b.median),
                },
            ],
        );
        println!();
    }
    let mut side = Vec::new();
    for vms in [8usize, 64, 1000] {
        let (r, w) = (
            modes::measure(vms, Mode::Ratio),
            modes::measure(vms, Mode::WorkingSet),
        );
        modes::table(vms, &r, &w)?;
        println!();
        side.push((r, w));
    }
    let small = medians.first().map_or(f64::NAN, |m| m.1);
    let large = medians.last().map_or(f64::NAN, |m| m.1);
    println!(
        "decide median, 1000 VMs / 8 VMs: {:.1}x for 125x the VMs",
        large / small
    );
    println!(
        "{}",
        result_line(&[
            ("converge_intervals_max", format!("{converge_max:.0}")),
            ("decide_ms_1000", format!("{large:.3}")),
            (
                "ratio_converge_max",
                format!("{:.0}", side_max(&side, |p| &p.0))
            ),
            (
                "ws_converge_max",
                format!("{:.0}", side_max(&side, |p| &p.1))
            ),
            (
                "ratio_moved_gib_1000",
                format!("{:.1}", last_median(&side, |p| &p.0.moved_gib)),
            ),
            (
                "ws_moved_gib_1000",
                format!("{:.1}", last_median(&side, |p| &p.1.moved_gib)),
            ),
            (
                "ratio_wrong_way_1000",
                format!("{:.0}", last_median(&side, |p| &p.0.wrong_way)),
            ),
            (
                "ws_wrong_way_1000",
                format!("{:.0}", last_median(&side, |p| &p.1.wrong_way)),
            ),
        ])
    );
    Ok(())
}
