//! tierd's controller on a simulated host of 8-1000 VMs, fed by each
//! backend's reading of the VMs at real access rates.
//!
//! The VMs, their phases and the host budget are `tier_sim`'s
//! (`fleet`), their balloons move at 1 GiB/s (`SimVm::move_balloons`).
//! What a backend reads is modelled per VM from its phase at real rates:
//! its hot set in 64 buckets (finer at the hot end) of pages with the
//! phase's per-page rates, scaled to `MISSES_PER_S` memory accesses per
//! second (the phase's relative rates; the LLC miss share of touches is
//! taken as uniform, `TOUCHES_PER_MISS`), hottest pages in DRAM as the sim
//! lays them out. Per pass of tierd's schedule each bucket's examined
//! pages are young with the probability the kernel model gives (`ept`:
//! touched by a TLB miss, TLB by Che's characteristic time over the VM's
//! pages; `hostpte`: touched at all), drawn binomially. The readings go
//! through tierd's aggregator (`feed`), the controller reads them with
//! `input::from_proto` and decides; pmu counts go through `annotate`.

use std::sync::Arc;
use std::time::Duration;

use tier_controller::policy::input::from_proto;
use tier_controller::policy::{Config, Controller, Tuning};
use tier_profiler::estimate::pass_ends;
use tier_profiler::sampler::pmu::counting::{Tally, TierReading as PmuTier};
use tier_profiler::sampler::pmu::loader::Reading;
use tier_profiler::sampler::pmu::source::{PmuReadings, annotate};
use tier_sim::fleet::{FleetSpec, fleet};
use tier_sim::guest::{Guest, SimVm};
use tier_sim::workload::Phase;

use super::feed::{Feed, ModelVm, two_tier_vm};
use super::stream::Rng;
use super::tlb::STLB_ENTRIES;

const PAGE: u64 = 4096;
/// Memory accesses (LLC misses) per second of a VM whose phase makes 1e6
/// accesses per interval; the phase's own number scales it.
pub const MISSES_PER_S: f64 = 5e7;
pub const TOUCHES_PER_MISS: f64 = 10.0;
const BUCKETS: usize = 64;
pub const EPSILON: f64 = 0.02;
pub const TARGET: f64 = 0.9;
const STEP: u64 = 1 << 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Ept,
    HostPte,
    PmuCount,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Ept => "ept",
            Backend::HostPte => "hostpte",
            Backend::PmuCount => "pmu-count",
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct FleetResult {
    pub backend: &'static str,
    pub vms: usize,
    /// Per cooperative VM and phase: intervals until it stays within
    /// epsilon of its target (converged ones).
    pub to_target: Vec<f64>,
    pub not_converged: usize,
    pub dram_moved_gib: f64,
    pub moves: usize,
    /// Moves of DRAM toward a VM already above target + epsilon, or away
    /// from one below target - epsilon (by its true ratio).
    pub wrong_moves: usize,
    /// VM-intervals within epsilon at the end of each phase, share.
    pub within_end: f64,
    /// Per cooperative VM-interval with accesses: modelled slowdown
    /// (`crate::value::CostModel`, when costed).
    pub slowdowns: Vec<f64>,
    /// Hot bytes on the slow tier and in all, summed over VM-intervals.
    pub hot_slow: f64,
    pub hot_all: f64,
    /// Modelled time and all-DRAM time summed over those VM-intervals, ns.
    pub time_ns: f64,
    pub ref_ns: f64,
    /// DRAM all VMs held, summed over costed intervals, and the budget.
    pub dram_held: f64,
    pub intervals_costed: u64,
    pub budget: u64,
}

/// Who sets the VMs' DRAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decider {
    /// tierd's controller on the backend's readings.
    Tierd,
    /// The budget split equally (capped at each VM's DRAM), fixed.
    StaticEqual,
    /// The budget split in proportion to each VM's DRAM size, fixed.
    StaticProportional,
    /// Each interval, the budget split greedily by the exact marginal
    /// accesses of the VMs' current phases (hindsight).
    Oracle,
}

impl Decider {
    pub fn name(self) -> &'static str {
        match self {
            Decider::Tierd => "tierd",
            Decider::StaticEqual => "static-equal",
            Decider::StaticProportional => "static-proportional",
            Decider::Oracle => "oracle",
        }
    }
}

