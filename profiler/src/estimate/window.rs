//! Rates carried across intervals. One interval's passes pin a tier's
//! touch rate only loosely: with a few hundred young pages per pass the
//! rate, and with it the estimate of a tier touched at a different rate
//! from its neighbours, moves by 1-2 pp of DRAM-hit ratio from one interval
//! to the next on a steady guest. Each tier therefore keeps the passes of
//! its last [`WINDOW`] intervals and fits one rate to all of them (each
//! interval with its own active pages), as long as this interval's passes
//! agree with that rate (the likelihood-ratio test of tier pooling,
//! [`POOL_Z`]); passes that do not agree start the window anew, so a
//! change of workload reads from its first whole interval. The estimate
//! itself is always this interval's young pages at the chosen rate.

use std::collections::VecDeque;

use super::{Estimate, Fit, POOL_Z, chi2, plain, pool, rate, rate_over};

/// Intervals whose passes a tier's rate is fitted to, this one included.
pub const WINDOW: usize = 4;

/// The passes of the last consistent intervals of one tier (or pool).
#[derive(Debug, Clone, Default)]
struct Window(VecDeque<Vec<(f64, f64)>>);

impl Window {
    /// Appends one interval's passes, keeping at most `len` intervals; the
    /// buffer of the interval dropped is reused (no allocation per tier and
    /// interval once the window is full).
    fn push(&mut self, passes: &[(f64, f64)], len: usize) {
        let mut v = if self.0.len() >= len.max(1) {
            self.0.pop_front().unwrap_or_default()
        } else {
            Vec::new()
        };
        v.clear();
        v.extend_from_slice(passes);
        self.0.push_back(v);
    }

    /// Takes this interval's passes (whose own fit is `own`) and returns
    /// the rate to use: the window's (at most `len` intervals), when they
    /// agree with it; else their own, and the window restarts from them.
    fn take(&mut self, passes: &[(f64, f64)], own: &Fit, len: usize) -> f64 {
        if len > 1 && !self.0.is_empty() {
            self.0.push_back(passes.to_vec());
            let sets: Vec<&[(f64, f64)]> = self.0.iter().map(Vec::as_slice).collect();
            if let Some(r) = rate_over(&sets)
                && Fit::at(passes, r).chi2 - own.chi2 <= POOL_Z * POOL_Z
            {
                while self.0.len() > len {
                    self.0.pop_front();
                }
                return r;
            }
        }
        self.0.clear();
        self.0.push_back(passes.to_vec());
        own.r
    }

    /// Weighted squared residuals of every interval held, at rate `r`.
    fn chi2(&self, r: f64) -> f64 {
        self.0.iter().map(|p| chi2(p, r).0).sum()
    }
}

/// What one VM's fits carry to its next interval: a window per tier, and
/// one per set of tiers pooled together.
#[derive(Debug, Clone)]
pub struct VmWindows {
    /// Intervals per window ([`WINDOW`]; 1: each interval alone).
    len: usize,
    tiers: Vec<Window>,
    /// Keyed by the pooled tiers (bit i: tier i); only the groups that
    /// pooled in the last interval are kept, so a group that forms anew
    /// starts from this interval's passes (its members' own windows still
    /// decide whether it holds).
    pools: Vec<(u64, Window)>,
}

impl Default for VmWindows {
    fn default() -> Self {
        VmWindows::new(WINDOW)
    }
}

impl VmWindows {
    /// Windows of `len` intervals (at least 1, which fits each interval
    /// alone).
    pub fn new(len: usize) -> VmWindows {
        VmWindows {
            len: len.max(1),
            tiers: Vec::new(),
            pools: Vec::new(),
        }
    }

    /// Estimates for one interval's passes per tier (an empty slice for a
    /// tier without timed passes: it keeps no window).
    ///
    /// Per tier: the rate of its window (above). Then tiers are pooled: the
    /// passes of a group of tiers, summed pass by pass, give a pooled rate
    /// (with a window of its own), and the group holds when each member's
    /// window fits the pooled rate about as well as its own rate (weighted
    /// squared residuals grow by at most [`POOL_Z`]²). Tiers touched alike
    /// then weigh by their young pages, as the plain sum does, instead of
    /// by two noisy rates; a tier touched at another rate keeps its own.
    /// Tiers whose passes differ in number or length (beyond `POOL_SLACK`)
    /// are not pooled.
    pub fn fit(&mut self, tiers: &[&[(f64, f64)]]) -> Vec<Estimate> {
        self.fit_rates(tiers).into_iter().map(|(e, _)| e).collect()
    }

