//! Scoring a DRAM-hit-ratio source against the ground truth: error in
//! percentage points, and how many intervals it takes to settle after a
//! phase change.

/// Share of accesses that hit dram; `None` without accesses.
pub fn ratio(dram: f64, slow: f64) -> Option<f64> {
    let total = dram + slow;
    (total > 0.0).then(|| dram / total)
}

/// Error statistics of one source over a set of intervals, in percentage points.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErrorStats {
    pub n: usize,
    pub mean: f64,
    /// Nearest-rank 95th percentile.
    pub p95: f64,
    pub max: f64,
}

impl ErrorStats {
    /// Absolute errors in pp; `None` when empty or any is NaN.
    pub fn of(errors_pp: &[f64]) -> Option<ErrorStats> {
        if errors_pp.is_empty() || errors_pp.iter().any(|e| e.is_nan()) {
            return None;
        }
        let mut v: Vec<f64> = errors_pp.iter().map(|e| e.abs()).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        Some(ErrorStats {
            n,
            mean: v.iter().sum::<f64>() / n as f64,
            p95: percentile(&v, 95.0),
            max: v[n - 1],
        })
    }
}

/// Nearest-rank percentile of sorted, non-empty values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// |a - b| in percentage points, when both exist.
pub fn error_pp(source: Option<f64>, truth: Option<f64>) -> Option<f64> {
    Some((source? - truth?).abs() * 100.0)
}

/// How a source followed one phase change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lag {
    /// Settled this many intervals after the interval of the change (0:
    /// the change interval itself already showed the new level).
    Settled(usize),
    /// Its level moved by less than half of the truth's step: the change
    /// was not seen at all (a steady bias is not a lag).
    Missed,
    /// Still not steady at the end of the phase.
    Unsettled,
}

impl std::fmt::Display for Lag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lag::Settled(n) => write!(f, "{n}"),
            Lag::Missed => f.write_str("missed"),
            Lag::Unsettled => f.write_str("unsettled"),
        }
    }
}

/// A source's steady level in a phase: the median of its second half.
pub fn steady_level(values: &[Option<f64>]) -> Option<f64> {
    let tail: Vec<f64> = values[values.len() / 2..]
        .iter()
        .flatten()
        .copied()
        .collect();
    crate::Summary::of(&tail).map(|s| s.median)
}

/// Intervals from a change until a source settles at its new level.
///
/// `before` and `after` are one source's ratios in the phase before the
/// change and in the phase that starts with the interval in which the
/// change happened; `truth_step` is the truth's level change. The new level
/// is the source's own steady level (so a biased source is judged on speed,
/// not bias); the lag is the index in `after` of the first interval from
/// which every later one stays within `tol` of it. `None` when a phase is
/// too short (< 3 intervals) to have a steady level.
pub fn detect_lag(
    before: &[Option<f64>],
    after: &[Option<f64>],
    truth_step: f64,
    tol: f64,
) -> Option<Lag> {
    if before.len() < 3 || after.len() < 3 {
        return None;
    }
    let old = steady_level(before)?;
    let Some(level) = steady_level(after) else {
        return Some(Lag::Unsettled);
    };
    let moved = level - old;
    if moved * truth_step.signum() < 0.5 * truth_step.abs() {
        return Some(Lag::Missed);
    }
    let within = |v: &Option<f64>| v.is_some_and(|v| (v - level).abs() <= tol);
    let mut lag = None;
    for i in (0..after.len()).rev() {
        if !within(&after[i]) {
            break;
        }
        lag = Some(i);
    }
    Some(lag.map_or(Lag::Unsettled, Lag::Settled))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_and_error() {
        assert_eq!(ratio(3.0, 1.0), Some(0.75));
        assert_eq!(ratio(0.0, 0.0), None);
        let e = error_pp(Some(0.70), Some(0.75)).unwrap();
        assert!((e - 5.0).abs() < 1e-9);
        assert_eq!(error_pp(None, Some(0.5)), None);
    }

    #[test]
    fn error_stats_nearest_rank() {
        let errs: Vec<f64> = (1..=20).map(f64::from).collect();
        let s = ErrorStats::of(&errs).unwrap();
        assert_eq!(s.n, 20);
        assert!((s.mean - 10.5).abs() < 1e-12);
        assert_eq!(s.p95, 19.0);
        assert_eq!(s.max, 20.0);
        // Signs do not matter; one value is its own p95.
        assert_eq!(ErrorStats::of(&[-3.0]).unwrap().p95, 3.0);
        assert_eq!(ErrorStats::of(&[]), None);
        assert_eq!(ErrorStats::of(&[1.0, f64::NAN]), None);
    }

    #[test]
    fn lag_counts_from_the_change_interval() {
        let v = |x: &[f64]| x.iter().map(|&a| Some(a)).collect::<Vec<_>>();
        let before = v(&[0.75, 0.75, 0.75, 0.75]);
        let lag = |after: &[Option<f64>], step: f64| detect_lag(&before, after, step, 0.02);
        // Mixed change interval, then settled.
        assert_eq!(
            lag(&v(&[0.5, 0.25, 0.25, 0.25, 0.25]), -0.5),
            Some(Lag::Settled(1))
        );
        // Already settled in the change interval.
        assert_eq!(
            lag(&v(&[0.26, 0.25, 0.25, 0.25]), -0.5),
            Some(Lag::Settled(0))
        );
        // Two intervals to settle.
        assert_eq!(
            lag(&v(&[0.7, 0.4, 0.25, 0.25, 0.25, 0.25]), -0.5),
            Some(Lag::Settled(2))
        );
        // A biased source that follows the step settles at its own level.
        assert_eq!(lag(&v(&[0.6, 0.4, 0.4, 0.4]), -0.5), Some(Lag::Settled(1)));
        // A source that does not move with the truth missed the change.
        assert_eq!(lag(&v(&[0.74, 0.72, 0.73, 0.73]), -0.3), Some(Lag::Missed));
        assert_eq!(lag(&v(&[0.8, 0.9, 0.9, 0.9]), -0.3), Some(Lag::Missed));
        // An excursion after settling moves the lag past it.
        assert_eq!(
            lag(&v(&[0.5, 0.25, 0.4, 0.25, 0.25, 0.25]), -0.5),
            Some(Lag::Settled(3))
        );
        // A missing reading counts as not settled.
        let mut w = v(&[0.5, 0.25, 0.25, 0.25, 0.25]);
        w[1] = None;
        assert_eq!(lag(&w, -0.5), Some(Lag::Settled(2)));
        // Still moving at the end.
        assert_eq!(
            lag(&v(&[0.7, 0.6, 0.5, 0.4, 0.3, 0.2]), -0.5),
            Some(Lag::Unsettled)
        );
        assert_eq!(lag(&v(&[0.5, 0.25]), -0.5), None);
        assert_eq!(Lag::Settled(2).to_string(), "2");
        assert_eq!(Lag::Missed.to_string(), "missed");
    }
}
