//! One workload through every backend: the stream is simulated once, and
//! every access goes through the LLC, the TLBs and each backend's model;
//! at each pass end of tierd's schedule the backends' readings go through
//! tierd's aggregator (`feed`), and each interval is scored against the
//! truth of the same accesses.

use std::sync::Arc;
use std::time::Duration;

use tier_profiler::estimate::pass_ends;
use tier_proto::v1::VmStats;

use super::ept::EptBits;
use super::ept_ages::{AgeRec, Ages, HORIZONS};
use super::feed::{Feed, ModelVm, annotate_pmu, two_tier_vm};
use super::hostpte::HostPteBits;
use super::llc::Cache;
use super::pmu::{Pmu, PmuConfig};
use super::stream::{Alias, Phase, Rng, Trace, sample_pages};
use super::tlb::{STLB_ENTRIES, STLB_WAYS, Tlb, characteristic_time};
use super::{BACKENDS, PAGE_BACKENDS};

const PAGE: u64 = 4096;

/// Where the DRAM tier's pages are: a share of the pages at random, or
/// the hottest share (what tiering aims for).
#[derive(Debug, Clone, Copy)]
pub enum Placement {
    Random(f64),
    Head(f64),
}

#[derive(Debug, Clone)]
pub enum Source {
    Synthetic {
        ws_pages: u64,
        rate: f64,
        phases: Vec<Phase>,
    },
    Trace {
        name: String,
        trace: Arc<Trace>,
        rate: f64,
    },
}

#[derive(Debug, Clone)]
pub struct Workload {
    pub name: String,
    pub source: Source,
    pub placement: Placement,
    /// Overrides `Config::max_rate` (a workload simulated whole).
    pub max_rate: Option<f64>,
}

#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub seed: u64,
    pub intervals: usize,
    pub passes: u32,
    pub llc_bytes: u64,
    pub llc_ways: usize,
    pub stride: usize,
    /// Most simulated touches per simulated second (sets the sample).
    pub max_rate: f64,
    /// Fewest simulated pages (overrides `max_rate`).
    pub min_pages: u64,
    pub pmu: PmuConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            seed: 1,
            intervals: 65,
            passes: 5,
            llc_bytes: 32 << 20,
            llc_ways: 16,
            stride: 1,
            max_rate: 4e5,
            min_pages: 2048,
            pmu: PmuConfig::default(),
        }
    }
}

/// What one backend read in one interval.
#[derive(Debug, Clone, Copy, Default)]
pub struct Est {
    pub point: Option<f64>,
    pub low: Option<f64>,
    pub high: Option<f64>,
    pub open: bool,
}

/// One scored interval.
#[derive(Debug, Clone)]
pub struct IntervalRec {
    pub end_s: f64,
    /// DRAM share of LLC misses (what the tiers serve) and of all touches.
    pub truth_mem: Option<f64>,
    pub truth_all: Option<f64>,
    pub est: [Est; 5],
    /// LLC misses and touches per second (real scale).
    pub misses: f64,
    pub touches: f64,
}

/// Hot set over a window ending at `end_s`: pages, real scale.
#[derive(Debug, Clone, Copy)]
pub struct HotRec {
    pub window_s: f64,
    pub truth: f64,
    pub read: [f64; PAGE_BACKENDS],
}

#[derive(Debug, Clone)]
pub struct Outcome {
    pub workload: String,
    pub ws_bytes: u64,
    pub rate: f64,
    pub fraction: f64,
    pub sim_pages: usize,
    pub intervals: Vec<IntervalRec>,
    pub hot: Vec<HotRec>,
    /// Working set per tier and horizon through tierd's ages code (ept,
    /// ept+flush), from the first interval each horizon was watched.
    pub ages: Vec<AgeRec>,
    pub llc_hit: f64,
    /// PMU overflow samples per second (real scale), sampling mode.
    pub pmu_samples_per_s: f64,
    /// hostpte refaults per second (real scale).
    pub refaults_per_s: f64,
    pub sim_touches: u64,
}

fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn unit_hash(x: u64, seed: u64) -> f64 {
    (mix(x ^ seed.rotate_left(17)) >> 11) as f64 / (1u64 << 53) as f64
}

