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

/// Modelled time over all-DRAM time of all guests together, per second
/// of a run: `(t, sample)` grouped by `t` rounded to the second; seconds
/// with no work are left out.
pub fn per_second(model: &CostModel, ticks: &[(f64, Sample)]) -> Vec<f64> {
    let mut by: std::collections::BTreeMap<i64, (f64, f64)> = std::collections::BTreeMap::new();
    for (t, s) in ticks {
        let e = by.entry(t.round() as i64).or_default();
        e.0 += model.time_ns(s.instructions, s.misses);
        e.1 += model.reference_ns(s.instructions, s.misses);
    }
    by.values()
        .filter(|v| v.1 > 0.0)
        .map(|v| v.0 / v.1)
        .collect()
}

/// The cloud-hypervisor test guests (docs/value.md, "The cloud-hypervisor
/// test guests"): their schedule, how their exact per-tier counts are
/// costed, and what the oracle knows of them.
pub mod ch {
    use super::{Demand, PAGE, Sample};

    /// One test guest of the schedule: its hot set (hot set 0, which
    /// prefers the DRAM tier) and the pages of it each phase touches.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct GuestPlan {
        pub name: &'static str,
        /// Pages of the hot set.
        pub hot: u32,
        /// Pages touched before and after the phase change (its first ones).
        pub active: [u32; 2],
    }

    /// The schedule, on the guests' own clocks (seconds since their
    /// workload started): `settle_s` for the guests to reach the starting
    /// split (unrecorded), then `phase_s` recorded before a's hot set grows
    /// past its DRAM and b's shrinks, then `after_s`; c idles (a hot set of
    /// `idle` pages) all along.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Schedule {
        pub settle_s: u64,
        pub phase_s: u64,
        pub after_s: u64,
        /// The large hot set, pages (a's after the change, b's before).
        pub big: u32,
        /// The small one (a's before, b's after).
        pub small: u32,
        /// The idle guest's.
        pub idle: u32,
    }

    impl Default for Schedule {
        fn default() -> Self {
            // 6000 pages (23.4 MiB) of a 32 MiB DRAM zone; 1500 (5.9 MiB).
            Schedule {
                settle_s: 20,
                phase_s: 40,
                after_s: 60,
                big: 6000,
                small: 1500,
                idle: 64,
            }
        }
    }

    impl Schedule {
        /// The guests in sample order: a grows, b shrinks, c idles.
        pub fn guests(&self) -> [GuestPlan; 3] {
            [
                GuestPlan {
                    name: "a",
                    hot: self.big,
                    active: [self.small, self.big],
                },
                GuestPlan {
                    name: "b",
                    hot: self.big,
                    active: [self.big, self.small],
                },
                GuestPlan {
                    name: "c",
                    hot: self.idle,
                    active: [self.idle, self.idle],
                },
            ]
        }

        /// Pages the guest's workload touches in `phase` (0 or 1; later
        /// phases as 1).
        pub fn active(&self, guest: usize, phase: u64) -> Option<u32> {
            let g = self.guests().get(guest).copied()?;
            Some(g.active[usize::from(phase > 0)])
        }

        /// The guest's command line (docs/testguest.md): one hot set, all
        /// of it DRAM-preferring, touched uniformly; a tick line a second.
        pub fn cmdline(&self, guest: usize) -> Option<String> {
            let g = self.guests().get(guest).copied()?;
            Some(format!(
                "hot={} phases=100@{}s:{},100@0:{} report=1s",
                g.hot,
                self.settle_s + self.phase_s,
                g.active[0],
                g.active[1]
            ))
        }

        /// Whether the guest-second ending at `s` of the guest's clock is
        /// recorded: after the settling, up to the end of the watch.
        pub fn recorded(&self, s: u64) -> bool {
            s > self.settle_s && s <= self.end_s()
        }

        /// The guest second the run ends at.
        pub fn end_s(&self) -> u64 {
            self.settle_s + self.phase_s + self.after_s
        }
    }

    /// One guest-interval of a test guest, costed as the fleet is: each
    /// access an LLC miss to the tier its page is on (`acc`: DRAM, slow),
    /// `insns_per_miss` instructions per access; `res` the workload's pages
    /// resident on each tier, `dram_bytes` the DRAM the guest held.
    pub fn sample(
        guest: usize,
        acc: [u64; 2],
        res: [u64; 2],
        insns_per_miss: f64,
        dram_bytes: u64,
    ) -> Sample {
        Sample {
            guest,
            instructions: (insns_per_miss.max(0.0) * (acc[0] + acc[1]) as f64).round() as u64,
            misses: acc,
            pages: res,
            dram_bytes,
        }
    }

    /// `now - before` per tier; a counter that went back (a restarted
    /// guest) counts from 0.
    pub fn delta(now: &[u64], before: &[u64]) -> [u64; 2] {
        let at = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
        std::array::from_fn(|i| {
            let (n, b) = (at(now, i), at(before, i));
            if n >= b { n - b } else { n }
        })
    }

    /// What the oracle knows of a test guest: its hot set's `active` pages
    /// (the schedule's), touched uniformly, shared the window's `accesses`
    /// (the exact count over both tiers); `overhead` the guest's own pages
    /// in its DRAM zone.
    pub fn demand(active: u32, accesses: u64, overhead: u64, floor: u64, ceiling: u64) -> Demand {
        let n = u64::from(active);
        let page_misses = (0..n)
            .map(|k| accesses / n + u64::from(k < accesses % n))
            .collect();
        Demand {
            page_misses,
            overhead,
            floor,
            ceiling,
        }
    }

    /// The balloon targets (bytes ballooned out of each DRAM zone of
    /// `zone` bytes) that leave each guest the DRAM of `split`, and the
    /// order to set them in: guests that give DRAM up first, so that the
    /// DRAM held never sums above the budget on the way.
    pub fn balloon_plan(split: &[u64], held: &[u64], zone: u64) -> Vec<(usize, u64)> {
        let mut order: Vec<usize> = (0..split.len()).collect();
        order.sort_by_key(|&g| (split[g] >= held.get(g).copied().unwrap_or(0), g));
        order
            .into_iter()
            .map(|g| (g, zone.saturating_sub(split[g].min(zone))))
            .collect()
    }

    /// Pages of `bytes`, rounded down.
    pub fn pages(bytes: u64) -> u64 {
        bytes / PAGE
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

    #[test]
    fn per_second_sums_the_guests_of_each_second() {
        let m = CostModel::default();
        let s = |guest, misses| Sample {
            guest,
            misses,
            ..Default::default()
        };
        let v = per_second(
            &m,
            &[
                (1.0, s(0, [10, 0])),
                (1.2, s(1, [0, 10])),
                (2.0, s(0, [0, 0])),
                (3.0, s(1, [0, 4])),
            ],
        );
        // Second 1: (800 + 2500) / 1600; second 2 did nothing.
        assert_eq!(v.len(), 2);
        assert!((v[0] - 3300.0 / 1600.0).abs() < 1e-12);
        assert!((v[1] - 250.0 / 80.0).abs() < 1e-12);
    }

    #[test]
    fn ch_schedule_grows_a_shrinks_b_and_idles_c() {
        let s = ch::Schedule::default();
        let g = s.guests();
        assert_eq!(g.map(|g| g.name), ["a", "b", "c"]);
        assert_eq!(s.active(0, 0), Some(1500));
        assert_eq!(s.active(0, 1), Some(6000));
        assert_eq!(s.active(1, 0), Some(6000));
        assert_eq!(s.active(1, 3), Some(1500));
        assert_eq!(s.active(2, 1), Some(64));
        assert_eq!(s.active(3, 0), None);
        assert_eq!(
            s.cmdline(0).unwrap(),
            "hot=6000 phases=100@60s:1500,100@0:6000 report=1s"
        );
        assert!(!s.recorded(20) && s.recorded(21) && s.recorded(120) && !s.recorded(121));
        assert_eq!(s.end_s(), 120);
        // The guest's own parser takes every line.
        for i in 0..3 {
            let line = s.cmdline(i).unwrap();
            tier_testguest::params::Params::parse(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
        }
    }

    #[test]
    fn ch_accesses_are_misses_and_instructions_scale_with_them() {
        let s = ch::sample(2, [300, 100], [50, 10], 2.5, 7);
        assert_eq!(s.guest, 2);
        assert_eq!(s.misses, [300, 100]);
        assert_eq!(s.instructions, 1000);
        assert_eq!(s.pages, [50, 10]);
        assert_eq!(s.dram_bytes, 7);
        // All on DRAM: no slowdown; all on slow with no instructions: the
        // latency ratio.
        let m = CostModel::default();
        assert_eq!(
            m.slowdown(ch::sample(0, [10, 0], [1, 0], 2.8, 0).instructions, [10, 0]),
            Some(1.0)
        );
        let x = ch::sample(0, [0, 10], [0, 1], 0.0, 0);
        assert!((m.slowdown(x.instructions, x.misses).unwrap() - 250.0 / 80.0).abs() < 1e-12);
        assert_eq!(ch::delta(&[10, 20], &[4, 5]), [6, 15]);
        // A counter that went back counts from 0; a missing tier is 0.
        assert_eq!(ch::delta(&[3, 20], &[4, 5]), [3, 15]);
        assert_eq!(ch::delta(&[7], &[]), [7, 0]);
    }

    #[test]
    fn ch_oracle_favours_the_hotter_pages_of_a_smaller_set() {
        // After the change: a touches 6000 pages, b 1500, c 64, at equal
        // rates; 1.5 MiB of each zone is the guest's own.
        let over = 1536 * 1024;
        let d: Vec<Demand> = [(6000, 30_000), (1500, 30_000), (64, 30_000)]
            .iter()
            .map(|&(p, a)| ch::demand(p, a, over, 4 * MIB, 32 * MIB))
            .collect();
        assert_eq!(d[1].page_misses.len(), 1500);
        assert_eq!(d[1].page_misses.iter().sum::<u64>(), 30_000);
        let s = oracle_split(&d, 30 * MIB, MIB).unwrap();
        assert_eq!(s.iter().sum::<u64>(), 30 * MIB);
        // c needs less than its floor, b its whole set, a the rest.
        assert_eq!(s[2], 4 * MIB);
        assert!(s[1] >= over + 1500 * PAGE, "{s:?}");
        assert!(s[1] < over + 1500 * PAGE + 2 * MIB, "{s:?}");
        assert_eq!(s[0], 30 * MIB - s[1] - s[2]);
        // Uneven shares of accesses still sum exactly.
        let u = ch::demand(3, 10, 0, 0, 0);
        assert_eq!(u.page_misses, vec![4, 3, 3]);
    }

    #[test]
    fn ch_balloon_plan_gives_up_dram_before_taking_it() {
        let zone = 32 * MIB;
        // a grows 10 -> 18, b shrinks 10 -> 8, c 10 -> 4.
        let plan = ch::balloon_plan(&[18 * MIB, 8 * MIB, 4 * MIB], &[10 * MIB; 3], zone);
        assert_eq!(plan, vec![(1, 24 * MIB), (2, 28 * MIB), (0, 14 * MIB)]);
        // Never a negative balloon.
        assert_eq!(ch::balloon_plan(&[40 * MIB], &[0], zone), vec![(0, 0)]);
        assert_eq!(ch::pages(MIB), 256);
    }
}
