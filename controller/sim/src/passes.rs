//! What a host sampler that reads accessed bits in passes makes of a
//! simulated guest, handed to the controller through the same
//! `input::from_proto` tierd uses (`SimConfig::passes`).
//!
//! A page touched r times a second is young in a pass of t seconds with
//! probability 1 - e^(-r t). The guest makes `touches_per_s` page touches a
//! second over its hot set, spread by the phase's skew (the page of rank i
//! in proportion to 1 / (1 + skew x i / pages), as `workload` does), so a
//! hot set touched about once a second is only partly young in a short
//! pass. Expected values, no noise: what matters here is the bias.
//!
//! What each interval carries, as hostpte gives it (docs/working-set.md):
//! - `estimated_accessed_bytes` from one pass of `pass_s`, young pages
//!   weighing alike (hostpte's one rate: the ratio's point), with an
//!   interval open at both ends (accessed bits cannot say how often);
//! - ages per horizon from one reading whose exposure is within a quarter
//!   of the horizon: inside a *sweep* (`sweep_intervals` every
//!   `sweep_every` intervals; the sweep's k-th interval reads k intervals
//!   of exposure, and gives the ratio no pass), or, for horizons of one
//!   interval, the long pass one interval in `long_every`. Every page is
//!   read, so the reading is exact but for its edges (`edge` of it each
//!   way); cold bytes are resident bytes not young in the longest horizon.

use tier_proto::v1::{Tier, TierAges, TierKind, TierSample, Vm, VmStats, WorkingSet};

use crate::workload::Phase;
use tier_controller::policy::PAGE;

/// The sampler's passes and schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Passes {
    /// Length of the pass that gives the interval's young pages.
    pub pass_s: f64,
    /// Page touches per second the guest makes over its hot set.
    pub touches_per_s: f64,
    /// Horizons, seconds, shortest first.
    pub horizons: &'static [f64],
    /// A sweep of this many intervals every `sweep_every`; 0: none.
    pub sweep_intervals: u64,
    pub sweep_every: u64,
    /// Horizons of one interval are read one interval in this many.
    pub long_every: u64,
    /// Relative uncertainty of a reading's edges, each way.
    pub edge: f64,
}

impl Default for Passes {
    /// The e2e's guests under tierd's hostpte (one 1 s pass an interval):
    /// a 6000-page hot set touched about once a second.
    fn default() -> Self {
        Passes {
            pass_s: 1.0,
            touches_per_s: 5500.0,
            horizons: &[1.0, 5.0],
            sweep_intervals: 5,
            sweep_every: 10,
            long_every: 5,
            edge: 0.01,
        }
    }
}

/// Share of the hot set's ranks (0, x] young within `t` seconds: the
/// integral of 1 - e^(-r(u) t) over u in (0, x], midpoint rule.
fn young_share(p: &Phase, touches_per_s: f64, x: f64, t: f64) -> f64 {
    const N: usize = 128;
    let pages = (p.hot_bytes / PAGE).max(1) as f64;
    let x = x.clamp(0.0, 1.0);
    if x == 0.0 || t <= 0.0 {
        return 0.0;
    }
    let skew = if p.skew.is_finite() && p.skew > 1e-6 {
        p.skew
    } else {
        0.0
    };
    // Mean of 1 / (1 + skew u) over (0, 1]: the weights' normaliser.
    let mean = if skew > 0.0 { skew.ln_1p() / skew } else { 1.0 };
    let per_page = touches_per_s / pages;
    (0..N)
        .map(|i| {
            let u = x * (i as f64 + 0.5) / N as f64;
            let r = per_page / (1.0 + skew * u) / mean;
            1.0 - (-r * t).exp()
        })
        .sum::<f64>()
        * x
        / N as f64
}

/// Bytes of the hot set young within `t` seconds in ranks [from, to).
fn young(p: &Phase, touches: f64, from: u64, to: u64, t: f64) -> f64 {
    if p.hot_bytes == 0 || to <= from {
        return 0.0;
    }
    let h = p.hot_bytes as f64;
    let share = |b: u64| young_share(p, touches, b as f64 / h, t);
    (share(to.min(p.hot_bytes)) - share(from.min(p.hot_bytes))) * h
}

/// Warm bytes (kept in DRAM after the hot set) touched within `t`.
fn warm(p: &Phase, t: f64) -> f64 {
    if p.warm_period_s <= 0.0 {
        return p.warm_bytes as f64;
    }
    p.warm_bytes as f64 * (t / p.warm_period_s).min(1.0)
}