/// Tier per simulated page (0 DRAM, 1 slow), by placement over `heat`.
fn place(placement: Placement, real: &[u64], heat: &[f64], seed: u64) -> Vec<u8> {
    match placement {
        Placement::Random(share) => real
            .iter()
            .map(|&p| u8::from(unit_hash(p, seed) >= share))
            .collect(),
        Placement::Head(share) => {
            let mut order: Vec<usize> = (0..real.len()).collect();
            order.sort_by(|&a, &b| heat[b].total_cmp(&heat[a]).then(a.cmp(&b)));
            let head = (real.len() as f64 * share).round() as usize;
            let mut tier = vec![1u8; real.len()];
            for &i in &order[..head.min(real.len())] {
                tier[i] = 0;
            }
            tier
        }
    }
}

/// Everything that sees the stream.
struct Machine {
    llc: Cache,
    ept: EptBits,
    ept_flush: EptBits,
    host: HostPteBits,
    pmu: Pmu,
    tier_of: Vec<u8>,
    /// Real pages per simulated page.
    scale: f64,
    last_touch: Vec<f64>,
    touches: [f64; 2],
    misses: [f64; 2],
}

impl Machine {
    /// `lines` consecutive lines of page `p` (real page `real`) from `line`.
    fn access(&mut self, p: u32, real: u64, line: u8, lines: u32, count: u32, now: f64) {
        let tier = self.tier_of[p as usize] as usize;
        self.touches[tier] += f64::from(count);
        self.last_touch[p as usize] = now;
        self.ept.touch(p, now);
        self.ept_flush.touch(p, now);
        self.host.touch(p);
        for i in 0..lines {
            let l = (u64::from(line) + u64::from(i)) & 63;
            if !self.llc.access((real << 6) | l) {
                self.misses[tier] += 1.0;
                self.pmu.miss(tier, now, self.scale);
            }
        }
    }
}

/// The model VMs of one workload, in `BACKENDS` order.
struct Vms {
    vms: Vec<Arc<ModelVm>>,
    feed: Feed,
}

fn stats_of<'a>(u: &'a tier_proto::v1::StatsUpdate, id: &str) -> Option<&'a VmStats> {
    u.stats.iter().find(|s| s.vm_id == id)
}

fn est_of(s: Option<&VmStats>, counted: bool) -> Est {
    let Some(s) = s else {
        return Est::default();
    };
    if counted {
        return Est {
            point: s.counted_dram_hit_ratio,
            low: s.counted_dram_hit_ratio,
            high: s.counted_dram_hit_ratio,
            open: false,
        };
    }
    Est {
        point: s.has_accesses.then_some(s.dram_hit_ratio),
        low: s.dram_hit_low,
        high: s.dram_hit_high,
        open: s.dram_hit_low_open || s.dram_hit_high_open,
    }
}

fn ratio(d: f64, s: f64) -> Option<f64> {
    (d + s > 0.0).then(|| d / (d + s))
}

