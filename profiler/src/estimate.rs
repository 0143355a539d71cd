//! From young-page counts to an access estimate, and the pass schedule that
//! makes one possible.
//!
//! A pass of length `t` finds young each page touched at least once in it.
//! With page touches arriving at rate `r` over `a` active pages, a pass sees
//! `a (1 - e^(-r t))` young pages: linear in `r t` while pages are touched
//! less than once per pass, flat once every active page is touched in every
//! pass. Summing young pages over equal passes (the old estimate) therefore
//! counts pages, not accesses, as soon as a set saturates. Passes of two
//! lengths tell the two apart: a set whose long passes find three times the
//! young pages of its short ones is unsaturated, one whose counts do not grow
//! is saturated. [`fit`] fits `a` and `r` per tier to the interval's passes
//! and returns `a r T`, accesses touched at page granularity over the
//! interval. Rates above [`CAP`] per shortest pass cannot be resolved:
//! they are held at the cap, so fully saturated tiers fall back to their
//! share of pages, and [`Estimate::saturation`] says so.

use std::time::Duration;

/// Long passes are this many times as long as short ones.
pub const LONG_OVER_SHORT: u32 = 3;

/// Highest `r t_min` the fit reports: at 3 a page is young in 95 % of the
/// shortest passes, where binomial noise swamps what is left of the signal.
pub const CAP: f64 = 3.0;

/// Below this ratio of longest to shortest pass the passes are taken as
/// equal: rate and active pages cannot be told apart.
const MIN_SPREAD: f64 = 1.5;

/// End of each pass within an interval, as an offset from its start; the
/// last is `interval`. Passes alternate short and long
/// ([`LONG_OVER_SHORT`]), starting short; one pass takes the interval.
pub fn pass_ends(interval: Duration, passes: u32) -> Vec<Duration> {
    let passes = passes.max(1);
    if passes == 1 {
        return vec![interval];
    }
    let units: Vec<u32> = (0..passes)
        .map(|i| if i % 2 == 0 { 1 } else { LONG_OVER_SHORT })
        .collect();
    let total: u32 = units.iter().sum();
    let mut acc = 0u32;
    units
        .iter()
        .map(|u| {
            acc += u;
            if acc == total {
                interval
            } else {
                interval.mul_f64(f64::from(acc) / f64::from(total))
            }
        })
        .collect()
}

/// Length of each pass of [`pass_ends`].
pub fn pass_lengths(interval: Duration, passes: u32) -> Vec<Duration> {
    let mut prev = Duration::ZERO;
    pass_ends(interval, passes)
        .into_iter()
        .map(|e| {
            let len = e.saturating_sub(prev);
            prev = e;
            len
        })
        .collect()
}

/// The shortest pass of [`pass_ends`].
pub fn shortest_pass(interval: Duration, passes: u32) -> Duration {
    pass_lengths(interval, passes)
        .into_iter()
        .min()
        .unwrap_or(interval)
}

/// One tier over one interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Page touches over the passes (`a r T`); the plain sum of young pages
    /// when the passes cannot separate rate from pages.
    pub accesses: f64,
    /// Share of the active pages young in the shortest pass
    /// (`1 - e^(-r t_min)`); `None` when the passes do not tell.
    pub saturation: Option<f64>,
}

/// Fits `young = a (1 - e^(-r t))` to `(pass seconds, young pages)` by least
/// squares over `r` (`a` in closed form for each `r`).
pub fn fit(passes: &[(f64, f64)]) -> Estimate {
    let young: f64 = passes.iter().map(|p| p.1).sum();
    let total_t: f64 = passes.iter().map(|p| p.0).sum();
    let t_min = passes.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let t_max = passes.iter().map(|p| p.0).fold(0.0, f64::max);
    let plain = Estimate {
        accesses: young,
        saturation: None,
    };
    if young <= 0.0 || t_min.is_nan() || t_min <= 0.0 || t_max / t_min < MIN_SPREAD {
        return plain;
    }
    // Search ln r between the linear regime and the cap: a coarse grid
    // finds the basin, golden section refines it.
    let lo = (1e-3 / total_t).ln();
    let hi = (CAP / t_min).ln();
    let sse = |u: f64| residual(passes, u.exp()).0;
    const GRID: usize = 12;
    let step = (hi - lo) / GRID as f64;
    let (mut best_i, mut best) = (0usize, f64::INFINITY);
    for i in 0..=GRID {
        let e = sse(lo + step * i as f64);
        // Only a clearly better fit moves up: equal fits keep the lower rate.
        if i == 0 || e < best - best.abs() * 1e-12 {
            (best_i, best) = (i, e);
        }
    }
    let mut a = lo + step * best_i.saturating_sub(1) as f64;
    let mut b = (lo + step * (best_i + 1) as f64).min(hi);
    const INV_PHI: f64 = 0.618_033_988_749_894_9;
    let mut c = b - (b - a) * INV_PHI;
    let mut d = a + (b - a) * INV_PHI;
    let (mut fc, mut fd) = (sse(c), sse(d));
    for _ in 0..24 {
        if fc <= fd {
            (b, d, fd) = (d, c, fc);
            c = b - (b - a) * INV_PHI;
            fc = sse(c);
        } else {
            (a, c, fc) = (c, d, fd);
            d = a + (b - a) * INV_PHI;
            fd = sse(d);
        }
    }
    let mut u = (a + b) / 2.0;
    if best_i == GRID && best <= sse(u) {
        u = hi;
    }
    let r = u.exp();
    let (_, active) = residual(passes, r);
    Estimate {
        accesses: active * r * total_t,
        saturation: Some(1.0 - (-r * t_min).exp()),
    }
}