/// How a VM-interval is costed: the model and instructions per access.
#[derive(Debug, Clone, Copy)]
pub struct Costing {
    pub model: crate::value::CostModel,
    pub insns_per_access: f64,
}

/// Granularity of the oracle's split.
const ORACLE_BLOCK: u64 = 64 << 20;

/// DRAM per VM for a fixed split of `budget`.
fn static_split(sims: &[SimVm], budget: u64, proportional: bool) -> Vec<u64> {
    let total: u64 = sims.iter().map(|v| v.dram_size).sum();
    sims.iter()
        .map(|v| {
            let share = if proportional {
                (budget as f64 * v.dram_size as f64 / total.max(1) as f64) as u64
            } else {
                budget / sims.len().max(1) as u64
            };
            share.min(v.dram_size) / PAGE * PAGE
        })
        .collect()
}

/// The oracle's DRAM per VM in interval `k`: blocks of the budget go one
/// at a time to the VM whose next block turns the most accesses from slow
/// into DRAM hits (each phase's share law is concave, so greedy is
/// optimal up to the block).
pub fn oracle_alloc(sims: &[SimVm], k: u64, budget: u64) -> Vec<u64> {
    use std::collections::BinaryHeap;
    let gain = |v: &SimVm, d: u64| -> f64 {
        let Some(p) = v.phase(k) else { return 0.0 };
        let total = v.dram_size + v.slow_size;
        let now = p.load(d, total - d).dram_accesses;
        let next = p.load(
            (d + ORACLE_BLOCK).min(v.dram_size),
            total - (d + ORACLE_BLOCK).min(v.dram_size),
        );
        next.dram_accesses - now
    };
    // A guest that refuses its balloon keeps all its DRAM whatever it is
    // given.
    let mut alloc: Vec<u64> = sims
        .iter()
        .map(|v| {
            if v.guest == Guest::Cooperative {
                0
            } else {
                v.dram_size
            }
        })
        .collect();
    let mut heap: BinaryHeap<(u64, usize)> = BinaryHeap::new();
    let key = |g: f64| (g.max(0.0) * 1e6) as u64;
    for (i, v) in sims.iter().enumerate() {
        if alloc[i] == 0 {
            heap.push((key(gain(v, 0)), i));
        }
    }
    let mut left = budget.saturating_sub(alloc.iter().sum());
    while let Some((g, i)) = heap.pop() {
        if g == 0 || left == 0 {
            break;
        }
        let v = &sims[i];
        let add = ORACLE_BLOCK.min(v.dram_size - alloc[i]).min(left);
        alloc[i] += add;
        left -= add;
        if alloc[i] < v.dram_size {
            heap.push((key(gain(v, alloc[i])), i));
        }
    }
    alloc
}

fn policy(budget: u64) -> Config {
    Config {
        enabled: true,
        dry_run: false,
        default_target: TARGET,
        epsilon: EPSILON,
        budget: Some(budget),
        max_step: STEP,
        cooldown_intervals: 1,
        idle_threshold: 0.5,
        vms: Default::default(),
        tuning: Tuning::default(),
        mode: Default::default(),
        working_set: Default::default(),
        reclaim: tier_controller::policy::Reclaim::OnDemand,
    }
}

/// Share of a phase's accesses to the hottest fraction `x` of its hot set
/// (the sim's law).
fn share(p: &Phase, x: f64) -> f64 {
    let x = x.clamp(0.0, 1.0);
    if p.skew > 1e-6 {
        (p.skew * x).ln_1p() / p.skew.ln_1p()
    } else {
        x
    }
}

