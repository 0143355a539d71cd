//! A simulated VM: two tiers, a balloon on each, and its workload phases.

use crate::workload::{Phase, TierLoad};

/// How the guest's balloon driver behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guest {
    /// Moves each balloon toward its target at the simulation's speed.
    Cooperative,
    /// Never moves its balloons (a broken or malicious guest).
    Refuses,
}

/// One sub-balloon: the target the controller set, the size the guest has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Balloon {
    pub target: u64,
    pub actual: u64,
}

impl Balloon {
    /// Moves the actual size toward the target by at most `bytes`.
    pub fn advance(&mut self, bytes: u64) {
        if self.actual < self.target {
            self.actual += (self.target - self.actual).min(bytes);
        } else {
            self.actual -= (self.actual - self.target).min(bytes);
        }
    }
}

/// One simulated VM.
#[derive(Debug, Clone, PartialEq)]
pub struct SimVm {
    pub id: String,
    pub dram_size: u64,
    pub slow_size: u64,
    pub dram: Balloon,
    pub slow: Balloon,
    /// Sorted by `start`; the first should start at 0.
    pub phases: Vec<Phase>,
    pub guest: Guest,
}

impl SimVm {
    /// The phase in force at `interval` (none before the first one).
    pub fn phase(&self, interval: u64) -> Option<&Phase> {
        self.phases.iter().rev().find(|p| p.start <= interval)
    }

    /// Both balloons move for one interval: `bytes` each, concurrently.
    pub fn move_balloons(&mut self, bytes: u64) {
        if self.guest == Guest::Cooperative {
            self.dram.advance(bytes);
            self.slow.advance(bytes);
        }
    }

    /// DRAM and slow memory the guest holds now.
    pub fn held(&self) -> (u64, u64) {
        (
            self.dram_size.saturating_sub(self.dram.actual),
            self.slow_size.saturating_sub(self.slow.actual),
        )
    }

    /// The true per-tier load of `interval` with what the guest holds now.
    pub fn load(&self, interval: u64) -> TierLoad {
        let (d, s) = self.held();
        self.phase(interval)
            .map_or(TierLoad::default(), |p| p.load(d, s))
    }

    /// What the host samples over `interval` when the guest held `from` at
    /// its start and the balloons then moved to what it holds now, each at
    /// `per_interval` bytes per interval (concurrently, from the start):
    /// accesses are the load averaged over the interval, accessed bytes per
    /// tier are the most hot bytes the tier had (a page demoted or promoted
    /// during the interval was touched on both sides). Without a move, the
    /// load of the interval.
    pub fn sampled_load(&self, interval: u64, from: (u64, u64), per_interval: u64) -> TierLoad {
        const POINTS: u32 = 16;
        let to = self.held();
        let Some(p) = self.phase(interval) else {
            return TierLoad::default();
        };
        if from == to || per_interval == 0 {
            return p.load(to.0, to.1);
        }
        // Held bytes at time t (share of the interval) along the move.
        let at = |a: u64, b: u64, t: f64| {
            let span = a.abs_diff(b) as f64;
            let done = (t * per_interval as f64).min(span);
            if b >= a {
                a + done as u64
            } else {
                a - done as u64
            }
        };
        let mut out = TierLoad::default();
        for i in 0..POINTS {
            let t = (f64::from(i) + 0.5) / f64::from(POINTS);
            let l = p.load(at(from.0, to.0, t), at(from.1, to.1, t));
            out.dram_accesses += l.dram_accesses / f64::from(POINTS);
            out.slow_accesses += l.slow_accesses / f64::from(POINTS);
        }
        for (d, s) in [from, to] {
            let l = p.load(d, s);
            out.dram_hot = out.dram_hot.max(l.dram_hot);
            out.slow_hot = out.slow_hot.max(l.slow_hot);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balloons_move_at_speed_unless_refused() {
        let mut b = Balloon {
            target: 10,
            actual: 0,
        };
        b.advance(4);
        assert_eq!(b.actual, 4);
        b.advance(100);
        assert_eq!(b.actual, 10);
        b.target = 3;
        b.advance(5);
        assert_eq!(b.actual, 5);
        let mut vm = SimVm {
            id: "a".into(),
            dram_size: 100,
            slow_size: 100,
            dram: Balloon {
                target: 50,
                actual: 0,
            },
            slow: Balloon::default(),
            phases: vec![],
            guest: Guest::Refuses,
        };
        vm.move_balloons(100);
        assert_eq!(vm.held(), (100, 100));
        vm.guest = Guest::Cooperative;
        vm.move_balloons(100);
        assert_eq!(vm.held(), (50, 100));
        assert_eq!(vm.phase(0), None);
    }

    #[test]
    fn samples_during_a_move_mix_before_and_after() {
        const G: u64 = 1 << 30;
        let phase = Phase::hot(0, 4 * G, 0.0, 1000.0);
        let mut vm = SimVm {
            id: "a".into(),
            dram_size: 4 * G,
            slow_size: 4 * G,
            dram: Balloon {
                target: 2 * G,
                actual: 3 * G,
            },
            slow: Balloon {
                target: 2 * G,
                actual: G,
            },
            phases: vec![phase],
            guest: Guest::Cooperative,
        };
        let from = vm.held();
        assert_eq!(from, (G, 3 * G));
        // 1G per interval: DRAM grows from 1G to 2G over the whole interval,
        // uniform accesses: on average 1.5G of 4G hot in DRAM.
        vm.move_balloons(G);
        let l = vm.sampled_load(0, from, G);
        assert!((l.dram_accesses - 375.0).abs() < 1e-9, "{l:?}");
        assert!((l.slow_accesses - 625.0).abs() < 1e-9, "{l:?}");
        // Touched on both sides: 2G in DRAM by the end, 3G in slow at first.
        assert_eq!((l.dram_hot, l.slow_hot), (2 * G, 3 * G));
        // Twice as fast: the move is over at half time, 1.75G on average.
        let l = vm.sampled_load(0, from, 2 * G);
        assert!((l.dram_accesses - 437.5).abs() < 1e-9, "{l:?}");
        // No move: the load of what it holds.
        assert_eq!(vm.sampled_load(0, vm.held(), G), vm.load(0));
    }
}
