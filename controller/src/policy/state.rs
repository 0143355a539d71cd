//! What the controller remembers about a VM between intervals: cooldown,
//! the direction of its last change (hysteresis), a move still under way,
//! and whether its balloons follow their targets.

use super::config::Tuning;
use super::input::{TierObs, VmObs};

/// Which rule produced a want.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// DRAM given above the tier ceiling.
    Ceiling,
    /// DRAM given below the tier floor.
    Floor,
    /// Idle DRAM above the idle threshold.
    Idle,
    /// Ratio above the band (`Config::hold_epsilon`).
    Above,
    /// Ratio below the band.
    Below,
    /// working_set mode: the hot working set beyond the DRAM given.
    HotSet,
    /// working_set mode: slow-tier promotion above the SLO.
    Promotion,
    /// working_set mode: DRAM found cold (beyond the longest horizon) and
    /// beyond the hot set.
    Cold,
    /// working_set mode: DRAM beyond the hot set, taken because another VM
    /// is short of DRAM.
    Warm,
}

impl Why {
    /// A working_set mode rule.
    pub fn is_working_set(self) -> bool {
        matches!(self, Why::HotSet | Why::Promotion | Why::Cold | Why::Warm)
    }

    /// The amount was measured, not extrapolated by the ratio model: a
    /// multi-step move carries all of it on without a reserve.
    pub fn measured(self) -> bool {
        matches!(self, Why::Idle | Why::HotSet | Why::Cold)
    }
}

/// Direction of a change of a VM's DRAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    Up,
    Down,
}

/// A move planned in one assessment and larger than one step: the rest is
/// carried out one step per interval, without a new assessment in between
/// (the samples of those intervals are a mix of before and after).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Move {
    pub dir: Dir,
    /// Bytes of DRAM still to move without a new assessment.
    pub left: u64,
    /// Bytes kept back for the next assessment (`Tuning::move_reserve`).
    pub reserve: u64,
    /// The rule that planned it: `Below`, `Above`, `Idle`, `HotSet` or
    /// `Cold`.
    pub why: Why,
    /// Round of the assessment.
    pub planned: u64,
    /// Bytes the assessment asked for in all.
    pub total: u64,
    /// The target ratio it was planned for: a new target drops the plan.
    pub target: f64,
    /// The ratio the planning assessment expected once the unassessed part
    /// is done.
    pub expected: f64,
}

/// How far one balloon has come toward its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Lag {
    /// Round since which the balloon lags without progress.
    since: Option<u64>,
    /// |actual - target| at `since`.
    gap: u64,
    /// The target at `since`: a new target restarts the window.
    target: u64,
}

impl Lag {
    /// Updates with this round's look: (lagging, grace period over,
    /// progressed this round).
    ///
    /// Progress is counted over the grace window, not per interval: a guest
    /// that moves its balloon slowly but steadily (a driver that has to
    /// migrate pages first, a guest under emulation) follows its target and
    /// is not marked; one that stops for the whole window is.
    fn look(&mut self, t: &TierObs, round: u64, tuning: &Tuning) -> (bool, bool, bool) {
        let gap = t.balloon_actual.abs_diff(t.balloon_target);
        let target = t.balloon_target;
        let tol = tuning.balloon_tolerance;
        if gap <= tol {
            *self = Lag {
                since: None,
                gap,
                target,
            };
            return (false, false, false);
        }
        let progressed = self.gap.saturating_sub(gap) >= progress_min(tol);
        match self.since {
            Some(since) if !progressed && target == self.target => (
                true,
                round - since >= u64::from(tuning.grace_intervals),
                false,
            ),
            _ => {
                *self = Lag {
                    since: Some(round),
                    gap,
                    target,
                };
                (true, tuning.grace_intervals == 0, progressed)
            }
        }
    }
}

/// Shrinking the gap by this much within the grace window is progress:
/// an eighth of the arrival tolerance, at least one page.
fn progress_min(tol: u64) -> u64 {
    (tol / 8).max(super::config::PAGE)
}

/// Where a VM's balloons are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Balloons {
    /// Both within tolerance of their targets.
    Arrived,
    /// At least one still on its way, within its grace period.
    Moving,
    /// One has not followed its target for the whole grace period.
    Stuck,
}

