//! What sampling costs the guest and the host: the demo VM's throughput
//! (guest accesses per second) with and without each sampler that runs
//! here, alternating in one run; per-program BPF run time; and tierd's CPU
//! per GiB of guest memory scanned. See benches/README.md.

mod attach;
mod bpf;
mod scan_cost;

use std::time::{Duration, Instant};

use anyhow::Context;
use tier_benches::progress::Progress;
use tier_benches::sys::{load_1min, sched_stat};
use tier_benches::workload::{DemoSource, Shape, Skew, WorkloadSource};
use tier_benches::{Row, Summary, print_table, result_line};
use tier_profiler::sampler::ept::{EptProgram, enable_run_stats};

const RUNS: usize = 9;
const RUN_TIME: Duration = Duration::from_secs(2);
const SETTLE: Duration = Duration::from_millis(300);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cond {
    None,
    Hostpte,
    EptAttached,
}

/// Throughput metrics (label, unit), the first one headlines.
const METRICS: [(&str, &str); 3] = [
    ("/ready-s", "k acc/s"),
    ("/s", "k acc/s"),
    ("/cpu-s", "k acc/cpu-s"),
];

impl Cond {
    fn short(self) -> &'static str {
        match self {
            Cond::None => "baseline",
            Cond::Hostpte => "hostpte",
            Cond::EptAttached => "ept attached",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Cond::None => "no sampler (baseline)",
            Cond::Hostpte => "hostpte passes",
            Cond::EptAttached => "ept BPF attached",
        }
    }
}

/// One measurement window: guest accesses per wall second, per second the
/// vCPU thread was not waiting for a CPU (wall minus run-queue wait: it
/// keeps time the guest lost to faults, locks and blocking, and drops time
/// other work on the host took the CPU), and per vCPU CPU-second.
struct Sample {
    per_s: f64,
    per_ready_s: f64,
    per_cpu_s: f64,
}

fn measure(src: &DemoSource) -> anyhow::Result<Sample> {
    let (pid, tids) = src.vcpu_threads();
    let tid = *tids.first().context("no vCPU thread")?;
    let sched = || sched_stat(pid, tid).context("vCPU thread gone");
    let (a, s0, t) = (src.truth(), sched()?, Instant::now());
    std::thread::sleep(RUN_TIME);
    let (b, s1, secs) = (src.truth(), sched()?, t.elapsed().as_secs_f64());
    let acc = (b.accesses[0] + b.accesses[1] - a.accesses[0] - a.accesses[1]) as f64;
    let wait = (s1.wait_ns - s0.wait_ns) as f64 / 1e9;
    let run = (s1.run_ns - s0.run_ns) as f64 / 1e9;
    Ok(Sample {
        per_s: acc / secs,
        per_ready_s: acc / (secs - wait).max(1e-9),
        per_cpu_s: acc / run.max(1e-9),
    })
}

