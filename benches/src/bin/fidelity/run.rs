//! Drives the matrix through tierd's own pipeline (registry, aggregator,
//! sampler passes at interval / passes_per_interval, as `tierd run` does)
//! and records truth, guest-reported and host readings per interval.

use std::time::{Duration, Instant};

use anyhow::Context;
use tier_benches::progress::Progress;
use tier_benches::workload::{Schedule, Shape, WorkloadSource};
use tier_profiler::aggregate::{Aggregator, pass_ends};
use tier_profiler::registry::Registry;
use tier_profiler::sampler::Sampler;
use tier_proto::v1::StatsUpdate;

use crate::coverage::ratio_interval;
use crate::matrix::{CHANGE_AT, Workload};
use crate::ws::{WsPoint, points};

/// What a host backend reported for one interval.
#[derive(Debug, Clone, Default)]
pub struct Host {
    pub ratio: Option<f64>,
    /// Most pages young in one pass [dram, slow].
    pub young: [u64; 2],
    /// Young pages summed over passes [dram, slow].
    pub estimated: [f64; 2],
    pub passes: u32,
    /// Time spent in the sampler over the interval's passes.
    pub scan_ns: u64,
    /// What the fit worked from, [dram, slow]: the seconds each pass
    /// watched the tier and its young pages (empty where it did not run).
    pub passes_fit: [TierPasses; 2],
    /// The same for the VM's other tiers (the test guest's `sys`): the fit
    /// pools them with dram and slow, so a re-fit needs them too.
    pub passes_other: Vec<TierPasses>,
    /// ~95 % interval of the ratio over dram and slow, from the tiers'
    /// accesses_low/high as tierd forms it (coverage.rs); None: the
    /// estimate gave none.
    pub interval: Option<(f64, f64)>,
    /// The VM's own dram_hit_low/high (all its tiers, the test guest's
    /// `sys` included, so not scored against the truth; CSV only).
    pub vm_interval: Option<(f64, f64)>,
}

/// One tier's passes as the fit saw them.
#[derive(Debug, Clone, Default)]
pub struct TierPasses {
    pub seconds: Vec<f64>,
    pub young: Vec<u64>,
}

impl TierPasses {
    fn of(t: &tier_proto::v1::TierSample) -> TierPasses {
        TierPasses {
            seconds: t.pass_seconds.clone(),
            young: t.pass_young_pages.clone(),
        }
    }
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
    /// Working set per horizon and tier against the exact pages touched.
    pub ws: Vec<WsPoint>,
}

/// One interval of a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    step: usize,
    warmup: bool,
    /// The step that starts at CHANGE_AT of this interval.
    change: Option<usize>,
}

