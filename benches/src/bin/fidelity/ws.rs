//! Working-set ages (docs/working-set.md) against the guest's
//! exact pages touched per horizon: per horizon and tier, the relative
//! error of the estimate, whether its ~95 % interval held the truth, and
//! how often the backend did not measure the horizon.

use std::time::Instant;

use tier_benches::fidelity::ErrorStats;
use tier_benches::verdict::{Pair, Unit, Verdict};
use tier_proto::v1::StatsUpdate;

const PAGE: f64 = 4096.0;

/// One tier's working set within one horizon at one interval end.
#[derive(Debug, Clone)]
pub struct WsPoint {
    pub horizon: f64,
    /// 0 dram, 1 slow.
    pub tier: usize,
    /// Pages the guest touched within the horizon, (low, high): exact
    /// where equal, else as the guest's count log brackets it.
    pub truth: (u64, u64),
    /// (point, low, high) pages; None: not measured, and why.
    pub est: Result<(f64, f64, f64), String>,
    /// The tier's pages: an interval from 0 to these says nothing.
    pub pages: u64,
}

/// The points of one update: the dram and slow tiers' ages against
/// `truth(horizon)` (None: the source has no such truth).
pub fn points(
    u: &StatsUpdate,
    vm_id: &str,
    at: Instant,
    truth: &dyn Fn(Instant, f64) -> Option<[(u64, u64); 2]>,
    pages: [u64; 2],
) -> Vec<WsPoint> {
    let Some(s) = u.stats.iter().find(|s| s.vm_id == vm_id) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (tier, name) in ["dram", "slow"].into_iter().enumerate() {
        let Some(a) = s
            .tiers
            .iter()
            .find(|t| t.tier == name)
            .and_then(|t| t.ages.as_ref())
        else {
            continue;
        };
        for w in &a.working_set {
            let Some(t) = truth(at, w.horizon_seconds) else {
                continue;
            };
            out.push(WsPoint {
                horizon: w.horizon_seconds,
                tier,
                truth: t[tier],
                est: if w.not_measured.is_empty() {
                    Ok((w.bytes / PAGE, w.bytes_low / PAGE, w.bytes_high / PAGE))
                } else {
                    Err(w.not_measured.clone())
                },
                pages: pages[tier],
            });
        }
    }
    out
}

/// One horizon's score.
#[derive(Debug, Clone)]
pub struct WsScore {
    pub horizon: f64,
    /// Relative error in %, over measured points with a non-zero truth.
    pub err: Option<ErrorStats>,
    /// The same per tier [dram, slow].
    pub err_tier: [Option<ErrorStats>; 2],
    /// Share of measured points whose interval held the truth.
    pub coverage: Option<f64>,
    pub measured: usize,
    /// p95 width of the truth's band, % of its low end.
    pub truth_width: Option<f64>,
    pub not_measured: usize,
    /// One reason it was not measured.
    pub why: Option<String>,
    /// Coverage, width and open ends (the verdict every fidelity bench
    /// shares), over measured and unmeasured points alike.
    pub verdict: Verdict,
}

/// |estimate - truth| / truth in %, against the nearest end of the
/// truth's band (0 inside it).
fn error_pct(est: f64, truth: (u64, u64)) -> f64 {
    let (lo, hi) = (truth.0 as f64, truth.1 as f64);
    (est - est.clamp(lo, hi)).abs() / lo * 100.0
}

pub fn score<'a>(points: impl Iterator<Item = &'a WsPoint>) -> Vec<WsScore> {
    let mut by: Vec<(f64, Vec<&WsPoint>)> = Vec::new();
    for p in points {
        match by.iter_mut().find(|b| b.0 == p.horizon) {
            Some(b) => b.1.push(p),
            None => by.push((p.horizon, vec![p])),
        }
    }
    by.sort_by(|a, b| a.0.total_cmp(&b.0));
    by.into_iter()
        .map(|(horizon, ps)| {
            let measured: Vec<(&WsPoint, (f64, f64, f64))> = ps
                .iter()
                .filter_map(|p| Some((*p, p.est.clone().ok()?)))
                .collect();
            let errs_of = |tier: Option<usize>| -> Vec<f64> {
                measured
                    .iter()
                    .filter(|(p, _)| p.truth.0 > 0 && tier.is_none_or(|t| t == p.tier))
                    .map(|(p, e)| error_pct(e.0, p.truth))
                    .collect()
            };
            let errs = errs_of(None);
            // The interval meets the truth's band (one point when exact).
            let covered = measured
                .iter()
                .filter(|(p, e)| e.1 <= p.truth.1 as f64 && p.truth.0 as f64 <= e.2)
                .count();
            let widths: Vec<f64> = ps
                .iter()
                .filter(|p| p.truth.0 > 0)
                .map(|p| (p.truth.1 - p.truth.0) as f64 / p.truth.0 as f64 * 100.0)
                .collect();
            let pairs: Vec<Pair> = ps
                .iter()
                .map(|p| {
                    let e = p.est.as_ref().ok();
                    Pair {
                        truth: (p.truth.0 as f64, p.truth.1 as f64),
                        point: e.map(|e| e.0),
                        interval: e.map(|e| (e.1, e.2)),
                        full: p.pages as f64,
                    }
                })
                .collect();
            WsScore {
                verdict: Verdict::of(&pairs, Unit::Pct),
                horizon,
                err: ErrorStats::of(&errs),
                err_tier: [0, 1].map(|t| ErrorStats::of(&errs_of(Some(t)))),
                coverage: (!measured.is_empty()).then(|| covered as f64 / measured.len() as f64),
                measured: measured.len(),
                truth_width: ErrorStats::of(&widths).map(|w| w.p95),
                not_measured: ps.len() - measured.len(),
                why: ps.iter().find_map(|p| p.est.clone().err()),
            }
        })
        .collect()
}

