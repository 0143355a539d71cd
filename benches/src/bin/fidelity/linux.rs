//! `--source linux` (docs/linux-bed.md): real Linux workloads in the Linux bed
//! (Debian 6.12 under QEMU TCG, two NUMA nodes, exact truth from the
//! tier_truth plugin), sampled by tierd's hostpte backend on QEMU through
//! tierd's own pipeline (registry, aggregator, passes per interval), as
//! the other sources are. One guest runs every workload in turn.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use tier_benches::progress::Progress;
use tier_benches::workload::linux::{self, LinuxBed, LinuxWorkload};
use tier_benches::workload::linux_truth::{IntervalSums, PageHistory};
use tier_profiler::aggregate::{Aggregator, pass_ends};
use tier_profiler::registry::Registry;
use tier_profiler::sampler::Sampler;
use tier_proto::v1::StatsUpdate;

use crate::run::{Host, readings};
use crate::ws::{WsPoint, points};

/// What the run was asked to do.
pub struct Opts {
    pub interval: Duration,
    pub passes: u32,
    pub warmup: usize,
    pub scored: usize,
    /// Workload names to run (None: all).
    pub only: Option<Vec<String>>,
}

/// One interval of one workload.
#[derive(Debug, Clone)]
pub struct LRecord {
    pub workload: usize,
    pub index: usize,
    pub warmup: bool,
    pub t_s: f64,
    pub sums: IntervalSums,
    pub instructions: u64,
    pub host: Option<Host>,
    pub ws: Vec<WsPoint>,
}

/// The plugin's cost: the same fixed work with and without it.
#[derive(Debug, Clone, Copy)]
pub struct Cost {
    pub with_s: f64,
    pub without_s: f64,
    pub boot_with_s: f64,
    pub boot_without_s: f64,
}