/// The intervals of a row of `steps` steps, in order: the warm-up
/// interval(s), then `per_step` per step, each change in the first interval
/// of its step.
fn row_plans(steps: usize, schedule: &Schedule) -> Vec<Plan> {
    let mut out = Vec::new();
    for _ in 0..schedule.warmup {
        out.push(Plan {
            step: 0,
            warmup: true,
            change: None,
        });
    }
    for s in 0..steps {
        for i in 0..schedule.per_step {
            out.push(Plan {
                step: s,
                warmup: false,
                change: (s > 0 && i == 0).then_some(s),
            });
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

/// Records of every interval, and how far from its scheduled instant each
/// phase change was seen (seconds; sources that can tell).
pub struct Output {
    pub records: Vec<Record>,
    pub change_offsets_s: Vec<f64>,
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// The schedule of a row with `per_step` measured intervals per step.
pub fn schedule(interval: Duration, per_step: usize) -> Schedule {
    Schedule {
        interval,
        warmup: 1,
        per_step: u32::try_from(per_step).unwrap_or(u32::MAX),
        change_at: CHANGE_AT,
    }
}

/// Runs every row; prints one progress line per workload to stderr.
pub fn run(p: Pipeline<'_>, matrix: &[Workload]) -> anyhow::Result<Output> {
    let Pipeline {
        source,
        mut sampler,
        interval,
        passes,
    } = p;
    let mut registry = Registry::default();
    let mut agg = Aggregator::default();
    let started = Instant::now();
    let mut records = Vec::new();
    let mut offsets = Vec::new();
    let total: usize = matrix
        .iter()
        .map(|w| schedule(interval, w.per_step()).intervals(w.steps.len()))
        .sum();
    // One step per interval: rows differ in length.
    let progress = Progress::bar("fidelity", total as u64);
    for (w, work) in matrix.iter().enumerate() {
        let schedule = schedule(interval, work.per_step());
        source.check()?;
        progress.suspend(|| {
            eprintln!(
                "  [{:>3}/{}] {} ({})",
                records.len() + 1,
                total,
                work.name,
                work.steps
                    .iter()
                    .map(|s| s.label())
                    .collect::<Vec<_>>()
                    .join(" -> ")
            )
        });
        progress.item(format!("row {}/{}: {}", w + 1, matrix.len(), work.name));
        let row = source
            .begin_row(&work.steps, &schedule, &mut registry)
            .with_context(|| format!("starting workload {}", w + 1))?;
        sleep_until(row.t0);
        let mut last_truth = source.truth_at(row.t0)?;
        for (k, plan) in row_plans(work.steps.len(), &schedule)
            .into_iter()
            .enumerate()
        {
            let start = row.t0 + interval * u32::try_from(k).context("row length")?;
            let (at, read, update) = interval_passes(
                Interval {
                    source,
                    sampler: sampler.as_deref_mut().map(|s| s as &mut dyn Sampler),
                    start,
                    interval,
                    passes,
                    change: plan.change,
                },
                &mut agg,
                &mut registry,
            )?;
            let truth = source.truth_at(at)?;
            let delta = [
                truth.accesses[0].saturating_sub(last_truth.accesses[0]),
                truth.accesses[1].saturating_sub(last_truth.accesses[1]),
            ];
            last_truth = truth;
            let (guest, host) = readings(&update, &row.vm_id);
            let truth_ws = |at: Instant, h: f64| {
                source.touched_within(at, Duration::try_from_secs_f64(h).ok()?)
            };
            // Pages of dram and slow: where a working set's interval says
            // nothing (0 to the whole tier).
            let pages = registry
                .iter()
                .find(|t| t.vm().id == row.vm_id)
                .map(|t| {
                    ["dram", "slow"].map(|n| {
                        t.vm()
                            .tiers
                            .iter()
                            .find(|x| x.name == n)
                            .map_or(0, |x| x.size_bytes / 4096)
                    })
                })
                .unwrap_or_default();
            let ws = points(&update, &row.vm_id, read, &truth_ws, pages);
            records.push(Record {
                index: records.len(),
                t_s: started.elapsed().as_secs_f64(),
                workload: w,
                step: plan.step,
                warmup: plan.warmup,
                change: plan.change.is_some(),
                shape: work.steps[plan.step],
                truth: delta,
                guest,
                host,
                ws,
            });
            progress.inc();
        }
        offsets.extend(source.end_row(&mut registry)?);
    }
    progress.finish();
    Ok(Output {
        records,
        change_offsets_s: offsets,
    })
}

struct Interval<'a> {
    source: &'a dyn WorkloadSource,
    sampler: Option<&'a mut dyn Sampler>,
    start: Instant,
    interval: Duration,
    passes: u32,
    /// The step that starts at CHANGE_AT of this interval.
    change: Option<usize>,
}

/// The passes of one interval, the last one closing it after the source's
/// discovery step (as `tierd run` does); returns the instant just before
/// tierd's tick, at which the truth is to be read, the instant right
/// after it, at which its working-set horizons end, and the update.
fn interval_passes(
    i: Interval<'_>,
    agg: &mut Aggregator,
    reg: &mut Registry,
) -> anyhow::Result<(Instant, Instant, StatsUpdate)> {
    let Interval {
        source,
        mut sampler,
        start,
        interval,
        passes,
        change,
    } = i;
    let interval_ns = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX);
    let change_at = start + interval.mul_f64(CHANGE_AT);
    let mut change = change;
    let ends = pass_ends(interval, passes);
    let last = ends.len();
    for (k, end) in ends.into_iter().enumerate() {
        let at = start + end;
        if change_at <= at
            && let Some(s) = change.take()
        {
            sleep_until(change_at);
            source.change(s)?;
        }
        sleep_until(at);
        let s = sampler.as_deref_mut().map(|s| s as &mut dyn Sampler);
        if k + 1 < last {
            agg.pass(reg, s);
        } else {
            source.discover(reg);
            let at = Instant::now();
            let update = agg.tick(reg, s, interval_ns);
            // The tick's pass read the VM just now: the working set's
            // horizons end here, not before the walk.
            let read = Instant::now();
            source.mark(read);
            return Ok((at, read, update));
        }
    }
    anyhow::bail!("passes_per_interval is 0")
}

/// The VM's guest-reported deltas and host estimate in one update.
pub(crate) fn readings(u: &StatsUpdate, vm_id: &str) -> (Option<[u64; 2]>, Option<Host>) {
    let Some(s) = u.stats.iter().find(|s| s.vm_id == vm_id) else {
        return (None, None);
    };
    // Scored over the `dram` and `slow` tiers only: a source may give the
    // guest's own memory a tier of its own, which the truth does not count.
    let index = |name: &str| s.tiers.iter().position(|t| t.tier == name);
    let (Some(di), Some(wi)) = (index("dram"), index("slow")) else {
        return (None, None);
    };
    let g = &s.guest_reported_accesses;
    let guest = (g.len() == s.tiers.len()).then(|| [g[di], g[wi]]);
    let (d, w) = (&s.tiers[di], &s.tiers[wi]);
    let est = d.estimated_accesses + w.estimated_accesses;
    // A tier no pass read has unknown accesses, not none: no ratio.
    let raw = (est > 0.0 && d.passes > 0 && w.passes > 0).then(|| d.estimated_accesses / est);
    // The point scored is the one tierd publishes: none where it says the
    // ratio is not measured (a 0-100 % interval, a long pass it could not
    // carry a fit through); the interval is scored either way.
    let ratio = raw.filter(|_| s.dram_hit_not_measured.is_empty());
    let host = match u.health.first() {
        Some(h) if d.passes > 0 || w.passes > 0 => Some(Host {
            ratio,
            young: [d.young_pages, w.young_pages],
            estimated: [d.estimated_accesses, w.estimated_accesses],
            passes: d.passes.max(w.passes),
            scan_ns: h.scan_cost_ns,
            passes_fit: [TierPasses::of(d), TierPasses::of(w)],
            passes_other: s
                .tiers
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != di && *i != wi)
                .map(|(_, t)| TierPasses::of(t))
                .collect(),
            // No point, no interval: a missing ratio is missing, not 0.
            interval: raw.and_then(|p| ratio_interval(d, w, p)),
            vm_interval: s.dram_hit_low.zip(s.dram_hit_high),
        }),
        _ => None,
    };
    (guest, host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::INTERVALS;

    #[test]
    fn a_row_has_its_changes_in_the_first_interval_of_each_step() {
        let s = schedule(Duration::from_secs(1), INTERVALS);
        let plans = row_plans(3, &s);
        assert_eq!(plans.len(), s.intervals(3));
        assert!(plans[0].warmup && plans[0].change.is_none());
        let changes: Vec<(usize, usize)> = plans
            .iter()
            .enumerate()
            .filter_map(|(k, p)| Some((k, p.change?)))
            .collect();
        // Interval k of the row starts at k * interval: each change sits at
        // CHANGE_AT of the interval the schedule gives it.
        assert_eq!(
            changes,
            vec![(s.change_interval(1), 1), (s.change_interval(2), 2)]
        );
        for (k, step) in changes {
            let at = s.interval * k as u32 + s.interval.mul_f64(CHANGE_AT);
            assert_eq!(at, s.change_offset(step));
            assert_eq!(plans[k].step, step);
        }
        assert_eq!(
            plans.iter().filter(|p| !p.warmup && p.step == 1).count(),
            INTERVALS
        );
    }
}
