//! `cargo xtask bench value`: what acting on tierd gains (docs/value.md).
//! Two Linux guests on the bed share a host DRAM budget below their
//! combined demand; the same schedule runs under each policy (all DRAM,
//! static split, the guests' own tiering, tierd's controller in both
//! modes, an oracle) and each guest's time is modelled from its exact
//! counts. Prints the policy table, writes a CSV of every interval and an
//! SVG, ends with one RESULT line. `--source ch`: three test guests under
//! the patched cloud-hypervisor instead (`ch.rs`).

mod ch;
mod run;

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use tier_benches::value::{CostModel, Sample, Summary, gain_share, per_second, summarise};
use tier_benches::{Row, Summary as Mmm, print_table, result_line};

use run::{Policy, RunOut, Schedule};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let val = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
    };
    let num = |k: &str, d: f64| -> anyhow::Result<f64> {
        val(k).map_or(Ok(d), |v| v.parse().with_context(|| format!("{k} {v:?}")))
    };
    let d = CostModel::default();
    let model = CostModel {
        cpi: num("--cpi", d.cpi)?,
        ghz: num("--ghz", d.ghz)?,
        dram_ns: num("--dram-ns", d.dram_ns)?,
        slow_ns: num("--slow-ns", d.slow_ns)?,
        mlp: num("--mlp", d.mlp)?,
    };
    model.validate()?;
    let sched = Schedule {
        phase_s: num("--phase-s", 60.0)? as u64,
        after_s: num("--after-s", 100.0)? as u64,
        grow_mib: num("--grow-mib", 200.0)? as u64,
    };
    let policies: Vec<Policy> = match val("--policies") {
        Some(v) => v.split(',').map(Policy::parse).collect::<Result<_, _>>()?,
        None => Policy::DEFAULT.to_vec(),
    };
    let repeats: u32 = match val("--repeats") {
        Some(v) => v
            .parse()
            .with_context(|| format!("--repeats {v:?}: a whole number"))?,
        None => 1,
    };
    anyhow::ensure!(repeats >= 1, "--repeats {repeats}: at least 1");
    let rounds = Rounds {
        n: repeats,
        keep: args.iter().any(|a| a == "--keep-work"),
    };
    let out = PathBuf::from(val("--out").map_or("target/value", String::as_str));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    if args.iter().any(|a| a == "--fleet") {
        return fleet(
            &model,
            num("--fleet-vms", 1000.0)? as usize,
            num("--insns-per-miss", 2.8)?,
        );
    }
    let source = match val("--source").map(String::as_str) {
        None | Some("linux") => Source::Linux,
        Some("ch") => Source::Ch,
        Some(v) => anyhow::bail!("--source {v:?}: known: linux, ch"),
    };
    if let Some(csv) = val("--from-csv") {
        // Re-cost a recorded run under this model: no guest is booted.
        println!(
            "value: re-costing {csv}: time = insns x {} CPI / {} GHz + (dram misses x {} ns + slow misses x {} ns) / MLP {}",
            model.cpi, model.ghz, model.dram_ns, model.slow_ns, model.mlp
        );
        let runs = read_csv(std::path::Path::new(csv), source)?;
        let sums = summaries(&model, &runs, source);
        return report(&sums, &runs, &model, source);
    }
    if source == Source::Ch {
        let ch_sched = tier_benches::value::ch::Schedule {
            settle_s: num("--settle-s", 20.0)? as u64,
            phase_s: num("--phase-s", 40.0)? as u64,
            after_s: num("--after-s", 60.0)? as u64,
            ..Default::default()
        };
        let ipm = num("--insns-per-miss", 2.8)?;
        return run_ch(
            &model,
            ch_sched,
            ipm,
            &policies,
            rounds,
            &out,
            val("--ch-bin").map(String::as_str),
        );
    }
    let env = run::Env::from_env()?;
    println!(
        "value: source linux: 2 Debian 6.12 guests under QEMU TCG with tier_truth; each: DRAM node 128 MiB boot + virtio-mem (64 of 256 MiB plugged), slow node the same; host DRAM budget {} MiB",
        run::BUDGET >> 20
    );
    println!(
        "  schedule: a touches 16 of its {} MiB until {} s, then all of it (grows past its DRAM); b idles on 16 MiB; every 64-byte line of the hot set per pass; watched {} s",
        sched.grow_mib,
        sched.phase_s,
        sched.phase_s + sched.after_s
    );
    println!(
        "  cost model: time = insns x {} CPI / {} GHz + (dram misses x {} ns + slow misses x {} ns) / MLP {}; slowdown = time / time with every miss in DRAM",
        model.cpi, model.ghz, model.dram_ns, model.slow_ns, model.mlp
    );
    let rt = runtime()?;
    let runs = run_all(&policies, rounds, &out, &model, Source::Linux, |p, work| {
        rt.block_on(run::run(&env, sched, p, work))
    })?;
    let sums = summaries(&model, &runs, Source::Linux);
    report(&sums, &runs, &model, Source::Linux)?;
    plot(&out, &sums, &runs, &model, Source::Linux)?;
    Ok(())
}