/// The table; returns the RESULT pairs.
pub fn print(scores: &[WsScore]) -> Vec<(String, String)> {
    println!(
        "working set per horizon (dram and slow tiers, scored intervals; error = |estimate - pages the guest touched| / touched, against the truth's band; truth± = p95 width of that band, % of it):"
    );
    println!(
        "  {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9} {:>9} {:>6} {:>6} {:>4}  not measured because",
        "horizon",
        "measured",
        "n/m",
        "p95 err%",
        "max err%",
        "dram p95",
        "slow p95",
        "coverage",
        "truth±",
        "w_med",
        "w_p95",
        "1side",
        "vacu",
        "goal"
    );
    let mut pairs = Vec::new();
    for s in scores {
        let f = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2}"));
        println!(
            "  {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9} {:>9} {:>6} {:>6} {:>4}  {}",
            format!("{}s", s.horizon),
            s.measured,
            s.not_measured,
            f(s.err.map(|e| e.p95)),
            f(s.err.map(|e| e.max)),
            f(s.err_tier[0].map(|e| e.p95)),
            f(s.err_tier[1].map(|e| e.p95)),
            f(s.coverage),
            f(s.truth_width),
            f(s.verdict.width_median) + "%",
            f(s.verdict.width_p95) + "%",
            f(s.verdict.one_sided),
            f(s.verdict.vacuous),
            match s.verdict.meets_goal() {
                Some(true) => "yes",
                Some(false) => "no",
                None => "-",
            },
            s.why.as_deref().unwrap_or("-")
        );
        let na = |x: Option<f64>| x.map_or("na".to_string(), |x| format!("{x:.2}"));
        let h = s.horizon;
        pairs.push((format!("ws_p95_err_pct_{h}s"), na(s.err.map(|e| e.p95))));
        pairs.push((format!("ws_coverage_{h}s"), na(s.coverage)));
        pairs.push((format!("ws_measured_{h}s"), s.measured.to_string()));
        pairs.extend(s.verdict.result_pairs(&format!("ws_{h}s")));
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_split_by_horizon_and_count_what_was_not_measured() {
        let p = |h: f64, truth: u64, est: Result<(f64, f64, f64), String>| WsPoint {
            horizon: h,
            tier: 0,
            truth: (truth, truth),
            est,
            pages: 1000,
        };
        let pts = [
            p(1.0, 100, Ok((104.0, 99.0, 110.0))),
            p(1.0, 100, Ok((90.0, 85.0, 95.0))),
            p(10.0, 100, Err("beyond".into())),
        ];
        let s = score(pts.iter());
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].measured, s[0].not_measured), (2, 0));
        assert_eq!(s[0].err.map(|e| e.p95), Some(10.0));
        assert_eq!(s[0].coverage, Some(0.5));
        assert_eq!((s[1].measured, s[1].not_measured), (0, 1));
        assert_eq!(s[1].why.as_deref(), Some("beyond"));
        assert_eq!(s[0].truth_width, Some(0.0));
        // Widths 11 and 10 % of the truth; one point without an estimate.
        assert_eq!(s[0].verdict.n, 2);
        assert!((s[0].verdict.width_median.unwrap() - 10.5).abs() < 1e-9);
        assert_eq!((s[1].verdict.n, s[1].verdict.none), (0, 1));
    }

    /// A truth known within a band: no error inside it, the distance to
    /// its nearer end outside; an interval that meets it covers it.
    #[test]
    fn a_banded_truth_scores_against_its_nearer_end() {
        let p = |est: (f64, f64, f64)| WsPoint {
            horizon: 1.0,
            tier: 1,
            truth: (100, 110),
            est: Ok(est),
            pages: 1000,
        };
        let pts = [p((105.0, 104.0, 106.0)), p((120.0, 111.0, 130.0))];
        let s = score(pts.iter());
        assert_eq!(s[0].err.map(|e| e.max), Some(10.0));
        assert_eq!(s[0].err_tier[1].map(|e| e.p95 <= 10.0), Some(true));
        assert_eq!(s[0].coverage, Some(0.5));
        assert_eq!(s[0].truth_width, Some(10.0));
    }
}
