//! Re-fits a recorded fidelity run: reads the per-pass young counts that
//! `cargo xtask bench fidelity` writes to its intervals CSV, replays them in
//! order through this build's estimate (`estimate::VmFit`, one per
//! workload, warm-up intervals included as tierd would see them) and
//! scores the result against the
//! recorded truth, next to what the run itself reported. A change to the
//! estimate is then judged on real passes in a second, without a VM; only a
//! new schedule of passes needs a new run. Usage: `refit [CSV]` (default:
//! the last test-guest run's hostpte intervals); `refit --refit-every N
//! [CSV]`: a full fit at least every N intervals (1: every interval, as
//! before the kept fits were reused).

use std::path::PathBuf;

use anyhow::{Context, bail};
use tier_benches::fidelity::{ErrorStats, error_pp, ratio};
use tier_benches::result_line;
use tier_profiler::aggregate::{HitInterval, hit_interval};
use tier_profiler::estimate::bounds::Programs;
use tier_profiler::estimate::{REFIT_EVERY, TierIn, VmFit, VmWindows, WINDOW};
use tier_proto::v1::TierSample;

/// One scored interval of the CSV.
#[derive(Debug, Clone, PartialEq)]
struct Interval {
    index: String,
    workload: String,
    /// Not scored; its passes still go into the rate windows.
    warmup: bool,
    change: bool,
    truth: f64,
    /// The ratio the run reported; `None` when it said nothing.
    recorded: Option<f64>,
    /// (seconds, young) per pass, [dram, slow].
    passes: [Vec<(f64, f64)>; 2],
    /// The VM's other tiers, pooled with these by the fit.
    other: Vec<Vec<(f64, f64)>>,
}

/// Splits one CSV line; fields may be double-quoted (workload names hold
/// commas).
fn fields(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out
}

fn list(s: &str, what: &str) -> anyhow::Result<Vec<f64>> {
    s.split(';')
        .map(|x| x.parse::<f64>().with_context(|| format!("{what}: {x:?}")))
        .collect()
}

/// The intervals with truth and per-pass counts, warm-up ones included.
fn parse(csv: &str) -> anyhow::Result<Vec<Interval>> {
    let mut lines = csv.lines();
    let head = fields(lines.next().context("empty CSV")?);
    let names = [
        "interval",
        "workload",
        "warmup",
        "change",
        "truth_ratio",
        "hostpte_ratio",
        "host_pass_s",
        "host_pass_young_dram",
        "host_pass_young_slow",
    ];
    let at: Vec<Option<usize>> = names
        .iter()
        .map(|n| head.iter().position(|h| h == n))
        .collect();
    let missing: Vec<&str> = names
        .iter()
        .zip(&at)
        .filter(|(_, a)| a.is_none())
        .map(|(n, _)| *n)
        .collect();
    if !missing.is_empty() {
        bail!(
            "no column {}: not a fidelity intervals CSV, or one written before per-pass counts were recorded",
            missing.join(", ")
        );
    }
    let c: Vec<usize> = at.into_iter().flatten().collect();
    // Written from the third run of 2026-11-21 on; older CSVs re-fit
    // without the VM's other tiers in the pool.
    let other = head.iter().position(|h| h == "host_pass_young_other");
    // Each tier's own pass seconds, written since passes are timed per
    // tier; before, every tier had host_pass_s.
    let col = |name: &str| head.iter().position(|h| h == name);
    let (secs_slow, secs_other) = (col("host_pass_s_slow"), col("host_pass_s_other"));
    let [
        interval,
        workload,
        warmup,
        change,
        truth,
        recorded,
        secs,
        dram,
        slow,
    ] = c[..]
    else {
        bail!("column lookup");
    };
    let mut out = Vec::new();
    for (n, line) in lines.enumerate() {
        let f = fields(line);
        if f.len() != head.len() {
            bail!(
                "line {}: {} fields, the header has {}",
                n + 2,
                f.len(),
                head.len()
            );
        }
        if f[truth].is_empty() || f[secs].is_empty() {
            continue;
        }
        let at = || format!("line {}", n + 2);
        let t = list(&f[secs], "host_pass_s").with_context(at)?;
        // One tier's passes: its seconds if recorded, else dram's.
        let zip = |y: &str, what: &str, s: Option<&str>| -> anyhow::Result<Vec<(f64, f64)>> {
            let y = list(y, what).with_context(at)?;
            let s = match s.filter(|s| !s.is_empty()) {
                Some(s) => list(s, "pass seconds").with_context(at)?,
                None => t.clone(),
            };
            if y.len() != s.len() {
                bail!("{}: {} passes, {} pass lengths", at(), y.len(), s.len());
            }
            Ok(s.into_iter().zip(y).collect())
        };
        let cell = |c: Option<usize>| c.map(|c| f[c].as_str()).filter(|v| !v.is_empty());
        let other_secs: Vec<&str> = cell(secs_other).map_or(Vec::new(), |v| v.split('|').collect());
        out.push(Interval {
            index: f[interval].clone(),
            workload: f[workload].clone(),
            warmup: f[warmup] == "true",
            change: f[change] == "true",
            truth: f[truth].parse().with_context(at)?,
            recorded: f[recorded].parse().ok(),
            passes: [
                zip(&f[dram], &head[dram], None)?,
                zip(&f[slow], &head[slow], cell(secs_slow))?,
            ],
            other: match cell(other) {
                None => Vec::new(),
                Some(o) => o
                    .split('|')
                    .enumerate()
                    .filter(|(_, t)| !t.is_empty())
                    .map(|(k, t)| zip(t, "host_pass_young_other", other_secs.get(k).copied()))
                    .collect::<anyhow::Result<_>>()?,
            },
        })
    }
    if !out.iter().any(|i| !i.warmup) {
        bail!("no scored interval with per-pass counts");
    }
    Ok(out)
}