/// The runtime both sources drive their guests and tierd from.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("tokio")
}

/// How often each policy runs, and what is kept of its runs.
#[derive(Debug, Clone, Copy)]
struct Rounds {
    /// `--repeats`.
    n: u32,
    /// `--keep-work`: every run's work dir under `--out`.
    keep: bool,
}

/// Where the guests run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Two Debian guests on the Linux bed.
    Linux,
    /// Three test guests under the patched cloud-hypervisor.
    Ch,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::Linux => "linux",
            Source::Ch => "ch",
        }
    }

    fn guests(self) -> &'static [&'static str] {
        match self {
            Source::Linux => &run::GUESTS,
            Source::Ch => &ch::GUESTS,
        }
    }
}

/// The cloud-hypervisor source: each policy on three fresh test guests.
fn run_ch(
    model: &CostModel,
    sched: tier_benches::value::ch::Schedule,
    insns_per_miss: f64,
    policies: &[Policy],
    rounds: Rounds,
    out: &std::path::Path,
    ch_bin: Option<&str>,
) -> anyhow::Result<()> {
    let env = ch::Env::from_env(ch_bin)?;
    let started = std::time::Instant::now();
    let g = sched.guests();
    println!(
        "value: source ch: 3 PVH test guests under the patched cloud-hypervisor ({}); each: DRAM zone {} MiB, slow zone {} MiB, per-tier balloon; host DRAM budget {} MiB ({} MiB each at the start)",
        env.ch_bin.display(),
        ch::DRAM_MIB,
        ch::SLOW_MIB,
        ch::BUDGET >> 20,
        ch::SHARE_MIB
    );
    println!(
        "  schedule (guest clocks): {} s to settle at the starting split (not recorded), then a's hot set grows from {} to {} pages at {} s (past its DRAM), b's shrinks from {} to {}, c idles on {}; one hot set each, DRAM-preferring, touched uniformly; recorded {} s",
        sched.settle_s,
        g[0].active[0],
        g[0].active[1],
        sched.settle_s + sched.phase_s,
        g[1].active[0],
        g[1].active[1],
        g[2].active[0],
        sched.phase_s + sched.after_s
    );
    println!(
        "  cost model: every access an LLC miss to its page's tier (exact per-tier counts), {insns_per_miss} instructions per access; time = insns x {} CPI / {} GHz + (dram misses x {} ns + slow misses x {} ns) / MLP {}",
        model.cpi, model.ghz, model.dram_ns, model.slow_ns, model.mlp
    );
    let rt = runtime()?;
    let runs = run_all(policies, rounds, out, model, Source::Ch, |p, work| {
        rt.block_on(ch::run(&env, sched, insns_per_miss, p, work))
    })?;
    let sums = summaries(model, &runs, Source::Ch);
    report(&sums, &runs, model, Source::Ch)?;
    plot(out, &sums, &runs, model, Source::Ch)?;
    println!(
        "value --source ch: {:.1} min in all",
        started.elapsed().as_secs_f64() / 60.0
    );
    Ok(())
}

