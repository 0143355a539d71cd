//! Scores, tables and plots of a fidelity run (its CSV files: `csv.rs`).

use std::path::{Path, PathBuf};

use tier_benches::fidelity::{ErrorStats, Lag, detect_lag, error_pp, ratio};
use tier_benches::plot::{Panel, Series, grid};

use crate::matrix::{Kind, Workload};
use crate::run::Record;
use tier_benches::verdict::{Pair, Unit, Verdict};

/// One source's DRAM-hit ratio per interval.
pub struct Source {
    pub name: String,
    pub ratios: Vec<Option<f64>>,
    /// Time in the sampler per interval, when it has one.
    pub scan_ns: Option<Vec<u64>>,
    /// ~95 % interval of the ratio per interval (host backends only).
    pub intervals: Option<Vec<Option<(f64, f64)>>>,
}

/// Truth, guest-reported and host sources of one run, index-aligned with
/// its records.
pub fn sources(records: &[Record], host_name: Option<&str>) -> (Source, Source, Option<Source>) {
    let truth = Source {
        name: "truth".into(),
        ratios: records
            .iter()
            .map(|r| ratio(r.truth[0] as f64, r.truth[1] as f64))
            .collect(),
        scan_ns: None,
        intervals: None,
    };
    let guest = Source {
        name: "guest-reported".into(),
        ratios: records
            .iter()
            .map(|r| r.guest.and_then(|g| ratio(g[0] as f64, g[1] as f64)))
            .collect(),
        scan_ns: None,
        intervals: None,
    };
    let host = host_name.map(|n| Source {
        name: n.to_string(),
        ratios: records
            .iter()
            .map(|r| r.host.as_ref().and_then(|h| h.ratio))
            .collect(),
        scan_ns: Some(
            records
                .iter()
                .map(|r| r.host.as_ref().map_or(0, |h| h.scan_ns))
                .collect(),
        ),
        intervals: Some(
            records
                .iter()
                .map(|r| r.host.as_ref().and_then(|h| h.interval))
                .collect(),
        ),
    });
    (truth, guest, host)
}

/// Per-interval errors (pp) of `s` over the scored records selected by
/// `keep`; an interval where the source has no reading but the truth has
/// is an error of 100 pp (it said nothing).
pub(crate) fn errors(
    records: &[Record],
    truth: &Source,
    s: &Source,
    keep: impl Fn(&Record) -> bool,
) -> Vec<f64> {
    records
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.warmup && keep(r))
        .filter_map(|(i, _)| match (s.ratios[i], truth.ratios[i]) {
            (_, None) => None,
            (None, Some(_)) => Some(100.0),
            (a, b) => error_pp(a, b),
        })
        .collect()
}

/// `errors` over the intervals where `s` published a ratio only (what a
/// user reads as a number), and the share of scored intervals it did.
pub(crate) fn published_errors(
    records: &[Record],
    truth: &Source,
    s: &Source,
    keep: impl Fn(&Record) -> bool,
) -> (Vec<f64>, Option<f64>) {
    let scored: Vec<usize> = records
        .iter()
        .enumerate()
        .filter(|(i, r)| !r.warmup && keep(r) && truth.ratios[*i].is_some())
        .map(|(i, _)| i)
        .collect();
    let errs: Vec<f64> = scored
        .iter()
        .filter_map(|&i| error_pp(s.ratios[i], truth.ratios[i]))
        .collect();
    let share = (!scored.is_empty()).then(|| errs.len() as f64 / scored.len() as f64);
    (errs, share)
}

/// The verdict of `s`'s intervals over the scored records selected by
/// `keep` (None: `s` has no intervals at all, or no record is scored). An
/// interval where `s` has no ratio counts as `none`, not as a ratio of 0.
pub(crate) fn coverage(
    records: &[Record],
    truth: &Source,
    s: &Source,
    keep: impl Fn(&Record) -> bool,
) -> Option<Verdict> {
    let iv = s.intervals.as_ref()?;
    let pairs: Vec<Pair> = records
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.warmup && keep(r))
        .filter_map(|(i, _)| Some(Pair::ratio(truth.ratios[i]?, s.ratios[i], iv[i])))
        .collect();
    (!pairs.is_empty()).then(|| Verdict::of(&pairs, Unit::Pp))
}

