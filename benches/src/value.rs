//! The value bench's pure parts (docs/value.md): a cost model of a guest's
//! time from exact counts, the oracle's split of a DRAM budget, and the
//! figures each policy is judged by.

/// Bytes of a guest page.
pub const PAGE: u64 = 4096;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ValueError {
    #[error("cost model: {0} must be finite and > 0, is {1}")]
    Parameter(&'static str, f64),
    #[error("cost model: slow-tier latency {slow} ns < DRAM latency {dram} ns")]
    Inverted { dram: f64, slow: f64 },
    #[error("oracle: block size 0")]
    Block,
}

/// A guest's time over an interval, modelled: every instruction costs a
/// base CPI, every last-level-cache miss the latency of the tier its page
/// is on, divided by the memory-level parallelism (misses in flight at
/// once). A model, not a measurement: TCG runs every instruction at the
/// same speed whatever tier its data is on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Cycles per instruction with every access an LLC hit.
    pub cpi: f64,
    pub ghz: f64,
    pub dram_ns: f64,
    pub slow_ns: f64,
    /// Misses overlapped on average.
    pub mlp: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            cpi: 1.0,
            ghz: 3.0,
            dram_ns: 80.0,
            slow_ns: 250.0,
            mlp: 2.0,
        }
    }
}

impl CostModel {
    pub fn validate(&self) -> Result<(), ValueError> {
        for (name, v) in [
            ("cpi", self.cpi),
            ("ghz", self.ghz),
            ("dram_ns", self.dram_ns),
            ("slow_ns", self.slow_ns),
            ("mlp", self.mlp),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(ValueError::Parameter(name, v));
            }
        }
        if self.slow_ns < self.dram_ns {
            return Err(ValueError::Inverted {
                dram: self.dram_ns,
                slow: self.slow_ns,
            });
        }
        Ok(())
    }

    /// Modelled nanoseconds for `instructions` and `misses` (DRAM, slow).
    pub fn time_ns(&self, instructions: u64, misses: [u64; 2]) -> f64 {
        instructions as f64 * self.cpi / self.ghz
            + (misses[0] as f64 * self.dram_ns + misses[1] as f64 * self.slow_ns) / self.mlp
    }

    /// The same counts with every miss served by DRAM.
    pub fn reference_ns(&self, instructions: u64, misses: [u64; 2]) -> f64 {
        self.time_ns(instructions, [misses[0] + misses[1], 0])
    }

    /// Modelled time over the all-DRAM time; None for an interval that did
    /// nothing.
    pub fn slowdown(&self, instructions: u64, misses: [u64; 2]) -> Option<f64> {
        let r = self.reference_ns(instructions, misses);
        (r > 0.0).then(|| self.time_ns(instructions, misses) / r)
    }
}

