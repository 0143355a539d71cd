//! A simulated VM: two tiers, a balloon on each, and its workload phases.

use super::workload::{Phase, TierLoad};

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

    /// The true per-tier load of `interval`.
    pub fn load(&self, interval: u64) -> TierLoad {
        let (d, s) = self.held();
        self.phase(interval)
            .map_or(TierLoad::default(), |p| p.load(d, s))
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
}