    /// [`VmWindows::fit`], with the rate each estimate rests on (`None`:
    /// the plain sum).
    pub(crate) fn fit_rates(&mut self, tiers: &[&[(f64, f64)]]) -> Vec<(Estimate, Option<f64>)> {
        if self.tiers.len() != tiers.len() {
            *self = VmWindows {
                tiers: vec![Window::default(); tiers.len()],
                ..VmWindows::new(self.len)
            };
        }
        let own: Vec<Option<Fit>> = tiers.iter().map(|p| rate(p)).collect();
        let rates: Vec<Option<f64>> = self
            .tiers
            .iter_mut()
            .zip(tiers)
            .zip(&own)
            .map(|((w, p), own)| match own {
                Some(f) => Some(w.take(p, f, self.len)),
                None => {
                    w.0.clear();
                    None
                }
            })
            .collect();
        let pooled = self.pool(tiers, &rates);
        tiers
            .iter()
            .enumerate()
            .map(|(i, p)| match (pooled[i].or(rates[i]), &own[i]) {
                // This interval's own rate: its fit is at hand.
                (Some(r), Some(f)) if r.to_bits() == f.r.to_bits() => (f.estimate(p), Some(r)),
                (Some(r), _) => (Fit::at(p, r).estimate(p), Some(r)),
                (None, _) => (plain(p), None),
            })
            .collect()
    }

    /// Adds one interval's passes to the windows without fitting: for an
    /// interval whose passes agree with the rates kept (`estimate::reuse`),
    /// so that the next full fit still rests on the last intervals. Tiers
    /// and pools without a window, or a tier count that changed, are left
    /// alone (the next fit starts them).
    pub(crate) fn extend(&mut self, tiers: &[&[(f64, f64)]]) {
        if self.tiers.len() != tiers.len() {
            return;
        }
        let len = self.len;
        let push = |w: &mut Window, p: &[(f64, f64)]| {
            if !w.0.is_empty() && len > 1 {
                while w.0.len() > len {
                    w.0.pop_front();
                }
                w.push(p, len);
            }
        };
        for (w, p) in self.tiers.iter_mut().zip(tiers) {
            push(w, p);
        }
        for (m, w) in &mut self.pools {
            let set: Vec<&[(f64, f64)]> = bits(*m).filter_map(|i| tiers.get(i).copied()).collect();
            match pool(&set) {
                Some(p) => push(w, &p),
                None => w.0.clear(),
            }
        }
    }

    /// The pooled rate of each tier that shares one with others. All tiers
    /// with a rate are pooled first; while some member's window does not
    /// agree with the pooled rate, the one that agrees least is left out
    /// and the rest pooled again, until the members agree or fewer than
    /// two remain. The tiers left out then get one such try of their own,
    /// so two tiers touched alike still pool when a third, busier one at
    /// another rate pulled the first pooled rate away from them.
    fn pool(&mut self, tiers: &[&[(f64, f64)]], rates: &[Option<f64>]) -> Vec<Option<f64>> {
        let all = rates
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_some())
            .fold(0u64, |m, (i, _)| if i < 64 { m | 1 << i } else { m });
        // Each tier's window at its own rate: the pooling test's base, the
        // same in every round.
        let base: Vec<f64> = self
            .tiers
            .iter()
            .zip(rates)
            .map(|(w, r)| r.map_or(0.0, |r| w.chi2(r)))
            .collect();
        let (group, left_out) = self.shrink(tiers, &base, all);
        let second = self.shrink(tiers, &base, left_out).0;
        let mut out = vec![None; tiers.len()];
        let mut kept = Vec::new();
        for (m, rp, w) in group.into_iter().chain(second) {
            for i in bits(m) {
                out[i] = Some(rp);
            }
            kept.push((m, w));
        }
        self.pools = kept;
        out
    }

    /// Pools `members`, leaving out the one that agrees least while any
    /// does not, until all agree (the group, its rate and window) or fewer
    /// than two remain; also the tiers left out. `base`: each tier's window
    /// residuals at its own rate.
    fn shrink(
        &self,
        tiers: &[&[(f64, f64)]],
        base: &[f64],
        mut members: u64,
    ) -> (Option<(u64, f64, Window)>, u64) {
        let mut left_out = 0u64;
        while members.count_ones() >= 2 {
            let set: Vec<&[(f64, f64)]> = bits(members).map(|i| tiers[i]).collect();
            let Some(passes) = pool(&set) else { break };
            let Some(fit) = rate(&passes) else { break };
            let mut w = self
                .pools
                .iter()
                .find(|(m, _)| *m == members)
                .map_or_else(Window::default, |(_, w)| w.clone());
            let rp = w.take(&passes, &fit, self.len);
            // The member whose window fits the pooled rate worst.
            let worst = bits(members)
                .map(|i| (i, self.tiers[i].chi2(rp) - base[i]))
                .max_by(|a, b| a.1.total_cmp(&b.1));
            match worst {
                Some((i, grew)) if grew > POOL_Z * POOL_Z => {
                    members &= !(1 << i);
                    left_out |= 1 << i;
                }
                _ => return (Some((members, rp, w)), left_out),
            }
        }
        (None, left_out)
    }
}

