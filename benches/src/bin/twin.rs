//! What tierd would read on a real host (docs/twin.md): a trace-driven twin
//! of EPT ageing, host page-table bits and PMU counting at real access
//! rates, with tierd's own aggregator, estimator and controller on top
//! (`tier_benches::twin`). Per backend and workload: DRAM-hit error
//! against the LLC-miss truth and the all-access truth, interval
//! coverage, hot-set size at 1/10/60 s; CPU per pass per GiB from this
//! machine's measured costs, 1 GiB to 1 TiB; the controller on 8-1000
//! simulated VMs fed by each backend. Tables on stdout, CSV and SVG in
//! `--out` (default target/twin), one RESULT line.
//!
//! Options: `--seed N` (default 1), `--intervals N` (default 65),
//! `--stride N` (ept_sample_stride, default 1), `--out DIR`,
//! `--traces DIR` (default benches/traces), `--quick` (fewer workloads and
//! fleets: a smoke run), `--only TEXT` (workloads whose name holds it). `--convert-lackey LOG OUT.pgs.xz [SKIP MAX_RUNS]`
//! turns a lackey log into a compact trace (benches/traces/README.md).

use std::path::PathBuf;

use anyhow::{Context, bail};
use tier_benches::progress::Progress;
use tier_benches::result_line;
use tier_benches::twin::fleet::{self, Backend};
use tier_benches::twin::run::{Config, Outcome, run};
use tier_benches::twin::stream::Trace;
use tier_benches::twin::{cost, report, suite};

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> anyhow::Result<T>
where
    T::Err: std::fmt::Display,
{
    match args.iter().position(|a| a == name) {
        Some(i) => {
            let v = args
                .get(i + 1)
                .with_context(|| format!("{name} needs a value"))?;
            v.parse::<T>()
                .map_err(|e| anyhow::anyhow!("{name} {v:?}: {e}"))
        }
        None => Ok(default),
    }
}