/// This build's ratio for one interval, fitted with `w`, the windows of
/// its workload's earlier intervals.
fn refit(i: &Interval, w: &mut VmWindows) -> Option<f64> {
    let mut tiers: Vec<&[(f64, f64)]> = vec![&i.passes[0], &i.passes[1]];
    tiers.extend(i.other.iter().map(Vec::as_slice));
    let e = w.fit(&tiers);
    ratio(e[0].accesses, e[1].accesses)
}

/// This build's ratio for every interval, in order, each workload (one VM
/// of the run) with windows of its own, of `len` intervals.
fn refit_all(all: &[Interval], len: usize) -> Vec<Option<f64>> {
    let mut w = VmWindows::new(len);
    let mut last: Option<&str> = None;
    all.iter()
        .map(|i| {
            if last != Some(i.workload.as_str()) {
                w = VmWindows::new(len);
                last = Some(&i.workload);
            }
            refit(i, &mut w)
        })
        .collect()
}

/// This build's ratio and ~95 % interval for every interval, in order, as
/// the aggregator forms them (`estimate::VmFit`: windows of `WINDOW`, the
/// kept fit reused while the passes agree, a full fit at least every
/// `refit_every` intervals), each workload with a `VmFit` of its own. The
/// interval over dram and slow only, as the fidelity bench scores it (the
/// truth leaves the guest's other tiers out; alpha is still split over all
/// of them); the CSV does not record pages examined: a million stand in,
/// which only widens the noise to Poisson's, every page examined as the
/// test guest's runs do.
fn refit_kept(all: &[Interval], refit_every: u32) -> Vec<(Option<f64>, Option<HitInterval>)> {
    let mut programs = Programs::default();
    let mut v = VmFit::new(VmWindows::new(WINDOW), refit_every);
    let mut last: Option<&str> = None;
    all.iter()
        .map(|i| {
            if last != Some(i.workload.as_str()) {
                v = VmFit::new(VmWindows::new(WINDOW), refit_every);
                last = Some(&i.workload);
            }
            let mut tiers: Vec<&[(f64, f64)]> = vec![&i.passes[0], &i.passes[1]];
            tiers.extend(i.other.iter().map(Vec::as_slice));
            let input: Vec<TierIn<'_>> = tiers
                .iter()
                .map(|p| TierIn {
                    passes: p,
                    pages: 1e6,
                    fraction: 1.0,
                })
                .collect();
            let alpha = 0.05 / tiers.len() as f64;
            let (e, _) = v.fit(&input, alpha, &mut programs, true);
            let Some(point) = ratio(e[0].estimate.accesses, e[1].estimate.accesses) else {
                return (None, None);
            };
            let samples: Option<Vec<TierSample>> = e[..2]
                .iter()
                .zip(&i.passes)
                .map(|(t, p)| {
                    let b = t.bounds?;
                    Some(TierSample {
                        passes: p.len() as u32,
                        accesses_low: Some(b.low),
                        accesses_high: b.high,
                        accesses_high_open: b.high.is_none(),
                        ..Default::default()
                    })
                })
                .collect();
            let h = samples.and_then(|s| hit_interval(&s, &[true, false], point));
            (Some(point), h)
        })
        .collect()
}