/// Bytes of each tier young within `t`, when the guest holds `dram` and
/// `slow` (hottest first in DRAM, then warm, the rest of the hot set in
/// the slow tier).
pub fn young_bytes(p: &Phase, touches: f64, dram: u64, slow: u64, t: f64) -> [f64; 2] {
    let dram_hot = dram.min(p.hot_bytes);
    let slow_hot = slow.min(p.hot_bytes - dram_hot);
    let warm_in = (dram - dram_hot).min(p.warm_bytes) as f64;
    let w = if p.warm_bytes > 0 {
        warm(p, t) * warm_in / p.warm_bytes as f64
    } else {
        0.0
    };
    [
        young(p, touches, 0, dram_hot, t) + w,
        young(p, touches, dram_hot, dram_hot + slow_hot, t),
    ]
}

impl Passes {
    /// `Some(k)`: interval `n` is the k-th (1-based) of a sweep.
    fn sweep(&self, n: u64) -> Option<u64> {
        if self.sweep_intervals == 0 || self.sweep_every == 0 {
            return None;
        }
        let k = n % self.sweep_every;
        (k < self.sweep_intervals).then_some(k + 1)
    }

    /// The exposure that measures horizon `h` in interval `n`, if any.
    fn exposure(&self, h: f64, n: u64, interval_s: f64) -> Option<f64> {
        let near = |e: f64| (h - e).abs() <= h / 4.0 + 1e-9;
        match self.sweep(n) {
            Some(k) => Some(k as f64 * interval_s).filter(|&e| near(e)),
            None if self.long_every > 0 && n.is_multiple_of(self.long_every) => {
                Some(interval_s).filter(|&e| near(e))
            }
            None => None,
        }
    }
}

/// The protocol's view of one simulated VM: its `Vm` (two tiers) and
/// `VmStats` for interval `n`, as tierd would send them.
#[derive(Debug)]
pub struct Seen {
    pub vm: Vm,
    pub stats: VmStats,
}

/// Sizes, balloons and what the guest holds, per tier `[dram, slow]`.
#[derive(Debug)]
pub struct Held {
    pub size: [u64; 2],
    pub target: [u64; 2],
    pub actual: [u64; 2],
}

