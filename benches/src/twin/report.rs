//! Scores, tables, CSV and SVG of the twin's runs.

use std::fmt::Write as _;
use std::path::Path;

use super::fleet::FleetResult;
use super::run::{Est, Outcome};
use super::{BACKENDS, PAGE_BACKENDS};
use crate::fidelity::ErrorStats;
use crate::plot::{Panel, Series, grid};
use crate::verdict::{HEADER, Pair, Unit, Verdict};

/// Intervals before this are warm-up (arming, rate windows filling).
pub const WARMUP: usize = 2;

/// One backend on one workload.
#[derive(Debug, Clone, Default)]
pub struct Score {
    pub backend: &'static str,
    /// Error of the point (pp) against LLC-miss truth and all-access truth.
    pub err_mem: Option<ErrorStats>,
    pub err_all: Option<ErrorStats>,
    /// Share of intervals whose interval holds the truth (page backends).
    pub coverage_mem: Option<f64>,
    pub coverage_all: Option<f64>,
    pub open: Option<f64>,
    pub width_pp: Option<f64>,
    /// Intervals with a truth but no reading.
    pub missing: usize,
    /// Hot-set relative error (%), p95 per window 1, 10, 60 s.
    pub hot_p95: [Option<f64>; 3],
    pub hot_ratio_median: [Option<f64>; 3],
}

