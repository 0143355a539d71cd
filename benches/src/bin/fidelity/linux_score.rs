//! Scores the Linux source: per workload and metric, how tierd's ~95 %
//! intervals and points did against tier_truth. Metrics: the DRAM-hit
//! ratio against the share of LLC misses and against the share of
//! touches on node 0, and the working set per horizon and tier.

use std::fmt::Write as _;

use crate::linux::{LRecord, Output};

use tier_benches::verdict::{Pair, Unit, Verdict};

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
    /// The scored intervals (pooled over workloads for the RESULT).
    pub pairs: Vec<Pair>,
    pub verdict: Verdict,
}

/// Scores pairs with the verdict every fidelity bench shares
/// (`tier_benches::verdict`).
fn score(pairs: &[Pair], unit: Unit) -> Row {
    let v = Verdict::of(pairs, unit);
    let truths: Vec<f64> = pairs
        .iter()
        .map(|p| (p.truth.0 + p.truth.1) / 2.0)
        .collect();
    Row {
        workload: String::new(),
        metric: String::new(),
        n: v.n,
        none: v.none,
        coverage: v.coverage,
        width_median: v.width_median,
        width_p95: v.width_p95,
        one_sided: v.one_sided,
        vacuous: v.vacuous,
        err_p95: v.err_p95,
        truth_min: truths.iter().copied().reduce(f64::min),
        truth_max: truths.iter().copied().reduce(f64::max),
        unit: unit.label(),
        why: None,
        pairs: pairs.to_vec(),
        verdict: v,
    }
}

/// Ratio pairs of scored records: `share` picks (dram, slow) counts.
fn ratio_pairs(rs: &[&LRecord], share: impl Fn(&LRecord) -> [u64; 2]) -> Vec<Pair> {
    rs.iter()
        .filter_map(|r| {
            let [d, s] = share(r);
            let t = (d + s > 0).then(|| d as f64 / (d + s) as f64)?;
            let host = r.host.as_ref();
            Some(Pair::ratio(
                t,
                host.and_then(|h| h.ratio),
                host.and_then(|h| h.interval),
            ))
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
            score(&ratio_pairs(&rs, |r| r.sums.misses), Unit::Pp),
        );
        push(
            "hit_touch".into(),
            score(&ratio_pairs(&rs, |r| r.sums.touches), Unit::Pp),
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
                            full: out.tier_pages[tier] as f64,
                        }
                    })
                    .collect();
                let mut row = score(&pairs, Unit::Pct);
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
        "{:<13} {:<15} {:>4} {:>5} {:>6} {:>8} {:>8} {:>6} {:>6} {:>8} {:>4}  {:<17} not measured because",
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
        "goal",
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
            "{:<13} {:<15} {:>4} {:>5} {:>6} {:>8} {:>8} {:>6} {:>6} {:>8} {:>4}  {:<17} {}",
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
            match r.verdict.meets_goal() {
                Some(true) => "yes",
                Some(false) => "no",
                None => "-",
            },
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

/// The verdict of `metric` (a prefix) over every workload's scored
/// intervals together.
pub fn pooled(rows: &[Row], metric: &str) -> Option<Verdict> {
    let rs: Vec<&Row> = rows
        .iter()
        .filter(|r| r.metric.starts_with(metric))
        .collect();
    let unit = rs.first()?.verdict.unit;
    let pairs: Vec<Pair> = rs.iter().flat_map(|r| r.pairs.iter().copied()).collect();
    Some(Verdict::of(&pairs, unit))
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

    #[test]
    fn rows_carry_the_shared_verdict_and_pool_over_workloads() {
        let a = Pair::ratio(0.5, Some(0.5), Some((0.0, 1.0)));
        let b = Pair::ratio(0.5, Some(0.52), Some((0.45, 0.55)));
        let mut r1 = score(&[a, a], Unit::Pp);
        let mut r2 = score(&[b, b, b], Unit::Pp);
        r1.metric = "hit_miss".into();
        r2.metric = "hit_miss".into();
        assert_eq!(r1.vacuous, Some(1.0));
        assert_eq!(r2.coverage, Some(1.0));
        let v = pooled(&[r1, r2], "hit_miss").unwrap();
        assert_eq!(v.n, 5);
        assert!((v.vacuous.unwrap() - 0.4).abs() < 1e-12, "{v:?}");
        assert!((v.width_median.unwrap() - 10.0).abs() < 1e-9, "{v:?}");
        assert_eq!(pooled(&[], "hit_miss"), None);
    }
}
