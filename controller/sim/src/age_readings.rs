//! What a sampler's recency profile (`TierAges`) makes of a simulated VM:
//! per tier, bytes touched within each horizon, cold bytes and slow-tier
//! promotion, each estimated from a page sample with binomial noise and a
//! ~95 % interval.
//!
//! Layout (`workload`): the guest keeps its most recently used pages in
//! DRAM: the hot set, then warm pages, then cold ones fill the rest of the
//! DRAM it holds; the slow tier holds the remainder. Churning pages are
//! drawn from all cold pages alike, so promotion from the slow tier is
//! churn x its share of the cold bytes. The sampler reads `coverage` of
//! each tier's pages: an estimate of p x held from m = coverage x pages
//! sampled pages has sigma = held x sqrt(p (1 - p) / m); the draw is
//! clipped at 1.96 sigma, so the interval [est - 1.96 sigma, est + 1.96
//! sigma] covers the truth by construction (as `estimate` does for the
//! ratio). Horizons longer than the history are not measured, and cold
//! bytes and promotion not before the longest one is.

use crate::rng::Rng;
use crate::workload::Phase;
use tier_controller::policy::PAGE;
use tier_controller::policy::ages::{Est, Horizon, TierAges};

/// The simulated sampler's ages.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AgeSampling {
    /// Horizons, seconds, shortest first.
    pub horizons: [f64; 3],
    /// Share of each tier's pages sampled, (0, 1].
    pub coverage: f64,
}

impl Default for AgeSampling {
    fn default() -> Self {
        AgeSampling {
            horizons: [1.0, 5.0, 20.0],
            coverage: 1.0 / 16.0,
        }
    }
}

/// The truth of one tier: bytes touched within each horizon, cold bytes,
/// promoted bytes per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TierTruth {
    pub working_set: [u64; 3],
    pub cold: u64,
    pub promoted_per_s: f64,
}

/// Per-tier truth `[dram, slow]` when the guest holds `dram` and `slow`.
pub fn truth(p: &Phase, a: &AgeSampling, interval_s: f64, dram: u64, slow: u64) -> [TierTruth; 2] {
    let ws = a.horizons.map(|h| p.working_set(h, interval_s));
    let split = |w: u64| {
        let d = w.min(dram);
        (d, (w - d).min(slow))
    };
    let long = split(ws[2]);
    let (dc, sc) = (dram - long.0, slow - long.1);
    let promoted = if dc + sc > 0 {
        p.churn.max(0.0) * sc as f64 / (dc + sc) as f64
    } else {
        0.0
    };
    [
        TierTruth {
            working_set: ws.map(|w| split(w).0),
            cold: dc,
            promoted_per_s: 0.0,
        },
        TierTruth {
            working_set: ws.map(|w| split(w).1),
            cold: sc,
            promoted_per_s: promoted,
        },
    ]
}

/// A normal draw clipped at +-1.96 (Box-Muller).
fn z(rng: &mut Rng) -> f64 {
    let (u, v) = (rng.unit().max(1e-12), rng.unit());
    ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()).clamp(-1.96, 1.96)
}

/// An estimate of `bytes` of a tier holding `held`, from its page sample.
fn sampled(rng: &mut Rng, bytes: u64, held: u64, coverage: f64) -> Est {
    let m = (held as f64 / PAGE as f64 * coverage).max(1.0);
    let p = if held > 0 {
        (bytes as f64 / held as f64).clamp(0.0, 1.0)
    } else {
        0.0
    };
    // Half a page of sigma at least: a sample never knows a size exactly.
    let sigma = (held as f64 * (p * (1.0 - p) / m).sqrt()).max(PAGE as f64 / 2.0);
    let est = (bytes as f64 + z(rng) * sigma).max(0.0);
    Est {
        point: est,
        low: (est - 1.96 * sigma).max(0.0),
        high: est + 1.96 * sigma,
    }
}

/// A rate from the pages seen promoted over one interval (Poisson noise).
fn rate(rng: &mut Rng, per_s: f64, interval_s: f64, coverage: f64) -> Est {
    let pages = per_s * interval_s / PAGE as f64 * coverage;
    let sigma = (pages.sqrt().max(1.0) / coverage) * PAGE as f64 / interval_s;
    let est = (per_s + z(rng) * sigma).max(0.0);
    Est {
        point: est,
        low: (est - 1.96 * sigma).max(0.0),
        high: est + 1.96 * sigma,
    }
}

/// One tier's `TierAges` after `history_s` seconds of watching.
pub fn tier_ages(
    rng: &mut Rng,
    t: &TierTruth,
    held: u64,
    a: &AgeSampling,
    interval_s: f64,
    history_s: f64,
) -> TierAges {
    let horizons = a
        .horizons
        .iter()
        .zip(t.working_set)
        .map(|(&h, w)| {
            let seen = history_s + 1e-9 >= h;
            Horizon {
                seconds: h,
                bytes: seen.then(|| sampled(rng, w, held, a.coverage)),
                why: if seen {
                    String::new()
                } else {
                    format!("watched for {history_s} s of {h}")
                },
            }
        })
        .collect();
    let long = history_s + 1e-9 >= a.horizons[2];
    TierAges {
        horizons,
        cold: long.then(|| sampled(rng, t.cold, held, a.coverage)),
        promoted_per_s: long.then(|| rate(rng, t.promoted_per_s, interval_s, a.coverage)),
        history_seconds: history_s,
        not_measured: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    #[test]
    fn layout_and_honest_intervals() {
        let p = Phase {
            warm_bytes: G,
            warm_period_s: 10.0,
            churn: 1e6,
            ..Phase::hot(0, 2 * G, 0.0, 1e5)
        };
        let a = AgeSampling::default();
        // 3G of DRAM: hot 2G + 0.1G warm within 1 s, 2.5G within 5 s,
        // 3G within 20 s (all of it: nothing cold in DRAM).
        let [d, s] = truth(&p, &a, 1.0, 3 * G, 4 * G);
        assert_eq!(d.working_set, [2 * G + G / 10, 2 * G + G / 2, 3 * G]);
        assert_eq!(s.working_set, [0, 0, 0]);
        assert_eq!((d.cold, s.cold), (0, 4 * G));
        assert_eq!(s.promoted_per_s, 1e6);
        // 1G of DRAM: the hot set spills into the slow tier.
        let [d, s] = truth(&p, &a, 1.0, G, 4 * G);
        assert_eq!((d.working_set[0], s.working_set[0]), (G, G + G / 10));
        let mut rng = Rng::new(3);
        for _ in 0..1000 {
            let e = sampled(&mut rng, G, 4 * G, 1.0 / 16.0);
            assert!(e.low <= G as f64 && G as f64 <= e.high, "{e:?}");
            assert!(e.high - e.low < 0.05 * G as f64, "{e:?}");
        }
        let t = tier_ages(&mut rng, &s, 4 * G, &a, 1.0, 5.0);
        assert!(t.horizons[1].bytes.is_some() && t.horizons[2].bytes.is_none());
        assert_eq!(t.horizons[2].why, "watched for 5 s of 20");
        assert!(t.cold.is_none() && t.promoted_per_s.is_none());
    }
}
