//! Sampling cost against guest size, with the sampler CPU budget on and
//! off (docs/hostpte.md, "Sampler CPU budget"): CPU per interval and the
//! sampler's peak RSS for guests of 0.25, 1, 4 and 8 GiB resident (a
//! stand-in process holding that much memory in 4 KiB pages, one at a
//! time), for hostpte and for the EPT
//! ageing driver's user-space part (pagemap and kpageflags reads, bitmap
//! writes: to a stand-in file where /sys/kernel/mm/page_idle/bitmap is
//! absent, as here; the kernel's ageing behind the real bitmap is not in
//! it). Ends with `RESULT ... slope_ratio=`: CPU growth from the smallest
//! to the largest guest with the budget over that without (the worse of
//! the two samplers); the budget should hold it at or below 0.10.
//!
//! Options: `--sizes 0.25,1,4,8` (GiB), `--runs N` (3), `--intervals N`
//! (least intervals of a budget-on run, 100), `--budget-pct P` (tierd's
//! default). A budget-on run spans whole cycles (sampled intervals and the
//! skipped ones that pay them back), so its mean is not cut off in debt.

mod guest;
mod measure;

use std::path::Path;

use anyhow::Context;
use tier_benches::progress::Progress;
use tier_benches::{Row, Summary, print_table, result_line};

use measure::{Cost, Plan};

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).cloned()
}

/// The two samplers measured.
const SAMPLERS: [&str; 2] = ["hostpte", "ept-user"];

fn main() -> anyhow::Result<()> {
    if let Some(bytes) = arg("--hold") {
        return guest::hold(bytes.parse().context("--hold BYTES")?);
    }
    let sizes: Vec<f64> = arg("--sizes")
        .unwrap_or_else(|| "0.25,1,4,8".into())
        .split(',')
        .map(|s| s.trim().parse::<f64>().context("--sizes"))
        .collect::<anyhow::Result<_>>()?;
    anyhow::ensure!(sizes.len() >= 2, "--sizes needs two sizes or more");
    let runs: usize = arg("--runs")
        .map_or(Ok(3), |v| v.parse())
        .context("--runs")?;
    let intervals: usize = arg("--intervals")
        .map_or(Ok(100), |v| v.parse())
        .context("--intervals")?;
    let pct: f64 = arg("--budget-pct")
        .map_or(Ok(tier_profiler::config::DEFAULT_CPU_BUDGET_PCT), |v| {
            v.parse()
        })
        .context("--budget-pct")?;
    let real_bitmap = Path::new(tier_profiler::sampler::page_idle::BITMAP).exists();
    let dir = tempfile::tempdir().context("temp dir")?;
    let stand_in = dir.path().join("page_idle-bitmap");
    std::fs::write(&stand_in, []).context("bitmap stand-in")?;
    println!(
        "sampler-scale: budget {pct} % of one core; intervals of {} ms, {} passes (tierd's defaults); \
         passes back to back, intervals counted in pass slots; {runs} runs per case; a budget-on \
         run is at least {intervals} intervals and 2 whole cycles (sampled intervals and the \
         skipped ones paying them back), a budget-off run 1 interval; guests: a child process \
         holding N GiB of touched 4 KiB pages",
        measure::INTERVAL.as_millis(),
        measure::PASSES
    );
    println!(
        "ept-user: pagemap + kpageflags reads of the sample, page_idle bitmap writes to a STAND-IN \
         FILE ({}); the kernel's ageing behind a real bitmap is not timed",
        if real_bitmap {
            "page_idle exists here but is not written by a bench"
        } else {
            "/sys/kernel/mm/page_idle/bitmap is absent here"
        }
    );
    // results[sampler][budget on?][size]
    let mut results: Vec<[Vec<Cost>; 2]> = vec![Default::default(), Default::default()];
    let progress = Progress::bar("sampler-scale", (sizes.len() * 4) as u64);
    for &gib in &sizes {
        let bytes = (gib * (1u64 << 30) as f64) as u64;
        let g = progress
            .step(format!("{gib} GiB guest: touching"), || {
                guest::Guest::start(bytes)
            })
            .with_context(|| format!("{gib} GiB guest"))?;
        let rss = g.rss();
        progress.suspend(|| {
            println!(
                "guest {gib} GiB: pid {}, resident {:.2} GiB",
                g.pid(),
                rss as f64 / (1u64 << 30) as f64
            )
        });
        for (i, name) in SAMPLERS.iter().enumerate() {
            for (on, budget) in [(0usize, None), (1, Some(pct))] {
                let plan = Plan {
                    runs,
                    intervals: if budget.is_some() { intervals } else { 1 },
                    budget_pct: budget,
                };
                let what = format!(
                    "{gib} GiB {name} budget {}",
                    if on == 1 { "on" } else { "off" }
                );
                let cost = progress.step(what.clone(), || match *name {
                    "hostpte" => measure::hostpte(&g, plan),
                    _ => measure::ept_user(&g, plan, &stand_in),
                })?;
                results[i][on].push(cost);
            }
        }
        // Freed before the next, larger one.
        drop(g);
    }
    progress.finish();
    report(&sizes, &results, pct)
}

