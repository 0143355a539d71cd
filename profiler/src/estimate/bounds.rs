//! How far one tier's accesses can be from the fit: a ~95 % interval over
//! every mixture of per-page touch rates that explains the passes, not over
//! one rate.
//!
//! A page touched `r` times per second is young in a pass of `t` seconds
//! with probability `g(r t)`: `1 - e^(-r t)` for touches at random times,
//! `min(1, r t)` for touches at a fixed period; burstier timing reads
//! lower still and is assumed away (docs/estimate.md). A tier is a mixture:
//! `x_k` pages at rate `r_k` on a log grid up to [`CAP`] per shortest pass,
//! in both timings, plus a column of pages young in every pass whatever
//! their rate. Its accesses are `sum x_k r_k T`. Each pass's young count
//! bounds the mixture within `z` standard errors (binomial noise of the
//! pages and of the page sample, `z` set so all passes hold at once), and
//! two linear programs give the least and the most accesses any such
//! mixture makes.
//!
//! Above the resolvable rate accessed bits tell nothing: a page touched a
//! thousand times per pass looks like one touched three times. So when the
//! passes need pages touched once in ten shortest passes or more
//! ([`SATURATED_RATE`]) the upper end is open; those pages count at the cap
//! in the lower end, which stays firm (a page young in a pass was touched
//! in it). Otherwise pages hidden in the noise count at the cap in the
//! upper end. When no mixture fits at `z` (the tier changed within the
//! passes, or the guest stalled through one) the upper end is open too and
//! the lower end widens to what does fit, by half again.

use super::simplex::{Feasible, Outcome, maximize};
use super::{CAP, MIN_SPREAD};

/// Objective weight that keeps the open column out of the upper end's
/// program (far above any column's accesses per page).
const PRICED_OUT: f64 = 1e7;

/// Rates on the grid, log-spaced from a hundredth of a touch per longest
/// pass to [`CAP`] per shortest one.
const GRID: usize = 10;

/// Per shortest pass: pages touched this often or more count as saturated
/// when the passes cannot do without them (see the module text). Low on
/// purpose: a few pages touched a thousand times per pass hide in the
/// passes' noise as a larger number touched a few times, so only a
/// threshold this far below the cap catches them (measured in the tests:
/// at 0.5 a Zipf 1.2 set of 512 pages at 10 k touches/s was covered in 87
/// % of intervals, at 0.1 in all).
pub const SATURATED_RATE: f64 = 0.1;

/// Saturated pages (of the sample) the passes must need before the upper
/// end opens: half a page, i.e. any.
const SATURATED_MIN: f64 = 0.5;

/// When no mixture fits at the nominal `z`, the bounds use this multiple
/// of the smallest `z` at which one does.
const MISFIT_WIDEN: f64 = 1.5;

/// One tier's interval, on the sample's scale (pages examined) and over
/// the watched seconds of its passes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    pub low: f64,
    /// `None`: open (saturated pages, whose touches accessed bits cannot
    /// count).
    pub high: Option<f64>,
    /// Least saturated pages any fitting mixture has.
    pub saturated: f64,
    /// Smallest multiple of the passes' standard errors within which some
    /// mixture fits every pass.
    pub misfit: f64,
}

/// The columns of one tier's program: for each pass, the young share of
/// every column (row-major, `n` per pass), and per column the accesses per
/// page over the passes (for the every-pass column, `open`, at the cap: its
/// rate is unknown) and whether it counts as saturated.
#[derive(Debug, Clone, Default)]
struct Columns {
    n: usize,
    g: Vec<f64>,
    cost: Vec<f64>,
    saturated: Vec<bool>,
    open: Vec<bool>,
}

impl Columns {
    /// Young shares of every column in pass `j`.
    fn pass(&self, j: usize) -> &[f64] {
        &self.g[j * self.n..(j + 1) * self.n]
    }
}

fn columns(ts: &[f64]) -> Columns {
    let t_min = ts.iter().copied().fold(f64::INFINITY, f64::min);
    let t_max = ts.iter().copied().fold(0.0, f64::max);
    let total: f64 = ts.iter().sum();
    let (lo, hi) = ((0.01 / t_max).ln(), (CAP / t_min).ln());
    let n = 2 * GRID + 1;
    let mut c = Columns {
        n,
        g: vec![0.0; n * ts.len()],
        cost: Vec::with_capacity(n),
        saturated: Vec::with_capacity(n),
        open: Vec::with_capacity(n),
    };
    for k in 0..GRID {
        let r = (lo + (hi - lo) * k as f64 / (GRID - 1) as f64).exp();
        for periodic in [false, true] {
            let col = c.cost.len();
            for (j, &t) in ts.iter().enumerate() {
                c.g[j * n + col] = if periodic {
                    (r * t).min(1.0)
                } else {
                    -(-r * t).exp_m1()
                };
            }
            c.cost.push(r * total);
            c.saturated.push(r * t_min >= SATURATED_RATE);
            c.open.push(false);
        }
    }
    // Young in every pass, at any rate from the cap up.
    for j in 0..ts.len() {
        c.g[j * n + n - 1] = 1.0;
    }
    c.cost.push(CAP / t_min * total);
    c.saturated.push(true);
    c.open.push(true);
    c
}

