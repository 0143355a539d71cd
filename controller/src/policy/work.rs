//! One VM's assessment within a round, and the round's DRAM pool: what
//! `decide` works out and `decision` reports.

use tier_proto::v1::SteeringSignal;

use super::VmStatus;
use super::classify::Want;
use super::config::Mode;
use super::model::Load;
use super::state::{Dir, Move};
use super::working_set::View;

/// Everything decided about one VM in this round.
#[derive(Debug, Clone)]
pub(super) struct Work {
    pub status: VmStatus,
    pub newly_uncooperative: bool,
    pub target: f64,
    pub lo: u64,
    pub hi: u64,
    pub slow_lo: u64,
    pub slow_hi: u64,
    pub load: Load,
    pub want: Want,
    /// Extra DRAM taken because the host is over budget.
    pub forced: u64,
    /// DRAM granted from the pool.
    pub granted: u64,
    /// Change of DRAM given, and of slow memory given, bytes.
    pub delta: i64,
    pub slow_delta: i64,
    pub was_budget_limited: bool,
    /// Held although the point alone would move it this way: the interval
    /// cannot place the ratio outside the band.
    pub unplaced: Option<Dir>,
    pub was_unplaced: bool,
    /// The want is the next step of this move under way (before the round).
    pub resumed: Option<Move>,
    /// Decided in working_set mode, on this view.
    pub ws: Option<View>,
    /// Ratio mode: the VM's working-set view, evidence for what the ratio
    /// cannot place (a hot set beyond the DRAM given).
    pub evidence: Option<View>,
    /// Configured for working_set mode but decided in ratio mode: why.
    pub fallback: Option<String>,
    /// working_set mode with nothing measured (no ages, the hot horizon
    /// not measured, no PMU count): held, and why. Reported once per
    /// episode (`was_unmeasured`).
    pub unmeasured: Option<String>,
    pub was_unmeasured: bool,
    /// working_set mode: DRAM beyond the hot set this VM can give a VM
    /// short of DRAM this round (`working_set::classify`).
    pub spare: u64,
    /// `Reclaim::OnDemand`: the release a rule asked for, when part or all
    /// of it was kept because no VM needed that much beyond the free pool;
    /// `want` then holds what was taken, if anything.
    pub kept: Option<Want>,
    pub was_kept: bool,
    /// The mode the policy gives the VM (before `Mode::resolve`).
    pub mode: Mode,
    /// What the assessment rests on.
    pub signal: SteeringSignal,
}

/// The signal in words, for the decisions' detail text and `tierctl top`.
pub fn signal_text(s: SteeringSignal) -> &'static str {
    match s {
        SteeringSignal::CountedRatio => "PMU-counted ratio",
        SteeringSignal::AccessedBitRatio => "accessed-bit ratio interval",
        SteeringSignal::HotSet => "accessed-bit hot set",
        SteeringSignal::None => "nothing measured",
        SteeringSignal::Unspecified => "unspecified",
    }
}

/// What the pool looked like, for the decisions' detail text.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pool {
    pub budget: u64,
    pub committed: u64,
    pub size: u64,
}

impl Work {
    /// The view the want was decided on: working_set mode's, or ratio
    /// mode's evidence for a want of the working set (a hot-set deficit,
    /// a move carried on from one).
    pub fn view_for_want(&self) -> Option<&View> {
        let ws_want = match self.want {
            Want::Need { why, .. } | Want::Release { why, .. } => why.is_working_set(),
            Want::Hold => false,
        };
        self.ws
            .as_ref()
            .or(self.evidence.as_ref().filter(|_| ws_want))
    }
}