/// Per-VM memory of the controller.
#[derive(Debug, Clone, Default)]
pub struct VmState {
    /// Last round the VM was seen (departed VMs are forgotten).
    pub seen: u64,
    /// No change in rounds up to and including this one.
    pub cooldown_until: u64,
    pub last_dir: Option<Dir>,
    /// Round of the last change that reversed `last_dir`.
    pub last_reversal: Option<u64>,
    /// The last change itself reversed the one before.
    pub last_reversed: bool,
    /// The hot set (bytes accessed, both tiers) of the last settled sample
    /// before that reversal.
    pub hot_at_reversal: Option<u64>,
    /// Samples up to this round may mix before and after a balloon move.
    pub mixed_until: u64,
    /// Hot set of the last sample taken with the balloons at rest.
    pub settled_hot: Option<u64>,
    pub uncooperative: bool,
    /// Marked because a balloon stopped following its target (not because
    /// it is not drivable): cleared when it reaches its target again.
    pub stuck: bool,
    /// The last round left the VM short for lack of budget.
    pub budget_limited: bool,
    /// The last round held the VM on an interval that straddled its band
    /// while the point alone would have moved it (`classify::unplaced`).
    pub unplaced: bool,
    /// The last round held it in working_set mode with nothing measured.
    pub unmeasured: bool,
    /// The last round kept DRAM a rule would release, no VM needing it
    /// (`Reclaim::OnDemand`).
    pub kept: bool,
    /// DRAM the VM's last assessment needed and the pool could not give,
    /// and the round: demand that on-demand reclaim serves in later rounds
    /// too, as the donors' idle memory and the needer's hot set are often
    /// measured in different rounds (hostpte's long pass).
    pub unmet: Option<(u64, u64)>,
    /// The rest of a multi-step move, if one is under way.
    pub moving: Option<Move>,
    /// The last assessment moved in this direction by less than it asked
    /// (step cap) and planned no continuation: the next one aims at the
    /// target itself, not just the band around it.
    pub short: Option<Dir>,
    /// DRAM given by the last change that the guest may still be moving
    /// into.
    pub fill: Option<Fill>,
    lag: [Lag; 2],
}

/// DRAM just given to a VM that the guest fills over several intervals
/// (pages migrated in after a virtio-mem plug or a balloon deflate): its
/// samples until then mix before and after, and the memory reads as idle.
/// While its DRAM-resident bytes keep rising towards what was given (for
/// at most `Tuning::fill_max_intervals`) nothing is taken back from it;
/// more may be given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fill {
    pub since: u64,
    /// DRAM-resident bytes at the last look.
    pub last: u64,
    /// Resident bytes at which the given memory is all in use.
    pub goal: u64,
    /// A rise below this per interval is no filling (page tables, noise).
    pub min_rise: u64,
    /// An interval has been held for it.
    pub held: bool,
    /// Resident bytes were unknown when the memory was given: the first
    /// known reading is the baseline (`last`, `goal` on top of it).
    pub rebase: bool,
}

impl Fill {
    /// After giving `given` bytes of DRAM at `resident` bytes resident
    /// (`None`: unknown).
    pub fn new(round: u64, resident: Option<u64>, given: u64) -> Fill {
        let r = resident.unwrap_or(0);
        Fill {
            since: round,
            last: r,
            goal: r.saturating_add(given),
            min_rise: (given / 64).max(256 << 10),
            held: false,
            rebase: resident.is_none(),
        }
    }

    /// `given` more bytes given while filling.
    pub fn more(self, given: u64) -> Fill {
        Fill {
            goal: self.goal.saturating_add(given),
            min_rise: self.min_rise.max((given / 64).max(256 << 10)),
            ..self
        }
    }

    /// Whether the fill may still be under way at `round` (its residency
    /// unknown).
    pub fn within(&self, round: u64, max_intervals: u32) -> bool {
        round - self.since <= u64::from(max_intervals)
    }

    /// Whether the guest is still filling at `resident` bytes now.
    pub fn filling(&mut self, round: u64, resident: u64, max_intervals: u32) -> bool {
        if self.rebase {
            self.rebase = false;
            self.goal = resident.saturating_add(self.goal - self.last);
            self.last = resident;
            return self.within(round, max_intervals);
        }
        let rising = resident >= self.last.saturating_add(self.min_rise);
        self.last = resident;
        rising && resident < self.goal && round - self.since <= u64::from(max_intervals)
    }
}

