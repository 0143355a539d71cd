//! Drives the matrix through tierd's own pipeline (registry, aggregator,
//! sampler passes at interval / passes_per_interval, as `tierd run` does)
//! and records truth, guest-reported and host readings per interval.

use std::time::{Duration, Instant};

use anyhow::Context;
use tier_benches::workload::{Shape, Truth, WorkloadSource};
use tier_profiler::aggregate::Aggregator;
use tier_profiler::registry::Registry;
use tier_profiler::sampler::Sampler;
use tier_proto::v1::StatsUpdate;

use crate::matrix::{CHANGE_AT, INTERVALS, Workload};

/// What a host backend reported for one interval.
#[derive(Debug, Clone, Copy, Default)]
pub struct Host {
    pub ratio: Option<f64>,
    /// Most pages young in one pass [dram, slow].
    pub young: [u64; 2],
    /// Young pages summed over passes [dram, slow].
    pub estimated: [f64; 2],
    pub passes: u32,
    /// Time spent in the sampler over the interval's passes.
    pub scan_ns: u64,
}

/// One interval.
#[derive(Debug, Clone)]
pub struct Record {
    pub index: usize,
    /// End of the interval, seconds since the run started.
    pub t_s: f64,
    pub workload: usize,
    pub step: usize,
    /// First interval of a workload, after its shape was set: not scored.
    pub warmup: bool,
    /// The shape changed inside this interval.
    pub change: bool,
    pub shape: Shape,
    pub truth: [u64; 2],
    pub guest: Option<[u64; 2]>,
    pub host: Option<Host>,
}

/// One interval to run.
struct Plan {
    workload: usize,
    step: usize,
    warmup: bool,
    /// Applied at the start of the interval.
    start: Option<Shape>,
    /// Applied at CHANGE_AT of the interval.
    change: Option<Shape>,
}

fn plans(matrix: &[Workload]) -> Vec<Plan> {
    let mut out = Vec::new();
    for (w, work) in matrix.iter().enumerate() {
        for (s, shape) in work.steps.iter().enumerate() {
            let first = s == 0;
            if first {
                out.push(Plan {
                    workload: w,
                    step: 0,
                    warmup: true,
                    start: Some(*shape),
                    change: None,
                });
            }
            for i in 0..INTERVALS {
                out.push(Plan {
                    workload: w,
                    step: s,
                    warmup: false,
                    start: None,
                    change: (!first && i == 0).then_some(*shape),
                });
            }
        }
    }
    out
}

pub struct Pipeline<'a> {
    pub source: &'a dyn WorkloadSource,
    pub sampler: Option<&'a mut dyn Sampler>,
    pub interval: Duration,
    pub passes: u32,
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// Runs every plan; prints one progress line per workload to stderr.
pub fn run(p: Pipeline<'_>, matrix: &[Workload]) -> anyhow::Result<Vec<Record>> {
    let Pipeline {
        source,
        mut sampler,
        interval,
        passes,
    } = p;
    let mut registry = Registry::default();
    registry.insert(source.tracked());
    let vm_id = registry
        .iter()
        .next()
        .map(|t| t.vm().id.clone())
        .context("registry is empty")?;
    let mut agg = Aggregator::default();
    let started = Instant::now();
    let mut next = started;

    let mut tick =
        |agg: &mut Aggregator, reg: &mut Registry, start: Instant, change: Option<Shape>| {
            interval_passes(
                Interval {
                    source,
                    sampler: sampler.as_deref_mut().map(|s| s as &mut dyn Sampler),
                    start,
                    interval,
                    passes,
                    change,
                },
                agg,
                reg,
            )
        };
    // One interval that only arms the sampler (its first pass reports nothing).
    tick(&mut agg, &mut registry, next, None)?;
    next += interval;
    let mut last_truth = source.truth();
    let mut records = Vec::new();
    let plans = plans(matrix);
    for (index, plan) in plans.iter().enumerate() {
        source.check()?;
        if plan.warmup {
            let w = &matrix[plan.workload];
            eprintln!(
                "  [{:>3}/{}] {} ({})",
                index + 1,
                plans.len(),
                w.name,
                w.steps
                    .iter()
                    .map(|s| s.label())
                    .collect::<Vec<_>>()
                    .join(" -> ")
            );
        }
        if let Some(s) = plan.start {
            source.apply(s)?;
        }
        let (truth, update) = tick(&mut agg, &mut registry, next, plan.change)?;
        next += interval;
        let delta = [
            truth.accesses[0] - last_truth.accesses[0],
            truth.accesses[1] - last_truth.accesses[1],
        ];
        last_truth = truth;
        let (guest, host) = readings(&update, &vm_id);
        records.push(Record {
            index,
            t_s: started.elapsed().as_secs_f64(),
            workload: plan.workload,
            step: plan.step,
            warmup: plan.warmup,
            change: plan.change.is_some(),
            shape: source.shape(),
            truth: delta,
            guest,
            host,
        });
    }
    Ok(records)
}

struct Interval<'a> {
    source: &'a dyn WorkloadSource,
    sampler: Option<&'a mut dyn Sampler>,
    start: Instant,
    interval: Duration,
    passes: u32,
    change: Option<Shape>,
}

/// The passes of one interval, the last one closing it: the truth is read
/// just before tierd's tick.
fn interval_passes(
    i: Interval<'_>,
    agg: &mut Aggregator,
    reg: &mut Registry,
) -> anyhow::Result<(Truth, StatsUpdate)> {
    let Interval {
        source,
        mut sampler,
        start,
        interval,
        passes,
        change,
    } = i;
    let pass_len = interval / passes.max(1);
    let interval_ns = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX);
    let change_at = start + interval.mul_f64(CHANGE_AT);
    let mut change = change;
    for k in 1..=passes {
        let at = start + pass_len * k;
        if change_at <= at
            && let Some(s) = change.take()
        {
            sleep_until(change_at);
            source.apply(s)?;
        }
        sleep_until(at);
        let s = sampler.as_deref_mut().map(|s| s as &mut dyn Sampler);
        if k < passes {
            agg.pass(reg, s);
        } else {
            let truth = source.truth();
            let update = agg.tick(reg, s, interval_ns);
            return Ok((truth, update));
        }
    }
    anyhow::bail!("passes_per_interval is 0")
}

/// The VM's guest-reported deltas and host estimate in one update.
fn readings(u: &StatsUpdate, vm_id: &str) -> (Option<[u64; 2]>, Option<Host>) {
    let Some(s) = u.stats.iter().find(|s| s.vm_id == vm_id) else {
        return (None, None);
    };
    let tier = |name: &str| s.tiers.iter().find(|t| t.tier == name);
    let guest = match s.guest_reported_accesses.as_slice() {
        [d, w] => Some([*d, *w]),
        _ => None,
    };
    let host = match (tier("dram"), tier("slow"), u.health.first()) {
        (Some(d), Some(w), Some(h)) if d.passes > 0 || w.passes > 0 => Some(Host {
            ratio: s.has_accesses.then_some(s.dram_hit_ratio),
            young: [d.young_pages, w.young_pages],
            estimated: [d.estimated_accesses, w.estimated_accesses],
            passes: d.passes.max(w.passes),
            scan_ns: h.scan_cost_ns,
        }),
        _ => None,
    };
    (guest, host)
}
