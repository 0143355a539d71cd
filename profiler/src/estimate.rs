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

pub mod bounds;
mod reuse;
mod simplex;
mod window;
pub use reuse::{FitPath, REFIT_EVERY, TierIn, TierOut, VmFit};
pub use window::{VmWindows, WINDOW};

/// Long passes are this many times as long as short ones.
pub const LONG_OVER_SHORT: u32 = 3;

/// Highest `r t_min` the fit reports: at 3 a page is young in 95 % of the
/// shortest passes, where binomial noise swamps what is left of the signal.
pub const CAP: f64 = 3.0;

/// Below this ratio of longest to shortest pass the passes are taken as
/// equal: rate and active pages cannot be told apart.
pub(crate) const MIN_SPREAD: f64 = 1.5;

/// A lead pass is this fraction of a short pass (see [`pass_ends`]).
pub const LEAD_SPLIT: u32 = 5;

/// Shortest pass tierd schedules: shorter ones are dominated by the walk
/// itself and its scheduling jitter.
pub const MIN_PASS: Duration = Duration::from_millis(5);

/// End of each pass within an interval, as an offset from its start; the
/// last is `interval`. Passes alternate short and long
/// ([`LONG_OVER_SHORT`]), starting short; one pass takes the interval. With
/// an odd count of three or more the first short pass is split 1:4 into a
/// lead pass ([`LEAD_SPLIT`]) and the rest: at 1000 ms and 5 passes, 25,
/// 100, 375, 125 and 375 ms. The lead pass reads tiers whose pages are
/// touched too often for the short passes to tell their rate (more than
/// `CAP` per short pass) at the cost of one more walk. Where it would be
/// shorter than [`MIN_PASS`] the odd count alternates plainly instead.
pub fn pass_ends(interval: Duration, passes: u32) -> Vec<Duration> {
    let passes = passes.max(1);
    if passes == 1 {
        return vec![interval];
    }
    let (short, long) = (LEAD_SPLIT, LEAD_SPLIT * LONG_OVER_SHORT);
    let mut units: Vec<u32> = Vec::with_capacity(passes as usize);
    // Units of an odd schedule with a lead pass: (n - 1) / 2 short (the
    // lead pair is one) and as many long; the lead is one unit of them.
    let lead_units = passes / 2 * (short + long);
    let lead = passes % 2 == 1 && interval / lead_units >= MIN_PASS;
    if lead {
        units.extend([1, short - 1]);
    }
    while units.len() < passes as usize {
        // Long after each short; the lead pair counts as one short.
        let next_long = (units.len() % 2 == 1) != lead;
        units.push(if next_long { long } else { short });
    }
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

/// Fits `young = a (1 - e^(-r t))` to `(pass seconds, young pages)`:
/// weighted least squares over every pass (binomial variances), `r` by a
/// golden-section search on `log r`, `a` in closed form for each `r`.
pub fn fit(passes: &[(f64, f64)]) -> Estimate {
    rate(passes).map_or_else(|| plain(passes), |f| f.estimate(passes))
}

/// [`fit`] for every tier of one VM, with one more step: tiers that the
/// rate of all the VM's tiers together fits about as well as their own
/// take the pooled rate ([`VmWindows`] with no earlier interval; see there).
pub fn fit_vm(tiers: &[&[(f64, f64)]]) -> Vec<Estimate> {
    VmWindows::default().fit(tiers)
}

/// Standard errors within which a tier's rate is taken as the VM's (as a
/// likelihood-ratio test: `POOL_Z`² of weighted squared residuals).
pub const POOL_Z: f64 = 3.0;

fn plain(passes: &[(f64, f64)]) -> Estimate {
    Estimate {
        accesses: passes.iter().map(|p| p.1).sum(),
        saturation: None,
    }
}

/// Passes of two tiers line up when their lengths differ by at most this
/// share of the shorter: one walk reads a VM's tiers a millisecond or two
/// apart, so their passes differ by that much and no more.
pub const POOL_SLACK: f64 = 0.25;

/// The passes of all tiers summed pass by pass, at the tiers' mean length,
/// when they line up.
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
        for ((s, p), f) in sum.iter_mut().zip(t.iter()).zip(first.iter()) {
            if (f.0 - p.0).abs() > POOL_SLACK * f.0.min(p.0) {
                return None;
            }
            s.0 += p.0;
            s.1 += p.1;
        }
    }
    let n = tiers.len() as f64;
    for s in &mut sum {
        s.0 /= n;
    }
    Some(sum)
}