/// CPU per tier and interval over `runs` replays, (min, median, max) in
/// us: the fit alone (windows, no intervals), the fit with intervals
/// every interval in full (the estimate before reuse), and as tierd runs
/// it (kept fits reused while the passes agree).
fn cpu(all: &[Interval], runs: usize) -> [(f64, f64, f64); 3] {
    let tiers: usize = all.iter().map(|i| 2 + i.other.len()).sum::<usize>().max(1);
    let time = |f: &dyn Fn()| {
        let mut us: Vec<f64> = (0..runs)
            .map(|_| {
                let t = std::time::Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e6 / tiers as f64
            })
            .collect();
        us.sort_by(f64::total_cmp);
        (us[0], us[us.len() / 2], us[us.len() - 1])
    };
    [
        time(&|| {
            std::hint::black_box(refit_all(all, WINDOW));
        }),
        time(&|| {
            std::hint::black_box(refit_kept(all, 1));
        }),
        time(&|| {
            std::hint::black_box(refit_kept(all, REFIT_EVERY));
        }),
    ]
}

fn stats(errs: &[f64]) -> String {
    ErrorStats::of(errs).map_or("-".into(), |s| {
        format!("{:>5} {:>8.2} {:>8.2} {:>8.2}", s.n, s.mean, s.p95, s.max)
    })
}