fn p95(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((0.95 * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

fn covers(e: &Est, truth: f64) -> Option<bool> {
    Some(e.low? - 1e-9 <= truth && truth <= e.high? + 1e-9)
}

/// Scores every backend of one outcome.
pub fn score(o: &Outcome) -> Vec<Score> {
    let scored = &o.intervals[WARMUP.min(o.intervals.len())..];
    BACKENDS
        .iter()
        .enumerate()
        .map(|(b, name)| {
            let (mut em, mut ea, mut cm, mut ca, mut open, mut width) =
                (vec![], vec![], vec![], vec![], vec![], vec![]);
            let mut missing = 0;
            for i in scored {
                let e = &i.est[b];
                if i.truth_mem.is_none() && i.truth_all.is_none() {
                    continue;
                }
                let Some(p) = e.point else {
                    missing += 1;
                    continue;
                };
                if let Some(tm) = i.truth_mem {
                    em.push((p - tm) * 100.0);
                    if let Some(c) = covers(e, tm).filter(|_| b < PAGE_BACKENDS) {
                        cm.push(f64::from(u8::from(c)));
                    }
                }
                if let Some(ta) = i.truth_all {
                    ea.push((p - ta) * 100.0);
                    if let Some(c) = covers(e, ta).filter(|_| b < PAGE_BACKENDS) {
                        ca.push(f64::from(u8::from(c)));
                    }
                }
                if b < PAGE_BACKENDS {
                    open.push(f64::from(u8::from(e.open)));
                    if let (Some(l), Some(h)) = (e.low, e.high) {
                        width.push((h - l) * 100.0);
                    }
                }
            }
            let mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
            let mut hot_p95 = [None; 3];
            let mut hot_ratio = [None; 3];
            if b < PAGE_BACKENDS {
                for (k, w) in [1.0, 10.0, 60.0].iter().enumerate() {
                    let mut errs: Vec<f64> = o
                        .hot
                        .iter()
                        .filter(|h| h.window_s == *w && h.truth > 0.0)
                        .map(|h| (h.read[b] - h.truth).abs() / h.truth * 100.0)
                        .collect();
                    let mut ratios: Vec<f64> = o
                        .hot
                        .iter()
                        .filter(|h| h.window_s == *w && h.truth > 0.0)
                        .map(|h| h.read[b] / h.truth)
                        .collect();
                    hot_p95[k] = p95(&mut errs);
                    hot_ratio[k] = median(&mut ratios);
                }
            }
            Score {
                backend: name,
                err_mem: ErrorStats::of(&em),
                err_all: ErrorStats::of(&ea),
                coverage_mem: (b < PAGE_BACKENDS).then(|| mean(&cm)).flatten(),
                coverage_all: (b < PAGE_BACKENDS).then(|| mean(&ca)).flatten(),
                open: mean(&open),
                width_pp: median(&mut width),
                missing,
                hot_p95,
                hot_ratio_median: hot_ratio,
            }
        })
        .collect()
}

/// Backend `b`'s scored intervals of `o` against the LLC-miss truth (what
/// the tiers serve), as the shared verdict takes them.
pub fn ratio_pairs(o: &Outcome, b: usize) -> Vec<Pair> {
    o.intervals[WARMUP.min(o.intervals.len())..]
        .iter()
        .filter_map(|i| {
            let e = &i.est[b];
            Some(Pair::ratio(i.truth_mem?, e.point, e.low.zip(e.high)))
        })
        .collect()
}

/// The ratio interval's verdict per backend over every workload; returns
/// the RESULT pairs (`<backend>_cov_hit`, ...).
pub fn print_verdicts(outcomes: &[Outcome]) -> Vec<(String, String)> {
    println!(
        "DRAM-hit interval per backend against the LLC-miss truth, all workloads (cover: share holding the truth, vacuous 0-100 % ones included; w_med/w_p95: width; 1side/vacu: one / both ends at 0 or 100 %; goal: cover >= 0.95 and w_med <= 10 pp; pmu-*: a count, its interval is the point):"
    );
    println!("  {:<11} {HEADER}", "backend");
    let mut out = Vec::new();
    for (b, name) in BACKENDS.iter().enumerate() {
        let pairs: Vec<Pair> = outcomes.iter().flat_map(|o| ratio_pairs(o, b)).collect();
        let v = Verdict::of(&pairs, Unit::Pp);
        println!("  {:<11} {}", name, v.columns());
        let key = name.replace(['+', '-'], "");
        out.extend(
            v.result_pairs("hit")
                .into_iter()
                .map(|(k, x)| (format!("{key}_{k}"), x)),
        );
    }
    out
}

fn f(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

/// The per-workload table.
pub fn print_workload(o: &Outcome, scores: &[Score]) {
    let truth_m: Vec<f64> = o.intervals.iter().filter_map(|i| i.truth_mem).collect();
    let truth_a: Vec<f64> = o.intervals.iter().filter_map(|i| i.truth_all).collect();
    let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let misses = avg(&o.intervals.iter().map(|i| i.misses).collect::<Vec<_>>());
    println!(
        "{}: working set {:.3} GiB, {:.0e} touches/s, simulated {} pages (1/{:.1}), {} touches; LLC hit {:.1} %, {:.2e} LLC misses/s; truth DRAM share of misses {:.1} %, of touches {:.1} %",
        o.workload,
        o.ws_bytes as f64 / f64::from(1u32 << 30),
        o.rate,
        o.sim_pages,
        1.0 / o.fraction,
        o.sim_touches,
        o.llc_hit * 100.0,
        misses,
        avg(&truth_m) * 100.0,
        avg(&truth_a) * 100.0,
    );
    println!(
        "  {:<11} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>6} {:>7} {:>4} {:>8} {:>8} {:>8} {:>6} {:>6} {:>6}",
        "backend",
        "mem err",
        "mem p95",
        "all err",
        "all p95",
        "cov",
        "cov all",
        "open",
        "width",
        "n/m",
        "hot1 p95",
        "hot10",
        "hot60",
        "r1",
        "r10",
        "r60"
    );
    for s in scores {
        println!(
            "  {:<11} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>6} {:>7} {:>4} {:>7}% {:>7}% {:>7}% {:>6} {:>6} {:>6}",
            s.backend,
            f(s.err_mem.map(|e| e.mean), 2),
            f(s.err_mem.map(|e| e.p95), 2),
            f(s.err_all.map(|e| e.mean), 2),
            f(s.err_all.map(|e| e.p95), 2),
            f(s.coverage_mem, 2),
            f(s.coverage_all, 2),
            f(s.open, 2),
            f(s.width_pp, 1),
            s.missing,
            f(s.hot_p95[0], 1),
            f(s.hot_p95[1], 1),
            f(s.hot_p95[2], 1),
            f(s.hot_ratio_median[0], 2),
            f(s.hot_ratio_median[1], 2),
            f(s.hot_ratio_median[2], 2),
        );
    }
}

/// intervals.csv rows of one outcome.
pub fn intervals_csv(o: &Outcome, out: &mut String) {
    if out.is_empty() {
        out.push_str("workload,end_s,truth_mem,truth_all,misses_per_s,touches_per_s");
        for b in BACKENDS {
            let _ = write!(out, ",{b}_point,{b}_low,{b}_high,{b}_open");
        }
        out.push('\n');
    }
    let o_ = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.5}"));
    for i in &o.intervals {
        let _ = write!(
            out,
            "\"{}\",{},{},{},{:.0},{:.0}",
            o.workload,
            i.end_s,
            o_(i.truth_mem),
            o_(i.truth_all),
            i.misses,
            i.touches
        );
        for e in &i.est {
            let _ = write!(
                out,
                ",{},{},{},{}",
                o_(e.point),
                o_(e.low),
                o_(e.high),
                u8::from(e.open)
            );
        }
        out.push('\n');
    }
}

/// summary.csv rows.
pub fn summary_csv(o: &Outcome, scores: &[Score], out: &mut String) {
    if out.is_empty() {
        out.push_str("workload,backend,err_mem_mean_pp,err_mem_p95_pp,err_all_mean_pp,err_all_p95_pp,coverage_mem,coverage_all,open,width_pp,missing,hot1_p95_pct,hot10_p95_pct,hot60_p95_pct\n");
    }
    let o_ = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.4}"));
    for s in scores {
        let _ = writeln!(
            out,
            "\"{}\",{},{},{},{},{},{},{},{},{},{},{},{},{}",
            o.workload,
            s.backend,
            o_(s.err_mem.map(|e| e.mean)),
            o_(s.err_mem.map(|e| e.p95)),
            o_(s.err_all.map(|e| e.mean)),
            o_(s.err_all.map(|e| e.p95)),
            o_(s.coverage_mem),
            o_(s.coverage_all),
            o_(s.open),
            o_(s.width_pp),
            s.missing,
            o_(s.hot_p95[0]),
            o_(s.hot_p95[1]),
            o_(s.hot_p95[2]),
        );
    }
}

/// One panel per workload: truths and each backend's point over time.
pub fn plot(outcomes: &[Outcome], path: &Path) -> anyhow::Result<()> {
    let panels: Vec<Panel> = outcomes
        .iter()
        .map(|o| {
            let line = |name: &str, get: &dyn Fn(&super::run::IntervalRec) -> Option<f64>| Series {
                name: name.into(),
                points: o.intervals.iter().map(|i| (i.end_s, get(i))).collect(),
            };
            let mut series = vec![
                line("truth (LLC misses)", &|i| i.truth_mem),
                line("truth (all touches)", &|i| i.truth_all),
            ];
            for b in [0usize, 2, 3, 4] {
                series.push(line(BACKENDS[b], &|i| i.est[b].point));
            }
            Panel {
                title: o.workload.chars().take(60).collect(),
                series,
                markers: Vec::new(),
            }
        })
        .collect();
    grid(path, &panels, 2, (640, 300), "seconds", "DRAM share %")?;
    Ok(())
}

/// The controller table.
pub fn print_fleet(rows: &[FleetResult]) {
    println!(
        "  {:<10} {:>5} {:>10} {:>10} {:>8} {:>10} {:>7} {:>7} {:>10}",
        "backend",
        "VMs",
        "to target",
        "max",
        "not conv",
        "DRAM moved",
        "moves",
        "wrong",
        "in eps end"
    );
    for r in rows {
        let mut v = r.to_target.clone();
        let med = median(&mut v);
        let max = v.last().copied();
        println!(
            "  {:<10} {:>5} {:>10} {:>10} {:>8} {:>8.1}GiB {:>7} {:>7} {:>10.2}",
            r.backend,
            r.vms,
            f(med, 1),
            f(max, 0),
            r.not_converged,
            r.dram_moved_gib,
            r.moves,
            r.wrong_moves,
            r.within_end
        );
    }
}

/// One ept model's working set per horizon through tierd's ages code,
/// pooled over `outcomes`' tiers and intervals: (horizon, p95 relative
/// error %, coverage, points), tiers with a non-zero truth.
pub fn age_scores(
    outcomes: &[Outcome],
    model: usize,
) -> Vec<(f64, Option<f64>, Option<f64>, usize)> {
    super::ept_ages::HORIZONS
        .iter()
        .map(|&h| {
            let pts: Vec<(f64, (f64, f64, f64))> = outcomes
                .iter()
                .flat_map(|o| &o.ages)
                .filter(|a| a.horizon == h && a.truth > 0.0)
                .filter_map(|a| Some((a.truth, a.est[model]?)))
                .collect();
            let mut errs: Vec<f64> = pts
                .iter()
                .map(|(t, e)| (e.0 - t).abs() / t * 100.0)
                .collect();
            // Populations are fractional pages (sim pages x scale): the
            // ends and the truth differ in the last bits where they meet.
            let covered = pts
                .iter()
                .filter(|(t, e)| {
                    let tol = 1e-9 * t.abs().max(1.0);
                    e.1 - tol <= *t && *t <= e.2 + tol
                })
                .count();
            let cov = (!pts.is_empty()).then(|| covered as f64 / pts.len() as f64);
            (h, p95(&mut errs), cov, pts.len())
        })
        .collect()
}

/// One ept model's working-set verdict per horizon, over the points
/// [`age_scores`] takes (tiers with a non-zero truth: widths are % of it).
pub fn age_verdicts(outcomes: &[Outcome], model: usize) -> Vec<(f64, Verdict)> {
    super::ept_ages::HORIZONS
        .iter()
        .map(|&h| {
            let pairs: Vec<Pair> = outcomes
                .iter()
                .flat_map(|o| &o.ages)
                .filter(|a| a.horizon == h && a.truth > 0.0)
                .map(|a| {
                    let e = a.est[model];
                    Pair {
                        truth: (a.truth, a.truth),
                        point: e.map(|e| e.0),
                        interval: e.map(|e| (e.1, e.2)),
                        full: a.full,
                    }
                })
                .collect();
            (h, Verdict::of(&pairs, Unit::Pct))
        })
        .collect()
}

/// The working-set table of both ept models; returns RESULT pairs.
pub fn print_ages(outcomes: &[Outcome]) -> Vec<(String, String)> {
    println!(
        "working set per tier through tierd's ages code (ages::recency fed each pass's young bits; from_recency's ~95 % interval), pooled over workloads, tiers and intervals:"
    );
    println!(
        "  {:<10} {:>8} {:>8} {:>10} {:>9}  {HEADER}",
        "model", "horizon", "points", "p95 err%", "coverage"
    );
    let mut pairs = Vec::new();
    for (model, name, key) in [(0, "ept", "ept"), (1, "ept+flush", "eptflush")] {
        let verdicts = age_verdicts(outcomes, model);
        for ((h, p, c, n), (_, v)) in age_scores(outcomes, model).into_iter().zip(verdicts) {
            println!(
                "  {:<10} {:>8} {:>8} {:>10} {:>9}  {}",
                name,
                format!("{h}s"),
                n,
                f(p, 1),
                f(c, 2),
                v.columns()
            );
            let na = |v: Option<f64>, d: usize| v.map_or("na".into(), |x| format!("{x:.d$}"));
            pairs.push((format!("{key}_ws_p95_err_pct_{h}s"), na(p, 1)));
            pairs.push((format!("{key}_ws_coverage_{h}s"), na(c, 2)));
            pairs.extend(
                v.result_pairs(&format!("ws_{h}s"))
                    .into_iter()
                    .map(|(k, x)| (format!("{key}_{k}"), x)),
            );
        }
    }
    pairs
}
