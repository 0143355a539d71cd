//! A VM's fit carried over while its passes agree with it. On a steady
//! guest a tier's rate and interval move only by noise from one interval
//! to the next, yet the full fit (rate searches over the windows, the
//! pooling test, the interval's programs) costs tens of microseconds per
//! tier. So each VM keeps its last full fit: the rate per tier, its
//! estimate and its interval. An interval whose passes every tier of the
//! VM fits at the kept rate within the window's own test (weighted squared
//! residuals, this interval's active pages re-solved, at most [`POOL_Z`]²)
//! takes the kept rates with its own young pages, and each tier's kept
//! interval rescaled by its new estimate over the kept one; the passes
//! still join the windows. Any disagreement, a changed schedule, or
//! [`REFIT_EVERY`] intervals since the last full fit, and the VM is fitted
//! in full again. A tier's reuse costs one weighted fit at one rate.
//!
//! Where the estimator's CPU budget (the aggregator's) has no room for a
//! full fit that is due, the fit is deferred: each tier reads at its kept
//! rate (the plain sum without one) and gets only the firm lower end of
//! its interval, the upper end open ([`Programs::firm`]); wider, never
//! narrower, than the full interval.

use super::bounds::{Bounds, Programs};
use super::{CAP, Estimate, Fit, MIN_SPREAD, POOL_SLACK, POOL_Z, VmWindows, plain};

/// Intervals a full fit serves at most (itself included) before the VM is
/// fitted in full again, however well its passes agree.
pub const REFIT_EVERY: u32 = 8;

/// The reuse test: weighted squared residuals of a tier's passes at its
/// kept rate, at most this (the window's and pooling's [`POOL_Z`]²).
const REUSE_CHI2: f64 = POOL_Z * POOL_Z;

/// How one VM's interval was estimated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FitPath {
    /// Fitted in full (windows, pooling, the interval's programs).
    Full,
    /// The last full fit, which every tier's passes agree with.
    Reused,
    /// Due for a full fit the CPU budget had no room for.
    Deferred,
}

/// One tier's passes as the estimate takes them.
#[derive(Debug, Clone, Copy)]
pub struct TierIn<'a> {
    /// (seconds watched, young pages) per pass; empty for a tier without
    /// timed passes (it keeps no window and gets no interval).
    pub passes: &'a [(f64, f64)],
    /// Pages examined (the sample).
    pub pages: f64,
    /// Share of the tier's pages examined.
    pub fraction: f64,
}

/// One tier's estimate and interval, on the sample's scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TierOut {
    pub estimate: Estimate,
    pub bounds: Option<Bounds>,
    /// Intervals since the fit this rests on (0: fitted in this one).
    pub age: u32,
}

/// What a tier keeps of its last full fit.
#[derive(Debug, Clone, Default)]
struct Kept {
    rate: Option<f64>,
    accesses: f64,
    bounds: Option<Bounds>,
    /// Pass lengths of that interval: a changed schedule refits.
    ts: Vec<f64>,
}

/// One VM's windows and its last full fit.
#[derive(Debug, Clone)]
pub struct VmFit {
    windows: VmWindows,
    kept: Vec<Kept>,
    /// Intervals since the last full fit; `None`: nothing to reuse.
    age: Option<u32>,
    refit_every: u32,
}

impl Default for VmFit {
    fn default() -> Self {
        VmFit::new(VmWindows::default(), REFIT_EVERY)
    }
}

impl VmFit {
    /// `refit_every`: intervals a full fit serves at most (1: every
    /// interval is fitted in full, as before reuse).
    pub fn new(windows: VmWindows, refit_every: u32) -> VmFit {
        VmFit {
            windows,
            kept: Vec::new(),
            age: None,
            refit_every: refit_every.max(1),
        }
    }

