//! Scores the Linux source: per workload and metric, how tierd's ~95 %
//! intervals and points did against tier_truth. Metrics: the DRAM-hit
//! ratio against the share of LLC misses and against the share of
//! touches on node 0, and the working set per horizon and tier.

use std::fmt::Write as _;

use tier_benches::Summary;

use crate::linux::{LRecord, Output};

const EPS: f64 = 1e-9;

/// One (truth, estimate) pair; the estimate is (point, low, high) or
/// absent (no reading, or no interval: not covered).
#[derive(Debug, Clone, Copy)]
pub struct Pair {
    /// Truth as a band (equal ends: exact).
    pub truth: (f64, f64),
    pub point: Option<f64>,
    pub interval: Option<(f64, f64)>,
}

/// How one metric did over a workload's scored intervals.
#[derive(Debug, Clone)]
pub struct Row {
    pub workload: String,
    pub metric: String,
    /// Scored intervals with an estimate.
    pub n: usize,
    /// Scored intervals without one (hostpte's sweep, or not measured).
    pub none: usize,
    pub coverage: Option<f64>,
    /// Interval width: pp for ratios, % of the truth for working sets.
    pub width_median: Option<f64>,
    pub width_p95: Option<f64>,
    pub one_sided: Option<f64>,
    pub vacuous: Option<f64>,
    /// Point error p95: pp, or % of the truth.
    pub err_p95: Option<f64>,
    pub truth_min: Option<f64>,
    pub truth_max: Option<f64>,
    /// "pp" or "%".
    pub unit: &'static str,
    /// Why not measured (first reason), for working sets.
    pub why: Option<String>,
}