fn convert(args: &[String]) -> anyhow::Result<()> {
    let (Some(log), Some(out)) = (args.first(), args.get(1)) else {
        bail!("usage: twin --convert-lackey LOG OUT.pgs.xz [SKIP MAX_RUNS]");
    };
    let skip = args
        .get(2)
        .map_or(Ok(1_000_000), |s| s.parse())
        .context("SKIP")?;
    let max_runs = args
        .get(3)
        .map_or(Ok(400_000), |s| s.parse())
        .context("MAX_RUNS")?;
    let text = std::fs::read_to_string(log).with_context(|| format!("read {log}"))?;
    let t = Trace::from_lackey(&text, skip, max_runs);
    let raw = t.encode();
    let mut xz = std::process::Command::new("xz")
        .args(["-9e", "-c"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::fs::File::create(out).with_context(|| format!("create {out}"))?)
        .spawn()
        .context("xz")?;
    std::io::Write::write_all(xz.stdin.as_mut().context("xz stdin")?, &raw).context("xz write")?;
    drop(xz.stdin.take());
    let st = xz.wait().context("xz")?;
    anyhow::ensure!(st.success(), "xz: {st}");
    println!(
        "{out}: {} runs, {} accesses, {} pages ({} MiB), {} bytes raw",
        t.runs.len(),
        t.accesses,
        t.pages,
        (u64::from(t.pages) * 4096) >> 20,
        raw.len()
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--convert-lackey") {
        return convert(&args[i + 1..]);
    }
    let started = std::time::Instant::now();
    let quick = args.iter().any(|a| a == "--quick");
    let cfg = Config {
        seed: arg(&args, "--seed", 1u64)?,
        intervals: arg(&args, "--intervals", if quick { 15 } else { 65 })?,
        stride: arg(&args, "--stride", 1usize)?,
        ..Config::default()
    };
    let out = PathBuf::from(arg(&args, "--out", "target/twin".to_string())?);
    let traces = PathBuf::from(arg(
        &args,
        "--traces",
        concat!(env!("CARGO_MANIFEST_DIR"), "/traces").to_string(),
    )?);
    std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
    let measured = cost::measure().context("measuring pagemap and read() costs")?;

    let mut workloads = suite::synthetic_suite();
    match suite::trace_suite(&traces, 1e7) {
        Ok(t) if !t.is_empty() => workloads.extend(t),
        Ok(_) => println!("no traces in {}: synthetic streams only", traces.display()),
        Err(e) => println!(
            "traces in {}: {e:#}; synthetic streams only",
            traces.display()
        ),
    }
    if let Some(i) = args.iter().position(|a| a == "--only") {
        let want = args.get(i + 1).context("--only needs a value")?;
        workloads.retain(|w| w.name.contains(want.as_str()));
    } else if quick {
        workloads.truncate(3);
    }
    println!(
        "twin: seed {}, {} intervals of 1 s, {} passes per interval (tierd's schedule), LLC {} MiB {}-way, STLB 1536 entries 12-way, ept_sample_stride {}, PMU {} events on {} counters ({} ms rotation), sampling period {}",
        cfg.seed,
        cfg.intervals,
        cfg.passes,
        cfg.llc_bytes >> 20,
        cfg.llc_ways,
        cfg.stride,
        cfg.pmu.events,
        cfg.pmu.counters,
        cfg.pmu.slice_s * 1e3,
        cfg.pmu.period
    );
    println!(
        "errors in pp of the DRAM share (mean, p95) against LLC misses (mem) and all touches (all); cov: share of intervals whose ~95 % interval holds the truth; open: one-sided share; hot: hot-set size error p95 (%) over 1/10/60 s windows, r: median read/true"
    );
    println!();
    let progress = Progress::bar("twin", workloads.len() as u64 + 1);
    let (mut icsv, mut scsv) = (String::new(), String::new());
    let mut outcomes: Vec<Outcome> = Vec::new();
    let mut ept_cov_min = f64::INFINITY;
    let (mut pmu_p95, mut ept_hot_p95, mut ept_p95) = (0.0f64, 0.0f64, 0.0f64);
    for w in &workloads {
        progress.item(w.name.clone());
        let o = run(w, &cfg);
        let scores = report::score(&o);
        progress.suspend(|| {
            report::print_workload(&o, &scores);
            println!();
        });
        report::intervals_csv(&o, &mut icsv);
        report::summary_csv(&o, &scores, &mut scsv);
        if let Some(c) = scores[0].coverage_mem {
            ept_cov_min = ept_cov_min.min(c);
        }
        if let Some(e) = scores[3].err_mem {
            pmu_p95 = pmu_p95.max(e.p95);
        }
        if let Some(e) = scores[0].err_mem {
            ept_p95 = ept_p95.max(e.p95);
        }
        for h in scores[0].hot_p95.iter().flatten() {
            ept_hot_p95 = ept_hot_p95.max(*h);
        }
        outcomes.push(o);
        progress.inc();
    }

    // Cost per pass, 1 GiB .. 1 TiB.
    let busiest = outcomes
        .iter()
        .map(|o| {
            let m =
                o.intervals.iter().map(|i| i.misses).sum::<f64>() / o.intervals.len().max(1) as f64;
            m / (o.ws_bytes as f64 / f64::from(1u32 << 30)).max(1.0)
        })
        .fold(0.0f64, f64::max);
    progress.suspend(|| {
        println!(
            "CPU per pass, from measured costs: pagemap {:.1} ns/page chunked, {:.1} ns/page one pread each; BPF {:.1} ns per young page (bpf-cost); hostpte {:.1} ms/GiB (overhead bench); read() {:.0} ns; page_idle's rmap walk not measurable here (ept column is a lower bound); pmu sampling at {:.2e} LLC misses/s per GiB (the busiest workload)",
            measured.pagemap_chunked_ns,
            measured.pagemap_single_ns,
            cost::BPF_NS_PER_YOUNG,
            cost::HOSTPTE_NS_PER_GIB / 1e6,
            measured.read_syscall_ns,
            busiest
        );
        println!(
            "  {:>6} {:>14} {:>14} {:>16} {:>12} {:>14} {:>16}",
            "GiB", "ept 10% young", "ept all young", "ept stride 64", "hostpte", "pmu count", "pmu samples/s"
        );
    });
    let mut ccsv = String::from(
        "gib,ept_ms_10pct_young,ept_ms_all_young,ept_ms_stride64,hostpte_ms,pmu_count_ms,pmu_samples_per_s\n",
    );
    for gib in [1.0, 4.0, 16.0, 64.0, 256.0, 1024.0] {
        let a = cost::row(&measured, gib, cfg.stride, 0.1, busiest, cfg.pmu.period);
        let b = cost::row(&measured, gib, cfg.stride, 1.0, busiest, cfg.pmu.period);
        let c = cost::row(&measured, gib, 64, 0.5, busiest, cfg.pmu.period);
        progress.suspend(|| {
            println!(
                "  {:>6} {:>11.2} ms {:>11.2} ms {:>13.2} ms {:>9.1} ms {:>11.4} ms {:>16.0}",
                gib,
                a.ept_ms,
                b.ept_ms,
                c.ept_ms,
                a.hostpte_ms,
                a.pmu_count_ms,
                a.pmu_samples_per_s
            );
        });
        ccsv.push_str(&format!(
            "{gib},{:.4},{:.4},{:.4},{:.4},{:.6},{:.0}\n",
            a.ept_ms, b.ept_ms, c.ept_ms, a.hostpte_ms, a.pmu_count_ms, a.pmu_samples_per_s
        ));
    }

    // The controller on simulated hosts.
    progress.item("controller fleets");
    let sizes: &[usize] = if quick { &[8] } else { &[8, 64, 1000] };
    let mut rows = Vec::new();
    for &vms in sizes {
        for b in [Backend::Ept, Backend::HostPte, Backend::PmuCount] {
            rows.push(fleet::run(b, vms, 40, 20, cfg.seed));
        }
    }
    progress.inc();
    progress.finish();
    println!();
    println!(
        "controller on simulated hosts (tier_sim fleets, 40 intervals, a third of the VMs change phase at 20, target {} +- {}, balloons 1 GiB/s; {:.0e} LLC misses/s per VM at 1e6 phase accesses, {} touches per miss): intervals to target per VM and phase (median, max), DRAM moved, moves against the true ratio",
        fleet::TARGET,
        fleet::EPSILON,
        fleet::MISSES_PER_S,
        fleet::TOUCHES_PER_MISS
    );
    report::print_fleet(&rows);
    println!();
    let verdict_pairs = report::print_verdicts(&outcomes);
    println!();
    let age_pairs = report::print_ages(&outcomes);
    let mut fcsv = String::from(
        "backend,vms,to_target_median,not_converged,dram_moved_gib,moves,wrong_moves,within_eps_end\n",
    );
    for r in &rows {
        let mut v = r.to_target.clone();
        v.sort_by(f64::total_cmp);
        let med = v.get(v.len() / 2).copied().unwrap_or(f64::NAN);
        fcsv.push_str(&format!(
            "{},{},{med},{},{:.2},{},{},{:.3}\n",
            r.backend,
            r.vms,
            r.not_converged,
            r.dram_moved_gib,
            r.moves,
            r.wrong_moves,
            r.within_end
        ));
    }
    for (name, text) in [
        ("intervals.csv", &icsv),
        ("summary.csv", &scsv),
        ("cost.csv", &ccsv),
        ("controller.csv", &fcsv),
    ] {
        std::fs::write(out.join(name), text).with_context(|| format!("write {name}"))?;
    }
    report::plot(&outcomes, &out.join("ratio_over_time.svg"))?;
    println!();
    println!(
        "wrote {}/{{intervals,summary,cost,controller}}.csv and ratio_over_time.svg; run took {:.0} s",
        out.display(),
        started.elapsed().as_secs_f64()
    );
    let wrong = |b: &str| {
        rows.iter()
            .filter(|r| r.backend == b)
            .map(|r| r.wrong_moves)
            .sum::<usize>()
    };
    let mut pairs = vec![
        ("ept_coverage_min", format!("{ept_cov_min:.2}")),
        ("ept_p95_err_pp", format!("{ept_p95:.1}")),
        ("pmu_p95_err_pp", format!("{pmu_p95:.2}")),
        ("ept_hotset_p95_err_pct", format!("{ept_hot_p95:.1}")),
        ("controller_wrong_moves", wrong("ept").to_string()),
        (
            "controller_wrong_moves_hostpte",
            wrong("hostpte").to_string(),
        ),
        ("controller_wrong_moves_pmu", wrong("pmu-count").to_string()),
    ];
    pairs.extend(verdict_pairs.iter().map(|(k, v)| (k.as_str(), v.clone())));
    pairs.extend(age_pairs.iter().map(|(k, v)| (k.as_str(), v.clone())));
    println!("{}", result_line(&pairs));
    Ok(())
}