/// Squared residual at rate `r`, and the best active-page count for it.
fn residual(passes: &[(f64, f64)], r: f64) -> (f64, f64) {
    // y = a f with f = 1 - e^(-r t): a = <f,y>/<f,f>, residual
    // <y,y> - <f,y>^2/<f,f>.
    let (mut fy, mut ff, mut yy) = (0.0, 0.0, 0.0);
    for &(t, y) in passes {
        let f = -(-r * t).exp_m1();
        fy += f * y;
        ff += f * f;
        yy += y * y;
    }
    if ff <= 0.0 {
        return (f64::INFINITY, 0.0);
    }
    ((yy - fy * fy / ff).max(0.0), fy / ff)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expected(a: f64, r: f64, ts: &[f64]) -> Vec<(f64, f64)> {
        ts.iter().map(|&t| (t, a * -(-r * t).exp_m1())).collect()
    }

    const TS: [f64; 4] = [0.125, 0.375, 0.125, 0.375];

    #[test]
    fn schedule_alternates_and_ends_on_the_interval() {
        let i = Duration::from_millis(1000);
        let e = pass_ends(i, 4);
        assert_eq!(e, [125, 500, 625, 1000].map(Duration::from_millis).to_vec());
        assert_eq!(pass_ends(i, 1), vec![i]);
        assert_eq!(pass_ends(i, 0), vec![i]);
        let odd = pass_ends(i, 3);
        assert_eq!((odd.len(), odd[2]), (3, i));
        assert!(odd.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(
            pass_lengths(i, 4),
            [125, 375, 125, 375].map(Duration::from_millis).to_vec()
        );
        assert_eq!(shortest_pass(i, 4), Duration::from_millis(125));
        assert_eq!(shortest_pass(i, 1), i);
    }

    #[test]
    fn recovers_rate_times_pages_below_the_cap() {
        for (a, r) in [(1024.0, 11.7), (1024.0, 2.9), (200.0, 0.5), (4096.0, 20.0)] {
            let e = fit(&expected(a, r, &TS));
            let want = a * r * TS.iter().sum::<f64>();
            assert!((e.accesses / want - 1.0).abs() < 1e-3, "{a} {r}: {e:?}");
            let sat = e.saturation.unwrap_or(-1.0);
            assert!((sat - (1.0 - (-r * 0.125f64).exp())).abs() < 1e-3, "{e:?}");
        }
    }

    #[test]
    fn four_to_one_rates_read_four_to_one_where_the_sum_reads_less() {
        let hot = expected(1024.0, 11.7, &TS);
        let cold = expected(1024.0, 2.925, &TS);
        let share = |h: f64, c: f64| h / (h + c);
        let fitted = share(fit(&hot).accesses, fit(&cold).accesses);
        let summed = share(
            hot.iter().map(|p| p.1).sum(),
            cold.iter().map(|p| p.1).sum(),
        );
        assert!((fitted - 0.8).abs() < 1e-3, "{fitted}");
        assert!(summed < 0.7, "{summed}");
    }

    #[test]
    fn saturated_tiers_fall_back_to_their_share_of_pages() {
        // Every page young in every pass: both tiers sit at the cap.
        let a = fit(&TS.map(|t| (t, 300.0)));
        let b = fit(&TS.map(|t| (t, 100.0)));
        assert!(a.saturation.unwrap_or(0.0) > 0.94, "{a:?}");
        assert!((a.accesses / (a.accesses + b.accesses) - 0.75).abs() < 1e-6);
    }

    #[test]
    fn equal_passes_or_nothing_young_keep_the_plain_sum() {
        let eq = fit(&[(0.25, 10.0), (0.25, 12.0), (0.26, 11.0)]);
        assert_eq!(
            eq,
            Estimate {
                accesses: 33.0,
                saturation: None
            }
        );
        let none = fit(&TS.map(|t| (t, 0.0)));
        assert_eq!(
            none,
            Estimate {
                accesses: 0.0,
                saturation: None
            }
        );
        assert_eq!(fit(&[]).accesses, 0.0);
        assert_eq!(fit(&[(0.0, 3.0), (0.5, 2.0)]).saturation, None);
    }
}
