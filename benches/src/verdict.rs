//! The interval verdict every fidelity bench reports (test guest, twin,
//! Linux bed): per metric, how often the ~95 % interval held the truth and
//! how wide it was. Coverage alone rewards saying nothing: an interval of
//! 0-100 % always covers. So width comes with it (median and p95), and the
//! share of one-sided intervals (one end at its limit) and of vacuous ones
//! (both: 0-100 %, or 0 to the whole tier), still counted in coverage.
//! The goal (`benches/README.md`): coverage >= 0.95 with median width
//! <= 10 pp for ratios, <= 10 % of the truth for working sets.

/// Slack for float ends (truths are ratios of integers).
const EPS: f64 = 1e-9;

/// What the goal allows: coverage at least this...
pub const GOAL_COVERAGE: f64 = 0.95;
/// ...with a median width at most this (pp, or % of the truth).
pub const GOAL_WIDTH: f64 = 10.0;

/// How a metric's widths and errors are expressed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Unit {
    /// A ratio in [0, 1], reported in percentage points.
    Pp,
    /// A count (pages, bytes), reported in % of the truth's low end.
    Pct,
}

impl Unit {
    pub fn label(self) -> &'static str {
        match self {
            Unit::Pp => "pp",
            Unit::Pct => "%",
        }
    }
}

/// One scored interval: the truth (a band; equal ends when exact), the
/// estimate's point and ~95 % interval, and `full`, the value where the
/// interval stops saying anything (1 for a ratio, the tier's pages for a
/// working set).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pair {
    pub truth: (f64, f64),
    /// None: no estimate this interval (counted apart as `none`).
    pub point: Option<f64>,
    /// None with a point: no interval (counted as not covering).
    pub interval: Option<(f64, f64)>,
    pub full: f64,
}

impl Pair {
    /// A ratio's pair against an exact truth.
    pub fn ratio(truth: f64, point: Option<f64>, interval: Option<(f64, f64)>) -> Pair {
        Pair {
            truth: (truth, truth),
            point,
            interval,
            full: 1.0,
        }
    }

    fn covered(&self) -> bool {
        // Relative: the twin's populations are fractional pages, and its
        // ends and truths differ in the last bits where they meet.
        let tol = EPS * self.truth.1.abs().max(1.0);
        self.interval
            .is_some_and(|(lo, hi)| lo - tol <= self.truth.1 && self.truth.0 <= hi + tol)
    }

    /// (low end at 0, high end at `full` or open).
    fn open(&self) -> Option<(bool, bool)> {
        let (lo, hi) = self.interval?;
        let tol = EPS * self.full.abs().max(1.0);
        Some((lo <= tol, !hi.is_finite() || hi >= self.full - tol))
    }
}

/// One metric's verdict over its scored intervals.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    pub unit: Unit,
    /// Scored intervals with an estimate.
    pub n: usize,
    /// Scored intervals without one.
    pub none: usize,
    /// Of `n`, intervals with a point and no interval (not covering).
    pub no_interval: usize,
    /// Of `n`, the share whose interval held the truth.
    pub coverage: Option<f64>,
    /// Interval width, pp or % of the truth's low end.
    pub width_median: Option<f64>,
    pub width_p95: Option<f64>,
    /// Of `n`, the share with exactly one end at its limit...
    pub one_sided: Option<f64>,
    /// ...and with both (covers whatever the truth).
    pub vacuous: Option<f64>,
    /// Point error p95 against the truth's nearer end.
    pub err_p95: Option<f64>,
}

