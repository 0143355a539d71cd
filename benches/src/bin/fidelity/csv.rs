//! The fidelity run's CSV files: every interval with every source
//! (`intervals-<backend>.csv`, what `refit` replays) and per-workload
//! statistics (`summary-<backend>.csv`), and every working-set point
//! (`ws-<backend>.csv`).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use tier_benches::fidelity::{ErrorStats, error_pp};

use crate::matrix::Workload;
use crate::report::{Source, coverage, errors, lags, workload_lags};
use crate::run::{Record, TierPasses};

/// intervals.csv: one line per interval with every source.
pub fn write_intervals_csv(
    path: &Path,
    matrix: &[Workload],
    records: &[Record],
    truth: &Source,
    others: &[&Source],
) -> anyhow::Result<()> {
    let mut out = String::from(
        "interval,t_s,workload,workload_name,kind,step,warmup,change,shape,truth_dram,truth_slow,truth_ratio",
    );
    for s in others {
        let _ = write!(out, ",{0}_ratio,{0}_err_pp", s.name);
    }
    out.push_str(
        ",host_young_dram,host_young_slow,host_est_dram,host_est_slow,host_passes,host_scan_ms,host_pass_s,host_pass_young_dram,host_pass_young_slow,host_pass_young_other,host_pass_s_slow,host_pass_s_other,host_ratio_low,host_ratio_high,host_covered,vm_dram_hit_low,vm_dram_hit_high\n",
    );
    let f = |x: Option<f64>| x.map_or(String::new(), |x| format!("{x:.5}"));
    for (i, r) in records.iter().enumerate() {
        let w = &matrix[r.workload];
        let _ = write!(
            out,
            "{},{:.3},{},\"{}\",{},{},{},{},{},{},{},{}",
            r.index,
            r.t_s,
            r.workload + 1,
            w.name,
            w.kind.label(),
            r.step,
            r.warmup,
            r.change,
            r.shape.label(),
            r.truth[0],
            r.truth[1],
            f(truth.ratios[i])
        );
        for s in others {
            let _ = write!(
                out,
                ",{},{}",
                f(s.ratios[i]),
                f(error_pp(s.ratios[i], truth.ratios[i]))
            );
        }
        // Per-pass lists, `;`-separated, for re-fitting offline; other
        // tiers `|`-separated. host_pass_s is dram's seconds.
        let secs = |t: &TierPasses| -> String {
            let v: Vec<String> = t.seconds.iter().map(|t| format!("{t:.6}")).collect();
            v.join(";")
        };
        let young = |t: &TierPasses| -> String {
            let v: Vec<String> = t.young.iter().map(u64::to_string).collect();
            v.join(";")
        };
        match &r.host {
            Some(h) => {
                let other = |f: &dyn Fn(&TierPasses) -> String| -> String {
                    h.passes_other.iter().map(f).collect::<Vec<_>>().join("|")
                };
                let [d, w] = &h.passes_fit;
                let ends = |iv: Option<(f64, f64)>| {
                    iv.map_or(",".into(), |(lo, hi)| format!("{lo:.5},{hi:.5}"))
                };
                let covered = match (h.interval, truth.ratios[i]) {
                    (Some((lo, hi)), Some(t)) => (lo - 1e-9 <= t && t <= hi + 1e-9).to_string(),
                    (None, Some(_)) => "false".into(),
                    _ => String::new(),
                };
                let _ = writeln!(
                    out,
                    ",{},{},{:.1},{:.1},{},{:.3},{},{},{},{},{},{},{},{covered},{}",
                    h.young[0],
                    h.young[1],
                    h.estimated[0],
                    h.estimated[1],
                    h.passes,
                    h.scan_ns as f64 / 1e6,
                    secs(d),
                    young(d),
                    young(w),
                    other(&young),
                    secs(w),
                    other(&secs),
                    ends(h.interval),
                    ends(h.vm_interval),
                );
            }
            None => out.push_str(",,,,,,,,,,,,,,,,,\n"),
        }
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

/// summary.csv: error statistics per workload and source.
pub fn write_summary_csv(
    path: &Path,
    matrix: &[Workload],
    records: &[Record],
    truth: &Source,
    others: &[&Source],
) -> anyhow::Result<()> {
    let mut out = String::from(
        "workload,workload_name,kind,source,n,mean_pp,p95_pp,max_pp,lags,coverage,no_interval,width_median_pp,width_p95_pp,one_sided,vacuous,no_ratio\n",
    );
    for s in others {
        let l = lags(records, truth, s);
        for (w, work) in matrix.iter().enumerate() {
            let e = ErrorStats::of(&errors(records, truth, s, |r| r.workload == w));
            let lag = workload_lags(&l, w);
            let (n, a, b, c) = e.map_or((0, String::new(), String::new(), String::new()), |e| {
                (
                    e.n,
                    format!("{:.3}", e.mean),
                    format!("{:.3}", e.p95),
                    format!("{:.3}", e.max),
                )
            });
            let cov = coverage(records, truth, s, |r| r.workload == w);
            let o3 = |x: Option<f64>| x.map_or(String::new(), |x| format!("{x:.3}"));
            let o4 = |x: Option<f64>| x.map_or(String::new(), |x| format!("{x:.4}"));
            let _ = writeln!(
                out,
                "{},\"{}\",{},{},{n},{a},{b},{c},{},{},{},{},{},{},{},{}",
                w + 1,
                work.name,
                work.kind.label(),
                s.name,
                lag.join(";"),
                o4(cov.and_then(|c| c.coverage)),
                cov.map_or(String::new(), |c| c.no_interval.to_string()),
                o3(cov.and_then(|c| c.width_median)),
                o3(cov.and_then(|c| c.width_p95)),
                o4(cov.and_then(|c| c.one_sided)),
                o4(cov.and_then(|c| c.vacuous)),
                cov.map_or(String::new(), |c| c.none.to_string()),
            );
        }
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

/// ws.csv: one line per interval, tier and horizon: the truth's band and
/// the estimate with its interval, or why it was not measured.
pub fn write_ws_csv(path: &Path, matrix: &[Workload], records: &[Record]) -> anyhow::Result<()> {
    let mut out = String::from(
        "interval,t_s,workload,kind,step,warmup,horizon_s,tier,truth_low,truth_high,estimate,low,high,not_measured\n",
    );
    for r in records {
        for p in &r.ws {
            let (e, lo, hi, why) = match &p.est {
                Ok((e, lo, hi)) => (
                    format!("{e:.1}"),
                    format!("{lo:.1}"),
                    format!("{hi:.1}"),
                    "",
                ),
                Err(w) => (String::new(), String::new(), String::new(), w.as_str()),
            };
            let _ = writeln!(
                out,
                "{},{:.3},{},{},{},{},{},{},{},{},{e},{lo},{hi},\"{}\"",
                r.index,
                r.t_s,
                r.workload + 1,
                matrix[r.workload].kind.label(),
                r.step,
                r.warmup,
                p.horizon,
                ["dram", "slow"][p.tier.min(1)],
                p.truth.0,
                p.truth.1,
                why.replace('"', "'"),
            );
        }
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}
