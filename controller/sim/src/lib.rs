//! tier-sim: a trace-driven simulator around tier-controller's real decision
//! function, for the controller's tests (controller/tests/) and the benches
//! (`cargo xtask bench controller`, the twin, the value bench); tierd does
//! not link it. Simulated VMs produce each interval's per-tier accesses
//! from the DRAM they hold (`workload`), the controller decides, and the
//! simulated balloons move toward the new targets at a fixed speed
//! (`guest`). Each interval:
//!
//! 1. balloons move toward the targets of the previous decision, at the
//!    balloon speed from the start of the interval;
//! 2. each VM's load follows from what it holds (its phase for the
//!    interval); host samples are the load over the interval (a mix of
//!    before and after while a balloon moved) times (1 +- noise), the true
//!    ratio is that of what the guest holds at the end; with
//!    `SimConfig::hot_cap` the samples read like accessed bits do (hot
//!    pages under-read, an interval that covers the truth: `estimate`);
//!    with `SimConfig::ages` each tier also carries a recency profile
//!    (`ages`: working set per horizon, cold bytes, promotion, sampled with
//!    binomial noise), for working_set mode;
//! 3. the controller decides; its targets become the balloons' targets.

pub mod accessed_bits;
pub mod age_readings;
pub mod fleet;
pub mod guest;
pub mod metrics;
pub mod passes;
pub mod rng;
pub mod workload;

use std::time::Instant;

use tier_proto::v1::Decision;

use age_readings::AgeSampling;
use guest::SimVm;
use passes::Passes;
use rng::Rng;
use tier_controller::policy::{Config, Controller, Mode, TierObs, VmObs, VmStatus};

/// From the design note: about 1 GiB/s for the existing balloon.
pub const DEFAULT_BALLOON_SPEED: f64 = (1u64 << 30) as f64;

/// Simulation knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimConfig {
    pub interval_s: f64,
    /// Bytes per second each sub-balloon moves toward its target.
    pub balloon_speed: f64,
    /// Relative error of the host-sampled accesses, uniform in +-noise.
    pub noise: f64,
    pub seed: u64,
    /// `Some(cap)`: samples read like accessed bits, pages touched faster
    /// than `cap` x the phase's mean rate counting only `cap`, with the
    /// estimator's interval (`estimate`). `None`: exact rates, no
    /// interval (a sender from before intervals).
    pub hot_cap: Option<f64>,
    /// `Some`: each tier's sample carries ages (`ages`). `None`: no ages,
    /// as from a backend that gives none (working_set VMs fall back to
    /// ratio mode).
    pub ages: Option<AgeSampling>,
    /// `Some`: what the controller sees is what a sampler reading accessed
    /// bits in passes sends (`passes`), through `input::from_proto` as in
    /// tierd; `hot_cap`, `ages` and `noise` are then unused.
    pub passes: Option<Passes>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            interval_s: 1.0,
            balloon_speed: DEFAULT_BALLOON_SPEED,
            noise: 0.0,
            seed: 1,
            hot_cap: None,
            ages: None,
            passes: None,
        }
    }
}

/// One VM in one interval of the timeline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VmStep {
    /// True DRAM-hit ratio of what the guest holds at the end of the
    /// interval (no sampling noise, no mix); `None` without accesses.
    pub ratio: Option<f64>,
    /// The VM's target ratio.
    pub target: f64,
    /// DRAM and slow memory the guest holds at the end of the interval,
    /// and the balloon targets after the decision.
    pub dram_held: u64,
    pub slow_held: u64,
    pub dram_target: u64,
    pub slow_target: u64,
    pub status: VmStatus,
    /// working_set mode with ages: the true working set within the hot
    /// horizon (both tiers) at the end of the interval, what the VM needs
    /// in DRAM. `None` in ratio mode.
    pub hot: Option<u64>,
}

/// One interval of the timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub interval: u64,
    pub vms: Vec<VmStep>,
    pub decisions: Vec<Decision>,
    /// Wall time of `Controller::decide`.
    pub decide_ns: u64,
    pub committed: u64,
    pub budget: u64,
}

/// A fleet of simulated VMs under one controller.
#[derive(Debug)]
pub struct Sim {
    pub vms: Vec<SimVm>,
    pub config: SimConfig,
    pub controller: Controller,
    interval: u64,
    rng: Rng,
    obs: Vec<VmObs>,
}

fn tier_obs(name: &str, size: u64) -> TierObs {
    TierObs {
        name: name.into(),
        size,
        // The model has no host residency: known and flat, so a grow is
        // never held as a fill.
        resident: Some(0),
        ..Default::default()
    }
}

impl Sim {
    pub fn new(vms: Vec<SimVm>, config: SimConfig, policy: Config) -> Sim {
        let obs = vms
            .iter()
            .map(|v| VmObs {
                id: v.id.clone(),
                name: v.id.clone(),
                dram: tier_obs("dram", v.dram_size),
                slow: tier_obs("slow", v.slow_size),
                balloon_ok: true,
                guest_accesses: None,
                hit: Default::default(),
            })
            .collect();
        Sim {
            vms,
            rng: Rng::new(config.seed),
            config,
            controller: Controller::new(policy),
            interval: 0,
            obs,
        }
    }

    fn noisy(&mut self, x: f64) -> f64 {
        let n = self.config.noise;
        if n > 0.0 {
            x * (1.0 + self.rng.range(-n, n))
        } else {
            x
        }
    }