/// Per bucket: (pages, memory accesses per page per second, tier 0/1)
/// for a VM holding `dram` and `slow` bytes in phase `p`.
fn buckets(p: &Phase, dram: u64, slow: u64) -> Vec<(f64, f64, usize)> {
    let hot_pages = (p.hot_bytes / PAGE).max(1) as f64;
    let total = MISSES_PER_S * p.accesses / 1e6;
    let xd = (dram.min(p.hot_bytes) as f64 / p.hot_bytes.max(1) as f64).min(1.0);
    let xs = (xd + slow as f64 / p.hot_bytes.max(1) as f64).min(1.0);
    let mut out = Vec::with_capacity(2 * BUCKETS + 2);
    let edge = |i: usize| (i as f64 / BUCKETS as f64).powi(2);
    for i in 0..BUCKETS {
        let (a, b) = (edge(i), edge(i + 1));
        // Split at the tier boundary and at the end of what is held.
        for (lo, hi, tier) in [(a, b.min(xd), 0), (a.max(xd), b.min(xs), 1)] {
            if hi > lo {
                let pages = (hi - lo) * hot_pages;
                let rate = total * (share(p, hi) - share(p, lo)) / pages;
                out.push((pages, rate, tier));
            }
        }
    }
    out
}

/// Che's characteristic time of the TLB over the buckets' touch rates.
fn tc(b: &[(f64, f64, usize)]) -> f64 {
    let occ = |t: f64| {
        b.iter()
            .map(|&(n, r, _)| n * -(-(r * TOUCHES_PER_MISS) * t).exp_m1())
            .sum::<f64>()
    };
    let e = STLB_ENTRIES as f64;
    if occ(1e6) <= e {
        return f64::INFINITY;
    }
    let (mut lo, mut hi) = (0.0, 1e-9);
    while occ(hi) < e {
        lo = hi;
        hi *= 2.0;
    }
    for _ in 0..50 {
        let mid = 0.5 * (lo + hi);
        if occ(mid) < e { lo = mid } else { hi = mid }
    }
    0.5 * (lo + hi)
}

/// A VM's rate buckets, its TLB's characteristic time and what it holds.
type VmState = (Vec<(f64, f64, usize)>, f64, [u64; 2]);

/// (examined, young) per tier over a pass of `t` seconds.
fn pass(
    b: &[(f64, f64, usize)],
    held: [u64; 2],
    backend: Backend,
    tc: f64,
    t: f64,
    rng: &mut Rng,
) -> [(u64, u64); 2] {
    let mut out = [
        ((held[0] / PAGE).max(1), 0u64),
        ((held[1] / PAGE).max(1), 0u64),
    ];
    for &(n, r, tier) in b {
        let touches = r * TOUCHES_PER_MISS;
        let walking = match backend {
            // Touches that miss the TLB: the previous touch is older than tc.
            Backend::Ept => touches * (-touches * tc).exp(),
            _ => touches,
        };
        let p = -(-walking * t).exp_m1();
        out[tier].1 += rng.binomial(n.round(), p) as u64;
    }
    for o in &mut out {
        o.1 = o.1.min(o.0);
    }
    out
}

/// Runs `intervals` intervals of a fleet of `vms` on `backend`.
pub fn run(backend: Backend, vms: usize, intervals: u64, phase_at: u64, seed: u64) -> FleetResult {
    run_with(
        backend,
        vms,
        intervals,
        phase_at,
        seed,
        Decider::Tierd,
        None,
    )
}