/// What the sampler sends for a VM holding `held` in interval `n`.
pub fn observe(
    id: &str,
    p: Option<&Phase>,
    h: &Held,
    cfg: &Passes,
    n: u64,
    interval_s: f64,
) -> Seen {
    let names = ["dram", "slow"];
    let kinds = [TierKind::Dram, TierKind::Cxl];
    let vm = Vm {
        id: id.into(),
        name: id.into(),
        tiers: (0..2)
            .map(|i| Tier {
                name: names[i].into(),
                kind: kinds[i] as i32,
                size_bytes: h.size[i],
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let hold = [0, 1].map(|i| h.size[i].saturating_sub(h.actual[i]));
    let young_in = |t: f64| {
        p.map_or([0.0; 2], |p| {
            young_bytes(p, cfg.touches_per_s, hold[0], hold[1], t)
        })
    };
    let in_sweep = cfg.sweep(n).is_some();
    let pass = young_in(cfg.pass_s);
    let longest = cfg.horizons.last().copied().unwrap_or(interval_s);
    let history = (n + 1) as f64 * interval_s;
    let tiers = (0..2)
        .map(|i| {
            // A reading of exposure e stretched to the horizon h: its
            // point is the working set within h (hostpte follows the
            // growth between readings), its interval spans the readings
            // at e and h, and the edges.
            let reading = |h: f64| {
                cfg.exposure(h, n, interval_s).map(|e| {
                    let (lo, hi) = (young_in(e.min(h))[i], young_in(e.max(h))[i]);
                    let b = young_in(h)[i];
                    (
                        (lo * (1.0 - cfg.edge) - PAGE as f64).max(0.0),
                        b,
                        (hi * (1.0 + cfg.edge) + PAGE as f64).min(hold[i] as f64),
                    )
                })
            };
            let working_set = cfg
                .horizons
                .iter()
                .map(|&hz| match reading(hz) {
                    Some((low, b, high)) => WorkingSet {
                        horizon_seconds: hz,
                        bytes: b,
                        bytes_low: low,
                        bytes_high: high,
                        not_measured: String::new(),
                    },
                    None => WorkingSet {
                        horizon_seconds: hz,
                        not_measured: format!("not measured in interval {n}"),
                        ..Default::default()
                    },
                })
                .collect();
            let cold = reading(longest).map(|(low, b, high)| {
                let held = hold[i] as f64;
                (
                    (held - high).max(0.0),
                    (held - b).max(0.0),
                    (held - low).max(0.0),
                )
            });
            let young_b = if in_sweep { 0 } else { pass[i] as u64 };
            TierSample {
                tier: names[i].into(),
                estimated_accessed_bytes: young_b,
                estimated_accesses: young_b as f64 / PAGE as f64,
                young_pages: young_b / PAGE,
                sampled_pages: hold[i] / PAGE,
                coverage: 1.0,
                resident_bytes: hold[i],
                balloon_target_bytes: h.target[i],
                balloon_actual_bytes: h.actual[i],
                passes: u32::from(!in_sweep),
                ages: Some(TierAges {
                    working_set,
                    cold_bytes: cold.map(|c| c.1),
                    cold_bytes_low: cold.map(|c| c.0),
                    cold_bytes_high: cold.map(|c| c.2),
                    history_seconds: history,
                    ..Default::default()
                }),
                ..Default::default()
            }
        })
        .collect::<Vec<_>>();
    let (d, s) = (pass[0], pass[1]);
    let has = !in_sweep && d + s > 0.0;
    let stats = VmStats {
        vm_id: id.into(),
        has_accesses: has,
        dram_hit_ratio: if has { d / (d + s) } else { 0.0 },
        // Accessed bits cannot say how often: open at both ends.
        dram_hit_low: has.then_some(0.0),
        dram_hit_high: has.then_some(1.0),
        dram_hit_low_open: has,
        dram_hit_high_open: has,
        tiers,
        ..Default::default()
    };
    Seen { vm, stats }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    #[test]
    fn a_short_pass_misses_what_a_longer_one_sees() {
        let p = Phase::hot(0, 6000 * PAGE, 0.0, 1000.0);
        let c = Passes::default();
        // About 0.92 touches a second per page: 1 - e^-0.92 = 60 % in 1 s,
        // 99 % in 5 s.
        let [d1, _] = young_bytes(&p, c.touches_per_s, 32 * M, 0, 1.0);
        let [d5, _] = young_bytes(&p, c.touches_per_s, 32 * M, 0, 5.0);
        let hot = p.hot_bytes as f64;
        assert!((d1 / hot - 0.60).abs() < 0.01, "{}", d1 / hot);
        assert!(d5 / hot > 0.98, "{}", d5 / hot);
        // 16M of DRAM: the rest of the hot set young in the slow tier.
        let [d, s] = young_bytes(&p, c.touches_per_s, 16 * M, 64 * M, 5.0);
        assert!(
            (d - 16.0 * M as f64 * 0.99).abs() < 0.01 * 16.0 * M as f64,
            "{d}"
        );
        assert!((d + s - d5).abs() < 1.0, "{d} {s} {d5}");
    }

    #[test]
    fn the_schedule_measures_horizons_when_hostpte_would() {
        let c = Passes::default();
        let p = Phase::hot(0, 1500 * PAGE, 0.0, 1000.0);
        let h = Held {
            size: [32 * M, 64 * M],
            target: [16 * M, 0],
            actual: [16 * M, 0],
        };
        let measured = |n: u64| -> Vec<bool> {
            let s = observe("a", Some(&p), &h, &c, n, 1.0).stats;
            s.tiers[0]
                .ages
                .as_ref()
                .unwrap()
                .working_set
                .iter()
                .map(|w| w.not_measured.is_empty())
                .collect()
        };
        // Sweep intervals 1-5 (n = 0..4): 1 s in its first, 5 s in its
        // 4th and 5th (exposure within a quarter); then the long pass
        // (n = 5) reads 1 s; n = 6..9 nothing.
        assert_eq!(measured(0), [true, false]);
        assert_eq!(measured(3), [false, true]);
        assert_eq!(measured(4), [false, true]);
        assert_eq!(measured(5), [true, false]);
        assert_eq!(measured(7), [false, false]);
        // A sweep gives the ratio no pass; the others an open interval.
        let s = observe("a", Some(&p), &h, &c, 3, 1.0).stats;
        assert!(!s.has_accesses && s.tiers[0].passes == 0);
        let s = observe("a", Some(&p), &h, &c, 7, 1.0).stats;
        assert!(s.has_accesses && s.dram_hit_low_open && s.dram_hit_high_open);
        // Cold over the 5 s horizon: 16M held less the hot set (~6M).
        let s = observe("a", Some(&p), &h, &c, 4, 1.0).stats;
        let a = s.tiers[0].ages.as_ref().unwrap();
        let cold = a.cold_bytes_low.unwrap();
        assert!(cold > 9.5 * M as f64 && cold < 10.2 * M as f64, "{cold}");
    }
}