    /// Runs one interval.
    pub fn step(&mut self) -> Step {
        let k = self.interval;
        let moved = (self.config.balloon_speed * self.config.interval_s).max(0.0) as u64;
        let mut truth = Vec::with_capacity(self.vms.len());
        for i in 0..self.vms.len() {
            let from = self.vms[i].held();
            self.vms[i].move_balloons(moved);
            // What the host samples: a mix while a balloon moved.
            let load = self.vms[i].sampled_load(k, from, moved);
            let (mut dram_acc, mut slow_acc) = (
                self.noisy(load.dram_accesses),
                self.noisy(load.slow_accesses),
            );
            let vm = &self.vms[i];
            let (dh, sh) = vm.held();
            let cap = self.config.hot_cap;
            // What accessed bits make of it: the share seen of what the
            // guest holds now (at most 1, so a mixed sample stays covered).
            let hit = match (cap, vm.phase(k)) {
                (Some(cap), Some(p)) => {
                    let seen = accessed_bits::seen(p, dh, sh, cap);
                    (dram_acc, slow_acc) = (dram_acc * seen[0].share, slow_acc * seen[1].share);
                    accessed_bits::interval([dram_acc, slow_acc], seen, self.config.noise)
                }
                _ => Default::default(),
            };
            let aged = match (self.config.ages, vm.phase(k)) {
                (Some(a), Some(p)) => {
                    let iv = self.config.interval_s;
                    let history = (k + 1) as f64 * iv;
                    let [td, ts] = age_readings::truth(p, &a, iv, dh, sh);
                    Some([
                        age_readings::tier_ages(&mut self.rng, &td, dh, &a, iv, history),
                        age_readings::tier_ages(&mut self.rng, &ts, sh, &a, iv, history),
                    ])
                }
                _ => None,
            };
            let [dram_ages, slow_ages] = match aged {
                Some([d, s]) => [Some(d), Some(s)],
                None => [None, None],
            };
            let o = &mut self.obs[i];
            o.hit = hit;
            o.dram.ages = dram_ages;
            o.slow.ages = slow_ages;
            for (t, b, acc, hot, held) in [
                (&mut o.dram, vm.dram, dram_acc, load.dram_hot, dh),
                (&mut o.slow, vm.slow, slow_acc, load.slow_hot, sh),
            ] {
                t.balloon_target = b.target;
                t.balloon_actual = b.actual;
                t.accesses = acc;
                t.accessed_bytes = hot;
                t.idle_bytes = held.saturating_sub(hot);
            }
            if let Some(pc) = self.config.passes {
                let seen = passes::observe(
                    &vm.id,
                    vm.phase(k),
                    &passes::Held {
                        size: [vm.dram_size, vm.slow_size],
                        target: [vm.dram.target, vm.slow.target],
                        actual: [vm.dram.actual, vm.slow.actual],
                    },
                    &pc,
                    k,
                    self.config.interval_s,
                );
                if let Ok(o) = tier_controller::policy::input::from_proto(&seen.vm, &seen.stats) {
                    self.obs[i] = o;
                }
            }
            // Convergence is judged on what the guest holds at the end.
            let cfg = self.controller.config();
            let hot = match (self.config.ages, self.config.passes, vm.phase(k)) {
                (Some(a), _, Some(p))
                    if cfg.mode_of(&vm.id, &vm.id).resolve(matches!(
                        self.obs[i].hit,
                        tier_controller::policy::HitEvidence::Counted(_)
                    )) == Mode::WorkingSet =>
                {
                    let h = match cfg.working_set.hot_horizon {
                        h if h > 0.0 => h,
                        _ => a.horizons[0],
                    };
                    Some(p.working_set(h, self.config.interval_s))
                }
                // The whole hot set (and warm pages): what the guest needs.
                (_, Some(_), Some(p)) => Some(p.hot_bytes + p.warm_bytes),
                _ => None,
            };
            truth.push((vm.load(k).ratio(), dh, sh, hot));
        }
        let t0 = Instant::now();
        let plan = self.controller.decide(&self.obs, k * 1_000_000_000);
        let decide_ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let cfg = self.controller.config();
        let mut vms = Vec::with_capacity(self.vms.len());
        for ((vm, t), (ratio, dram_held, slow_held, hot)) in
            self.vms.iter_mut().zip(&plan.targets).zip(truth)
        {
            vm.dram.target = t.dram;
            vm.slow.target = t.slow;
            let target = cfg
                .vm(&vm.id, &vm.id)
                .and_then(|o| o.target)
                .unwrap_or(cfg.default_target);
            vms.push(VmStep {
                ratio,
                target,
                dram_held,
                slow_held,
                dram_target: t.dram,
                slow_target: t.slow,
                status: t.status,
                hot,
            });
        }
        self.interval += 1;
        Step {
            interval: k,
            vms,
            decisions: plan.decisions,
            decide_ns,
            committed: plan.budget.committed_after,
            budget: plan.budget.budget,
        }
    }

    /// What the controller saw in the last interval.
    pub fn observations(&self) -> &[VmObs] {
        &self.obs
    }

    /// Runs `n` intervals.
    pub fn run(&mut self, n: u64) -> Vec<Step> {
        (0..n).map(|_| self.step()).collect()
    }
}