/// [`run`] with the DRAM set by `decider`, each VM-interval costed by
/// `costing` when given (the non-tierd deciders read no backend).
pub fn run_with(
    backend: Backend,
    vms: usize,
    intervals: u64,
    phase_at: u64,
    seed: u64,
    decider: Decider,
    costing: Option<Costing>,
) -> FleetResult {
    let spec = FleetSpec {
        vms,
        phase_change: Some((phase_at, 0.3)),
        uncooperative: 0.02,
        seed,
        ..Default::default()
    };
    let f = fleet(&spec);
    let mut sims: Vec<SimVm> = f.vms;
    let mut controller = Controller::new(policy(f.budget));
    let mut rng = Rng::new(seed ^ 0xf1ee7);
    let mut feed = Feed::default();
    let models: Vec<Arc<ModelVm>> = sims
        .iter()
        .map(|v| ModelVm::new(two_tier_vm(&v.id, [v.dram_size, v.slow_size])))
        .collect();
    for m in &models {
        feed.add(m.clone());
        m.set(&[(0, 0), (0, 0)]);
    }
    feed.pass(0.0);
    let ends: Vec<f64> = pass_ends(Duration::from_secs(1), 5)
        .iter()
        .map(Duration::as_secs_f64)
        .collect();
    let mut res = FleetResult {
        backend: backend.name(),
        vms,
        budget: f.budget,
        ..Default::default()
    };
    // Per VM: the last interval it was outside epsilon, per phase.
    let mut last_out = vec![[None::<u64>; 2]; sims.len()];
    let mut ever_in = vec![[false; 2]; sims.len()];
    let mut within_end = Vec::new();
    let fixed = match decider {
        Decider::StaticEqual => Some(static_split(&sims, f.budget, false)),
        Decider::StaticProportional => Some(static_split(&sims, f.budget, true)),
        _ => None,
    };
    for k in 0..intervals {
        for v in &mut sims {
            v.move_balloons(STEP);
        }
        if decider != Decider::Tierd {
            let alloc = fixed
                .clone()
                .unwrap_or_else(|| oracle_alloc(&sims, k, f.budget));
            for (v, a) in sims.iter_mut().zip(alloc) {
                let before = v.dram.target;
                v.dram.target = v.dram_size - a;
                if before != v.dram.target && k > 0 {
                    res.moves += 1;
                    res.dram_moved_gib +=
                        before.abs_diff(v.dram.target) as f64 / (1u64 << 30) as f64;
                }
            }
            cost(&sims, k, costing, &mut res);
            continue;
        }
        let state: Vec<VmState> = sims
            .iter()
            .map(|v| {
                let (d, s) = v.held();
                let b = v.phase(k).map_or_else(Vec::new, |p| buckets(p, d, s));
                let t = tc(&b);
                (b, t, [d, s])
            })
            .collect();
        let t0 = k as f64;
        let mut prev = 0.0;
        for (j, e) in ends.iter().enumerate() {
            let len = e - prev;
            prev = *e;
            for (m, (b, t, held)) in models.iter().zip(&state) {
                let r = pass(b, *held, backend, *t, len, &mut rng);
                m.set(&r);
            }
            if j + 1 < ends.len() {
                feed.pass(t0 + e);
            }
        }
        for (m, v) in models.iter().zip(&sims) {
            m.set_balloon(vec![
                (v.dram.target, v.dram.actual),
                (v.slow.target, v.slow.actual),
            ]);
        }
        let mut update = feed.tick(t0 + 1.0, 1.0);
        if backend == Backend::PmuCount {
            let mut pr = PmuReadings::default();
            for (v, (b, _, _)) in sims.iter().zip(&state) {
                let mut per = [0.0f64; 2];
                for &(n, r, tier) in b {
                    per[tier] += n * r;
                }
                // Two of four events on counters at a time: half the time,
                // counts drawn for that half, scaled back by Tally.
                let tiers = per
                    .iter()
                    .map(|&c| {
                        let mut t = Tally::default();
                        t.add(Reading {
                            count: rng.binomial(c.round(), 0.5) as u64,
                            enabled_ns: 1_000_000_000,
                            running_ns: 500_000_000,
                        });
                        PmuTier::from_tally(t)
                    })
                    .collect();
                pr.per_vm.insert(v.id.clone(), tiers);
                pr.fast.insert(v.id.clone(), vec![true, false]);
            }
            annotate(&mut update, &pr);
        }
        let obs: Vec<_> = models
            .iter()
            .filter_map(|m| {
                use tier_profiler::registry::TrackedVm;
                let s = update.stats.iter().find(|s| s.vm_id == m.vm().id)?;
                from_proto(m.vm(), s).ok()
            })
            .collect();
        let plan = controller.decide(&obs, k * 1_000_000_000);
        cost(&sims, k, costing, &mut res);
        let ph = usize::from(k >= phase_at);
        for (i, (v, t)) in sims.iter_mut().zip(&plan.targets).enumerate() {
            let truth = v.load(k).ratio();
            let given_before = v.dram_size.saturating_sub(v.dram.target);
            let given_after = v.dram_size.saturating_sub(t.dram);
            if given_after != given_before {
                res.moves += 1;
                res.dram_moved_gib +=
                    given_after.abs_diff(given_before) as f64 / (1u64 << 30) as f64;
                if let Some(r) = truth {
                    let more = given_after > given_before;
                    if (more && r > TARGET + EPSILON) || (!more && r < TARGET - EPSILON) {
                        res.wrong_moves += 1;
                    }
                }
            }
            v.dram.target = t.dram;
            v.slow.target = t.slow;
            if v.guest == Guest::Cooperative {
                let inside = truth.is_some_and(|r| (r - TARGET).abs() <= EPSILON);
                if inside {
                    ever_in[i][ph] = true;
                } else {
                    last_out[i][ph] = Some(k);
                }
                let end = k + 1 == phase_at || k + 1 == intervals;
                if end {
                    within_end.push(f64::from(u8::from(inside)));
                }
            }
        }
    }
    for (i, v) in sims.iter().enumerate() {
        if v.guest != Guest::Cooperative {
            continue;
        }
        for (ph, start) in [(0usize, 0u64), (1, phase_at)] {
            match last_out[i][ph] {
                None => res.to_target.push(0.0),
                Some(k) if k + 1 < if ph == 0 { phase_at } else { intervals } => {
                    res.to_target.push((k + 1 - start) as f64);
                }
                Some(_) => res.not_converged += 1,
            }
        }
    }
    res.within_end = within_end.iter().sum::<f64>() / within_end.len().max(1) as f64;
    res
}