/// Runs `w` under `cfg`.
pub fn run(w: &Workload, cfg: &Config) -> Outcome {
    let mut rng =
        Rng::new(cfg.seed ^ mix(w.name.len() as u64 + w.name.bytes().map(u64::from).sum::<u64>()));
    // The simulated pages, their real page numbers and heat.
    let (real, heat, fraction, rate, sim_rates) = match &w.source {
        Source::Synthetic {
            ws_pages,
            rate,
            phases,
        } => {
            let max_rate = w.max_rate.unwrap_or(cfg.max_rate);
            let want = ((*ws_pages as f64) * (max_rate / rate).min(1.0)).ceil() as u64;
            let s = sample_pages(*ws_pages, want.max(cfg.min_pages), phases, *rate, &mut rng);
            let heat = s.rates[0].clone();
            (s.real, heat, s.fraction, *rate, Some(s.rates))
        }
        Source::Trace { trace, rate, .. } => {
            let f = (w.max_rate.unwrap_or(cfg.max_rate) / rate)
                .min(1.0)
                .max(cfg.min_pages as f64 / f64::from(trace.pages))
                .min(1.0);
            let real: Vec<u64> = (0..u64::from(trace.pages))
                .filter(|&p| unit_hash(p, cfg.seed ^ 0x7ace) < f)
                .collect();
            let mut heat = vec![0.0; trace.pages as usize];
            for r in &trace.runs {
                heat[r.page as usize] += f64::from(r.count);
            }
            let heat = real.iter().map(|&p| heat[p as usize]).collect();
            let fraction = real.len() as f64 / f64::from(trace.pages);
            (real, heat, fraction, *rate, None)
        }
    };
    let n = real.len();
    let scale = 1.0 / fraction;
    let tier_of = place(w.placement, &real, &heat, cfg.seed);
    let tlb = match &sim_rates {
        Some(r) => Tlb::che(characteristic_time(&r[0], fraction, STLB_ENTRIES), n),
        None => Tlb::sets(
            ((STLB_ENTRIES as f64 * fraction).round() as usize).max(STLB_WAYS),
            STLB_WAYS,
        ),
    };
    let mut m = Machine {
        llc: Cache::scaled(cfg.llc_bytes, 64, cfg.llc_ways, fraction),
        ept: EptBits::new(n, tlb.clone(), cfg.stride, false),
        ept_flush: EptBits::new(n, tlb, cfg.stride, true),
        host: HostPteBits::new(n),
        pmu: Pmu::new(cfg.pmu, 2, 0.0),
        tier_of,
        scale,
        last_touch: vec![f64::NEG_INFINITY; n],
        touches: [0.0; 2],
        misses: [0.0; 2],
    };
    // tierd's model VMs: real tier sizes.
    let pages_in = |t: u8| m.tier_of.iter().filter(|&&x| x == t).count() as f64 * scale;
    let sizes = [
        ((pages_in(0) as u64).max(1)) * PAGE,
        ((pages_in(1) as u64).max(1)) * PAGE,
    ];
    // The ages' populations, as the truth counts them (not whole pages).
    let population = [pages_in(0), pages_in(1)];
    let mut vms = Vms {
        vms: BACKENDS
            .iter()
            .map(|b| ModelVm::new(two_tier_vm(b, sizes)))
            .collect(),
        feed: Feed::default(),
    };
    for v in &vms.vms {
        vms.feed.add(v.clone());
    }
    let ends: Vec<f64> = pass_ends(Duration::from_secs(1), cfg.passes)
        .iter()
        .map(Duration::as_secs_f64)
        .collect();
    // The arming pass: examines nothing, clears the fault-time bits.
    let tiers = 2;
    m.ept.age(&m.tier_of, tiers, 0.0);
    m.ept_flush.age(&m.tier_of, tiers, 0.0);
    // The ageing at 0 arms the bits: what it found young was touched
    // before the run, so the first pass Ages sees starts there.
    let mut ages = [
        Ages::new(&m.ept, &m.tier_of, tiers),
        Ages::new(&m.ept_flush, &m.tier_of, tiers),
    ];
    m.host.age(&m.tier_of, tiers, 0.0);
    for v in &vms.vms {
        v.set(&[(0, 0), (0, 0)]);
    }
    vms.feed.pass(0.0);

    let mut out = Outcome {
        workload: w.name.clone(),
        ws_bytes: ((n as f64 * scale) as u64) * PAGE,
        rate,
        fraction,
        sim_pages: n,
        intervals: Vec::new(),
        hot: Vec::new(),
        ages: Vec::new(),
        llc_hit: 0.0,
        pmu_samples_per_s: 0.0,
        refaults_per_s: 0.0,
        sim_touches: 0,
    };
    // Stream state.
    let mut phase = 0usize;
    let mut alias = sim_rates.as_ref().map(|r| Alias::new(&r[0]));
    let mut total = sim_rates.as_ref().map_or(0.0, |r| r[0].iter().sum::<f64>());
    let mut next_t = if total > 0.0 {
        rng.exp(total)
    } else {
        f64::INFINITY
    };
    // Trace state: runs of sampled pages with their start times.
    let (runs, loop_s) = match &w.source {
        Source::Trace { trace, rate, .. } => {
            let index: std::collections::HashMap<u64, u32> = real
                .iter()
                .enumerate()
                .map(|(i, &p)| (p, i as u32))
                .collect();
            let mut at = 0u64;
            let mut v = Vec::new();
            for r in &trace.runs {
                if let Some(&i) = index.get(&u64::from(r.page)) {
                    v.push((i, r.line, r.count, at as f64 / rate));
                }
                at += u64::from(r.count);
            }
            (v, trace.accesses as f64 / rate)
        }
        Source::Synthetic { .. } => (Vec::new(), 0.0),
    };
    let (mut run_i, mut loop_k) = (0usize, 0u64);
    for k in 0..cfg.intervals {
        let (t0, misses0, touches0) = (k as f64, m.misses, m.touches);
        for (j, e) in ends.iter().enumerate() {
            let tend = t0 + e;
            if let (Some(rates), Source::Synthetic { phases, .. }) = (&sim_rates, &w.source) {
                loop {
                    // A phase change re-ranks the pages.
                    let change = phases.get(phase + 1).map_or(f64::INFINITY, |p| p.at_s);
                    let stop = tend.min(change);
                    while next_t < stop {
                        let Some(a) = alias.as_ref() else { break };
                        let p = a.draw(&mut rng) as u32;
                        let line = rng.below(64) as u8;
                        m.access(p, real[p as usize], line, 1, 1, next_t);
                        out.sim_touches += 1;
                        next_t += rng.exp(total);
                    }
                    if change > tend {
                        break;
                    }
                    phase += 1;
                    alias = Some(Alias::new(&rates[phase]));
                    total = rates[phase].iter().sum();
                    let tc = characteristic_time(&rates[phase], fraction, STLB_ENTRIES);
                    m.ept.tlb.set_tc(tc);
                    m.ept_flush.tlb.set_tc(tc);
                    next_t = change + rng.exp(total);
                }
            } else if !runs.is_empty() {
                loop {
                    let (p, line, count, off) = runs[run_i];
                    let t = loop_k as f64 * loop_s + off;
                    if t >= tend {
                        break;
                    }
                    // Accesses of a run walk the page's lines (8-byte
                    // accesses, 4 to a line on average).
                    let lines = (1 + (count - 1) / 4).min(64);
                    m.access(p, real[p as usize], line, lines, count, t);
                    out.sim_touches += u64::from(count);
                    run_i += 1;
                    if run_i == runs.len() {
                        run_i = 0;
                        loop_k += 1;
                    }
                }
            }
            let r_ept = m.ept.age(&m.tier_of, tiers, tend);
            let r_flush = m.ept_flush.age(&m.tier_of, tiers, tend);
            ages[0].observe(&m.ept, tend);
            ages[1].observe(&m.ept_flush, tend);
            let r_host = m.host.age(&m.tier_of, tiers, tend);
            for (i, v) in vms.vms.iter().enumerate() {
                v.set(match i {
                    1 => &r_flush,
                    2 => &r_host,
                    _ => &r_ept,
                });
            }
            if j + 1 < ends.len() {
                vms.feed.pass(tend);
            }
        }
        let t1 = t0 + 1.0;
        let mut update = vms.feed.tick(t1, 1.0);
        let (count, sample) = m.pmu.read(t1);
        annotate_pmu(&mut update, BACKENDS[3], &count, 1.0);
        annotate_pmu(&mut update, BACKENDS[4], &sample, 1.0);
        let dm = [m.misses[0] - misses0[0], m.misses[1] - misses0[1]];
        let dt = [m.touches[0] - touches0[0], m.touches[1] - touches0[1]];
        let mut est = [Est::default(); 5];
        for (i, b) in BACKENDS.iter().enumerate() {
            est[i] = est_of(stats_of(&update, b), i >= PAGE_BACKENDS);
        }
        out.intervals.push(IntervalRec {
            end_s: t1,
            truth_mem: ratio(dm[0], dm[1]),
            truth_all: ratio(dt[0], dt[1]),
            est,
            misses: (dm[0] + dm[1]) * scale,
            touches: (dt[0] + dt[1]) * scale,
        });
        let read = [ages[0].read(&population), ages[1].read(&population)];
        for (j, &h) in HORIZONS.iter().enumerate() {
            let tr = super::ept_ages::truth(&m.last_touch, &m.tier_of, tiers, t1 - h, scale);
            for (tier, &truth) in tr.iter().enumerate() {
                let est = [read[0][tier][j], read[1][tier][j]];
                if est.iter().any(Option::is_some) {
                    out.ages.push(AgeRec {
                        horizon: h,
                        tier,
                        truth,
                        est,
                        full: population[tier],
                    });
                }
            }
        }
        for wnd in [1.0, 10.0, 60.0] {
            if t1 + 1e-9 < wnd {
                continue;
            }
            let since = t1 - wnd;
            let truth = m.last_touch.iter().filter(|&&t| t > since).count() as f64 * scale;
            let per = |x: u64, stride: usize| x as f64 * stride as f64 * scale;
            out.hot.push(HotRec {
                window_s: wnd,
                truth,
                read: [
                    per(m.ept.young_since(since), m.ept.stride),
                    per(m.ept_flush.young_since(since), m.ept_flush.stride),
                    per(m.host.young_since(since), 1),
                ],
            });
        }
    }
    let secs = cfg.intervals as f64;
    out.llc_hit = m.llc.hit_ratio();
    out.pmu_samples_per_s = m.pmu.samples_total as f64 / secs;
    out.refaults_per_s = m.host.refaults as f64 * scale / secs;
    out
}