fn p95(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = (0.95 * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

fn median(v: &[f64]) -> Option<f64> {
    Summary::of(v).map(|s| s.median)
}

/// Scores pairs; `scale` turns a value into the unit (100 for ratios to
/// pp); `relative`: widths and errors as % of the truth's low end;
/// `full`: the value the vacuous interval's high end reaches.
fn score(pairs: &[Pair], scale: f64, relative: bool, full: f64) -> Row {
    let given: Vec<&Pair> = pairs.iter().filter(|p| p.point.is_some()).collect();
    let n = given.len();
    let share = |k: usize| (n > 0).then(|| k as f64 / n as f64);
    let norm = |x: f64, t: (f64, f64)| {
        if relative {
            x / t.0.max(1.0) * 100.0
        } else {
            x * scale
        }
    };
    let covered = given
        .iter()
        .filter(|p| {
            p.interval
                .is_some_and(|(lo, hi)| lo - EPS <= p.truth.1 && p.truth.0 <= hi + EPS)
        })
        .count();
    let mut widths: Vec<f64> = given
        .iter()
        .filter_map(|p| p.interval.map(|(lo, hi)| norm(hi - lo, p.truth)))
        .filter(|w| w.is_finite())
        .collect();
    let low_open = |lo: f64| lo <= EPS;
    let high_open = |hi: f64| !hi.is_finite() || hi >= full - EPS;
    let one_sided = given
        .iter()
        .filter(|p| {
            p.interval
                .is_some_and(|(lo, hi)| low_open(lo) != high_open(hi))
        })
        .count();
    let vacuous = given
        .iter()
        .filter(|p| {
            p.interval
                .is_some_and(|(lo, hi)| low_open(lo) && high_open(hi))
        })
        .count();
    let mut errs: Vec<f64> = given
        .iter()
        .filter_map(|p| {
            let x = p.point?;
            Some(norm((x - x.clamp(p.truth.0, p.truth.1)).abs(), p.truth))
        })
        .collect();
    let truths: Vec<f64> = pairs
        .iter()
        .map(|p| (p.truth.0 + p.truth.1) / 2.0)
        .collect();
    Row {
        workload: String::new(),
        metric: String::new(),
        n,
        none: pairs.len() - n,
        coverage: share(covered),
        width_median: median(&widths),
        width_p95: p95(&mut widths),
        one_sided: share(one_sided),
        vacuous: share(vacuous),
        err_p95: p95(&mut errs),
        truth_min: truths.iter().copied().reduce(f64::min),
        truth_max: truths.iter().copied().reduce(f64::max),
        unit: if relative { "%" } else { "pp" },
        why: None,
    }
}

/// Ratio pairs of scored records: `share` picks (dram, slow) counts.
fn ratio_pairs(rs: &[&LRecord], share: impl Fn(&LRecord) -> [u64; 2]) -> Vec<Pair> {
    rs.iter()
        .filter_map(|r| {
            let [d, s] = share(r);
            let t = (d + s > 0).then(|| d as f64 / (d + s) as f64)?;
            let host = r.host.as_ref();
            Some(Pair {
                truth: (t, t),
                point: host.and_then(|h| h.ratio),
                interval: host.and_then(|h| h.interval),
            })
        })
        .collect()
}

/// Every row: per workload, the two ratios, then each horizon and tier.
pub fn rows(out: &Output) -> Vec<Row> {
    let mut all = Vec::new();
    for (wi, w) in out.workloads.iter().enumerate() {
        let rs: Vec<&LRecord> = out
            .records
            .iter()
            .filter(|r| r.workload == wi && !r.warmup)
            .collect();
        let mut push = |metric: String, mut row: Row| {
            row.workload = w.name.to_string();
            row.metric = metric;
            all.push(row);
        };
        push(
            "hit_miss".into(),
            score(&ratio_pairs(&rs, |r| r.sums.misses), 100.0, false, 1.0),
        );
        push(
            "hit_touch".into(),
            score(&ratio_pairs(&rs, |r| r.sums.touches), 100.0, false, 1.0),
        );
        let mut horizons: Vec<f64> = rs
            .iter()
            .flat_map(|r| r.ws.iter().map(|p| p.horizon))
            .collect();
        horizons.sort_by(f64::total_cmp);
        horizons.dedup();
        for h in horizons {
            for (tier, name) in ["dram", "slow"].into_iter().enumerate() {
                let pts: Vec<_> = rs
                    .iter()
                    .flat_map(|r| &r.ws)
                    .filter(|p| p.horizon == h && p.tier == tier)
                    .collect();
                let pairs: Vec<Pair> = pts
                    .iter()
                    .map(|p| {
                        let e = p.est.as_ref().ok();
                        Pair {
                            truth: (p.truth.0 as f64, p.truth.1 as f64),
                            point: e.map(|e| e.0),
                            interval: e.map(|e| (e.1, e.2)),
                        }
                    })
                    .collect();
                let mut row = score(&pairs, 1.0, true, out.tier_pages[tier] as f64);
                // Working-set truth shown in MiB.
                row.truth_min = row.truth_min.map(|p| p * 4096.0 / f64::from(1u32 << 20));
                row.truth_max = row.truth_max.map(|p| p * 4096.0 / f64::from(1u32 << 20));
                row.why = pts.iter().find_map(|p| p.est.clone().err());
                push(format!("ws_{h}s_{name}"), row);
            }
        }
    }
    all
}

fn f(x: Option<f64>, digits: usize) -> String {
    x.map_or("-".into(), |x| format!("{x:.digits$}"))
}

/// The table, one line per workload and metric.
pub fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<13} {:<15} {:>4} {:>5} {:>6} {:>8} {:>8} {:>6} {:>6} {:>8}  {:<17} not measured because",
        "workload",
        "metric",
        "n",
        "none",
        "cover",
        "w_med",
        "w_p95",
        "1side",
        "vacu",
        "err_p95",
        "truth range"
    );
    for r in rows {
        let unit = if r.metric.starts_with("ws_") {
            "MiB"
        } else {
            "%"
        };
        let scale = if unit == "%" { 100.0 } else { 1.0 };
        let range = match (r.truth_min, r.truth_max) {
            (Some(a), Some(b)) => format!("{:.1}-{:.1} {unit}", a * scale, b * scale),
            _ => "-".into(),
        };
        let _ = writeln!(
            s,
            "{:<13} {:<15} {:>4} {:>5} {:>6} {:>8} {:>8} {:>6} {:>6} {:>8}  {:<17} {}",
            r.workload,
            r.metric,
            r.n,
            r.none,
            f(r.coverage, 2),
            f(r.width_median, 1) + r.unit,
            f(r.width_p95, 1) + r.unit,
            f(r.one_sided, 2),
            f(r.vacuous, 2),
            f(r.err_p95, 1) + r.unit,
            range,
            if r.n == 0 {
                r.why.as_deref().unwrap_or("-")
            } else {
                ""
            }
        );
    }
    s
}

/// Coverage and median width of `metric` (a prefix) pooled over workloads,
/// weighting each row by its intervals.
pub fn pooled(rows: &[Row], metric: &str) -> (Option<f64>, Option<f64>, usize) {
    let rs: Vec<&Row> = rows
        .iter()
        .filter(|r| r.metric.starts_with(metric) && r.n > 0)
        .collect();
    let n: usize = rs.iter().map(|r| r.n).sum();
    let cov = (n > 0).then(|| {
        rs.iter()
            .map(|r| r.coverage.unwrap_or(0.0) * r.n as f64)
            .sum::<f64>()
            / n as f64
    });
    let widths: Vec<f64> = rs.iter().filter_map(|r| r.width_median).collect();
    (cov, median(&widths), n)
}