/// Nearest-rank percentile `p` (0-100) of `v`; None if empty.
pub fn percentile(v: &[f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    Some(s[rank.clamp(1, s.len()) - 1])
}

/// A policy's share of the oracle's gain over the static split, on a
/// slowdown: 1 = the oracle's, 0 = no better than static, < 0 worse. None
/// when the oracle gains nothing over static (no gain to share).
pub fn gain_share(static_: f64, policy: f64, oracle: f64) -> Option<f64> {
    let gain = static_ - oracle;
    (gain > 1e-6).then(|| (static_ - policy) / gain)
}

/// What the oracle knows of one guest.
#[derive(Debug, Clone, Default)]
pub struct Demand {
    /// LLC misses per page over the window (any order; zeros allowed).
    pub page_misses: Vec<u64>,
    /// DRAM the guest uses for anything but its pages' misses (kernel,
    /// caches), bytes: held before any of its pages is.
    pub overhead: u64,
    /// Least and most DRAM it may hold, bytes.
    pub floor: u64,
    pub ceiling: u64,
}

/// Splits `budget` bytes of DRAM between guests so that the most misses
/// land in DRAM: each starts at max(floor, overhead), then `block`s go one
/// at a time to the guest whose next block of pages (its pages ranked by
/// misses) has the most misses. Each guest's blocks have non-increasing
/// worth, so this greedy split is optimal for the window's counts. DRAM
/// no page wants is shared out a block at a time in turn (an unused block
/// costs nothing either side). Floors are honoured even above the budget.
pub fn oracle_split(demands: &[Demand], budget: u64, block: u64) -> Result<Vec<u64>, ValueError> {
    if block == 0 {
        return Err(ValueError::Block);
    }
    let per_block = (block / PAGE).max(1) as usize;
    let worth: Vec<Vec<u64>> = demands
        .iter()
        .map(|d| {
            let mut m: Vec<u64> = d.page_misses.iter().copied().filter(|&m| m > 0).collect();
            m.sort_unstable_by(|a, b| b.cmp(a));
            m.chunks(per_block).map(|c| c.iter().sum()).collect()
        })
        .collect();
    let mut alloc: Vec<u64> = demands
        .iter()
        .map(|d| d.floor.max(d.overhead).min(d.ceiling.max(d.floor)))
        .collect();
    // Blocks of pages each guest's allocation already covers.
    let mut covered: Vec<usize> = demands
        .iter()
        .zip(&alloc)
        .map(|(d, a)| (a.saturating_sub(d.overhead) / block) as usize)
        .collect();
    let mut left = budget.saturating_sub(alloc.iter().sum());
    let room = |g: usize, alloc: &[u64]| alloc[g] + block <= demands[g].ceiling;
    while left >= block {
        let best = (0..demands.len())
            .filter(|&g| room(g, &alloc))
            .filter_map(|g| worth[g].get(covered[g]).map(|&w| (g, w)))
            .filter(|&(_, w)| w > 0)
            .max_by_key(|&(g, w)| (w, std::cmp::Reverse(g)));
        let Some((g, _)) = best else { break };
        alloc[g] += block;
        covered[g] += 1;
        left -= block;
    }
    let mut g = 0;
    let mut stuck = 0;
    while left >= block && stuck < demands.len() {
        if room(g, &alloc) {
            alloc[g] += block;
            left -= block;
            stuck = 0;
        } else {
            stuck += 1;
        }
        g = (g + 1) % demands.len();
    }
    Ok(alloc)
}

/// One guest in one interval of a run, by exact counts.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    pub guest: usize,
    pub instructions: u64,
    /// LLC misses to DRAM and to the slow tier.
    pub misses: [u64; 2],
    /// Distinct pages touched on DRAM and on the slow tier.
    pub pages: [u64; 2],
    /// DRAM the guest held (its DRAM node), bytes.
    pub dram_bytes: u64,
}

/// A policy's figures over a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Guest-intervals that did anything.
    pub samples: usize,
    /// Modelled time over all-DRAM time, summed over guest-intervals: the
    /// slowdown of the guests' work as a whole, weighted by how much of it
    /// each interval did (what the oracle minimises).
    pub aggregate: f64,
    pub mean: f64,
    pub p95: f64,
    pub max: f64,
    /// Per guest: mean slowdown.
    pub per_guest: Vec<f64>,
    /// Share of touched pages that sat on the slow tier (over all
    /// guest-intervals, by page count).
    pub slow_share: f64,
    /// Mean DRAM held per guest, bytes.
    pub dram_mean: f64,
    /// DRAM plugged plus unplugged over the run, bytes.
    pub moved: u64,
}