/// Two-sided normal quantile for tail `alpha` (bisection on an erfc with
/// 1.5e-7 absolute error, Abramowitz and Stegun 7.1.26).
pub fn z_for(alpha: f64) -> f64 {
    let tail = |z: f64| {
        let x = z / std::f64::consts::SQRT_2;
        let t = 1.0 / (1.0 + 0.327_591_1 * x);
        let poly = t
            * (0.254_829_592
                + t * (-0.284_496_736
                    + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
        poly * (-x * x).exp()
    };
    let (mut lo, mut hi) = (0.0, 10.0);
    for _ in 0..60 {
        let mid = (lo + hi) / 2.0;
        if tail(mid) > alpha {
            lo = mid
        } else {
            hi = mid
        }
    }
    (lo + hi) / 2.0
}

/// The interval of one tier's accesses over `passes` (seconds watched,
/// young pages of the sample) of `pages` examined pages, a `fraction` of
/// the tier (page sampling), at two-sided tail `alpha` for all its passes
/// together. `None` without a pass of positive length, or with passes of
/// one length. ([`Programs::bounds`] with nothing kept from other tiers.)
pub fn bounds(passes: &[(f64, f64)], pages: f64, fraction: f64, alpha: f64) -> Option<Bounds> {
    Programs::default().bounds(passes, pages, fraction, alpha)
}

/// What [`bounds`] can reuse from one tier to the next: its programs'
/// columns depend only on the pass lengths and `z` only on the tail and the
/// number of passes, and a VM's tiers (all of a host's VMs, with
/// synthetic sources or one walk for all) share them. Each is kept for the
/// last key seen, compared bit for bit, so a kept one is exactly what
/// would be computed anew.
#[derive(Debug, Default)]
pub struct Programs {
    /// Pass lengths (bits) and their columns.
    columns: Option<(Vec<u64>, Columns)>,
    /// Šidák tail per pass (bits) and its quantile.
    z: Option<(u64, f64)>,
}

impl Programs {
    fn columns(&mut self, ts: &[f64]) -> &Columns {
        let same = self.columns.as_ref().is_some_and(|(k, _)| {
            k.len() == ts.len() && k.iter().zip(ts).all(|(k, t)| *k == t.to_bits())
        });
        if !same {
            self.columns = None;
        }
        &self
            .columns
            .get_or_insert_with(|| (ts.iter().map(|t| t.to_bits()).collect(), columns(ts)))
            .1
    }

    fn z(&mut self, tail: f64) -> f64 {
        match self.z {
            Some((k, z)) if k == tail.to_bits() => z,
            _ => {
                let z = z_for(tail);
                self.z = Some((tail.to_bits(), z));
                z
            }
        }
    }

    /// Šidák: every one of `passes` passes within `z` at once, with
    /// probability `1 - alpha`.
    pub(crate) fn z_all(&mut self, passes: usize, alpha: f64) -> f64 {
        let m = passes.max(1) as f64;
        self.z(1.0 - (1.0 - alpha).powf(1.0 / m))
    }

    /// The part of [`bounds`] that needs no program: the firm lower end
    /// (each pass's young pages less `z` standard errors: touched at least
    /// once), the upper end open. What the estimator's CPU budget gives a
    /// tier whose fit it defers: wider than the full interval, never
    /// narrower (the full lower end is at least this). `saturated` is 0 and
    /// `misfit` NaN: neither was computed. `None` where [`bounds`] is.
    pub fn firm(
        &mut self,
        passes: &[(f64, f64)],
        pages: f64,
        fraction: f64,
        alpha: f64,
    ) -> Option<Bounds> {
        if !resolvable(passes) {
            return None;
        }
        let pages = passes
            .iter()
            .map(|p| p.1.max(0.0))
            .fold(pages, f64::max)
            .max(1.0);
        let z = self.z_all(passes.len(), alpha);
        let low = passes
            .iter()
            .map(|p| {
                let y = p.1.max(0.0);
                (y - z * sigma(y, pages, fraction)).max(0.0)
            })
            .sum();
        Some(Bounds {
            low,
            high: None,
            saturated: 0.0,
            misfit: f64::NAN,
        })
    }

    /// [`bounds`], reusing what earlier calls computed where it applies.
    pub fn bounds(
        &mut self,
        passes: &[(f64, f64)],
        pages: f64,
        fraction: f64,
        alpha: f64,
    ) -> Option<Bounds> {
        if !resolvable(passes) {
            return None;
        }
        let ts: Vec<f64> = passes.iter().map(|p| p.0).collect();
        let ys: Vec<f64> = passes.iter().map(|p| p.1.max(0.0)).collect();
        let pages = pages.max(ys.iter().copied().fold(0.0, f64::max)).max(1.0);
        let z = self.z_all(passes.len(), alpha);
        let sigma: Vec<f64> = ys.iter().map(|&y| sigma(y, pages, fraction)).collect();
        let cols = self.columns(&ts);
        let scale = ys.iter().copied().fold(1.0, f64::max);
        let misfit = misfit(cols, &ys, &sigma, pages, scale)?;
        // No steady mixture fits: the tier changed within the passes, or the
        // guest did not run through one (a vCPU held off its CPU reads as a
        // pass with nothing young). The low end still holds, at a wider box;
        // nothing bounds the high end.
        let broken = misfit > z;
        let z = z.max(MISFIT_WIDEN * misfit);
        // Each pass within z standard errors, and no more pages than examined.
        let n = cols.n;
        let mut a = Vec::with_capacity((2 * ys.len() + 1) * n);
        let mut b = Vec::with_capacity(2 * ys.len() + 1);
        for (j, (&y, s)) in ys.iter().zip(&sigma).enumerate() {
            let row = cols.pass(j);
            a.extend(row.iter().map(|v| -v));
            b.push(-(y - z * s) / scale);
            a.extend_from_slice(row);
            b.push((y + z * s) / scale);
        }
        a.extend(std::iter::repeat_n(1.0, n));
        b.push(pages / scale);
        let value = |o: Outcome| match o {
            Outcome::Optimal(v, _) => Some(v * scale),
            _ => None,
        };
        // One phase one for both objectives over all columns.
        let rows: Vec<&[f64]> = a.chunks_exact(n).collect();
        let feasible = Feasible::new(n, &rows, &b).ok()?;
        let neg_cost: Vec<f64> = cols.cost.iter().map(|c| -c).collect();
        let low = -value(feasible.maximize(&neg_cost))?;
        let sat_mass: Vec<f64> = cols
            .saturated
            .iter()
            .map(|s| if *s { -1.0 } else { 0.0 })
            .collect();
        let saturated = -value(feasible.maximize(&sat_mass))?;
        // The most accesses without the open column: priced out rather than
        // removed, so the same basis serves; a program that cannot do without
        // it is open too.
        let high = if saturated >= SATURATED_MIN || broken {
            None
        } else {
            let cost: Vec<f64> = (0..cols.cost.len())
                .map(|k| {
                    if cols.open[k] {
                        -PRICED_OUT
                    } else {
                        cols.cost[k]
                    }
                })
                .collect();
            match feasible.maximize(&cost) {
                Outcome::Optimal(v, x)
                    if cols.open.iter().zip(&x).all(|(o, x)| !*o || *x <= 1e-9) =>
                {
                    Some(v * scale)
                }
                Outcome::Optimal(..) => None,
                _ => return None,
            }
        };
        // Firm whatever the timing: each young page was touched in its pass.
        let firm: f64 = ys
            .iter()
            .zip(&sigma)
            .map(|(y, s)| (y - z * s).max(0.0))
            .sum();
        Some(Bounds {
            low: low.max(firm).max(0.0),
            high: high.map(|h| h.max(low)),
            saturated: saturated.max(0.0),
            misfit,
        })
    }
}

/// Binomial noise of a pass's `y` young pages of `pages` examined, and of
/// the page sample when not every page is examined; at least one page.
fn sigma(y: f64, pages: f64, fraction: f64) -> f64 {
    let pages_noise = y * (1.0 - y / pages);
    let sample_noise = y * (1.0 - fraction.clamp(0.0, 1.0));
    (pages_noise + sample_noise).max(1.0).sqrt()
}

/// Smallest `s` such that some mixture fits every pass within `s`
/// standard errors (one more column: `s` itself).
fn misfit(cols: &Columns, ys: &[f64], sigma: &[f64], pages: f64, scale: f64) -> Option<f64> {
    let n = cols.n;
    let w = n + 1;
    let mut a = Vec::with_capacity((2 * ys.len() + 1) * w);
    let mut b = Vec::with_capacity(2 * ys.len() + 1);
    for (j, (&y, &s)) in ys.iter().zip(sigma).enumerate() {
        let row = cols.pass(j);
        a.extend_from_slice(row);
        a.push(-s / scale);
        b.push(y / scale);
        a.extend(row.iter().map(|v| -*v));
        a.push(-s / scale);
        b.push(-y / scale);
    }
    a.extend(std::iter::repeat_n(1.0, n));
    a.push(0.0);
    b.push(pages / scale);
    let mut c = vec![0.0; n];
    c.push(-1.0);
    let rows: Vec<&[f64]> = a.chunks_exact(w).collect();
    match maximize(&c, &rows, &b) {
        Outcome::Optimal(v, _) => Some((-v).max(0.0)),
        _ => None,
    }
}

/// Whether `passes` can carry an interval: timed, finite, positive, and of
/// lengths far enough apart (passes of one length cannot tell rates apart,
/// as for the fit: no interval rather than one resting on the cap alone).
fn resolvable(passes: &[(f64, f64)]) -> bool {
    if passes.is_empty()
        || passes
            .iter()
            .any(|p| p.0.is_nan() || p.0 <= 0.0 || p.0.is_infinite())
    {
        return false;
    }
    let t_min = passes.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let t_max = passes.iter().map(|p| p.0).fold(0.0, f64::max);
    t_max / t_min >= MIN_SPREAD
}

#[cfg(test)]
mod tests;