/// Lowest coverage over the rows of `matrix` (rows with no scored interval
/// left out).
pub fn coverage_min(
    matrix: &[Workload],
    records: &[Record],
    truth: &Source,
    s: &Source,
) -> Option<f64> {
    (0..matrix.len())
        .filter_map(|w| coverage(records, truth, s, |r| r.workload == w)?.coverage)
        .min_by(f64::total_cmp)
}

/// One phase change of a workload.
pub struct Change {
    pub workload: usize,
    pub step: usize,
    pub truth_step: f64,
}

/// Lag of a source at every phase change, `None` for too-short phases.
/// The lags of one workload's changes, in order (`-`: no lag to tell).
pub(crate) fn workload_lags(changes: &[(Change, Option<Lag>)], w: usize) -> Vec<String> {
    changes
        .iter()
        .filter(|(c, _)| c.workload == w)
        .map(|(_, g)| g.map_or("-".into(), |g| g.to_string()))
        .collect()
}

pub fn lags(records: &[Record], truth: &Source, s: &Source) -> Vec<(Change, Option<Lag>)> {
    let mut out = Vec::new();
    let idx = |w: usize, step: usize| -> Vec<usize> {
        records
            .iter()
            .enumerate()
            .filter(|(_, r)| r.workload == w && r.step == step && !r.warmup)
            .map(|(i, _)| i)
            .collect()
    };
    let pick = |src: &Source, ix: &[usize]| ix.iter().map(|&i| src.ratios[i]).collect::<Vec<_>>();
    let mut seen = std::collections::BTreeSet::new();
    for r in records.iter().filter(|r| r.change) {
        if !seen.insert((r.workload, r.step)) || r.step == 0 {
            continue;
        }
        let (before, after) = (idx(r.workload, r.step - 1), idx(r.workload, r.step));
        let level = |ix: &[usize]| tier_benches::fidelity::steady_level(&pick(truth, ix));
        let truth_step = match (level(&before), level(&after)) {
            (Some(a), Some(b)) => b - a,
            _ => continue,
        };
        let lag = detect_lag(&pick(s, &before), &pick(s, &after), truth_step, 0.02);
        out.push((
            Change {
                workload: r.workload,
                step: r.step,
                truth_step,
            },
            lag,
        ));
    }
    out
}

fn lag_summary(l: &[(Change, Option<Lag>)]) -> (String, Option<usize>, usize) {
    let settled: Vec<usize> = l
        .iter()
        .filter_map(|(_, g)| match g {
            Some(Lag::Settled(n)) => Some(*n),
            _ => None,
        })
        .collect();
    let bad = l.len() - settled.len();
    let max = settled.iter().copied().max();
    let text = l
        .iter()
        .map(|(_, g)| g.map_or("-".to_string(), |g| g.to_string()))
        .collect::<Vec<_>>()
        .join(",");
    (text, max, bad)
}

fn fmt_stats(s: Option<ErrorStats>) -> String {
    match s {
        Some(s) => format!("{:>5} {:>8.2} {:>8.2} {:>8.2}", s.n, s.mean, s.p95, s.max),
        None => format!("{:>5} {:>8} {:>8} {:>8}", 0, "-", "-", "-"),
    }
}

/// Headline numbers of the host backend for the RESULT line.
pub struct Headline {
    pub all: Option<ErrorStats>,
    /// Intervals that hold no phase change.
    pub steady: Option<ErrorStats>,
    /// The intervals that hold a phase change.
    pub change: Option<ErrorStats>,
    pub footprint: Option<ErrorStats>,
    /// Rows of every kind but skew (each tier's pages alike).
    pub uniform: Option<ErrorStats>,
    /// Uniform rows, the intervals with a published ratio only, and the
    /// share of the uniform rows' scored intervals that have one.
    pub uniform_published: Option<ErrorStats>,
    pub published_uniform: Option<f64>,
    pub skew: Option<ErrorStats>,
    pub lag_max: Option<usize>,
    pub lag_bad: usize,
    /// Lowest per-row coverage of the ratio interval.
    pub coverage_min: Option<f64>,
    /// The ratio interval's verdict over the whole matrix, and over the
    /// uniform rows (every kind but skew) and the skew rows.
    pub verdict: Option<Verdict>,
    pub verdict_uniform: Option<Verdict>,
    pub verdict_skew: Option<Verdict>,
}