/// The tiers in bit set `m`.
fn bits(m: u64) -> impl Iterator<Item = usize> {
    (0..64).filter(move |&i| m & 1 << i != 0)
}

#[cfg(test)]
mod tests {
    use super::super::tests::expected;
    use super::super::{fit, fit_vm};
    use super::*;

    const TS: [f64; 5] = [0.022, 0.098, 0.373, 0.122, 0.373];

    /// Young pages with a fixed pattern of binomial-sized errors: `k`
    /// picks which passes read high and which low.
    fn noisy(a: f64, r: f64, k: usize) -> Vec<(f64, f64)> {
        expected(a, r, &TS)
            .into_iter()
            .enumerate()
            .map(|(i, (t, y))| {
                let sd = (y * (1.0 - y / a)).sqrt();
                let sign = if (i + k).is_multiple_of(3) { 1.0 } else { -0.5 };
                (t, (y + sign * sd).round())
            })
            .collect()
    }

    fn share(e: &[Estimate]) -> f64 {
        e[0].accesses / (e[0].accesses + e[1].accesses)
    }

    #[test]
    fn a_steady_tier_fits_its_rate_to_the_window() {
        // 4096 + 4096 pages touched 1.95 and 0.49 times per second per
        // page (the test guest's 80/20 row at 10 k/s): each interval alone
        // is off by its noise, the window much less.
        let mut w = VmWindows::default();
        let (mut alone, mut windowed) = (Vec::new(), Vec::new());
        for k in 0..8 {
            let (d, s) = (noisy(4096.0, 1.95, k), noisy(4096.0, 0.49, k + 1));
            alone.push((share(&fit_vm(&[&d, &s])) - 0.8).abs());
            windowed.push((share(&w.fit(&[&d, &s])) - 0.8).abs());
            assert!(w.tiers[0].0.len() <= WINDOW);
        }
        assert_eq!(w.tiers[0].0.len(), WINDOW, "{w:?}");
        let worst = |v: &[f64]| v[WINDOW..].iter().copied().fold(0.0, f64::max);
        assert!(
            worst(&windowed) < 0.5 * worst(&alone),
            "{windowed:?} {alone:?}"
        );
        assert!(worst(&windowed) < 0.01, "{windowed:?}");
    }

    #[test]
    fn a_change_of_rate_restarts_the_window() {
        let mut w = VmWindows::default();
        for k in 0..4 {
            w.fit(&[&noisy(1024.0, 2.0, k), &noisy(1024.0, 2.0, k + 1)]);
        }
        assert_eq!(w.tiers[0].0.len(), 4);
        // dram 4x as hot: its window starts from this interval, which then
        // reads as it would alone.
        let (d, s) = (expected(1024.0, 8.0, &TS), expected(1024.0, 2.0, &TS));
        let e = w.fit(&[&d, &s]);
        assert_eq!(w.tiers[0].0.len(), 1, "{w:?}");
        assert_eq!(w.tiers[1].0.len(), WINDOW, "slow did not change: {w:?}");
        assert!((share(&e) - 0.8).abs() < 0.01, "{e:?}");
        assert_eq!(e[0], fit_vm(&[&d, &s])[0]);
        // A tier that went quiet keeps no window; more or fewer tiers
        // start over.
        w.fit(&[&d, &[]]);
        assert!(w.tiers[1].0.is_empty());
        w.fit(&[&d, &s, &s]);
        assert_eq!(w.tiers.len(), 3);
        assert_eq!(w.tiers[0].0.len(), 1);
    }

    #[test]
    fn a_tier_at_another_rate_does_not_pull_the_pool() {
        // Two tiers touched alike and a third 4x as often: the first two
        // pool, the third keeps its own rate and is left out of the pool.
        let (a, b) = (noisy(2048.0, 2.0, 0), noisy(2048.0, 2.0, 1));
        let hot = expected(2048.0, 8.0, &TS);
        let mut w = VmWindows::default();
        let e = w.fit(&[&a, &b, &hot]);
        // One rate for a and b (so one saturation), read near 1:1.
        assert_eq!(e[0].saturation, e[1].saturation, "{e:?}");
        assert!((share(&e) - 0.5).abs() < 0.01, "{e:?}");
        assert_eq!(e[2], fit(&hot));
        assert_eq!(w.pools.last().map(|p| p.0), Some(0b011), "{w:?}");
    }
}
