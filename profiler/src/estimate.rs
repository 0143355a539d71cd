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

/// Fits `young = a (1 - e^(-r t))` to `(pass seconds, young pages)`: `r`
/// from the ratio of the mean young counts of long and short passes (exact
/// for two pass lengths), `a` by least squares for that `r`.
pub fn fit(passes: &[(f64, f64)]) -> Estimate {
    match rate(passes) {
        Some(r) => at_rate(passes, r.r),
        None => plain(passes),
    }
}

/// [`fit`] for every tier of one VM, with one more step: a tier whose own
/// rate is within [`POOL_Z`] standard errors of the rate of all the VM's
/// tiers together takes the pooled rate. Tiers touched alike then weigh by
/// their young pages, as the plain sum does, instead of by two noisy rates;
/// tiers whose rates really differ keep their own. Tiers whose passes
/// differ in number or length are fitted alone.
pub fn fit_vm(tiers: &[&[(f64, f64)]]) -> Vec<Estimate> {
    let pooled = pool(tiers).and_then(|p| rate(&p));
    tiers
        .iter()
        .map(|passes| match (rate(passes), pooled) {
            (Some(own), Some(all)) if (own.r - all.r).abs() <= POOL_Z * own.se => {
                at_rate(passes, all.r)
            }
            (Some(own), _) => at_rate(passes, own.r),
            (None, _) => plain(passes),
        })
        .collect()
}

/// A tier's own touch rate per page (per second) and its standard error
/// (binomial young counts, delta method through the long/short ratio).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Rate {
    r: f64,
    se: f64,
}

/// Standard errors within which a tier's rate is taken as the VM's.
pub const POOL_Z: f64 = 3.0;

fn plain(passes: &[(f64, f64)]) -> Estimate {
    Estimate {
        accesses: passes.iter().map(|p| p.1).sum(),
        saturation: None,
    }
}

/// The passes of all tiers summed pass by pass, when they line up.
fn pool(tiers: &[&[(f64, f64)]]) -> Option<Vec<(f64, f64)>> {
    let (first, rest) = tiers.split_first()?;
    if rest.is_empty() {
        return None;
    }
    let mut sum = first.to_vec();
    for t in rest {
        if t.len() != sum.len() {
            return None;
        }
        for (s, p) in sum.iter_mut().zip(t.iter()) {
            if (s.0 - p.0).abs() > 1e-9 {
                return None;
            }
            s.1 += p.1;
        }
    }
    Some(sum)
}

/// The rate of `passes`; `None` when they cannot tell rate from pages
/// (nothing young, or passes of one length).
fn rate(passes: &[(f64, f64)]) -> Option<Rate> {
    let young: f64 = passes.iter().map(|p| p.1).sum();
    let t_min = passes.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let t_max = passes.iter().map(|p| p.0).fold(0.0, f64::max);
    if young <= 0.0 || t_min.is_nan() || t_min <= 0.0 || t_max / t_min < MIN_SPREAD {
        return None;
    }
    // Short and long passes, split at the geometric middle of the lengths;
    // the ratio of their mean young counts fixes the rate.
    let mid = (t_min * t_max).sqrt();
    let mean = |short: bool| {
        let (mut t, mut y, mut n) = (0.0, 0.0, 0.0);
        for &(pt, py) in passes.iter().filter(|p| (p.0 < mid) == short) {
            (t, y, n) = (t + pt, y + py, n + 1.0);
        }
        (t / n, y / n, n)
    };
    let ((ts, ys, ns), (tl, yl, nl)) = (mean(true), mean(false));
    let k = tl / ts;
    // With x = e^(-r ts): yl / ys = (1 - x^k) / (1 - x), rising from 1
    // (saturated, x = 0) to k (linear, x -> 1).
    let q_of = |x: f64| (1.0 - x.powf(k)) / (1.0 - x);
    let x_cap = (-CAP).exp();
    let r = if ys <= 0.0 || yl >= k * ys {
        0.0
    } else if yl <= ys * q_of(x_cap) {
        CAP / ts
    } else {
        let q = yl / ys;
        let (mut lo, mut hi) = (x_cap, 1.0);
        for _ in 0..40 {
            let x = (lo + hi) / 2.0;
            if q_of(x) < q {
                lo = x;
            } else {
                hi = x;
            }
        }
        -((lo + hi) / 2.0).ln() / ts
    };
    // Binomial counts: var(mean y) = y (1 - p) / n with p = 1 - e^(-r t).
    let var = |y: f64, t: f64, n: f64| y.max(1.0) * (-r * t).exp() / n;
    let q = yl / ys.max(1.0);
    let var_q =
        q * q * (var(yl, tl, nl) / yl.max(1.0).powi(2) + var(ys, ts, ns) / ys.max(1.0).powi(2));
    let x = (-r * ts).exp();
    let dq_dx = if x > 1.0 - 1e-6 {
        k * (k - 1.0) / 2.0
    } else {
        (1.0 - x.powf(k) - k * x.powf(k - 1.0) * (1.0 - x)) / (1.0 - x).powi(2)
    };
    let dq_dr = (dq_dx * ts * x).abs();
    let se = if dq_dr > 0.0 {
        var_q.sqrt() / dq_dr
    } else {
        f64::INFINITY
    };
    Some(Rate { r, se })
}