/// Prints the per-source and per-workload tables; returns the host
/// backend's headline.
pub fn print_tables(
    matrix: &[Workload],
    records: &[Record],
    truth: &Source,
    others: &[&Source],
    overhead_pages: [u32; 2],
    interval_ns: u64,
) -> Option<Headline> {
    println!(
        "DRAM-hit ratio error against the truth per source, all scored intervals (pp = percentage points)"
    );
    println!(
        "{:<16} {:>5} {:>8} {:>8} {:>8}  {:<22} sampling cost",
        "source", "n", "mean_pp", "p95_pp", "max_pp", "lag (per change)"
    );
    let truth_lags = lags(records, truth, truth);
    let (tl, _, _) = lag_summary(&truth_lags);
    println!(
        "{:<16} {:>5} {:>8} {:>8} {:>8}  {:<22} a counter read per interval",
        "truth (ref)", "-", "0", "0", "0", tl
    );
    let mut headline = None;
    for s in others {
        let e = ErrorStats::of(&errors(records, truth, s, |_| true));
        let l = lags(records, truth, s);
        let (text, max, bad) = lag_summary(&l);
        let cost = match &s.scan_ns {
            Some(ns) => {
                let scored: Vec<f64> = ns.iter().map(|&n| n as f64 / 1e6).collect();
                let mean = scored.iter().sum::<f64>() / scored.len().max(1) as f64;
                format!(
                    "{mean:.2} ms in the sampler per interval ({:.2} % of one CPU)",
                    mean * 1e6 / interval_ns as f64 * 100.0
                )
            }
            None => "a counter read per interval".into(),
        };
        println!("{:<16} {}  {:<22} {}", s.name, fmt_stats(e), text, cost);
        if s.scan_ns.is_some() {
            let (pub_errs, pub_share) =
                published_errors(records, truth, s, |r| matrix[r.workload].kind != Kind::Skew);
            headline = Some(Headline {
                uniform_published: ErrorStats::of(&pub_errs),
                published_uniform: pub_share,
                all: e,
                steady: ErrorStats::of(&errors(records, truth, s, |r| !r.change)),
                change: ErrorStats::of(&errors(records, truth, s, |r| r.change)),
                footprint: ErrorStats::of(&errors(records, truth, s, |r| {
                    matrix[r.workload].kind == Kind::Footprint
                })),
                uniform: ErrorStats::of(&errors(records, truth, s, |r| {
                    matrix[r.workload].kind != Kind::Skew
                })),
                skew: ErrorStats::of(&errors(records, truth, s, |r| {
                    matrix[r.workload].kind == Kind::Skew
                })),
                lag_max: max,
                lag_bad: bad,
                coverage_min: coverage_min(matrix, records, truth, s),
                verdict: coverage(records, truth, s, |_| true),
                verdict_uniform: coverage(records, truth, s, |r| {
                    matrix[r.workload].kind != Kind::Skew
                }),
                verdict_skew: coverage(records, truth, s, |r| {
                    matrix[r.workload].kind == Kind::Skew
                }),
            });
        }
    }
    // A missing point counts 100 pp above: "not measured" never scores
    // well. What a user reads as a number is scored here on its own.
    if let Some(h) = &headline {
        println!(
            "uniform rows, published points only (a not-measured interval is no number to be wrong): {} of the scored intervals published; {}",
            h.published_uniform
                .map_or("-".into(), |s| format!("{:.0} %", s * 100.0)),
            h.uniform_published.map_or("none".into(), |e| format!(
                "n {} mean {:.2} pp p95 {:.2} pp max {:.2} pp",
                e.n, e.mean, e.p95, e.max
            ))
        );
    }
    // The same errors split: an interval that holds a change mixes two
    // phases, and a pass spanning the change sees pages of both.
    println!(
        "by interval: steady = holds no phase change; change = holds one (the truth is a mix of two phases)"
    );
    println!(
        "{:<16} {:>5} {:>8} {:>8} {:>8}  | {:>6} {:>8} {:>8}",
        "source", "n", "mean_pp", "p95_pp", "max_pp", "change", "mean_pp", "max_pp"
    );
    for s in others {
        let steady = ErrorStats::of(&errors(records, truth, s, |r| !r.change));
        let change = ErrorStats::of(&errors(records, truth, s, |r| r.change));
        let ch = change.map_or(format!("{:>6} {:>8} {:>8}", 0, "-", "-"), |c| {
            format!("{:>6} {:>8.2} {:>8.2}", c.n, c.mean, c.max)
        });
        println!("{:<16} {}  | {ch}", s.name, fmt_stats(steady));
    }
    println!(
        "lag: intervals from the one holding the change (at 40 % of it) until the source stays within 2 pp of its own new level; 'missed': it moved by less than half the truth's step"
    );
    for (i, (c, _)) in truth_lags.iter().enumerate() {
        let per: Vec<String> = others
            .iter()
            .map(|s| {
                let l = lags(records, truth, s);
                let g = l.get(i).and_then(|(_, g)| *g);
                format!("{} {}", s.name, g.map_or("-".into(), |g| g.to_string()))
            })
            .collect();
        println!(
            "  change W{} phase {} (truth {:+.1} pp): {}",
            c.workload + 1,
            c.step + 1,
            c.truth_step * 100.0,
            per.join(", ")
        );
    }
    for s in others.iter().filter(|s| s.scan_ns.is_some()) {
        println!();
        print_workloads(matrix, records, truth, s, overhead_pages);
    }
    headline
}

