//! `--source linux`: the options, the run (`linux.rs`), the tables and
//! the RESULT line (`linux_score.rs`), the CSVs.

use std::time::Duration;

use anyhow::Context;

use crate::linux::{LRecord, Opts, Output, run};
use tier_benches::workload::linux;

/// `--source linux`: runs, prints the tables and the RESULT line, writes
/// the CSVs. `--linux-warmup N` (5) unscored and `--linux-intervals N`
/// (40) scored intervals per workload; `--workloads a,b` runs those only.
pub fn bench(
    interval: Duration,
    passes: u32,
    ages: &tier_profiler::ages::AgesConfig,
) -> anyhow::Result<()> {
    let defaults = tier_profiler::config::Config::default();
    let args: Vec<String> = std::env::args().collect();
    let val = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
    };
    let num = |k: &str, d: usize| -> anyhow::Result<usize> {
        val(k).map_or(Ok(d), |v| v.parse().with_context(|| format!("{k} {v:?}")))
    };
    let opts = Opts {
        interval,
        passes,
        warmup: num("--linux-warmup", 5)?,
        scored: num("--linux-intervals", 40)?,
        only: val("--workloads").map(|v| v.split(',').map(String::from).collect()),
    };
    let probe = tier_profiler::probe::run();
    let mut sampler = tier_profiler::sampler::select(
        "hostpte",
        &probe,
        defaults.ept_sample_stride,
        Duration::from_millis(defaults.damon_sample_ms),
        tier_profiler::sampler::budget::Budget::new(
            defaults.sampler.cpu_budget_pct,
            interval,
            passes,
            u64::from(defaults.ept_sample_stride),
        ),
    )
    .context("selecting hostpte")?
    .context("hostpte: no sampler")?;
    sampler.set_ages(ages);
    println!(
        "fidelity: source linux: Debian 6.12 cloud kernel under QEMU TCG ({} vCPU), node 0 = DRAM tier (m0 + vm0), node 1 = slow tier (m1 + vm1, 128 MiB plugged); backend hostpte on QEMU",
        linux::VCPUS
    );
    println!(
        "  interval {} ms, {passes} passes per interval (tierd defaults: {} ms, {}); hostpte sweep {} s every {} s (tierd: {} s every {} s); {} warm-up + {} scored intervals per workload",
        interval.as_millis(),
        defaults.interval_ms,
        defaults.passes_per_interval,
        ages.sweep_s,
        ages.sweep_every_s,
        defaults.sampler.ws_sweep_s,
        defaults.sampler.ws_sweep_every_s,
        opts.warmup,
        opts.scored
    );
    println!(
        "  truth: tier_truth per guest-physical page (touches = guest loads/stores; misses = those missing a 32 MiB 16-way LLC model), snapshot right before each tick"
    );
    let out = run(&opts, sampler.as_mut())?;
    println!("workloads:");
    for w in &out.workloads {
        println!("  {:<13} {}; placement: {}", w.name, w.what, w.placement);
    }
    truth_summary(&out);
    let rows = crate::linux_score::rows(&out);
    println!();
    println!(
        "hostpte against tier_truth, scored intervals (cover = share whose ~95 % interval holds the truth; w = interval width, pp for ratios, % of the truth for working sets; 1side = one open end; vacu = 0-100 % / 0-all; err_p95 = point error; none = no estimate: hostpte's sweep, or not measured):"
    );
    print!("{}", crate::linux_score::table(&rows));
    let dir = tier_benches::sys::out_dir("fidelity/linux").context("results folder")?;
    let files = [
        ("summary-linux.csv", crate::linux_score::csv(&rows)),
        (
            "intervals-linux.csv",
            crate::linux_score::intervals_csv(&out),
        ),
        ("ws-linux.csv", crate::linux_score::ws_csv(&out)),
    ];
    println!("files:");
    for (name, body) in files {
        let p = dir.join(name);
        std::fs::write(&p, body).with_context(|| format!("writing {}", p.display()))?;
        println!("  {}", p.display());
    }
    let f = |x: Option<f64>| x.map_or("na".to_string(), |x| format!("{x:.2}"));
    let mut pairs: Vec<(String, String)> = vec![
        ("source".into(), "linux".into()),
        (
            "linux_rows".into(),
            rows.iter().filter(|r| r.n > 0).count().to_string(),
        ),
    ];
    for m in ["hit_miss", "hit_touch", "ws_1s", "ws_10s"] {
        if let Some(v) = crate::linux_score::pooled(&rows, m) {
            pairs.extend(v.result_pairs(m));
        }
    }
    if let Some(c) = out.cost {
        println!(
            "plugin cost: `{}` took {:.1} s with tier_truth, {:.1} s without ({:.1}x); boot {:.1} s vs {:.1} s; guest instructions with the plugin: {:.1} M/s over scored intervals",
            linux::COST_WORK,
            c.with_s,
            c.without_s,
            c.with_s / c.without_s.max(1e-9),
            c.boot_with_s,
            c.boot_without_s,
            out.insn_rate / 1e6
        );
        pairs.push((
            "plugin_slowdown".into(),
            f(Some(c.with_s / c.without_s.max(1e-9))),
        ));
    }
    pairs.push(("plugin_minsn_s".into(), f(Some(out.insn_rate / 1e6))));
    let refs: Vec<(&str, String)> = pairs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    println!("{}", tier_benches::result_line(&refs));
    Ok(())
}

/// Per workload: the truth's rates and footprint over scored intervals.
fn truth_summary(out: &Output) {
    println!(
        "truth per scored interval (median): touches/s, LLC misses/s, pages touched, per tier dram|slow; guest instructions/s:"
    );
    for (wi, w) in out.workloads.iter().enumerate() {
        let rs: Vec<&LRecord> = out
            .records
            .iter()
            .filter(|r| r.workload == wi && !r.warmup)
            .collect();
        let med = |g: &dyn Fn(&LRecord) -> u64| {
            let v: Vec<f64> = rs.iter().map(|r| g(r) as f64).collect();
            tier_benches::Summary::of(&v).map_or(0.0, |s| s.median)
        };
        let s = out.interval_s;
        println!(
            "  {:<13} touches {:.2}M|{:.2}M  misses {:.0}k|{:.0}k  pages {:.0}|{:.0}  insns {:.1}M",
            w.name,
            med(&|r| r.sums.touches[0]) / 1e6 / s,
            med(&|r| r.sums.touches[1]) / 1e6 / s,
            med(&|r| r.sums.misses[0]) / 1e3 / s,
            med(&|r| r.sums.misses[1]) / 1e3 / s,
            med(&|r| r.sums.pages[0]),
            med(&|r| r.sums.pages[1]),
            med(&|r| r.instructions) / 1e6 / s,
        );
    }
}