/// `a r T` for rate `r`, `a` by least squares; saturation at the shortest
/// pass.
fn at_rate(passes: &[(f64, f64)], r: f64) -> Estimate {
    let total_t: f64 = passes.iter().map(|p| p.0).sum();
    let t_min = passes.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let accesses = if r > 0.0 {
        let (fy, ff) = passes.iter().fold((0.0, 0.0), |(fy, ff), &(t, y)| {
            let f = -(-r * t).exp_m1();
            (fy + f * y, ff + f * f)
        });
        fy / ff * r * total_t
    } else {
        // Linear regime: young = (a r) t, least squares through 0.
        let (yt, tt) = passes
            .iter()
            .fold((0.0, 0.0), |(yt, tt), &(t, y)| (yt + y * t, tt + t * t));
        yt / tt * total_t
    };
    Estimate {
        accesses,
        saturation: Some(-(-r * t_min).exp_m1()),
    }
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
    fn jittered_lengths_and_three_passes_still_fit() {
        for ts in [&[0.124, 0.377, 0.126, 0.373][..], &[0.2, 0.6, 0.2][..]] {
            let e = fit(&expected(1024.0, 5.0, ts));
            let want = 1024.0 * 5.0 * ts.iter().sum::<f64>();
            assert!((e.accesses / want - 1.0).abs() < 0.01, "{ts:?}: {e:?}");
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
    fn tiers_touched_alike_share_the_pooled_rate() {
        // Same rate and pages; one binomial standard error (16 pages) more
        // in one tier's short passes, the kind of noise one interval has.
        let a = expected(2048.0, 5.0, &TS);
        let mut b = a.clone();
        for p in b.iter_mut().step_by(2) {
            p.1 += 16.0;
        }
        let share = |e: &[Estimate]| e[0].accesses / (e[0].accesses + e[1].accesses);
        let alone = share(&[fit(&a), fit(&b)]);
        let pooled = share(&fit_vm(&[&a, &b]));
        assert!((alone - 0.5).abs() > 0.005, "{alone}");
        assert!((pooled - 0.5).abs() < 0.004, "{pooled}");
    }

    #[test]
    fn tiers_touched_at_different_rates_keep_their_own() {
        let hot = expected(1024.0, 11.7, &TS);
        let cold = expected(1024.0, 2.925, &TS);
        assert_eq!(fit_vm(&[&hot, &cold]), vec![fit(&hot), fit(&cold)]);
        // Passes that do not line up are not pooled.
        let other = expected(1024.0, 11.7, &[0.2, 0.6, 0.2]);
        assert_eq!(fit_vm(&[&hot, &other]), vec![fit(&hot), fit(&other)]);
        assert_eq!(fit_vm(&[&hot]), vec![fit(&hot)]);
        assert!(fit_vm(&[]).is_empty());
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