/// Expected young share of a pass of `t` seconds at rate `r`; with `r = 0`
/// the linear model's `t` (young = (a r) t).
fn shape(r: f64, t: f64) -> f64 {
    if r > 0.0 { -(-r * t).exp_m1() } else { t }
}

/// Weighted squared residuals of the best `young = s shape(r, t)` and that
/// `s` (active pages; `a r` for `r = 0`). Binomial variance `s g (1 - p)`,
/// at least one page, with the weights re-estimated twice from `s`.
fn chi2(passes: &[(f64, f64)], r: f64) -> (f64, f64) {
    // (young, shape, 1 - p) per pass: one exp per pass and rate. On the
    // stack for tierd's schedules: the searches call this thousands of
    // times per interval.
    const ON_STACK: usize = 8;
    let point = |&(t, y): &(f64, f64)| {
        let g = shape(r, t);
        (y, g, if r > 0.0 { 1.0 - g } else { 1.0 })
    };
    if passes.len() <= ON_STACK {
        let mut pts = [(0.0, 0.0, 0.0); ON_STACK];
        for (p, x) in pts.iter_mut().zip(passes) {
            *p = point(x);
        }
        chi2_of(&pts[..passes.len()])
    } else {
        chi2_of(&passes.iter().map(point).collect::<Vec<_>>())
    }
}

fn chi2_of(pts: &[(f64, f64, f64)]) -> (f64, f64) {
    let var = |s: f64, g: f64, q: f64| (s * g * q).max(1.0);
    let solve = |s0: Option<f64>| {
        let (gy, gg) = pts.iter().fold((0.0, 0.0), |(gy, gg), &(y, g, q)| {
            let w = s0.map_or(1.0, |s| 1.0 / var(s, g, q));
            (gy + w * g * y, gg + w * g * g)
        });
        if gg > 0.0 { (gy / gg).max(0.0) } else { 0.0 }
    };
    let mut s = solve(None);
    for _ in 0..2 {
        s = solve(Some(s));
    }
    let c = pts
        .iter()
        .map(|&(y, g, q)| (y - s * g).powi(2) / var(s, g, q))
        .sum();
    (c, s)
}

/// One tier's passes fitted at one rate: the rate, its weighted squared
/// residuals and the fitted scale `s` (see [`chi2`]).
#[derive(Debug, Clone, Copy)]
struct Fit {
    r: f64,
    chi2: f64,
    s: f64,
}

impl Fit {
    fn at(passes: &[(f64, f64)], r: f64) -> Fit {
        let (chi2, s) = chi2(passes, r);
        Fit { r, chi2, s }
    }

    /// `a r T` (`s T` when linear), saturation at the shortest pass.
    fn estimate(&self, passes: &[(f64, f64)]) -> Estimate {
        let total_t: f64 = passes.iter().map(|p| p.0).sum();
        let t_min = passes.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
        Estimate {
            accesses: if self.r > 0.0 {
                self.s * self.r * total_t
            } else {
                self.s * total_t
            },
            saturation: Some(-(-self.r * t_min).exp_m1()),
        }
    }
}

/// The touch rate per page (per second) that fits `passes` best, within
/// `[0, CAP / t_min]`, with its fit; `None` when they cannot tell rate
/// from pages (nothing young, or passes of one length).
fn rate(passes: &[(f64, f64)]) -> Option<Fit> {
    rate_over(&[passes]).map(|r| Fit::at(passes, r))
}