fn main() -> anyhow::Result<()> {
    // By default the file the fidelity bench writes (same folder rules).
    // `--refit-every N` (default estimate::REFIT_EVERY; 1: every interval
    // fitted in full, as before reuse), then the CSV.
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let mut refit_every = REFIT_EVERY;
    if let Some(k) = args.iter().position(|a| a == "--refit-every") {
        refit_every = args
            .get(k + 1)
            .and_then(|v| v.to_str())
            .context("--refit-every needs a value")?
            .parse::<u32>()
            .context("--refit-every")?
            .max(1);
        args.drain(k..k + 2);
    }
    let path = match args.into_iter().next() {
        Some(p) => PathBuf::from(p),
        None => tier_benches::sys::out_dir("fidelity/test-guest")
            .context("the fidelity results folder")?
            .join("intervals-hostpte.csv"),
    };
    let csv = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading {} (run `cargo xtask bench fidelity` first)",
            path.display()
        )
    })?;
    let all = parse(&csv).with_context(|| path.display().to_string())?;
    // As the fidelity bench scores: saying nothing counts 100 pp.
    let err = |i: &Interval, r: Option<f64>| error_pp(r, Some(i.truth)).unwrap_or(100.0);
    let kept = refit_kept(&all, refit_every);
    let rows: Vec<(&Interval, f64, f64, f64)> = all
        .iter()
        .zip(kept.iter().map(|k| k.0).zip(refit_all(&all, 1)))
        .filter(|(i, _)| !i.warmup)
        .map(|(i, (r, alone))| (i, err(i, i.recorded), err(i, r), err(i, alone)))
        .collect();
    println!(
        "refit: {} ({} scored intervals): DRAM-hit ratio error against the truth, pp",
        path.display(),
        rows.len()
    );
    println!(
        "{:<24} {:>5} {:>8} {:>8} {:>8}",
        "intervals / source", "n", "mean_pp", "p95_pp", "max_pp"
    );
    let pick = |f: &dyn Fn(&Interval) -> bool, k: usize| -> Vec<f64> {
        rows.iter()
            .filter(|r| f(r.0))
            .map(|r| [r.1, r.2, r.3][k])
            .collect()
    };
    for (name, f) in [
        ("all", &(|_: &Interval| true) as &dyn Fn(&Interval) -> bool),
        ("steady", &|i: &Interval| !i.change),
        ("change", &|i: &Interval| i.change),
    ] {
        println!("{:<24} {}", format!("{name} recorded"), stats(&pick(f, 0)));
        println!("{:<24} {}", format!("{name} refit"), stats(&pick(f, 1)));
        println!(
            "{:<24} {}",
            format!("{name} 1 interval"),
            stats(&pick(f, 2))
        );
    }
    let mut worst: Vec<&(&Interval, f64, f64, f64)> = rows.iter().collect();
    worst.sort_by(|a, b| b.2.total_cmp(&a.2));
    println!(
        "largest refit errors (interval, workload, change, recorded pp, refit pp, passes s: dram young / slow young)"
    );
    for (i, rec, new, _) in worst.iter().take(8) {
        let show = |k: usize| {
            i.passes[k]
                .iter()
                .map(|p| format!("{:.0}", p.1))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let secs: Vec<String> = i.passes[0].iter().map(|p| format!("{:.3}", p.0)).collect();
        println!(
            "  #{:<4} w{:<3} {:<6} {rec:>6.2} {new:>6.2}  [{}]: {} / {}",
            i.index,
            i.workload,
            i.change,
            secs.join(" "),
            show(0),
            show(1)
        );
    }
    // Coverage of this build's intervals (as tierd forms them, kept fits
    // reused while the passes agree), and their width.
    let (mut scored, mut covered, mut open) = (0usize, 0usize, 0usize);
    let mut widths = Vec::new();
    // Per workload: (scored, covered, one-sided, widths).
    let mut rows_by: Vec<(String, usize, usize, usize, Vec<f64>)> = Vec::new();
    for (i, (_, h)) in all.iter().zip(&kept) {
        if i.warmup {
            continue;
        }
        scored += 1;
        if rows_by.last().is_none_or(|w| w.0 != i.workload) {
            rows_by.push((i.workload.clone(), 0, 0, 0, Vec::new()));
        }
        let Some(row) = rows_by.last_mut() else {
            continue;
        };
        row.1 += 1;
        if let Some(h) = *h {
            let hit = h.low <= i.truth && i.truth <= h.high;
            if !hit {
                println!(
                    "missed: #{} w{} truth {:.3} not in [{:.3}, {:.3}] (open low {}, high {})",
                    i.index, i.workload, i.truth, h.low, h.high, h.low_open, h.high_open
                );
            }
            let one_sided = h.low_open || h.high_open;
            covered += usize::from(hit);
            open += usize::from(one_sided);
            row.2 += usize::from(hit);
            row.3 += usize::from(one_sided);
            row.4.push(h.high - h.low);
            widths.push(h.high - h.low);
        }
    }
    println!(
        "{:<10} {:>6} {:>9} {:>10} {:>16}",
        "workload", "n", "coverage", "one-sided", "median width pp"
    );
    for (w, n, c, o, mut ws) in rows_by {
        ws.sort_by(f64::total_cmp);
        let mid = ws.get(ws.len() / 2).map_or(f64::NAN, |w| w * 100.0);
        println!(
            "{w:<10} {n:>6} {:>9.2} {o:>10} {mid:>16.1}",
            c as f64 / n.max(1) as f64
        );
    }
    widths.sort_by(f64::total_cmp);
    let coverage = covered as f64 / scored.max(1) as f64;
    let width = widths.get(widths.len() / 2).copied().unwrap_or(f64::NAN);
    println!(
        "intervals: {covered} of {scored} hold the truth ({:.3}), {open} one-sided, median width {:.1} pp",
        coverage,
        width * 100.0
    );
    let [cpu_old, cpu_full, cpu_new] = cpu(&all, 5);
    println!(
        "{:<44} {:>9} {:>9} {:>9}",
        "CPU per tier per interval, us", "min", "median", "max"
    );
    for (name, c) in [
        ("fit (before intervals)", cpu_old),
        ("fit + interval, every interval in full", cpu_full),
        ("fit + interval, kept fits reused (tierd)", cpu_new),
    ] {
        println!("{name:<44} {:>9.1} {:>9.1} {:>9.1}", c.0, c.1, c.2);
    }
    let cpu_ratio = cpu_new.1 / cpu_old.1.max(1e-9);
    let reuse_ratio = cpu_new.1 / cpu_full.1.max(1e-9);
    println!(
        "ratio (median): {cpu_ratio:.2}x the fit alone, {reuse_ratio:.2}x every interval in full"
    );
    let s = |k: usize| ErrorStats::of(&pick(&|_| true, k));
    let steady = ErrorStats::of(&pick(&|i| !i.change, 1));
    let (Some(rec), Some(new)) = (s(0), s(1)) else {
        bail!("no scored interval");
    };
    println!(
        "{}",
        result_line(&[
            ("p95_err_pp", format!("{:.2}", new.p95)),
            ("mean_err_pp", format!("{:.2}", new.mean)),
            ("max_err_pp", format!("{:.2}", new.max)),
            (
                "p95_err_pp_steady",
                steady.map_or("-".into(), |s| format!("{:.2}", s.p95))
            ),
            ("p95_err_pp_recorded", format!("{:.2}", rec.p95)),
            (
                "p95_err_pp_one_interval",
                s(2).map_or("-".into(), |s| format!("{:.2}", s.p95)),
            ),
            ("coverage", format!("{coverage:.3}")),
            ("median_width_pp", format!("{:.1}", width * 100.0)),
            ("cpu_us_per_tier", format!("{:.1}", cpu_new.1)),
            ("cpu_ratio", format!("{cpu_ratio:.2}")),
            ("cpu_us_per_tier_full", format!("{:.1}", cpu_full.1)),
            ("refit_every", format!("{refit_every}")),
        ])
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Young pages of `a` pages touched `r` times per second in passes `ts`.
    fn young(a: f64, r: f64, ts: &[f64]) -> String {
        ts.iter()
            .map(|&t| format!("{:.0}", a * -(-r * t).exp_m1()))
            .collect::<Vec<_>>()
            .join(";")
    }

    const HEAD: &str = "interval,workload,workload_name,warmup,change,truth_ratio,hostpte_ratio,host_pass_s,host_pass_young_dram,host_pass_young_slow";

    #[test]
    fn refits_recorded_passes_and_skips_warmup() {
        let ts = [0.025, 0.1, 0.375, 0.125, 0.375];
        let s = ts.map(|t| t.to_string()).join(";");
        let csv = format!(
            "{HEAD}\n0,1,\"a, b\",true,false,0.5,0.5,{s},1;2;3;4;5,1;2;3;4;5\n\
             1,10,\"1024+1024 pages, dram 4x\",false,false,0.8,0.5,{s},{},{}\n",
            young(1024.0, 7.3, &ts),
            young(1024.0, 1.825, &ts)
        );
        let all = parse(&csv).expect("parses");
        assert_eq!(all.len(), 2);
        assert!(
            all[0].warmup && !all[1].warmup,
            "the warm-up is kept, marked"
        );
        let got = &all[1..];
        assert_eq!(got[0].workload, "10");
        assert_eq!(got[0].passes[0].len(), 5);
        // Each workload starts with windows of its own: the warm-up of
        // workload 1 does not reach workload 10.
        let fitted = refit_all(&all, WINDOW);
        let r = fitted[1].expect("a ratio");
        assert!((r - 0.8).abs() < 0.005, "{r}");
        assert_eq!(fitted[1], refit(&got[0], &mut VmWindows::default()));
        let r = refit(&got[0], &mut VmWindows::default()).expect("a ratio");
        assert!((r - 0.8).abs() < 0.005, "{r}");
        // The VM's other tiers are read and pooled, not scored.
        let with_other = format!(
            "{HEAD},host_pass_young_other\n1,10,x,false,false,0.8,0.5,{s},{},{},{}|{}\n",
            young(1024.0, 7.3, &ts),
            young(1024.0, 1.825, &ts),
            young(64.0, 30.0, &ts),
            young(32.0, 30.0, &ts),
        );
        let got = parse(&with_other).expect("parses");
        assert_eq!(got[0].other.len(), 2);
        let r = refit(&got[0], &mut VmWindows::default()).expect("a ratio");
        assert!((r - 0.8).abs() < 0.005, "{r}");
        // Tiers timed apart: each tier's passes take its own seconds.
        let later = ts.map(|t| t - 0.002);
        let l = later.map(|t| t.to_string()).join(";");
        let timed = format!(
            "{HEAD},host_pass_young_other,host_pass_s_slow,host_pass_s_other
             1,10,x,false,false,0.8,0.5,{s},{},{},{},{l},{l}
",
            young(1024.0, 7.3, &ts),
            young(1024.0, 1.825, &later),
            young(64.0, 30.0, &later),
        );
        let got = parse(&timed).expect("parses");
        let secs = |p: &[(f64, f64)]| p.iter().map(|p| p.0).collect::<Vec<_>>();
        assert_eq!(secs(&got[0].passes[0]), ts.to_vec());
        assert_eq!(secs(&got[0].passes[1]), later.to_vec());
        assert_eq!(secs(&got[0].other[0]), later.to_vec());
        let r = refit(&got[0], &mut VmWindows::default()).expect("a ratio");
        assert!((r - 0.8).abs() < 0.005, "{r}");
    }

    #[test]
    fn bad_csv_says_what_is_wrong() {
        let e = parse("interval,workload\n1,2\n").expect_err("no per-pass columns");
        assert!(format!("{e:#}").contains("host_pass_s"), "{e:#}");
        let e = parse(&format!(
            "{HEAD}\n1,10,x,false,false,0.8,0.5,0.1;0.3,1;2;3,1;2\n"
        ))
        .expect_err("passes do not line up");
        assert!(
            format!("{e:#}").contains("3 passes, 2 pass lengths"),
            "{e:#}"
        );
        let e = parse(&format!("{HEAD}\n1,10,x,false\n")).expect_err("short line");
        assert!(format!("{e:#}").contains("line 2"), "{e:#}");
        assert!(parse(HEAD).is_err(), "no interval at all");
    }
}
