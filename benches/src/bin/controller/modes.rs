//! Ratio mode and working_set mode side by side (docs/working-set.md) on the same
//! fleets: warm pages beside each hot set, a budget that covers every VM's
//! hot and warm set (what working_set mode keeps in DRAM) as well as the
//! DRAM for the ratio target, ages sampled at 1/16 coverage with binomial
//! noise, a third of the VMs changing phase at interval 20 and back at 40.
//! Each mode is judged by its own target: ratio within epsilon of the
//! target, or the hot set (1 s working set) in DRAM within epsilon of its
//! size or the minimum step (step / 64 = 16 MiB: the controller moves
//! nothing smaller; without it one VM of 1000, 15.4 MiB short of a
//! 686 MiB hot set, counted as never converged). Wrong-way moves: DRAM to a VM that had more than its target
//! needs, or taken from one that had less, by the truth of the interval
//! decided on.

use tier_benches::{Row, Summary, print_table};
use tier_controller::policy::{Config, Mode};
use tier_sim::age_readings::AgeSampling;
use tier_sim::fleet::{FleetSpec, fleet};
use tier_sim::metrics::{converge_slack, cooperative, dram_moved, oscillations, wrong_way};
use tier_sim::{Sim, SimConfig};

use super::{EPSILON, RUNS, policy};

const PHASE: u64 = 20;
const BACK: u64 = 40;
const INTERVALS: u64 = 60;

/// One mode over one fleet size.
#[derive(Debug, Default)]
pub struct ModeSample {
    /// Intervals to target after the start, the phase change, the return.
    pub converge: [Vec<f64>; 3],
    pub not_converged: usize,
    pub moved_gib: Vec<f64>,
    pub wrong_way: Vec<f64>,
    pub flips: Vec<f64>,
    pub decide_ms: Vec<f64>,
}

impl ModeSample {
    /// Largest intervals-to-target over the three windows and all runs.
    pub fn converge_max(&self) -> f64 {
        self.converge.iter().flatten().copied().fold(0.0, f64::max)
    }
}

fn config(budget: u64, mode: Mode) -> Config {
    Config {
        mode,
        ..policy(budget)
    }
}

pub fn measure(vms: usize, mode: Mode) -> ModeSample {
    let mut m = ModeSample::default();
    for seed in 1..=RUNS {
        let spec = FleetSpec {
            vms,
            phase_change: Some((PHASE, 0.3)),
            phase_back: Some(BACK),
            uncooperative: 0.02,
            warm_share: (0.05, 0.2),
            budget_for_hot_set: true,
            seed,
            ..Default::default()
        };
        let f = fleet(&spec);
        let counted = cooperative(&f.vms);
        let sim_cfg = SimConfig {
            noise: 0.02,
            seed,
            ages: Some(AgeSampling::default()),
            ..SimConfig::default()
        };
        let mut sim = Sim::new(f.vms, sim_cfg, config(f.budget, mode));
        let steps = sim.run(INTERVALS);
        m.decide_ms
            .extend(steps.iter().map(|s| s.decide_ns as f64 / 1e6));
        let (p, b, n) = (PHASE as usize, BACK as usize, INTERVALS as usize);
        for (i, (from, to)) in [(0, p), (p, b), (b, n)].into_iter().enumerate() {
            // A working_set VM short of its hot set by less than the
            // minimum step is left alone by design: at target.
            let slack = sim.controller.config().min_step();
            match converge_slack(&steps, from, to, EPSILON, slack, &counted) {
                Some(k) => m.converge[i].push(k as f64),
                None => {
                    m.not_converged += 1;
                    m.converge[i].push((to - from) as f64);
                }
            }
        }
        m.moved_gib
            .push(dram_moved(&steps, 0, n) as f64 / f64::from(1u32 << 30));
        m.wrong_way.push(wrong_way(&steps, 0, n, EPSILON) as f64);
        m.flips.push(oscillations(&steps, 0, n) as f64);
    }
    m
}

fn row(name: String, unit: &'static str, v: &[f64], base: Option<f64>) -> anyhow::Result<Row> {
    let summary = Summary::of(v).ok_or_else(|| anyhow::anyhow!("empty sample: {name}"))?;
    let ratio = base.filter(|b| *b > 0.0).map(|b| summary.median / b);
    Ok(Row {
        name,
        unit,
        summary,
        ratio,
    })
}

fn median(v: &[f64]) -> Option<f64> {
    Summary::of(v).map(|s| s.median)
}

/// The side-by-side table for one fleet size; ratios are working_set over
/// ratio mode.
pub fn table(vms: usize, r: &ModeSample, w: &ModeSample) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    let windows = ["after start", "after phase change", "after return"];
    for (i, win) in windows.iter().enumerate() {
        rows.push(row(
            format!("ratio: to target {win}"),
            "intervals",
            &r.converge[i],
            None,
        )?);
        rows.push(row(
            format!("working_set: to target {win}"),
            "intervals",
            &w.converge[i],
            median(&r.converge[i]),
        )?);
    }
    for (name, unit, a, b) in [
        ("DRAM moved", "GiB/run", &r.moved_gib, &w.moved_gib),
        ("wrong-way moves", "per run", &r.wrong_way, &w.wrong_way),
        ("flip-backs", "per run", &r.flips, &w.flips),
        ("decide", "ms/interval", &r.decide_ms, &w.decide_ms),
    ] {
        rows.push(row(format!("ratio: {name}"), unit, a, None)?);
        rows.push(row(format!("working_set: {name}"), unit, b, median(a))?);
    }
    print_table(
        &format!(
            "{vms} VMs, modes side by side: {RUNS} runs x {INTERVALS} intervals, warm pages, phase change at {PHASE} and back at {BACK}, ages at 1/16 coverage (not converged: ratio {}, working_set {} runs x windows)",
            r.not_converged, w.not_converged
        ),
        &rows,
    );
    Ok(())
}
