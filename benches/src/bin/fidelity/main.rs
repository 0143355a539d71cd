//! Fidelity of per-tier DRAM-hit ratios: ground truth (the guest's exact
//! access counts) against the guest-reported stats and each host sampler
//! backend available here, over a matrix of workloads (hot-set size x skew
//! by footprint, skew by access rate, phase changes), run through tierd's
//! own pipeline (registry, aggregator, `passes_per_interval` sampler passes
//! per interval). Writes CSV and SVG plots; see benches/README.md.
//!
//! Workload source: the PVH test guest under the patched cloud-hypervisor
//! when a VMM binary is configured (`--ch-bin PATH` or `TIERD_CH_BIN`),
//! else the raw-KVM demo VM. Options: `--interval-ms N`, `--passes N`
//! (defaults: tierd's), `--kinds footprint,rate,phases,skew,ages` (rows of
//! these kinds only; default all but `ages`, the long working-set rows).
//! `--source linux`: real Linux workloads in the Linux bed instead
//! (`linux.rs`; run it through `cargo xtask bench fidelity -- --source
//! linux`, which prepares the bed's kernel, plugin and programs).

mod coverage;
mod csv;
mod linux;
mod linux_main;
mod linux_score;
mod matrix;
mod report;
mod run;
mod ws;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use tier_benches::workload::{DemoSource, Shape, TestGuestSource, WorkloadSource};
use tier_benches::{Summary, result_line};
use tier_profiler::sampler::{self, Sampler};

fn arg(name: &str) -> anyhow::Result<Option<u64>> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => {
            let v = args
                .get(i + 1)
                .with_context(|| format!("{name} needs a value"))?;
            Ok(Some(v.parse().with_context(|| format!("{name} {v:?}"))?))
        }
        None => Ok(None),
    }
}

/// `--source NAME` (only `linux` so far; without it: the test guest or
/// the demo VM, as below).
fn source_arg() -> anyhow::Result<Option<String>> {
    let args: Vec<String> = std::env::args().collect();
    let Some(i) = args.iter().position(|a| a == "--source") else {
        return Ok(None);
    };
    let v = args.get(i + 1).context("--source needs a name")?;
    anyhow::ensure!(v == "linux", "--source {v:?}: known: linux");
    Ok(Some(v.clone()))
}

/// The VMM binary: `--ch-bin PATH`, else `TIERD_CH_BIN` (as `cargo xtask
/// demo`); none: the demo VM.
fn ch_bin() -> anyhow::Result<Option<PathBuf>> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--ch-bin") {
        let v = args.get(i + 1).context("--ch-bin needs a path")?;
        return Ok(Some(v.into()));
    }
    Ok(std::env::var_os("TIERD_CH_BIN")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from))
}