pub struct Output {
    pub workloads: Vec<LinuxWorkload>,
    pub records: Vec<LRecord>,
    pub cost: Option<Cost>,
    /// Guest instructions per second over the scored intervals, with the plugin.
    pub insn_rate: f64,
    pub tier_pages: [u64; 2],
    pub interval_s: f64,
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// Boots the bed with the plugin, runs each workload through the
/// pipeline, then times the plugin's cost.
pub fn run(opts: &Opts, sampler: &mut dyn Sampler) -> anyhow::Result<Output> {
    let kernel = linux::kernel()?;
    let plugin = linux::env_path("TIERD_TRUTH_PLUGIN")?;
    let mut programs: Vec<PathBuf> = linux::PROGRAMS
        .iter()
        .map(|p| linux::which(p))
        .collect::<Result<_, _>>()?;
    programs.push(linux::env_path("TIERD_BED_KV")?);
    let workloads: Vec<LinuxWorkload> = linux::workloads()
        .into_iter()
        .filter(|w| {
            opts.only
                .as_ref()
                .is_none_or(|o| o.iter().any(|n| n == w.name))
        })
        .collect();
    anyhow::ensure!(!workloads.is_empty(), "--workloads: no such workload");
    eprintln!("booting the Linux bed with tier_truth ...");
    let mut bed = LinuxBed::boot(&kernel, &programs, Some(&plugin)).context("booting the bed")?;
    let boot_with = bed.boot_time().as_secs_f64();
    eprintln!("  booted in {boot_with:.1} s; QEMU pid {}", bed.pid());
    let nodes = bed.sh("numactl -H | head -n 8", Duration::from_secs(60))?;
    println!("guest NUMA layout at boot (numactl -H):");
    for l in nodes.lines() {
        println!("  {l}");
    }
    let vm = bed.tracked()?;
    let vm_id = tier_profiler::registry::TrackedVm::vm(&vm).id.clone();
    let tier_pages = [0, 1].map(|t| {
        tier_profiler::registry::TrackedVm::vm(&vm)
            .tiers
            .get(t)
            .map_or(0, |t| t.size_bytes / 4096)
    });
    let mut reg = Registry::default();
    reg.insert(Box::new(vm));
    let mut agg = Aggregator::default();
    let truth = bed.truth().context("no truth file")?;
    let mut history = PageHistory::new(truth.snapshot(), Instant::now(), &bed.node_ranges());
    let started = Instant::now();
    let per = opts.warmup + opts.scored;
    let progress = Progress::bar("fidelity", (per * workloads.len()) as u64);
    let mut records = Vec::new();
    let (mut insns, mut insn_s) = (0u64, 0f64);
    for (wi, w) in workloads.iter().enumerate() {
        progress.item(format!("{} ({}/{})", w.name, wi + 1, workloads.len()));
        progress.suspend(|| eprintln!("  workload {}: {}", w.name, w.what));
        bed.start(w)?;
        let t0 = Instant::now();
        for k in 0..per {
            let start = t0 + opts.interval * u32::try_from(k).context("intervals")?;
            let truth = bed.truth().context("no truth file")?;
            let mut sums = IntervalSums::default();
            let mark = history.mark();
            let (read, update) = interval(
                &mut agg,
                &mut reg,
                sampler,
                start,
                opts.interval,
                opts.passes,
                || sums.add(&history.push(truth.snapshot(), Instant::now())),
            )?;
            sums.pages = history.pages_since(mark);
            let (_, host) = readings(&update, &vm_id);
            let ws = points(
                &update,
                &vm_id,
                read,
                &|at, h| history.touched_within(at, Duration::try_from_secs_f64(h).ok()?),
                tier_pages,
            );
            let warmup = k < opts.warmup;
            if !warmup {
                insns += sums.instructions;
                insn_s += opts.interval.as_secs_f64();
            }
            records.push(LRecord {
                workload: wi,
                index: k,
                warmup,
                t_s: started.elapsed().as_secs_f64(),
                sums,
                instructions: sums.instructions,
                host,
                ws,
            });
            progress.inc();
        }
        let tail = bed.stop()?;
        progress.suspend(|| {
            for l in tail.lines().filter(|l| !l.trim().is_empty()).take(12) {
                eprintln!("    guest: {l}");
            }
        });
    }
    progress.finish();
    eprintln!("timing the plugin's cost: {}", linux::COST_WORK);
    let cost = plugin_cost(&mut bed, boot_with, &kernel, &programs)?;
    Ok(Output {
        workloads,
        records,
        cost: Some(cost),
        insn_rate: if insn_s > 0.0 {
            insns as f64 / insn_s
        } else {
            0.0
        },
        tier_pages,
        interval_s: opts.interval.as_secs_f64(),
    })
}

/// The same fixed work in this guest (plugin on) and in a fresh one
/// booted without the plugin.
fn plugin_cost(
    bed: &mut LinuxBed,
    boot_with_s: f64,
    kernel: &tier_linux_bed::Kernel,
    programs: &[PathBuf],
) -> anyhow::Result<Cost> {
    let limit = Duration::from_secs(600);
    let with_s = bed.time(linux::COST_WORK, limit)?.as_secs_f64();
    let mut plain = LinuxBed::boot(kernel, programs, None).context("booting without the plugin")?;
    let boot_without_s = plain.boot_time().as_secs_f64();
    let without_s = plain.time(linux::COST_WORK, limit)?.as_secs_f64();
    Ok(Cost {
        with_s,
        without_s,
        boot_with_s,
        boot_without_s,
    })
}

/// One interval's passes (as `tierd run` makes them), `at_pass` called
/// right before each pass's read (the truth's snapshot: per pass, so
/// the working set's truth has a pass's resolution, not an interval's);
/// returns the instant right after tierd's tick (the working set's
/// horizons end there) and the update.
fn interval(
    agg: &mut Aggregator,
    reg: &mut Registry,
    sampler: &mut dyn Sampler,
    start: Instant,
    interval: Duration,
    passes: u32,
    mut at_pass: impl FnMut(),
) -> anyhow::Result<(Instant, StatsUpdate)> {
    let interval_ns = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX);
    let ends = pass_ends(interval, passes);
    let last = ends.len();
    for (k, end) in ends.into_iter().enumerate() {
        sleep_until(start + end);
        at_pass();
        if k + 1 < last {
            agg.pass(reg, Some(&mut *sampler));
        } else {
            let update = agg.tick(reg, Some(&mut *sampler), interval_ns);
            return Ok((Instant::now(), update));
        }
    }
    anyhow::bail!("passes_per_interval is 0")
}