/// Each policy `repeats` times, the order rotated each round so that no
/// policy always runs first on a cold host. A run that fails (a TCG guest
/// now and then oopses at boot under load) gets one more try, its work
/// dir kept under `out`; a policy failing twice is reported missing.
/// `rounds.keep`: every run's work dir is kept (`work-POLICY-ROUND`: tierd's log
/// and decisions, the guests' serial logs).
fn run_all(
    policies: &[Policy],
    rounds: Rounds,
    out: &std::path::Path,
    model: &CostModel,
    source: Source,
    mut one: impl FnMut(Policy, &std::path::Path) -> anyhow::Result<RunOut>,
) -> anyhow::Result<Vec<RunOut>> {
    let mut runs = Vec::new();
    let mut failed = Vec::new();
    let (repeats, keep) = (rounds.n, rounds.keep);
    for rep in 0..repeats {
        let mut order = policies.to_vec();
        let n = order.len().max(1);
        order.rotate_left(rep as usize % n);
        for p in order {
            let what = match source {
                Source::Linux => p.what(),
                Source::Ch => ch::what(p),
            };
            println!(
                "policy {} (round {} of {repeats}): {what}",
                p.name(),
                rep + 1
            );
            if source == Source::Ch && p == Policy::GuestTiering {
                continue;
            }
            let t0 = std::time::Instant::now();
            let mut r = None;
            for attempt in 1..=2 {
                let tmp = tempfile::tempdir().context("work dir")?;
                let res = one(p, tmp.path());
                let name = match &res {
                    Ok(_) if keep => Some(format!("work-{}-{}", p.name(), rep + 1)),
                    Ok(_) => None,
                    Err(e) => {
                        println!("  policy {} attempt {attempt} failed: {e:#}", p.name());
                        // Kept for a look: the guests' serial logs and tierd's.
                        Some(format!("failed-{}-{}-{attempt}", p.name(), rep + 1))
                    }
                };
                if let Some(name) = name {
                    let dst = out.join(name);
                    let _ = std::fs::remove_dir_all(&dst);
                    let _ = std::process::Command::new("cp")
                        .arg("-r")
                        .arg(tmp.path())
                        .arg(&dst)
                        .status();
                }
                if let Ok(o) = res {
                    r = Some(o);
                    break;
                }
            }
            let Some(mut r) = r else {
                failed.push(format!("{}#{}", p.name(), rep + 1));
                continue;
            };
            r.repeat = rep;
            println!(
                "  done in {:.0} s: {} intervals, workloads alive {}, DRAM moved {} MiB{}",
                t0.elapsed().as_secs_f64(),
                r.ticks.len() / source.guests().len(),
                r.alive.map_or("-".into(), |a| a.to_string()),
                r.moved >> 20,
                r.vmstat
                    .iter()
                    .zip(source.guests())
                    .map(|(v, g)| format!("; vmstat {g} {v:?}"))
                    .collect::<String>()
            );
            runs.push(r);
            // Each run's counts are kept as soon as it ends.
            write_csv(&out.join("value.csv"), model, &runs, source)?;
        }
    }
    if !failed.is_empty() {
        println!("runs that failed twice: {}", failed.join(","));
    }
    Ok(runs)
}

/// A run's name in tables and plots: `policy#k` for round k when there
/// are several.
fn label(r: &RunOut, rounds: u32) -> String {
    if rounds > 1 {
        format!("{}#{}", r.policy.name(), r.repeat + 1)
    } else {
        r.policy.name().to_string()
    }
}

/// Rounds in `runs`.
fn rounds(runs: &[RunOut]) -> u32 {
    runs.iter().map(|r| r.repeat + 1).max().unwrap_or(1)
}

fn summaries(model: &CostModel, runs: &[RunOut], source: Source) -> Vec<(Policy, Summary)> {
    runs.iter()
        .map(|r| {
            let s: Vec<_> = r.ticks.iter().map(|t| t.sample).collect();
            (
                r.policy,
                summarise(model, &s, source.guests().len(), r.moved),
            )
        })
        .collect()
}

/// Runs back from [`write_csv`]'s file: DRAM moved from each guest's
/// changes of DRAM held, resizes as those changes.
fn read_csv(path: &std::path::Path, source: Source) -> anyhow::Result<Vec<RunOut>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut runs: Vec<RunOut> = Vec::new();
    for (n, line) in text.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        anyhow::ensure!(
            f.len() >= 9,
            "{}:{}: {} fields",
            path.display(),
            n + 1,
            f.len()
        );
        let num = |i: usize| -> anyhow::Result<u64> {
            f[i].parse()
                .with_context(|| format!("{}:{}: field {}", path.display(), n + 1, i + 1))
        };
        let policy = Policy::parse(f[0])?;
        let guest = source
            .guests()
            .iter()
            .position(|g| *g == f[2])
            .with_context(|| format!("{}:{}: guest {:?}", path.display(), n + 1, f[2]))?;
        let tick = run::Tick {
            t: f[1].parse().context("t_s")?,
            sample: tier_benches::value::Sample {
                guest,
                instructions: num(3)?,
                misses: [num(4)?, num(5)?],
                pages: [num(6)?, num(7)?],
                dram_bytes: num(8)?,
            },
        };
        // Older files have no repeat column: one round.
        let repeat: u32 = match f.get(10) {
            Some(v) => v
                .parse()
                .with_context(|| format!("{}:{}: repeat {v:?}", path.display(), n + 1))?,
            None => 0,
        };
        if runs
            .last()
            .is_none_or(|r| r.policy != policy || r.repeat != repeat)
        {
            runs.push(RunOut {
                policy,
                ticks: Vec::new(),
                moved: 0,
                resizes: 0,
                alive: None,
                vmstat: Vec::new(),
                repeat,
            });
        }
        if let Some(r) = runs.last_mut() {
            r.ticks.push(tick);
        }
    }
    for r in &mut runs {
        let mut last = std::collections::BTreeMap::new();
        for t in &r.ticks {
            if let Some(prev) = last.insert(t.sample.guest, t.sample.dram_bytes) {
                r.moved += prev.abs_diff(t.sample.dram_bytes);
            }
        }
        r.resizes = run::count_requests(&r.ticks);
    }
    Ok(runs)
}