fn main() -> anyhow::Result<()> {
    tier_profiler::bpf::route_libbpf_logs();
    let defaults = tier_profiler::config::Config::default();
    let interval_ms = arg("--interval-ms")?.unwrap_or(defaults.interval_ms);
    let passes = u32::try_from(arg("--passes")?.unwrap_or(u64::from(defaults.passes_per_interval)))
        .context("--passes")?;
    let interval = Duration::from_millis(interval_ms);
    let linux_source = source_arg()?.as_deref() == Some("linux");
    // hostpte's long pass for the working set (docs/working-set.md): one
    // interval in N, tierd's default unless `--ws-long-pass-every N` (0 =
    // never, to see the ratio without it).
    let ages = tier_profiler::ages::AgesConfig {
        long_pass_every: u32::try_from(
            arg("--ws-long-pass-every")?.unwrap_or(u64::from(defaults.sampler.ws_long_pass_every)),
        )
        .context("--ws-long-pass-every")?,
        horizons: defaults.sampler.ws_horizons_s.clone(),
        // hostpte's sweep: tierd's default unless `--ws-sweep-s N` /
        // `--ws-sweep-every-s N` (rows are shorter than its 20 min period;
        // the Linux source sweeps 10 s every 40 s unless told).
        sweep_s: arg("--ws-sweep-s")?.map_or(
            if linux_source {
                10.0
            } else {
                defaults.sampler.ws_sweep_s
            },
            |v| v as f64,
        ),
        sweep_every_s: arg("--ws-sweep-every-s")?.map_or(
            if linux_source {
                40.0
            } else {
                defaults.sampler.ws_sweep_every_s
            },
            |v| v as f64,
        ),
        interval_s: interval.as_secs_f64(),
    };
    anyhow::ensure!(
        (1..=64).contains(&passes)
            && tier_profiler::estimate::shortest_pass(interval, passes) >= Duration::from_millis(5),
        "need 1 <= passes <= 64 and a shortest pass of at least 5 ms (tierd's limits)"
    );
    if linux_source {
        return linux_main::bench(interval, passes, &ages);
    }
    let ch = ch_bin()?;
    let matrix = match ch {
        Some(_) => matrix::testguest(),
        None => matrix::demo(),
    };
    let matrix = only_kinds(matrix)?;
    let skew_rows = matrix
        .iter()
        .filter(|w| w.kind == matrix::Kind::Skew)
        .count();
    // One folder per source, so a demo run does not overwrite a test-guest one.
    let folder = if ch.is_some() {
        "fidelity/test-guest"
    } else {
        "fidelity/demo"
    };
    let out = tier_benches::sys::out_dir(folder).context("creating the results folder")?;

    // Which host backends run here: the library's own probe and selection.
    let probe = tier_profiler::probe::run();
    let mut backends: Vec<(String, Box<dyn Sampler>)> = Vec::new();
    let mut unavailable: Vec<(String, String)> = Vec::new();
    for name in ["ept-fexit", "ept-tracepoint", "hostpte"] {
        match sampler::select(
            name,
            &probe,
            defaults.ept_sample_stride,
            std::time::Duration::from_millis(defaults.damon_sample_ms),
            // As tierd runs: the default sampler CPU budget.
            sampler::budget::Budget::new(
                defaults.sampler.cpu_budget_pct,
                interval,
                passes,
                u64::from(defaults.ept_sample_stride),
            ),
        ) {
            Ok(Some(mut s)) => {
                // As tierd runs: the default working-set horizons.
                s.set_ages(&ages);
                backends.push((name.to_string(), s));
            }
            Ok(None) => unavailable.push((name.into(), "no sampler".into())),
            Err(e) => unavailable.push((name.into(), e.to_string())),
        }
    }
    match probe.get("pmu") {
        Some(c) if !c.available => unavailable.push(("pmu".into(), c.reason.clone())),
        _ => unavailable.push((
            "pmu".into(),
            "available, but this bench does not drive tierd's PMU source (PmuState) yet".into(),
        )),
    }

    let (source, which, truth_kind): (Box<dyn WorkloadSource>, &str, String) = match &ch {
        Some(bin) => (
            Box::new(
                TestGuestSource::new(bin, tier_testguest::elf_path())
                    .context("preparing the test guest")?,
            ),
            "test-guest",
            format!(
                "exact per-tier access counts the guest keeps in its memory, read through /proc/PID/mem of the VMM at each interval end; the guest paces its accesses to {} per second and prints nothing while it runs",
                tier_benches::workload::testguest::RATE
            ),
        ),
        None => (
            Box::new(
                DemoSource::start_default(Shape::pages(64, 64))
                    .context("starting the demo VM (needs /dev/kvm)")?,
            ),
            "demo-vm",
            "exact per-tier access counts from the guest side (counted by the vCPU thread per finished round)".into(),
        ),
    };
    let source = source.as_ref();
    let overhead_pages = source.overhead_pages();
    println!("fidelity: source {which}: {}", source.describe());
    println!(
        "  interval {interval_ms} ms, {passes} passes per interval (tierd defaults: {} ms, {}); {} workloads, {} measured intervals per phase ({} in ages rows)",
        defaults.interval_ms,
        defaults.passes_per_interval,
        matrix.len(),
        matrix::INTERVALS,
        matrix::AGES_PER_STEP
    );
    println!("sources:");
    println!("  {:<15} {truth_kind}", "truth");
    println!(
        "  {:<15} {}",
        "guest-reported",
        source.guest_reported_kind()
    );
    for (n, _) in &backends {
        println!("  {n:<15} available: runs the whole matrix");
    }
    for (n, why) in &unavailable {
        println!("  {n:<15} unavailable: {why}");
    }
    println!();

    let mut headline = None;
    let mut ws_result: Vec<(String, String)> = Vec::new();
    let mut runs: Vec<Option<(String, Box<dyn Sampler>)>> =
        backends.into_iter().map(Some).collect();
    if runs.is_empty() {
        runs.push(None); // truth and guest-reported still get scored
    }
    let mut files = Vec::new();
    for b in runs {
        let (name, mut s) = match b {
            Some((n, s)) => (Some(n), Some(s)),
            None => (None, None),
        };
        eprintln!(
            "running the matrix with host backend {} ...",
            name.as_deref().unwrap_or("none")
        );
        let out_run = run::run(
            run::Pipeline {
                source,
                sampler: s.as_deref_mut().map(|s| s as &mut dyn Sampler),
                interval,
                passes,
            },
            &matrix,
        )?;
        let records = out_run.records;
        print_alignment(&out_run.change_offsets_s);
        let (truth, guest, host) = report::sources(&records, name.as_deref());
        let mut others = vec![&guest];
        if let Some(h) = &host {
            others.push(h);
        }
        let interval_ns = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX);
        let h = report::print_tables(
            &matrix,
            &records,
            &truth,
            &others,
            overhead_pages,
            interval_ns,
        );
        let tag = name.as_deref().unwrap_or("none");
        let csv = out.join(format!("intervals-{tag}.csv"));
        let summary = out.join(format!("summary-{tag}.csv"));
        csv::write_intervals_csv(&csv, &matrix, &records, &truth, &others)?;
        csv::write_summary_csv(&summary, &matrix, &records, &truth, &others)?;
        let ws_csv = out.join(format!("ws-{tag}.csv"));
        csv::write_ws_csv(&ws_csv, &matrix, &records)?;
        let sub = out.join(tag);
        std::fs::create_dir_all(&sub).with_context(|| format!("creating {}", sub.display()))?;
        let mut all = vec![&truth];
        all.extend(others.iter().copied());
        files.extend([csv, summary, ws_csv]);
        files.extend(report::plots(&sub, &matrix, &records, &all)?);
        let scores = ws::score(records.iter().filter(|r| !r.warmup).flat_map(|r| &r.ws));
        let ws_pairs = ws::print(&scores);
        if name.as_deref() == Some("hostpte") {
            headline = h;
            ws_result = ws_pairs;
        }
        println!();
    }
    source.check().context("workload source")?;
    println!("files:");
    for f in &files {
        println!("  {}", f.display());
    }
    let f = |x: Option<f64>| x.map_or("na".to_string(), |x| format!("{x:.2}"));
    let pairs = match &headline {
        Some(h) => vec![
            ("p95_err_pp", f(h.all.map(|e| e.p95))),
            ("mean_err_pp", f(h.all.map(|e| e.mean))),
            ("max_err_pp", f(h.all.map(|e| e.max))),
            ("p95_err_pp_steady", f(h.steady.map(|e| e.p95))),
            ("max_err_pp_change", f(h.change.map(|e| e.max))),
            ("p95_err_pp_footprint", f(h.footprint.map(|e| e.p95))),
            ("lag_max", h.lag_max.map_or("na".into(), |l| l.to_string())),
            ("changes_missed_or_unsettled", h.lag_bad.to_string()),
            ("p95_err_pp_uniform", f(h.uniform.map(|e| e.p95))),
            (
                "p95_err_pp_uniform_published",
                f(h.uniform_published.map(|e| e.p95)),
            ),
            ("published_uniform", f(h.published_uniform)),
            ("p95_err_pp_skew", f(h.skew.map(|e| e.p95))),
            ("coverage_min", f(h.coverage_min)),
            ("skew_rows", skew_rows.to_string()),
        ],
        None => vec![
            ("p95_err_pp", "na".to_string()),
            ("skew_rows", skew_rows.to_string()),
        ],
    };
    // The ratio interval's verdict: whole matrix, uniform rows, skew rows.
    let verdicts: Vec<(String, String)> = headline
        .iter()
        .flat_map(|h| {
            [
                ("hit", h.verdict),
                ("hit_uniform", h.verdict_uniform),
                ("hit_skew", h.verdict_skew),
            ]
        })
        .filter_map(|(m, v)| Some(v?.result_pairs(m)))
        .flatten()
        .collect();
    let mut pairs = pairs;
    pairs.extend(verdicts.iter().map(|(k, v)| (k.as_str(), v.clone())));
    pairs.extend(ws_result.iter().map(|(k, v)| (k.as_str(), v.clone())));
    println!("{}", result_line(&pairs));
    Ok(())
}