/// summary-linux.csv.
pub fn csv(rows: &[Row]) -> String {
    let mut s = String::from(
        "workload,metric,n,none,coverage,width_median,width_p95,unit,one_sided,vacuous,err_p95,truth_min,truth_max,not_measured\n",
    );
    let c = |x: Option<f64>| x.map_or(String::new(), |x| format!("{x:.4}"));
    for r in rows {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            r.workload,
            r.metric,
            r.n,
            r.none,
            c(r.coverage),
            c(r.width_median),
            c(r.width_p95),
            r.unit,
            c(r.one_sided),
            c(r.vacuous),
            c(r.err_p95),
            c(r.truth_min),
            c(r.truth_max),
            r.why.as_deref().unwrap_or("").replace(',', ";")
        );
    }
    s
}

/// intervals-linux.csv: one line per interval.
pub fn intervals_csv(out: &Output) -> String {
    let mut s = String::from(
        "workload,interval,warmup,t_s,touches_dram,touches_slow,misses_dram,misses_slow,pages_dram,pages_slow,instructions,est_ratio,est_low,est_high,young_dram,young_slow\n",
    );
    let c = |x: Option<f64>| x.map_or(String::new(), |x| format!("{x:.5}"));
    for r in &out.records {
        let h = r.host.as_ref();
        let _ = writeln!(
            s,
            "{},{},{},{:.3},{},{},{},{},{},{},{},{},{},{},{},{}",
            out.workloads.get(r.workload).map_or("?", |w| w.name),
            r.index,
            r.warmup,
            r.t_s,
            r.sums.touches[0],
            r.sums.touches[1],
            r.sums.misses[0],
            r.sums.misses[1],
            r.sums.pages[0],
            r.sums.pages[1],
            r.instructions,
            c(h.and_then(|h| h.ratio)),
            c(h.and_then(|h| h.interval).map(|i| i.0)),
            c(h.and_then(|h| h.interval).map(|i| i.1)),
            h.map_or(String::new(), |h| h.young[0].to_string()),
            h.map_or(String::new(), |h| h.young[1].to_string()),
        );
    }
    s
}

/// ws-linux.csv: one line per interval, horizon and tier (pages).
pub fn ws_csv(out: &Output) -> String {
    let mut s = String::from(
        "workload,interval,warmup,horizon_s,tier,truth_low,truth_high,est,est_low,est_high,not_measured\n",
    );
    for r in &out.records {
        for p in &r.ws {
            let (e, why) = match &p.est {
                Ok((x, lo, hi)) => (format!("{x:.1},{lo:.1},{hi:.1}"), String::new()),
                Err(w) => (",,".into(), w.replace(',', ";")),
            };
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{e},{why}",
                out.workloads.get(r.workload).map_or("?", |w| w.name),
                r.index,
                r.warmup,
                p.horizon,
                ["dram", "slow"].get(p.tier).unwrap_or(&"?"),
                p.truth.0,
                p.truth.1,
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(t: f64, p: f64, lo: f64, hi: f64) -> Pair {
        Pair {
            truth: (t, t),
            point: Some(p),
            interval: Some((lo, hi)),
        }
    }

    #[test]
    fn coverage_width_and_open_ends() {
        let pairs = [
            pair(0.5, 0.5, 0.4, 0.6), // covered, 20 pp
            pair(0.5, 0.7, 0.6, 0.8), // missed, 20 pp, error 20 pp
            pair(0.5, 0.5, 0.0, 0.6), // one-sided
            pair(0.5, 0.5, 0.0, 1.0), // vacuous
            Pair {
                truth: (0.5, 0.5),
                point: None,
                interval: None,
            },
        ];
        let r = score(&pairs, 100.0, false, 1.0);
        assert_eq!((r.n, r.none), (4, 1));
        assert_eq!(r.coverage, Some(0.75));
        assert_eq!(r.one_sided, Some(0.25));
        assert_eq!(r.vacuous, Some(0.25));
        assert!((r.err_p95.unwrap() - 20.0).abs() < 1e-9);
        assert!((r.width_median.unwrap() - 40.0).abs() < 1e-9);
    }

    #[test]
    fn working_sets_score_against_the_band_in_percent() {
        let p = Pair {
            truth: (100.0, 110.0),
            point: Some(120.0),
            interval: Some((105.0, 130.0)),
        };
        let r = score(&[p], 1.0, true, 1000.0);
        assert_eq!(r.coverage, Some(1.0));
        assert!((r.err_p95.unwrap() - 10.0).abs() < 1e-9);
        assert!((r.width_median.unwrap() - 25.0).abs() < 1e-9);
        assert_eq!(r.one_sided, Some(0.0));
    }
}
