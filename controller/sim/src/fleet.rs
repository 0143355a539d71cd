//! Random fleets for what-if runs, property tests and the bench: each VM
//! starts near the DRAM its first phase needs for the target, and the host
//! budget covers what every VM needs in its hungriest phase, plus slack.

use crate::guest::{Balloon, Guest, SimVm};
use crate::rng::Rng;
use crate::workload::Phase;
use tier_controller::policy::PAGE;

/// What a random fleet looks like.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetSpec {
    pub vms: usize,
    /// Target DRAM-hit ratio the fleet is sized for.
    pub target: f64,
    /// Guest memory sizes to pick from; each VM gets a DRAM zone and a slow
    /// zone of this size, and starts holding this much in total.
    pub sizes: Vec<u64>,
    /// Hot set as a share of guest memory.
    pub hot_share: (f64, f64),
    /// Zipf-like skew of the hot set (see `workload`).
    pub skew: (f64, f64),
    /// The initial DRAM is the first phase's need +- up to this.
    pub initial_offset: u64,
    /// Interval of the phase change, and the share of VMs that change.
    pub phase_change: Option<(u64, f64)>,
    /// Share of VMs whose balloons never move.
    pub uncooperative: f64,
    /// Budget = max(initial DRAM, slack x what the VMs need).
    pub budget_slack: f64,
    pub seed: u64,
    /// Warm pages as a share of guest memory (`workload::Phase`); (0, 0):
    /// none, and the fleet is the one drawn before warm pages existed.
    pub warm_share: (f64, f64),
    /// Seconds between touches of a warm page.
    pub warm_period_s: f64,
    /// The budget covers each VM's hottest phase's whole hot and warm set
    /// too (what working_set mode keeps in DRAM), not only the DRAM for
    /// the target ratio: the same fleet then suits both modes.
    pub budget_for_hot_set: bool,
    /// VMs that changed phase return to their first phase at this interval
    /// (a hot set that outgrew its DRAM and shrinks back).
    pub phase_back: Option<u64>,
}

impl Default for FleetSpec {
    fn default() -> Self {
        FleetSpec {
            vms: 8,
            target: 0.9,
            sizes: vec![2 << 30, 4 << 30, 8 << 30],
            hot_share: (0.3, 0.8),
            skew: (0.0, 100.0),
            initial_offset: 2 << 30,
            phase_change: None,
            uncooperative: 0.0,
            budget_slack: 1.1,
            seed: 1,
            warm_share: (0.0, 0.0),
            warm_period_s: 10.0,
            budget_for_hot_set: false,
            phase_back: None,
        }
    }
}

/// A generated fleet and the host DRAM budget it is meant for.
#[derive(Debug, Clone, PartialEq)]
pub struct Fleet {
    pub vms: Vec<SimVm>,
    pub budget: u64,
}

fn pages(bytes: f64) -> u64 {
    (bytes / PAGE as f64).round().max(0.0) as u64 * PAGE
}

fn phase(rng: &mut Rng, spec: &FleetSpec, start: u64, size: u64) -> Phase {
    let hot = pages(size as f64 * rng.range(spec.hot_share.0, spec.hot_share.1)).max(PAGE);
    let mut p = Phase::hot(
        start,
        hot,
        rng.range(spec.skew.0, spec.skew.1),
        rng.range(1e5, 1e6),
    );
    // Drawn only when asked for, so fleets without warm pages stay the
    // ones drawn before.
    if spec.warm_share.1 > 0.0 {
        let w = pages(size as f64 * rng.range(spec.warm_share.0, spec.warm_share.1));
        p.warm_bytes = w.min(size - hot);
        p.warm_period_s = spec.warm_period_s;
    }
    p
}

pub fn fleet(spec: &FleetSpec) -> Fleet {
    let mut rng = Rng::new(spec.seed);
    let mut vms = Vec::with_capacity(spec.vms);
    let (mut initial, mut need) = (0u64, 0u64);
    for i in 0..spec.vms {
        let size = spec
            .sizes
            .get(rng.below(spec.sizes.len() as u64) as usize)
            .copied()
            .unwrap_or(1 << 30);
        let mut phases = vec![phase(&mut rng, spec, 0, size)];
        if let Some((at, share)) = spec.phase_change
            && rng.unit() < share
        {
            phases.push(phase(&mut rng, spec, at, size));
            if let Some(back) = spec.phase_back.filter(|&b| b > at) {
                let first = Phase {
                    start: back,
                    ..phases[0]
                };
                phases.push(first);
            }
        }
        let first = phases[0].dram_for(spec.target) as f64;
        let off = spec.initial_offset as f64;
        let g0 = pages(first + rng.range(-off, off)).min(size);
        initial += g0;
        need += phases
            .iter()
            .map(|p| {
                let hot_set = if spec.budget_for_hot_set {
                    p.hot_bytes + p.warm_bytes
                } else {
                    0
                };
                p.dram_for(spec.target).max(hot_set)
            })
            .max()
            .unwrap_or(0);
        let guest = if rng.unit() < spec.uncooperative {
            Guest::Refuses
        } else {
            Guest::Cooperative
        };
        let b = |x| Balloon {
            target: x,
            actual: x,
        };
        vms.push(SimVm {
            id: format!("vm{i}"),
            dram_size: size,
            slow_size: size,
            dram: b(size - g0),
            slow: b(g0),
            phases,
            guest,
        });
    }
    let budget = initial.max(pages(need as f64 * spec.budget_slack));
    Fleet { vms, budget }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleets_are_deterministic_and_fit_the_budget() {
        let spec = FleetSpec {
            vms: 50,
            phase_change: Some((10, 0.5)),
            uncooperative: 0.1,
            ..Default::default()
        };
        let f = fleet(&spec);
        assert_eq!(f, fleet(&spec));
        assert_eq!(f.vms.len(), 50);
        let held: u64 = f.vms.iter().map(|v| v.held().0).sum();
        assert!(held <= f.budget);
        for v in &f.vms {
            let (d, s) = v.held();
            assert_eq!(d + s, v.dram_size);
            assert!(v.phases.iter().all(|p| p.hot_bytes <= v.dram_size));
        }
        assert!(f.vms.iter().any(|v| v.phases.len() == 2));
        assert!(f.vms.iter().any(|v| v.guest == Guest::Refuses));
    }
}