fn report(sizes: &[f64], results: &[[Vec<Cost>; 2]], pct: f64) -> anyhow::Result<()> {
    let label = |on: usize| if on == 1 { "on" } else { "off" };
    let mut rows = Vec::new();
    let mut rss_rows = Vec::new();
    for (i, name) in SAMPLERS.iter().enumerate() {
        for on in [0, 1] {
            let base = Summary::of(&results[i][on][0].ms).map(|s| s.median);
            for (k, gib) in sizes.iter().enumerate() {
                let c = &results[i][on][k];
                let s = Summary::of(&c.ms).context("no runs")?;
                rows.push(Row {
                    name: format!("{name} {gib} GiB budget {}", label(on)),
                    unit: "ms CPU/interval",
                    summary: s,
                    ratio: base.filter(|b| *b > 0.0).map(|b| s.median / b),
                });
                let mib = c.peak_rss_kib as f64 / 1024.0;
                rss_rows.push(Row {
                    name: format!("{name} {gib} GiB budget {}", label(on)),
                    unit: "MiB peak RSS",
                    summary: Summary {
                        min: mib,
                        median: mib,
                        max: mib,
                    },
                    ratio: None,
                });
            }
        }
    }
    print_table(
        "CPU per interval of sampling (ratio: against the smallest guest, same sampler and budget)",
        &rows,
    );
    println!();
    print_table(
        "Peak RSS of the sampling process (the sampler code as tierd runs it; one value per case)",
        &rss_rows,
    );
    println!();
    println!("What the budget chose (last sampled interval, budget on):");
    for (i, name) in SAMPLERS.iter().enumerate() {
        for (k, gib) in sizes.iter().enumerate() {
            if let Some(r) = &results[i][1][k].last
                && let Some(v) = r.vms.first()
            {
                println!(
                    "  {name:8} {gib:>5} GiB: coverage {:.5} (stride {}), passes {}/{} (allowance pays {:.2}), spent {:.2} % of {:.2} % of a core{}",
                    v.coverage,
                    v.stride,
                    v.passes,
                    v.slots,
                    v.passes_allowed,
                    v.spent_pct,
                    v.budget_pct,
                    if v.limited.is_empty() {
                        String::new()
                    } else {
                        format!("; limited: {}", v.limited)
                    }
                );
            }
        }
    }
    println!();
    let median = |i: usize, on: usize, k: usize| {
        Summary::of(&results[i][on][k].ms).map_or(f64::NAN, |s| s.median)
    };
    let last = sizes.len() - 1;
    let mut pairs = vec![("bench", "sampler-scale".to_string())];
    let mut worst = f64::NEG_INFINITY;
    for (i, name) in SAMPLERS.iter().enumerate() {
        let growth_on = median(i, 1, last) - median(i, 1, 0);
        let growth_off = median(i, 0, last) - median(i, 0, 0);
        let ratio = growth_on / growth_off;
        println!(
            "{name}: {} -> {} GiB: +{growth_off:.1} ms/interval without the budget, {growth_on:+.2} with: ratio {ratio:.4}",
            sizes[0], sizes[last]
        );
        worst = worst.max(ratio);
        pairs.push((
            if i == 0 {
                "hostpte_slope_ratio"
            } else {
                "ept_user_slope_ratio"
            },
            format!("{ratio:.4}"),
        ));
    }
    let budget_ms = pct / 100.0 * measure::INTERVAL.as_secs_f64() * 1e3;
    pairs.push(("budget_ms_per_interval", format!("{budget_ms:.1}")));
    pairs.push(("ept_bitmap", "stand-in-file".into()));
    pairs.push(("slope_ratio", format!("{worst:.4}")));
    pairs.push(("pass", (worst <= 0.10).to_string()));
    println!("{}", result_line(&pairs));
    Ok(())
}