/// Share of distinct touched pages in dram, counting the guest's own
/// non-work pages: what accessed bits can see (analysis only, never fed to
/// the estimate).
fn pages_view(r: &Record, overhead: [u32; 2]) -> Option<f64> {
    let s = r.shape;
    let d = if s.dram_repeat > 0 { s.dram_pages } else { 0 } + overhead[0];
    let w = if s.slow_repeat > 0 { s.slow_pages } else { 0 } + overhead[1];
    ratio(f64::from(d), f64::from(w))
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let v: Vec<f64> = v.collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

fn print_workloads(
    matrix: &[Workload],
    records: &[Record],
    truth: &Source,
    s: &Source,
    overhead: [u32; 2],
) {
    println!(
        "per workload: {} against the truth; pages% = share of distinct touched pages in dram incl. the guest's code+parameter pages (what accessed bits can see; analysis only)",
        s.name
    );
    println!(
        "  cover = share of scored intervals with a ratio whose ~95 % ratio interval (dram and slow tiers' accesses_low/high) holds the truth (vacuous 0-100 % ones count); no_int = intervals with a ratio and no interval (not covered); w_med/w_p95 = interval width (pp); 1side/vacu = share with one / both ends at 0 or 100 %; goal = cover >= 0.95 and w_med <= 10 pp"
    );
    println!(
        "{:<3} {:<40} {:<9} {:>6} {:>6} {:>8} {:>5} {:>8} {:>8} {:>8}  {:<10} {:<8} {:>5} {:>6} {:>6} {:>6} {:>5} {:>5} {:>4}",
        "#",
        "workload",
        "kind",
        "truth%",
        "pages%",
        s.name,
        "n",
        "mean_pp",
        "p95_pp",
        "max_pp",
        "lag",
        "p95<=2pp",
        "cover",
        "no_int",
        "w_med",
        "w_p95",
        "1side",
        "vacu",
        "goal",
    );
    let changes = lags(records, truth, s);
    for (w, work) in matrix.iter().enumerate() {
        let ix: Vec<usize> = (0..records.len())
            .filter(|&i| records[i].workload == w && !records[i].warmup)
            .collect();
        let m = |src: &Source| mean(ix.iter().filter_map(|&i| src.ratios[i]));
        let pv = mean(ix.iter().filter_map(|&i| pages_view(&records[i], overhead)));
        let e = ErrorStats::of(&errors(records, truth, s, |r| r.workload == w));
        let lag = workload_lags(&changes, w);
        let pct = |x: Option<f64>| x.map_or("-".into(), |x| format!("{:.1}", x * 100.0));
        let cov = coverage(records, truth, s, |r| r.workload == w);
        let f1 = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.1}"));
        let f2 = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.2}"));
        println!(
            "{:<3} {:<40} {:<9} {:>6} {:>6} {:>8} {}  {:<10} {:<8} {:>5} {:>6} {:>6} {:>6} {:>5} {:>5} {:>4}",
            w + 1,
            work.name,
            work.kind.label(),
            pct(m(truth)),
            pct(pv),
            pct(m(s)),
            fmt_stats(e),
            if lag.is_empty() {
                "-".into()
            } else {
                lag.join(",")
            },
            match e {
                Some(e) if e.p95 <= 2.0 => "yes",
                Some(_) => "NO",
                None => "-",
            },
            f2(cov.and_then(|c| c.coverage)),
            cov.map_or("-".into(), |c| c.no_interval.to_string()),
            f1(cov.and_then(|c| c.width_median)),
            f1(cov.and_then(|c| c.width_p95)),
            f2(cov.and_then(|c| c.one_sided)),
            f2(cov.and_then(|c| c.vacuous)),
            match cov.and_then(|c| c.meets_goal()) {
                Some(true) => "yes",
                Some(false) => "no",
                None => "-",
            },
        );
    }
}