/// Summarises `samples` of `guests` guests under `model`.
pub fn summarise(model: &CostModel, samples: &[Sample], guests: usize, moved: u64) -> Summary {
    let slow: Vec<(usize, f64)> = samples
        .iter()
        .filter_map(|s| {
            model
                .slowdown(s.instructions, s.misses)
                .map(|x| (s.guest, x))
        })
        .collect();
    let all: Vec<f64> = slow.iter().map(|&(_, x)| x).collect();
    let (time, reference) = samples.iter().fold((0.0, 0.0), |a, s| {
        (
            a.0 + model.time_ns(s.instructions, s.misses),
            a.1 + model.reference_ns(s.instructions, s.misses),
        )
    });
    let mean = |v: &[f64]| {
        if v.is_empty() {
            f64::NAN
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let per_guest = (0..guests)
        .map(|g| {
            let v: Vec<f64> = slow.iter().filter(|s| s.0 == g).map(|s| s.1).collect();
            mean(&v)
        })
        .collect();
    let (p0, p1) = samples
        .iter()
        .fold((0u64, 0u64), |a, s| (a.0 + s.pages[0], a.1 + s.pages[1]));
    let dram: Vec<f64> = samples.iter().map(|s| s.dram_bytes as f64).collect();
    Summary {
        samples: all.len(),
        aggregate: if reference > 0.0 {
            time / reference
        } else {
            f64::NAN
        },
        mean: mean(&all),
        p95: percentile(&all, 95.0).unwrap_or(f64::NAN),
        max: all.iter().copied().fold(f64::NAN, f64::max),
        per_guest,
        slow_share: if p0 + p1 > 0 {
            p1 as f64 / (p0 + p1) as f64
        } else {
            0.0
        },
        dram_mean: mean(&dram),
        moved,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn all_dram_is_no_slowdown_and_all_slow_is_the_latency_ratio_when_memory_bound() {
        let m = CostModel::default();
        assert_eq!(m.slowdown(1000, [500, 0]), Some(1.0));
        // No instructions: time is misses only, so the ratio of latencies.
        let s = m.slowdown(0, [0, 100]).unwrap();
        assert!((s - 250.0 / 80.0).abs() < 1e-12, "{s}");
        assert_eq!(m.slowdown(0, [0, 0]), None);
    }

    #[test]
    fn time_is_instructions_at_cpi_plus_misses_over_mlp() {
        let m = CostModel {
            cpi: 2.0,
            ghz: 2.0,
            dram_ns: 100.0,
            slow_ns: 300.0,
            mlp: 4.0,
        };
        // 1000 insns x 1 ns + (10 x 100 + 20 x 300) / 4.
        assert!((m.time_ns(1000, [10, 20]) - (1000.0 + 1750.0)).abs() < 1e-9);
        assert!((m.reference_ns(1000, [10, 20]) - (1000.0 + 750.0)).abs() < 1e-9);
        let s = m.slowdown(1000, [10, 20]).unwrap();
        assert!((s - 2750.0 / 1750.0).abs() < 1e-12);
    }

    #[test]
    fn parameters_are_checked() {
        assert!(CostModel::default().validate().is_ok());
        let bad = CostModel {
            mlp: 0.0,
            ..Default::default()
        };
        assert_eq!(bad.validate(), Err(ValueError::Parameter("mlp", 0.0)));
        let inv = CostModel {
            slow_ns: 50.0,
            ..Default::default()
        };
        assert!(matches!(inv.validate(), Err(ValueError::Inverted { .. })));
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 95.0), Some(95.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 50.0), Some(2.0));
        assert_eq!(percentile(&[], 95.0), None);
    }

    #[test]
    fn gain_share_is_the_fraction_of_static_to_oracle() {
        assert_eq!(gain_share(1.5, 1.5, 1.0), Some(0.0));
        assert_eq!(gain_share(1.5, 1.0, 1.0), Some(1.0));
        assert!((gain_share(1.5, 1.25, 1.0).unwrap() - 0.5).abs() < 1e-12);
        // Worse than static is negative, not clamped.
        assert!(gain_share(1.5, 1.75, 1.0).unwrap() < 0.0);
        assert_eq!(gain_share(1.2, 1.1, 1.2), None);
    }

    fn demand(pages: u64, misses: u64, overhead: u64) -> Demand {
        Demand {
            page_misses: vec![misses; pages as usize],
            overhead,
            floor: 8 * MIB,
            ceiling: 512 * MIB,
        }
    }

    #[test]
    fn oracle_gives_the_budget_to_the_pages_with_most_misses() {
        // a: 64 MiB of pages at 10 misses each, b: 64 MiB at 1; budget
        // holds floors plus 64 MiB: all of it goes to a.
        let d = [
            demand(64 * MIB / PAGE, 10, 0),
            demand(64 * MIB / PAGE, 1, 0),
        ];
        let s = oracle_split(&d, 16 * MIB + 64 * MIB, 2 * MIB).unwrap();
        // a's floor covers its first 8 MiB: it needs 56 more, b gets 8.
        assert_eq!(s, vec![64 * MIB, 16 * MIB]);
        assert_eq!(s.iter().sum::<u64>(), 80 * MIB);
    }

    #[test]
    fn oracle_counts_overhead_before_pages_and_shares_what_nobody_wants() {
        let d = [demand(4 * MIB / PAGE, 5, 32 * MIB), demand(0, 0, 0)];
        let s = oracle_split(&d, 100 * MIB, 2 * MIB).unwrap();
        // a: 32 MiB overhead + 4 MiB of pages = 36; the 56 MiB left over
        // (100 - 36 - 8) is shared in turn, 28 each.
        assert_eq!(s, vec![36 * MIB + 28 * MIB, 8 * MIB + 28 * MIB]);
    }

    #[test]
    fn oracle_honours_ceilings_floors_and_skew() {
        let mut hot = demand(128 * MIB / PAGE, 1, 0);
        hot.ceiling = 40 * MIB;
        // b has few very hot pages and many cold ones.
        let mut b = vec![100u64; (8 * MIB / PAGE) as usize];
        b.extend(vec![0u64; (64 * MIB / PAGE) as usize]);
        let bd = Demand {
            page_misses: b,
            overhead: 0,
            floor: 8 * MIB,
            ceiling: 512 * MIB,
        };
        let s = oracle_split(&[hot, bd], 64 * MIB, 2 * MIB).unwrap();
        assert_eq!(s[0], 40 * MIB, "a stops at its ceiling");
        assert_eq!(s[1], 24 * MIB);
        // Floors above the budget are kept.
        let s = oracle_split(&[demand(0, 0, 0), demand(0, 0, 0)], 4 * MIB, 2 * MIB).unwrap();
        assert_eq!(s, vec![8 * MIB, 8 * MIB]);
        assert_eq!(oracle_split(&[], 1, 0), Err(ValueError::Block));
    }

    #[test]
    fn summary_takes_slowdown_per_guest_interval_and_slow_share_by_pages() {
        let m = CostModel::default();
        let s = [
            Sample {
                guest: 0,
                instructions: 0,
                misses: [10, 0],
                pages: [30, 10],
                dram_bytes: 100,
            },
            Sample {
                guest: 1,
                instructions: 0,
                misses: [0, 10],
                pages: [0, 20],
                dram_bytes: 300,
            },
            // Idle: no slowdown sample, but its DRAM counts.
            Sample {
                guest: 1,
                instructions: 0,
                misses: [0, 0],
                pages: [0, 0],
                dram_bytes: 200,
            },
        ];
        let r = summarise(&m, &s, 2, 7);
        assert_eq!(r.samples, 2);
        // 10 misses at 80 and 10 at 250 against 20 at 80.
        assert!((r.aggregate - (800.0 + 2500.0) / 1600.0).abs() < 1e-12);
        let ratio = 250.0 / 80.0;
        assert!((r.mean - (1.0 + ratio) / 2.0).abs() < 1e-12);
        assert!((r.max - ratio).abs() < 1e-12);
        assert!((r.p95 - ratio).abs() < 1e-12);
        assert_eq!(r.per_guest.len(), 2);
        assert!((r.per_guest[1] - ratio).abs() < 1e-12);
        assert!((r.slow_share - 0.5).abs() < 1e-12);
        assert!((r.dram_mean - 200.0).abs() < 1e-12);
        assert_eq!(r.moved, 7);
    }
}