impl VmState {
    /// Looks at both balloons.
    pub fn track(&mut self, vm: &VmObs, round: u64, tuning: &Tuning) -> Balloons {
        let (dm, mut ds, dp) = self.lag[0].look(&vm.dram, round, tuning);
        let (sm, mut ss, sp) = self.lag[1].look(&vm.slow, round, tuning);
        // A guest's driver works through its balloons one at a time (the
        // test guest migrates a DRAM inflate's pages before it deflates
        // the slow balloon): progress on one restarts the other's window.
        for (lag, stuck, other) in [(1, &mut ss, dp), (0, &mut ds, sp)] {
            if other && self.lag[lag].since.is_some() {
                self.lag[lag].since = Some(round);
                *stuck = tuning.grace_intervals == 0;
            }
        }
        if ds || ss {
            Balloons::Stuck
        } else if dm || sm {
            Balloons::Moving
        } else {
            Balloons::Arrived
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    fn vm(target: u64, actual: u64) -> VmObs {
        VmObs {
            dram: TierObs {
                size: 1024 * M,
                balloon_target: target,
                balloon_actual: actual,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn stuck_after_grace_without_progress() {
        let tuning = Tuning::default(); // 4M tolerance, grace 3
        let mut s = VmState::default();
        assert_eq!(s.track(&vm(0, 2 * M), 1, &tuning), Balloons::Arrived);
        assert_eq!(s.track(&vm(512 * M, 0), 2, &tuning), Balloons::Moving);
        assert_eq!(s.track(&vm(512 * M, 0), 3, &tuning), Balloons::Moving);
        // Less than tolerance / 8 in the whole window is no progress.
        assert_eq!(s.track(&vm(512 * M, M / 4), 4, &tuning), Balloons::Moving);
        assert_eq!(s.track(&vm(512 * M, M / 4), 5, &tuning), Balloons::Stuck);
    }

    #[test]
    fn progress_on_one_balloon_restarts_the_others_window() {
        // The guest inflates DRAM (2M a round) before it deflates slow:
        // the slow balloon stands still meanwhile and is not stuck.
        let tuning = Tuning::default(); // 4M tolerance, grace 3
        let mut s = VmState::default();
        let both = |dram_actual: u64, slow_actual: u64| {
            let mut v = vm(32 * M, dram_actual);
            v.slow = TierObs {
                size: 1024 * M,
                balloon_target: 0,
                balloon_actual: slow_actual,
                ..Default::default()
            };
            v
        };
        for (r, d) in (1..=8).zip((8..).step_by(2)) {
            let got = s.track(&both(d * M, 16 * M), r, &tuning);
            assert_eq!(got, Balloons::Moving, "round {r}");
        }
        // DRAM arrived (within the tolerance); slow still stands: stuck
        // once its own window, restarted by DRAM's last progress (round
        // 8), is over.
        assert_eq!(s.track(&both(30 * M, 16 * M), 9, &tuning), Balloons::Moving);
        assert_eq!(
            s.track(&both(30 * M, 16 * M), 10, &tuning),
            Balloons::Moving
        );
        assert_eq!(s.track(&both(30 * M, 16 * M), 11, &tuning), Balloons::Stuck);
    }

    #[test]
    fn a_new_target_restarts_the_grace_window() {
        // Lagging toward 8M without progress, then the target is raised
        // (an operator's SetBalloonTargets): the window starts again.
        let tuning = Tuning::default();
        let mut s = VmState::default();
        assert_eq!(s.track(&vm(8 * M, 0), 1, &tuning), Balloons::Moving);
        assert_eq!(s.track(&vm(8 * M, 0), 2, &tuning), Balloons::Moving);
        assert_eq!(s.track(&vm(8 * M, 0), 3, &tuning), Balloons::Moving);
        assert_eq!(s.track(&vm(64 * M, 0), 4, &tuning), Balloons::Moving);
        assert_eq!(s.track(&vm(64 * M, 0), 6, &tuning), Balloons::Moving);
        assert_eq!(s.track(&vm(64 * M, 0), 7, &tuning), Balloons::Stuck);
    }

    #[test]
    fn slow_steady_balloon_is_not_stuck() {
        // 1 MiB per interval toward an 8 MiB target: a guest that migrates
        // pages before it can give them (the PVH test guest under emulation).
        let tuning = Tuning::default();
        let mut s = VmState::default();
        for round in 1..=4 {
            let actual = (round - 1) * M;
            assert_eq!(
                s.track(&vm(8 * M, actual), round, &tuning),
                Balloons::Moving,
                "round {round}"
            );
        }
        assert_eq!(s.track(&vm(8 * M, 4 * M), 5, &tuning), Balloons::Arrived);
        // Progress spread over the window counts too: 256K per interval.
        let mut s = VmState::default();
        let mut states = Vec::new();
        for round in 1..=6u64 {
            states.push(s.track(&vm(64 * M, round * M / 4), round, &tuning));
        }
        assert!(!states.contains(&Balloons::Stuck), "{states:?}");
    }

    #[test]
    fn progress_restarts_grace() {
        let tuning = Tuning::default();
        let mut s = VmState::default();
        for (round, actual) in [(1, 0), (2, 100 * M), (3, 200 * M), (4, 300 * M)] {
            assert_eq!(
                s.track(&vm(512 * M, actual), round, &tuning),
                Balloons::Moving
            );
        }
        assert_eq!(
            s.track(&vm(512 * M, 510 * M), 5, &tuning),
            Balloons::Arrived
        );
    }

    #[test]
    fn unknown_residency_holds_the_fill_and_rebases_on_the_next_reading() {
        // Given 64M while resident bytes were unknown.
        let mut f = Fill::new(10, None, 64 * M);
        assert!(f.within(11, 4));
        // First known reading: the baseline, still held.
        assert!(f.filling(11, 300 * M, 4));
        assert_eq!((f.last, f.goal), (300 * M, 364 * M));
        // Rising towards the goal: filling; at the goal: done.
        assert!(f.filling(12, 330 * M, 4));
        assert!(!f.filling(13, 364 * M, 4));
        // Unknown for longer than the fill may last: no longer held.
        assert!(!Fill::new(10, None, 64 * M).within(15, 4));
    }
}
