//! The simulated guest's memory behaviour: a hot set with skewed accesses,
//! laid out hottest-first in DRAM.
//!
//! Model: during a phase a VM makes `accesses` accesses per interval over
//! `hot_bytes`, Zipf-like: the page of rank i (hottest first) is accessed in
//! proportion to 1 / (1 + skew x i / pages), so the hottest fraction x of
//! the hot set gets ln(1 + skew x) / ln(1 + skew) of the accesses (skew 0:
//! uniform; skew 100: the hottest page is touched 101 times as often as the
//! coldest). Smooth and concave, and deliberately not the controller's
//! power-law model. The guest keeps its hottest pages in DRAM (as Linux
//! memory tiering with promotion aims to), the rest of the hot set in the
//! slow tier; what fits in neither is not accessed. Every hot page is
//! touched each interval, the rest of what the guest holds is idle.

/// One phase of a VM's workload, from interval `start` on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Phase {
    pub start: u64,
    pub hot_bytes: u64,
    /// >= 0; see the module doc.
    pub skew: f64,
    /// Accesses per interval.
    pub accesses: f64,
    /// Bytes touched now and then, each page once per `warm_period_s`
    /// seconds (recency only: their accesses are too few to count in the
    /// ratio); the guest keeps them in DRAM after the hot set.
    pub warm_bytes: u64,
    pub warm_period_s: f64,
    /// Bytes per second of cold pages (untouched beyond every horizon)
    /// that turn hot, as many hot ones turning cold (the hot set drifts):
    /// promotion pressure where those cold pages sit in the slow tier.
    pub churn: f64,
}

/// Per-tier truth of one interval.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TierLoad {
    pub dram_accesses: f64,
    pub slow_accesses: f64,
    pub dram_hot: u64,
    pub slow_hot: u64,
}

impl TierLoad {
    /// DRAM-hit ratio; `None` without accesses.
    pub fn ratio(&self) -> Option<f64> {
        let t = self.dram_accesses + self.slow_accesses;
        (t > 0.0).then(|| self.dram_accesses / t)
    }
}

impl Phase {
    /// A skew too small to tell from uniform is uniform (and avoids 0/0).
    fn skew(&self) -> Option<f64> {
        (self.skew.is_finite() && self.skew > 1e-6).then_some(self.skew)
    }

    /// A phase without warm pages or churn.
    pub fn hot(start: u64, hot_bytes: u64, skew: f64, accesses: f64) -> Phase {
        Phase {
            start,
            hot_bytes,
            skew,
            accesses,
            warm_bytes: 0,
            warm_period_s: 0.0,
            churn: 0.0,
        }
    }

    /// Bytes touched within `horizon_s` seconds: the hot set (touched every
    /// interval of `interval_s`) and the warm pages touched in that time.
    pub fn working_set(&self, horizon_s: f64, interval_s: f64) -> u64 {
        if horizon_s + 1e-9 < interval_s {
            // Shorter than an interval: the hot set's touches are spread
            // over the interval.
            let f = (horizon_s / interval_s).clamp(0.0, 1.0);
            return (self.hot_bytes as f64 * f) as u64;
        }
        let warm = if self.warm_period_s > horizon_s {
            (self.warm_bytes as f64 * horizon_s / self.warm_period_s) as u64
        } else {
            self.warm_bytes
        };
        self.hot_bytes + warm
    }

    /// Share of accesses that go to the hottest `bytes` of the hot set.
    pub fn share(&self, bytes: u64) -> f64 {
        if self.hot_bytes == 0 {
            return 1.0;
        }
        let x = (bytes as f64 / self.hot_bytes as f64).min(1.0);
        match self.skew() {
            Some(a) => (a * x).ln_1p() / a.ln_1p(),
            None => x,
        }
    }

    /// DRAM the guest must hold for a DRAM-hit ratio of `ratio`.
    pub fn dram_for(&self, ratio: f64) -> u64 {
        let t = ratio.clamp(0.0, 1.0);
        let x = match self.skew() {
            Some(a) => (t * a.ln_1p()).exp_m1() / a,
            None => t,
        };
        (x.min(1.0) * self.hot_bytes as f64).ceil() as u64
    }

    /// The interval's per-tier load when the guest holds `dram` and `slow`.
    pub fn load(&self, dram: u64, slow: u64) -> TierLoad {
        let dram_hot = dram.min(self.hot_bytes);
        let slow_hot = slow.min(self.hot_bytes - dram_hot);
        let d = self.share(dram_hot);
        let both = self.share(dram_hot + slow_hot);
        TierLoad {
            dram_accesses: self.accesses * d,
            slow_accesses: self.accesses * (both - d),
            dram_hot,
            slow_hot,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    #[test]
    fn uniform_and_skewed() {
        let uniform = Phase::hot(0, 4 * G, 0.0, 1000.0);
        let l = uniform.load(G, 8 * G);
        assert_eq!((l.dram_accesses, l.slow_accesses), (250.0, 750.0));
        assert_eq!((l.dram_hot, l.slow_hot), (G, 3 * G));
        assert_eq!(uniform.dram_for(0.5), 2 * G);
        // skew 3: the hottest quarter gets ln(1.75) / ln(4) of the accesses.
        let skewed = Phase {
            skew: 3.0,
            ..uniform
        };
        let r = skewed.load(G, 8 * G).ratio().unwrap();
        // Warm pages count within the horizons that see them.
        let w = Phase {
            warm_bytes: 2 * G,
            warm_period_s: 20.0,
            ..uniform
        };
        assert_eq!(w.working_set(1.0, 1.0), 4 * G + G / 10);
        assert_eq!(w.working_set(60.0, 1.0), 6 * G);
        assert_eq!(w.working_set(0.5, 1.0), 2 * G);
        assert!((r - 1.75f64.ln() / 4.0f64.ln()).abs() < 1e-12);
        // ln(1 + 3x) / ln 4 = 0.5 at x = 1/3.
        assert!(skewed.dram_for(0.5).abs_diff(4 * G / 3) <= 1);
        // More DRAM than the hot set: all hits, the rest idle.
        let l = skewed.load(6 * G, 0);
        assert_eq!((l.ratio(), l.dram_hot), (Some(1.0), 4 * G));
        // Hot set larger than what the guest holds: the rest is not accessed.
        let l = uniform.load(G, G);
        assert_eq!(l.dram_accesses + l.slow_accesses, 500.0);
    }
}