/// Costs interval `k` of every cooperative VM as it is held now.
fn cost(sims: &[SimVm], k: u64, costing: Option<Costing>, res: &mut FleetResult) {
    let Some(c) = costing else { return };
    res.dram_held += sims.iter().map(|v| v.held().0 as f64).sum::<f64>();
    res.intervals_costed += 1;
    for v in sims.iter().filter(|v| v.guest == Guest::Cooperative) {
        let l = v.load(k);
        let insns = (l.dram_accesses + l.slow_accesses) * c.insns_per_access;
        let m = [
            l.dram_accesses.round() as u64,
            l.slow_accesses.round() as u64,
        ];
        if let Some(x) = c.model.slowdown(insns.round() as u64, m) {
            res.slowdowns.push(x);
            res.time_ns += c.model.time_ns(insns.round() as u64, m);
            res.ref_ns += c.model.reference_ns(insns.round() as u64, m);
        }
        res.hot_slow += l.slow_hot as f64;
        res.hot_all += (l.dram_hot + l.slow_hot) as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sims() -> (Vec<SimVm>, u64) {
        let f = fleet(&FleetSpec {
            vms: 16,
            uncooperative: 0.2,
            seed: 7,
            ..Default::default()
        });
        (f.vms, f.budget)
    }

    #[test]
    fn static_splits_stay_within_budget_and_size() {
        let (s, budget) = sims();
        for prop in [false, true] {
            let a = static_split(&s, budget, prop);
            assert!(a.iter().sum::<u64>() <= budget);
            assert!(a.iter().zip(&s).all(|(a, v)| *a <= v.dram_size));
        }
        let eq = static_split(&s, budget, false);
        let cap = budget / s.len() as u64 / PAGE * PAGE;
        assert!(eq.iter().zip(&s).all(|(a, v)| *a == cap.min(v.dram_size)));
    }

    #[test]
    fn oracle_fills_the_budget_by_gain_and_keeps_refusers_whole() {
        let (s, budget) = sims();
        let a = oracle_alloc(&s, 0, budget);
        assert!(a.iter().sum::<u64>() <= budget);
        for (a, v) in a.iter().zip(&s) {
            assert!(*a <= v.dram_size);
            if v.guest != Guest::Cooperative {
                assert_eq!(*a, v.dram_size);
            }
        }
        // More DRAM at the oracle's split moves no fewer accesses into
        // DRAM than an equal one of the same budget.
        let hits = |alloc: &[u64]| -> f64 {
            s.iter()
                .zip(alloc)
                .map(|(v, &d)| {
                    let p = v.phase(0).expect("a first phase");
                    p.load(d, v.dram_size + v.slow_size - d).dram_accesses
                })
                .sum()
        };
        let eq = static_split(&s, budget, false);
        assert!(hits(&a) >= hits(&eq) - 1e-6, "{} < {}", hits(&a), hits(&eq));
    }
}