    /// Estimates and intervals of one interval's tiers, at two-sided tail
    /// `alpha` per tier: the kept fit where the passes agree with it, else
    /// a full fit when `may_refit`, else deferred (module text).
    pub fn fit(
        &mut self,
        tiers: &[TierIn<'_>],
        alpha: f64,
        programs: &mut Programs,
        may_refit: bool,
    ) -> (Vec<TierOut>, FitPath) {
        if let Some(out) = self.carry(tiers, alpha, programs) {
            return (out, FitPath::Reused);
        }
        if let Some(out) = self.reuse(tiers) {
            let passes: Vec<&[(f64, f64)]> = tiers.iter().map(|t| t.passes).collect();
            self.windows.extend(&passes);
            return (out, FitPath::Reused);
        }
        if !may_refit {
            let out = self.deferred(tiers, alpha, programs);
            // The passes still go into the windows (the next full fit
            // rests on them), and the kept fit grows one interval older.
            let passes: Vec<&[(f64, f64)]> = tiers.iter().map(|t| t.passes).collect();
            self.windows.extend(&passes);
            self.age = self.age.map(|a| a.saturating_add(1));
            return (out, FitPath::Deferred);
        }
        let passes: Vec<&[(f64, f64)]> = tiers.iter().map(|t| t.passes).collect();
        let fitted = self.windows.fit_rates(&passes);
        self.kept.resize_with(tiers.len(), Kept::default);
        let out = tiers
            .iter()
            .zip(fitted)
            .zip(&mut self.kept)
            .map(|((t, (estimate, rate)), k)| {
                let bounds = if t.passes.is_empty() {
                    None
                } else {
                    programs.bounds(t.passes, t.pages, t.fraction, alpha)
                };
                k.rate = rate;
                k.accesses = estimate.accesses;
                k.bounds = bounds;
                k.ts.clear();
                k.ts.extend(t.passes.iter().map(|p| p.0));
                TierOut {
                    estimate,
                    bounds,
                    age: 0,
                }
            })
            .collect();
        self.age = Some(0);
        (out, FitPath::Full)
    }

    /// The kept fit for this interval, when every tier agrees with it.
    fn reuse(&mut self, tiers: &[TierIn<'_>]) -> Option<Vec<TierOut>> {
        let age = self.age? + 1;
        if age >= self.refit_every || self.kept.len() != tiers.len() {
            return None;
        }
        let mut out = Vec::with_capacity(tiers.len());
        for (k, t) in self.kept.iter().zip(tiers) {
            let p = t.passes;
            let same_schedule = p.len() == k.ts.len()
                && p.iter()
                    .zip(&k.ts)
                    .all(|(p, t)| (p.0 - t).abs() <= POOL_SLACK * p.0.min(*t));
            let (estimate, bounds) = match k.rate {
                // Untimed then and now: no fit, no interval.
                None if p.is_empty() && k.ts.is_empty() => (plain(p), None),
                // Nothing young then and now: the same program's inputs.
                None if same_schedule && k.accesses == 0.0 && p.iter().all(|p| p.1 == 0.0) => {
                    (plain(p), k.bounds)
                }
                Some(r) if same_schedule => {
                    let f = Fit::at(p, r);
                    if f.chi2.is_nan() || f.chi2 > REUSE_CHI2 {
                        return None;
                    }
                    let e = f.estimate(p);
                    let bounds = match k.bounds {
                        None => None,
                        Some(_) if k.accesses <= 0.0 => return None,
                        Some(b) => {
                            let s = e.accesses / k.accesses;
                            Some(Bounds {
                                low: b.low * s,
                                high: b.high.map(|h| h * s),
                                saturated: b.saturated * s,
                                misfit: b.misfit,
                            })
                        }
                    };
                    (e, bounds)
                }
                _ => return None,
            };
            out.push(TierOut {
                estimate,
                bounds,
                age,
            });
        }
        self.age = Some(age);
        Some(out)
    }

    /// An interval whose passes cannot tell rate from pages (all of one
    /// length: hostpte's long pass, docs/working-set.md) reads each tier's
    /// young pages at its kept rate, where the VM has a kept fit, instead
    /// of the plain sum, which weighs tiers by pages. The passes stay out
    /// of the windows (they fit any rate) and the kept fit grows older;
    /// the interval is what the programs give such passes (none here: the
    /// aggregator's firm low end, open above). Not where a kept rate is
    /// doubtful: a tier whose passes no steady mixture fitted (misfit
    /// above the nominal `z`: it changed within them) or held at the cap
    /// (a lower bound of its rate); then every tier takes the plain sum,
    /// as mixing the two would weigh one tier by touches, another by pages.
    fn carry(
        &mut self,
        tiers: &[TierIn<'_>],
        alpha: f64,
        programs: &mut Programs,
    ) -> Option<Vec<TierOut>> {
        let age = self.age? + 1;
        if self.kept.len() != tiers.len() || tiers.iter().all(|t| t.passes.is_empty()) {
            return None;
        }
        for (k, t) in self.kept.iter().zip(tiers) {
            if t.passes.is_empty() {
                continue;
            }
            let z = programs.z_all(k.ts.len(), alpha);
            if k.bounds.is_some_and(|b| b.misfit > z) {
                return None;
            }
            let t_min = k.ts.iter().copied().fold(f64::INFINITY, f64::min);
            if k.rate.is_some_and(|r| r * t_min >= CAP * (1.0 - 1e-9)) {
                return None;
            }
        }
        let one_length = |p: &[(f64, f64)]| {
            let t_min = p.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
            let t_max = p.iter().map(|p| p.0).fold(0.0, f64::max);
            p.is_empty() || t_max < MIN_SPREAD * t_min
        };
        if !tiers.iter().all(|t| one_length(t.passes)) {
            return None;
        }
        let out = self
            .kept
            .iter()
            .zip(tiers)
            .map(|(k, t)| {
                let p = t.passes;
                let estimate = match k.rate {
                    Some(r) if !p.is_empty() && p.iter().all(|p| p.0 > 0.0) => {
                        let e = Fit::at(p, r).estimate(p);
                        // Saturation as the kept schedule's shortest pass
                        // saw it: what the rate means.
                        let t_min = k.ts.iter().copied().fold(f64::INFINITY, f64::min);
                        Estimate {
                            saturation: t_min.is_finite().then(|| -(-r * t_min).exp_m1()),
                            ..e
                        }
                    }
                    _ => plain(p),
                };
                TierOut {
                    estimate,
                    bounds: None,
                    age,
                }
            })
            .collect();
        self.age = Some(age);
        Some(out)
    }

    /// A full fit that is due and has no room: kept rates (plain sums
    /// without), firm lower ends, upper ends open.
    fn deferred(&self, tiers: &[TierIn<'_>], alpha: f64, programs: &mut Programs) -> Vec<TierOut> {
        tiers
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let p = t.passes;
                let rate = self.kept.get(i).and_then(|k| k.rate);
                let estimate = match rate {
                    Some(r) if !p.is_empty() => Fit::at(p, r).estimate(p),
                    _ => plain(p),
                };
                let bounds = if p.is_empty() {
                    None
                } else {
                    programs.firm(p, t.pages, t.fraction, alpha)
                };
                TierOut {
                    estimate,
                    bounds,
                    age: self.age.map_or(0, |a| a + 1),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::expected;
    use super::*;

    const TS: [f64; 5] = [0.025, 0.1, 0.375, 0.125, 0.375];

    fn tier(p: &[(f64, f64)]) -> TierIn<'_> {
        TierIn {
            passes: p,
            pages: 4096.0,
            fraction: 1.0,
        }
    }

    #[test]
    fn agreeing_passes_reuse_the_fit_and_a_change_refits() {
        let mut programs = Programs::default();
        let mut v = VmFit::default();
        // Rates 16:1 apart: each tier keeps its own (4:1 on these exact
        // counts would pool, and the pooled rate fits neither exactly).
        let (d, s) = (expected(4096.0, 7.8, &TS), expected(4096.0, 0.49, &TS));
        let (first, path) = v.fit(&[tier(&d), tier(&s)], 0.025, &mut programs, true);
        assert_eq!(path, FitPath::Full);
        // The same tiers with 10 % more active pages: reused, the
        // estimate and interval scaled with them.
        let grown = |p: &[(f64, f64)]| p.iter().map(|&(t, y)| (t, y * 1.1)).collect::<Vec<_>>();
        let (d2, s2) = (grown(&d), grown(&s));
        let (out, path) = v.fit(&[tier(&d2), tier(&s2)], 0.025, &mut programs, true);
        assert_eq!(path, FitPath::Reused);
        assert_eq!(out[0].age, 1);
        let k = out[0].estimate.accesses / first[0].estimate.accesses;
        assert!((k - 1.1).abs() < 1e-6, "{k}");
        let (b0, b1) = (first[0].bounds.unwrap(), out[0].bounds.unwrap());
        assert!((b1.low / b0.low - k).abs() < 1e-9, "{b0:?} {b1:?}");
        // The fresh interval of the grown passes is what the rescaled one
        // stands for: close, not equal.
        let fresh = programs.bounds(&d2, 4096.0, 1.0, 0.025).unwrap();
        assert!((b1.low / fresh.low - 1.0).abs() < 0.05, "{b1:?} {fresh:?}");
        // dram four times as hot: refitted.
        let hot = expected(4096.0, 31.2, &TS);
        let (out, path) = v.fit(&[tier(&hot), tier(&s)], 0.025, &mut programs, true);
        assert_eq!(path, FitPath::Full);
        assert_eq!(out[0].age, 0);
        // At most REFIT_EVERY intervals per full fit.
        let paths: Vec<FitPath> = (0..REFIT_EVERY)
            .map(|_| v.fit(&[tier(&hot), tier(&s)], 0.025, &mut programs, true).1)
            .collect();
        assert_eq!(paths.last(), Some(&FitPath::Full), "{paths:?}");
        assert!(
            paths[..paths.len() - 1]
                .iter()
                .all(|p| *p == FitPath::Reused)
        );
    }

    /// One pass of the whole interval (hostpte's long pass) reads the
    /// tiers' young pages at their kept rates: the ratio of touches, not
    /// of pages; the next interval's passes still reuse the kept fit.
    #[test]
    fn a_long_pass_carries_the_kept_rates() {
        let mut programs = Programs::default();
        let mut v = VmFit::default();
        // 1024 pages at 7.8 touches/s against 4096 at 0.49: 8 k against 2 k.
        let (d, s) = (expected(1024.0, 7.8, &TS), expected(4096.0, 0.49, &TS));
        let (_, path) = v.fit(&[tier(&d), tier(&s)], 0.025, &mut programs, true);
        assert_eq!(path, FitPath::Full);
        let long = [0.99];
        let (dl, sl) = (expected(1024.0, 7.8, &long), expected(4096.0, 0.49, &long));
        let (out, path) = v.fit(&[tier(&dl), tier(&sl)], 0.025, &mut programs, true);
        assert_eq!(path, FitPath::Reused);
        assert_eq!(out[0].age, 1);
        let (a, b) = (out[0].estimate.accesses, out[1].estimate.accesses);
        let truth = 1024.0 * 7.8 / (1024.0 * 7.8 + 4096.0 * 0.49);
        assert!((a / (a + b) - truth).abs() < 1e-3, "{a} {b} {truth}");
        // The plain sum would have weighed pages: far off.
        let pages = dl[0].1 / (dl[0].1 + sl[0].1);
        assert!((pages - truth).abs() > 0.3, "{pages} {truth}");
        assert!(out.iter().all(|o| o.bounds.is_none()));
        // The schedule returns: the kept fit still serves it.
        let (_, path) = v.fit(&[tier(&d), tier(&s)], 0.025, &mut programs, true);
        assert_eq!(path, FitPath::Reused);
        // A kept fit of passes that changed within the interval (dram
        // idle, then busy): no steady mixture fits them, so its rate is
        // not carried; the plain sum instead.
        let mut changed = VmFit::default();
        let mut d_change = expected(1024.0, 7.8, &TS);
        for p in &mut d_change[..2] {
            p.1 = 0.0;
        }
        let (full, _) = changed.fit(&[tier(&d_change), tier(&s)], 0.025, &mut programs, true);
        let z = programs.z_all(TS.len(), 0.025);
        assert!(full[0].bounds.is_some_and(|b| b.misfit > z), "{full:?}");
        let (out, _) = changed.fit(&[tier(&dl), tier(&sl)], 0.025, &mut programs, true);
        assert_eq!(out[0].estimate.accesses, dl[0].1);
        // Without a kept fit: the plain sum.
        let mut fresh = VmFit::default();
        let (out, _) = fresh.fit(&[tier(&dl), tier(&sl)], 0.025, &mut programs, true);
        assert_eq!(out[0].estimate.accesses, dl[0].1);
    }

    #[test]
    fn a_deferred_fit_keeps_the_firm_low_end_and_opens_the_high_one() {
        let mut programs = Programs::default();
        let mut v = VmFit::default();
        let d = expected(4096.0, 1.95, &TS);
        let (full, _) = v.fit(&[tier(&d)], 0.05, &mut programs, true);
        // A different tier, due for a full fit, no room for it.
        let hot = expected(4096.0, 7.8, &TS);
        let (out, path) = v.fit(&[tier(&hot)], 0.05, &mut programs, false);
        assert_eq!(path, FitPath::Deferred);
        let b = out[0].bounds.unwrap();
        assert_eq!(b.high, None);
        let fresh = programs.bounds(&hot, 4096.0, 1.0, 0.05).unwrap();
        assert!(b.low <= fresh.low && b.low > 0.0, "{b:?} {fresh:?}");
        assert!(full[0].bounds.unwrap().high.is_some());
        // Deferred again: the kept fit is one interval older each time.
        assert_eq!(out[0].age, 1);
        let (again, _) = v.fit(&[tier(&hot)], 0.05, &mut programs, false);
        assert_eq!(again[0].age, 2);
    }
}