fn main() -> anyhow::Result<()> {
    tier_profiler::bpf::route_libbpf_logs();
    let defaults = tier_profiler::config::Config::default();
    let interval = Duration::from_millis(defaults.interval_ms);
    let passes = defaults.passes_per_interval;
    let probe = tier_profiler::probe::run();
    let load_start = load_1min();

    // BPF run statistics stay on only while this fd is held.
    let stats = enable_run_stats().context("BPF_ENABLE_STATS (needs root)");
    let mut ept = match attach::load_ept() {
        Ok((p, lines)) => Some((p, lines)),
        Err(e) => {
            println!("ept BPF programs: not loaded: {e:#}");
            None
        }
    };
    let mut conds = vec![Cond::None];
    let hostpte_ok = probe.get("hostpte").is_some_and(|c| c.available);
    if hostpte_ok {
        conds.push(Cond::Hostpte);
    }
    if ept.as_ref().is_some_and(|(p, _)| attach::ept_attached(p)) {
        conds.push(Cond::EptAttached);
    }
    println!("samplers on this host (tierd probe):");
    for name in ["hostpte", "ept-fexit", "ept-tracepoint", "page_idle", "pmu"] {
        if let Some(c) = probe.get(name) {
            let state = if c.available {
                "available  "
            } else {
                "unavailable"
            };
            println!("  {name:<15} {state}  {}", c.reason);
        }
    }
    if let Some((_, lines)) = &ept {
        for l in lines {
            println!("  ept program    {l}");
        }
    }
    println!(
        "conditions run: {}; pmu has no sampler to attach here",
        conds
            .iter()
            .map(|c| c.label())
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!();

    let shapes = [
        (
            "default 48x4|96x1 (146 pages)",
            Shape {
                dram_pages: 48,
                dram_repeat: 4,
                slow_pages: 96,
                slow_repeat: 1,
                skew: Skew::Uniform,
            },
        ),
        ("large 2048|2048 (4098 pages)", Shape::pages(2048, 2048)),
    ];
    let src =
        DemoSource::start_default(shapes[0].1).context("starting the demo VM (needs /dev/kvm)")?;
    let mut ept_runs = (0u64, 0u64);
    // samples[metric][shape][cond]; metrics as in METRICS.
    let mut samples = vec![vec![vec![Vec::new(); conds.len()]; shapes.len()]; METRICS.len()];
    let mut host_passes = attach::PassStats::default();
    let progress = Progress::bar("overhead", (RUNS * shapes.len() * conds.len()) as u64);
    for run in 0..RUNS {
        for (si, (_, shape)) in shapes.iter().enumerate() {
            src.apply(*shape)?;
            // Rotate the order so drift does not favour one condition.
            for k in 0..conds.len() {
                let ci = (k + run) % conds.len();
                progress.suspend(|| {
                    eprintln!(
                        "  run {}/{RUNS} shape {} {}",
                        run + 1,
                        si + 1,
                        conds[ci].label()
                    )
                });
                progress.item(format!(
                    "run {}/{RUNS}, {}: {}",
                    run + 1,
                    shapes[si].0,
                    conds[ci].label()
                ));
                let sample = match conds[ci] {
                    Cond::None => {
                        std::thread::sleep(SETTLE);
                        measure(&src)?
                    }
                    Cond::Hostpte => {
                        let t = attach::HostpteThread::start(src.tracked(), interval, passes)?;
                        std::thread::sleep(SETTLE);
                        let s = measure(&src);
                        host_passes.add(t.stop()?);
                        s?
                    }
                    Cond::EptAttached => {
                        let p = &ept.as_ref().context("ept not loaded")?.0;
                        let before = p.run_stats(EptProgram::SpteChanged)?;
                        std::thread::sleep(SETTLE);
                        let s = measure(&src)?;
                        let after = p.run_stats(EptProgram::SpteChanged)?;
                        ept_runs.0 += after.run_cnt - before.run_cnt;
                        ept_runs.1 += after.run_time_ns - before.run_time_ns;
                        s
                    }
                };
                for (m, v) in [sample.per_ready_s, sample.per_s, sample.per_cpu_s]
                    .into_iter()
                    .enumerate()
                {
                    samples[m][si][ci].push(v);
                }
                progress.inc();
            }
        }
    }
    progress.finish();
    src.check()?;
    let load_end = load_1min();

    // worst[metric] = (ratio, what)
    let mut worst = vec![(f64::INFINITY, String::new()); METRICS.len()];
    for (si, (name, _)) in shapes.iter().enumerate() {
        let mut rows = Vec::new();
        for (m, (label, unit)) in METRICS.iter().enumerate() {
            let base = Summary::of(&samples[m][si][0]).context("no samples")?;
            for (ci, c) in conds.iter().enumerate() {
                let s = Summary::of(&samples[m][si][ci]).context("no samples")?;
                let r = s.median / base.median;
                rows.push(Row {
                    name: format!("{} {label}", c.short()),
                    unit,
                    summary: scale(s, 1e-3),
                    ratio: Some(r),
                });
                if *c != Cond::None && r < worst[m].0 {
                    worst[m] = (r, format!("{} with shape {name}", c.label()));
                }
            }
        }
        print_table(
            &format!(
                "guest throughput, shape {name}: {RUNS} alternating runs of {RUN_TIME:?} per condition (ratio = median / baseline median)"
            ),
            &rows,
        );
        println!();
    }
    println!(
        "/ready-s: accesses per second the vCPU thread was not waiting for a CPU (wall minus run-queue wait: keeps faults, lock waits and blocking the sampler causes; drops CPU taken by other work on the host, whose load average was {} at start and {} at end on {} CPUs); /s: plain wall clock; /cpu-s: per second the vCPU thread ran",
        load_start.map_or("?".into(), |l| format!("{l:.2}")),
        load_end.map_or("?".into(), |l| format!("{l:.2}")),
        tier_benches::sys::cpus()
    );
    if hostpte_ok {
        println!(
            "hostpte thread during its runs: {} passes, {:.2} ms CPU and {:.2} ms wall per pass ({:.1} % of one CPU at {} passes per {} ms)",
            host_passes.passes,
            host_passes.cpu_ns as f64 / 1e6 / host_passes.passes.max(1) as f64,
            host_passes.wall_ns as f64 / 1e6 / host_passes.passes.max(1) as f64,
            host_passes.cpu_ns as f64 / host_passes.passes.max(1) as f64 * f64::from(passes)
                / interval.as_nanos() as f64
                * 100.0,
            passes,
            interval.as_millis()
        );
    }

    // BPF: attached programs during the runs, then BPF_PROG_TEST_RUN.
    println!();
    match (&stats, ept.as_mut()) {
        (Ok(_), Some((p, _))) => {
            println!(
                "BPF run time (BPF_ENABLE_STATS fd held; kernel.bpf_stats_enabled not touched)"
            );
            if conds.contains(&Cond::EptAttached) {
                println!(
                    "  attached {} during the ept runs: run_cnt {} run_time_ns {} (kvm.tdp_mmu=N here: the hook never fires)",
                    EptProgram::SpteChanged,
                    ept_runs.0,
                    ept_runs.1
                );
            }
            let rows: Vec<Row> = bpf::exercise(p)?
                .into_iter()
                .map(|(g, s)| Row {
                    name: g.to_string(),
                    unit: "ns/run",
                    summary: s,
                    ratio: None,
                })
                .collect();
            print_table(
                &format!(
                    "BPF_PROG_TEST_RUN, synthetic ageing event, run_time_ns/run_cnt over {} x {} runs",
                    bpf::EXERCISE_RUNS,
                    bpf::EXERCISE_EVENTS
                ),
                &rows,
            );
        }
        (Err(e), _) => println!("BPF run time: {e:#}"),
        (_, None) => println!("BPF run time: no EPT programs loaded"),
    }

    // tierd CPU per GiB scanned.
    println!();
    let mut cpu_per_gib = None;
    if hostpte_ok {
        println!(
            "hostpte, demo VM of 2 x 16 MiB (few pages resident): {:.1} ms CPU per GiB covered",
            host_passes.cpu_ms_per_gib()
        );
        drop(src);
        let spinner = Progress::spinner("overhead");
        spinner.item("hostpte passes over a resident 1.25 GiB demo VM");
        let c = scan_cost::resident_vm(interval, passes)?;
        spinner.finish();
        println!(
            "hostpte, resident demo VM (256 MiB dram + 1 GiB slow, every page faulted in, guest running 2048|2048): {} passes, {:.1} ms CPU and {:.1} ms wall per pass, {:.1} ms CPU per GiB scanned",
            c.passes,
            c.cpu_ns as f64 / 1e6 / c.passes.max(1) as f64,
            c.wall_ns as f64 / 1e6 / c.passes.max(1) as f64,
            c.cpu_ms_per_gib()
        );
        cpu_per_gib = Some(c.cpu_ms_per_gib());
    }
    for (m, (label, _)) in METRICS.iter().enumerate() {
        println!(
            "worst {label}: {} at {:.3} of the baseline median",
            if worst[m].1.is_empty() {
                "-"
            } else {
                &worst[m].1
            },
            worst[m].0
        );
    }
    let f = |x: f64| {
        if x.is_finite() {
            format!("{x:.3}")
        } else {
            "na".into()
        }
    };
    println!(
        "{}",
        result_line(&[
            ("throughput_ratio", f(worst[0].0)),
            ("wall_ratio", f(worst[1].0)),
            ("per_vcpu_s_ratio", f(worst[2].0)),
            (
                "hostpte_cpu_ms_per_gib",
                cpu_per_gib.map_or("na".into(), |c| format!("{c:.1}"))
            ),
        ])
    );
    Ok(())
}

fn scale(s: Summary, k: f64) -> Summary {
    Summary {
        min: s.min * k,
        median: s.median * k,
        max: s.max * k,
    }
}