/// The rows of the kinds `--kinds a,b` names (without it, all but the
/// long ages rows).
fn only_kinds(matrix: Vec<matrix::Workload>) -> anyhow::Result<Vec<matrix::Workload>> {
    let args: Vec<String> = std::env::args().collect();
    let Some(i) = args.iter().position(|a| a == "--kinds") else {
        return Ok(matrix
            .into_iter()
            .filter(|w| w.kind != matrix::Kind::Ages)
            .collect());
    };
    let v = args.get(i + 1).context("--kinds needs a list")?;
    let kinds: Vec<&str> = v.split(',').collect();
    let known = ["footprint", "rate", "phases", "skew", "ages"];
    if let Some(k) = kinds.iter().find(|k| !known.contains(k)) {
        anyhow::bail!("--kinds: unknown kind {k:?}; known: {}", known.join(","));
    }
    let m: Vec<_> = matrix
        .into_iter()
        .filter(|w| kinds.contains(&w.kind.label()))
        .collect();
    anyhow::ensure!(
        !m.is_empty(),
        "--kinds {v}: no row of these kinds in this matrix"
    );
    Ok(m)
}

/// Where the guest's own phase changes were seen against the instants the
/// schedule gave them (test guest: its truth block's phase, watched every
/// millisecond on the host clock).
fn print_alignment(offsets_s: &[f64]) {
    let ms: Vec<f64> = offsets_s.iter().map(|s| s * 1e3).collect();
    if let Some(s) = Summary::of(&ms) {
        println!(
            "phase changes seen by the host after their scheduled instant (first host read of the guest's new phase - wall-clock second): n {} min {:.1} ms median {:.1} ms max {:.1} ms",
            ms.len(),
            s.min,
            s.median,
            s.max
        );
    }
}