/// The one rate that fits every set of passes best, each set with its own
/// active pages (one interval's passes per set).
fn rate_over(sets: &[&[(f64, f64)]]) -> Option<f64> {
    let all = || sets.iter().flat_map(|s| s.iter());
    let young: f64 = all().map(|p| p.1).sum();
    let t_min = all().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let t_max = all().map(|p| p.0).fold(0.0, f64::max);
    if young <= 0.0 || t_min.is_nan() || t_min <= 0.0 || t_max / t_min < MIN_SPREAD {
        return None;
    }
    let chi2_at = |r: f64| sets.iter().map(|s| chi2(s, r).0).sum::<f64>();
    // From a hundredth of a touch per longest pass to the cap; 24 golden
    // steps narrow the ~9 e-folds to 1e-4 of one.
    let f = |lr: f64| chi2_at(lr.exp());
    let (mut lo, mut hi) = ((0.01 / t_max).ln(), (CAP / t_min).ln());
    let g = (5f64.sqrt() - 1.0) / 2.0;
    let (mut c, mut d) = (hi - g * (hi - lo), lo + g * (hi - lo));
    let (mut fc, mut fd) = (f(c), f(d));
    for _ in 0..24 {
        if fc < fd {
            (hi, d, fd) = (d, c, fc);
            c = hi - g * (hi - lo);
            fc = f(c);
        } else {
            (lo, c, fc) = (c, d, fd);
            d = lo + g * (hi - lo);
            fd = f(d);
        }
    }
    // The ends of the range are candidates too: linear (r = 0) and the cap.
    let best = ((lo + hi) / 2.0).exp();
    let start = (best, chi2_at(best));
    let (r, _) = [0.0, CAP / t_min]
        .into_iter()
        .map(|r| (r, chi2_at(r)))
        .fold(start, |b, x| if x.1 < b.1 { x } else { b });
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Young pages of `a` pages touched `r` times per second in passes `ts`.
    pub(super) fn expected(a: f64, r: f64, ts: &[f64]) -> Vec<(f64, f64)> {
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
        assert_eq!(odd, [50, 250, 1000].map(Duration::from_millis).to_vec());
        assert_eq!(
            pass_lengths(i, 5),
            [25, 100, 375, 125, 375].map(Duration::from_millis).to_vec()
        );
        assert_eq!(shortest_pass(i, 5), Duration::from_millis(25));
        // No room for a lead pass of 5 ms: odd counts alternate plainly.
        let tight = Duration::from_millis(100);
        let ms: Vec<u128> = pass_lengths(tight, 5)
            .iter()
            .map(|d| (d.as_micros() + 500) / 1000)
            .collect();
        assert_eq!(ms, [11, 33, 11, 33, 11]);
        assert_eq!(pass_lengths(Duration::from_millis(200), 5)[0], MIN_PASS);
        assert_eq!(pass_lengths(i, 7).len(), 7);
        assert!(pass_ends(i, 7).windows(2).all(|w| w[0] < w[1]));
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
    fn the_lead_pass_reads_tiers_too_hot_for_the_short_passes() {
        // 128 + 128 pages touched 140 and 35 times per second per page:
        // both saturate 125 ms passes; a 25 ms lead pass tells them apart.
        let share = |n: u32| {
            let ts: Vec<f64> = pass_lengths(Duration::from_secs(1), n)
                .iter()
                .map(Duration::as_secs_f64)
                .collect();
            let e = fit_vm(&[&expected(128.0, 140.0, &ts), &expected(128.0, 35.0, &ts)]);
            e[0].accesses / (e[0].accesses + e[1].accesses)
        };
        // The cap (3 per 25 ms, 120/s) holds the hot tier a little low.
        let (four, five) = (share(4), share(5));
        assert!((four - 0.5).abs() < 0.02, "{four}");
        assert!((five - 0.8).abs() < 0.03, "{five}");
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
        // Read 2 ms later in the same walks: still pooled.
        let later: Vec<f64> = TS.iter().map(|t| t - 0.002).collect();
        let mut c = expected(2048.0, 5.0, &later);
        for p in c.iter_mut().step_by(2) {
            p.1 += 16.0;
        }
        let apart = share(&fit_vm(&[&a, &c]));
        assert!((apart - 0.5).abs() < 0.004, "{apart}");
        assert_ne!(fit_vm(&[&a, &c])[1], fit(&c));
    }

    #[test]
    fn tiers_touched_at_different_rates_keep_their_own() {
        let hot = expected(1024.0, 11.7, &TS);
        let cold = expected(1024.0, 2.925, &TS);
        assert_eq!(fit_vm(&[&hot, &cold]), vec![fit(&hot), fit(&cold)]);
        // Passes that do not line up are not pooled.
        let other = expected(1024.0, 11.7, &[0.2, 0.6, 0.2]);
        assert_eq!(fit_vm(&[&hot, &other]), vec![fit(&hot), fit(&other)]);
        let longer = expected(1024.0, 11.7, &TS.map(|t| t * (1.0 + POOL_SLACK) + 1e-3));
        assert_eq!(fit_vm(&[&hot, &longer]), vec![fit(&hot), fit(&longer)]);
        assert_eq!(fit_vm(&[&hot]), vec![fit(&hot)]);
        assert!(fit_vm(&[]).is_empty());
    }

    #[test]
    fn saturated_tiers_fall_back_to_their_share_of_pages() {
        // Every page young in every pass: both tiers sit at the cap.
        let a = fit(&TS.map(|t| (t, 300.0)));
        let b = fit(&TS.map(|t| (t, 100.0)));
        assert!(a.saturation.unwrap_or(0.0) > 0.94, "{a:?}");
        // Within 0.2 pp: the one-page variance floor weighs the saturated
        // long passes of the smaller tier a little differently.
        let share = a.accesses / (a.accesses + b.accesses);
        assert!((share - 0.75).abs() < 2e-3, "{a:?} {b:?}");
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