fn pct(x: f64) -> f64 {
    (x - 1.0) * 100.0
}

fn report(
    sums: &[(Policy, Summary)],
    runs: &[RunOut],
    model: &CostModel,
    source: Source,
) -> anyhow::Result<()> {
    let names = source.guests();
    let rounds = rounds(runs);
    // Policies in the order they first ran.
    let mut policies: Vec<Policy> = Vec::new();
    for r in runs {
        if !policies.contains(&r.policy) {
            policies.push(r.policy);
        }
    }
    let find = |p: Policy, rep: u32| {
        sums.iter()
            .zip(runs)
            .find(|(s, r)| s.0 == p && r.repeat == rep)
            .map(|(s, _)| &s.1)
    };
    // Against the static split and the oracle of the same round: rounds
    // differ by more than policies do on the bed.
    let share = |s: &Summary, rep: u32| match (find(Policy::Static, rep), find(Policy::Oracle, rep))
    {
        (Some(st), Some(or)) => gain_share(st.aggregate, s.aggregate, or.aggregate),
        _ => None,
    };
    let label = |r: &RunOut| label(r, rounds);
    println!();
    println!(
        "policies (slowdown % = modelled time over all-DRAM time: agg = summed over guest-intervals, mean/p95/max = per guest-interval; slow share = {}; DRAM = mean held per guest; oracle share = (static - p) / (static - oracle) on agg{}):",
        match source {
            Source::Linux => "touched pages on the slow node",
            Source::Ch => "the workloads' resident pages on the slow tier",
        },
        if rounds > 1 {
            ", within the round; #k = round k"
        } else {
            ""
        }
    );
    let guest_cols: String = names
        .iter()
        .map(|n| format!(" {:>8}", format!("{n} mean")))
        .collect();
    println!(
        "{:<20} {:>6} {:>8} {:>8} {:>8} {:>8}{} {:>10} {:>10} {:>10} {:>8} {:>7} {:>6}",
        "policy",
        "n",
        "agg %",
        "mean %",
        "p95 %",
        "max %",
        guest_cols,
        "slow shr",
        "DRAM MiB",
        "moved MiB",
        "resizes",
        "oracle",
        "alive"
    );
    for ((_, s), r) in sums.iter().zip(runs) {
        let guest_cols: String = (0..names.len())
            .map(|g| {
                format!(
                    " {:>8.2}",
                    pct(s.per_guest.get(g).copied().unwrap_or(f64::NAN))
                )
            })
            .collect();
        println!(
            "{:<20} {:>6} {:>8.2} {:>8.2} {:>8.2} {:>8.2}{} {:>9.1}% {:>10.0} {:>10} {:>8} {:>7} {:>6}",
            label(r),
            s.samples,
            pct(s.aggregate),
            pct(s.mean),
            pct(s.p95),
            pct(s.max),
            guest_cols,
            s.slow_share * 100.0,
            s.dram_mean / (1u64 << 20) as f64,
            s.moved >> 20,
            r.resizes,
            share(s, r.repeat).map_or("-".into(), |x| format!("{x:.2}")),
            r.alive.map_or("-".into(), |a| a.to_string())
        );
    }
    if source == Source::Ch {
        println!(
            "{:<20} n/a (the test guest has no tiering of its own)",
            Policy::GuestTiering.name()
        );
    }
    interval_table(runs, &policies, model);
    // Per policy over the rounds: each value is one round's.
    let over_rounds = |p: Policy, f: &dyn Fn(&Summary, u32) -> Option<f64>| -> Vec<f64> {
        sums.iter()
            .zip(runs)
            .filter(|(s, _)| s.0 == p)
            .filter_map(|(s, r)| f(&s.1, r.repeat))
            .filter(|x| !x.is_nan())
            .collect()
    };
    let median = |v: Vec<f64>| Mmm::of(&v);
    // `oracle_share` is tierd's better mode of the two the bench runs by
    // default (as it always was); every mode run is in `oracle_share_per_mode`.
    let modes = [
        Policy::Ratio,
        Policy::WorkingSet,
        Policy::RatioEager,
        Policy::WorkingSetEager,
    ];
    let shares: Vec<(Policy, Mmm, usize)> = modes
        .into_iter()
        .filter_map(|p| {
            let v = over_rounds(p, &share);
            Some((p, median(v.clone())?, v.len()))
        })
        .collect();
    // "(k of N)": a figure from fewer rounds than were run (a run that
    // failed twice, no static split or oracle in its round).
    let of_rounds = |n: usize| {
        if (n as u32) < rounds {
            format!(" ({n} of {rounds})")
        } else {
            String::new()
        }
    };
    if rounds > 1 {
        let agg = |s: &Summary, _| Some(pct(s.aggregate));
        let base = Mmm::of(&over_rounds(Policy::Static, &agg));
        let mut rows = Vec::new();
        for &p in &policies {
            let v = over_rounds(p, &agg);
            if let Some(m) = Mmm::of(&v) {
                rows.push(Row {
                    name: format!("agg {}{}", p.name(), of_rounds(v.len())),
                    unit: "%",
                    summary: m,
                    ratio: base.filter(|b| b.median > 0.0).map(|b| m.median / b.median),
                });
            }
        }
        for (p, m, n) in &shares {
            rows.push(Row {
                name: format!("share {}{}", p.name(), of_rounds(*n)),
                unit: "x",
                summary: *m,
                ratio: None,
            });
        }
        println!();
        print_table(
            &format!(
                "over {rounds} rounds: agg slowdown % (ratio: median over the static split's) and tierd's share of the oracle's gain (within each round: the share rows); a spread wider than the gaps between policies means one round decides nothing"
            ),
            &rows,
        );
    }
    // The yardstick of every share: small gains make large shares of noise.
    let gain = Mmm::of(&over_rounds(Policy::Oracle, &|or, rep| {
        Some(pct(find(Policy::Static, rep)?.aggregate) - pct(or.aggregate))
    }));
    if let Some(g) = gain {
        println!();
        println!(
            "the oracle's gain over the static split (agg, pp): {:.1} (min {:.1}, max {:.1} over {rounds} round(s)); each share divides by it",
            g.median, g.min, g.max
        );
    }
    let beat: Vec<String> = sums
        .iter()
        .zip(runs)
        .filter(|(s, r)| {
            !matches!(s.0, Policy::Oracle | Policy::AllDram)
                && share(&s.1, r.repeat).is_some_and(|x| x > 1.0)
        })
        .map(|(_, r)| label(r))
        .collect();
    if !beat.is_empty() {
        println!(
            "{} beat the oracle (share above 1): {}; read those shares as ranks",
            beat.join(", "),
            match source {
                Source::Linux =>
                    "on the bed it splits the budget by the last 5 s's misses and leaves page placement to the guests' NUMA balancing, so it bounds no policy",
                Source::Ch =>
                    "it splits by the last 5 s's accesses over the known hot sets and acts a second later, so a policy can be ahead of it at a phase change",
            }
        );
    }
    let best = shares
        .iter()
        .filter(|s| matches!(s.0, Policy::Ratio | Policy::WorkingSet))
        .max_by(|a, b| a.1.median.total_cmp(&b.1.median));
    let per_mode: Vec<String> = shares
        .iter()
        .map(|(p, m, _)| format!("{}:{:.2}", p.name(), m.median))
        .collect();
    let per_policy = |f: &dyn Fn(&Summary, u32) -> Option<f64>| -> String {
        policies
            .iter()
            .filter_map(|&p| {
                Some(format!(
                    "{}:{:.1}",
                    p.name(),
                    median(over_rounds(p, f))?.median
                ))
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    let names: Vec<&str> = policies.iter().map(|p| p.name()).collect();
    let f2 = |x: Option<f64>| x.map_or("none".into(), |x| format!("{x:.2}"));
    println!();
    println!(
        "{}",
        result_line(&[
            ("bench", "value".into()),
            ("source", source.name().into()),
            ("repeats", rounds.to_string()),
            ("policies", names.join(",")),
            ("oracle_share", f2(best.map(|b| b.1.median))),
            (
                "oracle_share_mode",
                best.map_or("none".into(), |b| b.0.name().into())
            ),
            ("oracle_share_min", f2(best.map(|b| b.1.min))),
            ("oracle_share_max", f2(best.map(|b| b.1.max))),
            (
                "oracle_share_rounds",
                best.map_or("0".into(), |b| b.2.to_string()),
            ),
            (
                "oracle_share_per_mode",
                if per_mode.is_empty() {
                    "none".into()
                } else {
                    per_mode.join(",")
                },
            ),
            (
                "oracle_gain_pp",
                gain.map_or("none".into(), |g| format!("{:.1}", g.median))
            ),
            ("p95_slowdown_pct", per_policy(&|s, _| Some(pct(s.p95)))),
            (
                "agg_slowdown_pct",
                per_policy(&|s, _| Some(pct(s.aggregate)))
            ),
        ])
    );
    Ok(())
}

/// The benches' standard table: slowdown per guest-interval and of all
/// guests together per second, each policy's rounds pooled; ratio of
/// medians against the static split.
fn interval_table(runs: &[RunOut], policies: &[Policy], model: &CostModel) {
    let of = |p: Policy| runs.iter().filter(move |r| r.policy == p);
    let mut rows: Vec<Row> = Vec::new();
    for &p in policies {
        let v: Vec<f64> = of(p)
            .flat_map(|r| &r.ticks)
            .filter_map(|t| model.slowdown(t.sample.instructions, t.sample.misses))
            .map(pct)
            .collect();
        if let Some(m) = Mmm::of(&v) {
            rows.push(Row {
                name: format!("slowdown {}", p.name()),
                unit: "%",
                summary: m,
                ratio: None,
            });
        }
    }
    // The guests' work as a whole, per second: medians per guest-interval
    // are 0 where most intervals miss only in DRAM.
    for &p in policies {
        let v: Vec<f64> = of(p)
            .flat_map(|r| {
                let ticks: Vec<(f64, Sample)> = r.ticks.iter().map(|t| (t.t, t.sample)).collect();
                per_second(model, &ticks)
            })
            .map(pct)
            .collect();
        if let Some(m) = Mmm::of(&v) {
            rows.push(Row {
                name: format!("agg/s {}", p.name()),
                unit: "%",
                summary: m,
                ratio: None,
            });
        }
    }
    let base_of = |name: &str| {
        rows.iter()
            .find(|r| r.name == name)
            .map(|r| r.summary.median)
    };
    let (base, base_agg) = (base_of("slowdown static"), base_of("agg/s static"));
    for r in &mut rows {
        let b = if r.name.starts_with("agg/s") {
            base_agg
        } else {
            base
        };
        r.ratio = b.filter(|b| *b > 0.0).map(|b| r.summary.median / b);
    }
    println!();
    print_table(
        "slowdown % per guest-interval, and of all guests together per second (agg/s); ratio: median over the static split's",
        &rows,
    );
}

fn write_csv(
    path: &std::path::Path,
    model: &CostModel,
    runs: &[RunOut],
    source: Source,
) -> anyhow::Result<()> {
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    writeln!(
        f,
        "policy,t_s,guest,instructions,misses_dram,misses_slow,pages_dram,pages_slow,dram_bytes,slowdown,repeat"
    )?;
    for r in runs {
        for t in &r.ticks {
            let s = &t.sample;
            writeln!(
                f,
                "{},{:.1},{},{},{},{},{},{},{},{},{}",
                r.policy.name(),
                t.t,
                source.guests().get(s.guest).copied().unwrap_or("?"),
                s.instructions,
                s.misses[0],
                s.misses[1],
                s.pages[0],
                s.pages[1],
                s.dram_bytes,
                model
                    .slowdown(s.instructions, s.misses)
                    .map_or(String::new(), |x| format!("{x:.4}")),
                r.repeat
            )?;
        }
    }
    println!("wrote {}", path.display());
    Ok(())
}

/// Per policy a timeline panel (each guest's slowdown and slow-tier share)
/// and one scatter of mean slowdown against slow-tier share.
fn plot(
    out: &std::path::Path,
    sums: &[(Policy, Summary)],
    runs: &[RunOut],
    model: &CostModel,
    source: Source,
) -> anyhow::Result<()> {
    use tier_benches::plot::{Panel, Series, grid, scatter};
    let rounds = rounds(runs);
    let panels: Vec<Panel> = runs
        .iter()
        .map(|r| {
            let mut series = Vec::new();
            for (g, name) in source.guests().iter().enumerate() {
                let ticks = r.ticks.iter().filter(|t| t.sample.guest == g);
                series.push(Series {
                    name: format!("{name} slowdown %"),
                    points: ticks
                        .clone()
                        .map(|t| {
                            let s = &t.sample;
                            (t.t, model.slowdown(s.instructions, s.misses).map(pct))
                        })
                        .collect(),
                });
                series.push(Series {
                    name: format!("{name} on slow %"),
                    points: ticks
                        .map(|t| {
                            let p = t.sample.pages;
                            (
                                t.t,
                                (p[0] + p[1] > 0)
                                    .then(|| 100.0 * p[1] as f64 / (p[0] + p[1]) as f64),
                            )
                        })
                        .collect(),
                });
            }
            Panel {
                title: label(r, rounds),
                series,
                markers: Vec::new(),
            }
        })
        .collect();
    let path = out.join("value-timeline.svg");
    grid(&path, &panels, 2, (520, 300), "s", "%")?;
    println!("wrote {}", path.display());
    let points: Vec<(String, f64, f64)> = sums
        .iter()
        .zip(runs)
        .map(|((_, s), r)| (label(r, rounds), s.slow_share * 100.0, pct(s.mean)))
        .collect();
    let path = out.join("value.svg");
    scatter(
        &path,
        "modelled slowdown against slow-tier share, per policy",
        &points,
        "touched pages on the slow tier %",
        "mean slowdown %",
    )?;
    println!("wrote {}", path.display());
    Ok(())
}

/// The fleet: tierd's controller on simulated VMs per backend (their
/// readings modelled from each backend's sampling), against static splits
/// and the sim's oracle, every VM-interval costed by the same model.
fn fleet(model: &CostModel, vms: usize, insns_per_access: f64) -> anyhow::Result<()> {
    use tier_benches::twin::fleet::{Backend, Costing, Decider, run_with};
    let costing = Some(Costing {
        model: *model,
        insns_per_access,
    });
    let (intervals, phase_at, seed) = (40, 20, 1);
    println!(
        "value --fleet: {vms} simulated VMs (tier_sim fleet, 2/4/8 GiB, a third change phase at {phase_at} of {intervals} intervals, 2 % refuse their balloon), budget 1.1x the DRAM each needs for 0.9; {insns_per_access} instructions per LLC miss; cost model as on the bed"
    );
    let mut rows: Vec<(String, tier_benches::twin::fleet::FleetResult)> = Vec::new();
    for d in [
        Decider::StaticEqual,
        Decider::StaticProportional,
        Decider::Oracle,
    ] {
        rows.push((
            d.name().into(),
            run_with(Backend::HostPte, vms, intervals, phase_at, seed, d, costing),
        ));
    }
    for b in [Backend::HostPte, Backend::Ept, Backend::PmuCount] {
        rows.push((
            format!("tierd {}", b.name()),
            run_with(b, vms, intervals, phase_at, seed, Decider::Tierd, costing),
        ));
    }
    let mean = |r: &tier_benches::twin::fleet::FleetResult| {
        r.slowdowns.iter().sum::<f64>() / r.slowdowns.len().max(1) as f64
    };
    let agg = |r: &tier_benches::twin::fleet::FleetResult| r.time_ns / r.ref_ns;
    let base = |n: &str| rows.iter().find(|r| r.0 == n).map(|r| agg(&r.1));
    let (eq, prop, or) = (
        base("static-equal"),
        base("static-proportional"),
        base("oracle"),
    );
    println!(
        "agg = modelled time over all-DRAM time summed over cooperative VM-intervals; mean/p95/max per VM-interval; slow shr = hot bytes on the slow tier; DRAM used = held / budget; share eq/prop = (static - p) / (static - oracle) on agg, against the equal / proportional split:"
    );
    println!(
        "{:<20} {:>7} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>10} {:>7} {:>9} {:>9}",
        "policy",
        "n",
        "agg %",
        "mean %",
        "p95 %",
        "max %",
        "slow shr",
        "DRAM used",
        "moved GiB",
        "moves",
        "share eq",
        "share prop"
    );
    let mut result = Vec::new();
    for (name, r) in &rows {
        let (m, a) = (mean(r), agg(r));
        let p95 = tier_benches::value::percentile(&r.slowdowns, 95.0).unwrap_or(f64::NAN);
        let max = r.slowdowns.iter().copied().fold(f64::NAN, f64::max);
        let share = |st: Option<f64>| match (st, or) {
            (Some(st), Some(or)) => gain_share(st, a, or),
            _ => None,
        };
        let f = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.2}"));
        println!(
            "{:<20} {:>7} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.1}% {:>8.1}% {:>10.1} {:>7} {:>9} {:>9}",
            name,
            r.slowdowns.len(),
            pct(a),
            pct(m),
            pct(p95),
            pct(max),
            100.0 * r.hot_slow / r.hot_all.max(1.0),
            100.0 * r.dram_held / (r.intervals_costed.max(1) as f64 * r.budget.max(1) as f64),
            r.dram_moved_gib,
            r.moves,
            f(share(eq)),
            f(share(prop))
        );
        result.push((name.replace(' ', "-"), pct(p95), share(eq)));
    }
    let shares: Vec<String> = result
        .iter()
        .filter(|r| r.0.starts_with("tierd"))
        .map(|r| {
            format!(
                "{}:{}",
                r.0.trim_start_matches("tierd-"),
                r.2.map_or("none".into(), |x| format!("{x:.2}"))
            )
        })
        .collect();
    let p95: Vec<String> = result
        .iter()
        .map(|r| format!("{}:{:.1}", r.0, r.1))
        .collect();
    println!(
        "{}",
        result_line(&[
            ("bench", "value".into()),
            ("source", "fleet".into()),
            ("vms", vms.to_string()),
            (
                "policies",
                result
                    .iter()
                    .map(|r| r.0.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            ("oracle_share", shares.join(",")),
            ("p95_slowdown_pct", p95.join(",")),
        ])
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tick(guest: usize, insns: u64) -> run::Tick {
        run::Tick {
            t: 1.0,
            sample: Sample {
                guest,
                instructions: insns,
                misses: [10, 5],
                pages: [3, 1],
                dram_bytes: 1 << 20,
            },
        }
    }

    #[test]
    fn rounds_rotate_the_order_and_survive_the_csv() {
        let dir = tempfile::tempdir().unwrap();
        let ps = [Policy::Static, Policy::Ratio, Policy::Oracle];
        let mut order = Vec::new();
        let runs = run_all(
            &ps,
            Rounds { n: 2, keep: true },
            dir.path(),
            &CostModel::default(),
            Source::Linux,
            |p, work| {
                std::fs::write(work.join("tierd.log"), p.name()).unwrap();
                order.push(p);
                Ok(RunOut {
                    policy: p,
                    ticks: vec![tick(0, 100), tick(1, 200)],
                    moved: 0,
                    resizes: 0,
                    alive: Some(true),
                    vmstat: Vec::new(),
                    repeat: 0,
                })
            },
        )
        .unwrap();
        use Policy::*;
        assert_eq!(order, [Static, Ratio, Oracle, Ratio, Oracle, Static]);
        let kept = std::fs::read_to_string(dir.path().join("work-ratio-2/tierd.log")).unwrap();
        assert_eq!(kept, "ratio");
        let back = read_csv(&dir.path().join("value.csv"), Source::Linux).unwrap();
        let got: Vec<(Policy, u32, usize)> = back
            .iter()
            .map(|r| (r.policy, r.repeat, r.ticks.len()))
            .collect();
        let want: Vec<(Policy, u32, usize)> =
            runs.iter().map(|r| (r.policy, r.repeat, 2)).collect();
        assert_eq!(got, want);
        assert_eq!(want[3], (Ratio, 1, 2));
    }

    #[test]
    fn a_csv_without_a_repeat_column_is_one_round() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.csv");
        std::fs::write(
            &path,
            "policy,t_s,guest,instructions,misses_dram,misses_slow,pages_dram,pages_slow,dram_bytes,slowdown\n\
             static,1.0,a,100,10,5,3,1,1048576,1.5\n\
             static,1.0,b,100,10,5,3,1,1048576,1.5\n\
             oracle,1.0,a,100,10,5,3,1,1048576,1.5\n",
        )
        .unwrap();
        let runs = read_csv(&path, Source::Linux).unwrap();
        assert_eq!(runs.len(), 2);
        assert!(runs.iter().all(|r| r.repeat == 0));
        assert_eq!(runs[0].ticks.len(), 2);
    }

    #[test]
    fn a_failing_run_is_tried_twice_then_reported_missing() {
        let dir = tempfile::tempdir().unwrap();
        let mut tries = 0;
        let runs = run_all(
            &[Policy::Static],
            Rounds { n: 1, keep: false },
            dir.path(),
            &CostModel::default(),
            Source::Linux,
            |_, _| {
                tries += 1;
                anyhow::bail!("guest oopsed")
            },
        )
        .unwrap();
        assert_eq!(tries, 2);
        assert!(runs.is_empty());
        assert!(dir.path().join("failed-static-1-2").is_dir());
        assert!(!dir.path().join("work-static-1").exists());
    }
}