/// p95 by nearest rank; sorts `v`.
pub fn p95(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = (0.95 * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

fn median(v: &[f64]) -> Option<f64> {
    crate::Summary::of(v).map(|s| s.median)
}

impl Verdict {
    pub fn of(pairs: &[Pair], unit: Unit) -> Verdict {
        let given: Vec<&Pair> = pairs.iter().filter(|p| p.point.is_some()).collect();
        let n = given.len();
        let share = |k: usize| (n > 0).then(|| k as f64 / n as f64);
        let norm = |x: f64, t: (f64, f64)| match unit {
            Unit::Pp => x * 100.0,
            Unit::Pct => x / t.0.max(1.0) * 100.0,
        };
        let mut widths: Vec<f64> = given
            .iter()
            .filter_map(|p| p.interval.map(|(lo, hi)| norm(hi - lo, p.truth)))
            .filter(|w| w.is_finite())
            .collect();
        let ends = |want: fn((bool, bool)) -> bool| {
            given.iter().filter(|p| p.open().is_some_and(want)).count()
        };
        let mut errs: Vec<f64> = given
            .iter()
            .filter_map(|p| {
                let x = p.point?;
                Some(norm((x - x.clamp(p.truth.0, p.truth.1)).abs(), p.truth))
            })
            .collect();
        Verdict {
            unit,
            n,
            none: pairs.len() - n,
            no_interval: given.iter().filter(|p| p.interval.is_none()).count(),
            coverage: share(given.iter().filter(|p| p.covered()).count()),
            width_median: median(&widths),
            width_p95: p95(&mut widths),
            one_sided: share(ends(|(l, h)| l != h)),
            vacuous: share(ends(|(l, h)| l && h)),
            err_p95: p95(&mut errs),
        }
    }

    /// Coverage >= 0.95 with a median width <= 10 (pp or %); None without
    /// an estimate.
    pub fn meets_goal(&self) -> Option<bool> {
        let c = self.coverage?;
        Some(c >= GOAL_COVERAGE - EPS && self.width_median.is_some_and(|w| w <= GOAL_WIDTH + EPS))
    }

    /// The RESULT keys of `metric`: `cov_ wmed_ wp95_ oneside_ vacuous_
    /// n_ none_ goal_` (`na` where there is nothing to say).
    pub fn result_pairs(&self, metric: &str) -> Vec<(String, String)> {
        let f = |x: Option<f64>| x.map_or("na".to_string(), |x| format!("{x:.2}"));
        vec![
            (format!("cov_{metric}"), f(self.coverage)),
            (format!("wmed_{metric}"), f(self.width_median)),
            (format!("wp95_{metric}"), f(self.width_p95)),
            (format!("oneside_{metric}"), f(self.one_sided)),
            (format!("vacuous_{metric}"), f(self.vacuous)),
            (format!("n_{metric}"), self.n.to_string()),
            (format!("none_{metric}"), self.none.to_string()),
            (
                format!("goal_{metric}"),
                match self.meets_goal() {
                    Some(true) => "yes",
                    Some(false) => "no",
                    None => "na",
                }
                .to_string(),
            ),
        ]
    }

    /// The verdict's columns for a table (see [`HEADER`]).
    pub fn columns(&self) -> String {
        let f = |x: Option<f64>, d: usize| x.map_or("-".to_string(), |x| format!("{x:.d$}"));
        let u = self.unit.label();
        format!(
            "{:>5} {:>5} {:>6} {:>9} {:>9} {:>6} {:>6} {:>9} {:>4}",
            self.n,
            self.none,
            f(self.coverage, 2),
            f(self.width_median, 1) + u,
            f(self.width_p95, 1) + u,
            f(self.one_sided, 2),
            f(self.vacuous, 2),
            f(self.err_p95, 1) + u,
            match self.meets_goal() {
                Some(true) => "yes",
                Some(false) => "no",
                None => "-",
            }
        )
    }
}

/// Column titles of [`Verdict::columns`].
pub const HEADER: &str = "    n  none  cover     w_med     w_p95  1side   vacu   err_p95 goal";

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(t: f64, p: f64, lo: f64, hi: f64) -> Pair {
        Pair::ratio(t, Some(p), Some((lo, hi)))
    }

    #[test]
    fn coverage_width_and_open_ends() {
        let pairs = [
            pair(0.5, 0.5, 0.4, 0.6),          // covered, 20 pp
            pair(0.5, 0.7, 0.6, 0.8),          // missed, 20 pp, error 20 pp
            pair(0.5, 0.5, 0.0, 0.6),          // one-sided, covered
            pair(0.5, 0.5, 0.0, 1.0),          // vacuous, covered
            Pair::ratio(0.5, Some(0.5), None), // no interval: not covered
            Pair::ratio(0.5, None, None),      // no estimate
        ];
        let v = Verdict::of(&pairs, Unit::Pp);
        assert_eq!((v.n, v.none, v.no_interval), (5, 1, 1));
        assert_eq!(v.coverage, Some(0.6));
        assert_eq!(v.one_sided, Some(0.2));
        assert_eq!(v.vacuous, Some(0.2));
        assert!((v.err_p95.unwrap() - 20.0).abs() < 1e-9);
        // Widths 20, 20, 60, 100: median 40, p95 100.
        assert!((v.width_median.unwrap() - 40.0).abs() < 1e-9);
        assert!((v.width_p95.unwrap() - 100.0).abs() < 1e-9);
        assert_eq!(v.meets_goal(), Some(false));
        let keys: Vec<String> = v.result_pairs("hit").into_iter().map(|p| p.0).collect();
        assert_eq!(
            keys,
            [
                "cov_hit",
                "wmed_hit",
                "wp95_hit",
                "oneside_hit",
                "vacuous_hit",
                "n_hit",
                "none_hit",
                "goal_hit"
            ]
        );
    }

    #[test]
    fn a_narrow_covering_metric_meets_the_goal_and_an_empty_one_says_nothing() {
        let pairs: Vec<Pair> = (0..20)
            .map(|i| pair(0.5, 0.5, 0.46, 0.54 + f64::from(i) * 1e-3))
            .collect();
        let v = Verdict::of(&pairs, Unit::Pp);
        assert_eq!(v.meets_goal(), Some(true), "{v:?}");
        assert_eq!((v.one_sided, v.vacuous), (Some(0.0), Some(0.0)));
        let empty = Verdict::of(&[Pair::ratio(0.5, None, None)], Unit::Pp);
        assert_eq!((empty.coverage, empty.meets_goal()), (None, None));
        assert!(empty.result_pairs("x").iter().any(|p| p.1 == "na"));
    }

    #[test]
    fn counts_score_in_percent_of_the_truth_band_and_full_tier_is_vacuous() {
        let p = Pair {
            truth: (100.0, 110.0),
            point: Some(120.0),
            interval: Some((105.0, 130.0)),
            full: 1000.0,
        };
        let whole = Pair {
            interval: Some((0.0, 1000.0)),
            ..p
        };
        let v = Verdict::of(&[p], Unit::Pct);
        assert_eq!(v.coverage, Some(1.0));
        assert!((v.err_p95.unwrap() - 10.0).abs() < 1e-9);
        assert!((v.width_median.unwrap() - 25.0).abs() < 1e-9);
        assert_eq!(v.one_sided, Some(0.0));
        let v = Verdict::of(&[whole], Unit::Pct);
        assert_eq!((v.vacuous, v.coverage), (Some(1.0), Some(1.0)));
    }
}