/// ratio_over_time.svg (whole run) and ratio_by_workload.svg (one panel
/// per workload); returns their paths.
pub fn plots(
    dir: &Path,
    matrix: &[Workload],
    records: &[Record],
    sources: &[&Source],
) -> anyhow::Result<Vec<PathBuf>> {
    let series = |ix: &[usize], x: &dyn Fn(usize) -> f64| -> Vec<Series> {
        sources
            .iter()
            .map(|s| Series {
                name: s.name.clone(),
                points: ix.iter().map(|&i| (x(i), s.ratios[i])).collect(),
            })
            .collect()
    };
    let all: Vec<usize> = (0..records.len()).collect();
    let markers = matrix
        .iter()
        .enumerate()
        .filter_map(|(w, _)| {
            records
                .iter()
                .find(|r| r.workload == w)
                .map(|r| (r.index as f64, format!("W{}", w + 1)))
        })
        .collect();
    let whole = Panel {
        title: "DRAM-hit ratio per interval, whole matrix (W = workload start)".into(),
        series: series(&all, &|i| records[i].index as f64),
        markers,
    };
    let time = dir.join("ratio_over_time.svg");
    grid(&time, &[whole], 1, (1800, 480), "interval", "DRAM-hit %")?;

    let panels: Vec<Panel> = matrix
        .iter()
        .enumerate()
        .map(|(w, work)| {
            let ix: Vec<usize> = (0..records.len())
                .filter(|&i| records[i].workload == w)
                .collect();
            let first = ix.first().map_or(0, |&i| records[i].index);
            let x = |i: usize| (records[i].index - first) as f64;
            Panel {
                title: format!("W{} {} ({})", w + 1, work.name, work.kind.label()),
                series: series(&ix, &x),
                markers: ix
                    .iter()
                    .filter(|&&i| records[i].change)
                    .map(|&i| (x(i), "change".to_string()))
                    .collect(),
            }
        })
        .collect();
    let by = dir.join("ratio_by_workload.svg");
    grid(
        &by,
        &panels,
        3,
        (520, 300),
        "interval in workload (0 = warm-up)",
        "DRAM-hit %",
    )?;
    Ok(vec![time, by])
}
