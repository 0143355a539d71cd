//! The per-interval decision function of the controller: from what the host
//! sampled about each VM to new per-tier balloon targets and `Decision`
//! records. Pure: no I/O, no clock; the caller applies the targets.
//! Semantics: docs/controller.md.

pub mod ages;
pub mod allocate;
mod budget;
pub mod classify;
pub mod config;
mod decide;
mod decision;
pub mod hit_interval;
pub mod input;
pub mod model;
pub mod state;
mod work;
pub mod working_set;

use std::collections::HashMap;

use tier_proto::v1::Decision;

pub use config::{
    Config, ConfigError, Limits, Mode, PAGE, Reclaim, Tuning, VmOverride, WorkingSet,
    default_policy,
};
pub use hit_interval::{ActOn, Hit, HitEvidence, HitKind};
pub use input::{TierObs, VmObs};
pub use work::signal_text;

use state::VmState;

/// Why the controller may or may not change a VM this interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmStatus {
    /// The policy is disabled.
    Disabled,
    /// The operator excluded the VM.
    Excluded,
    /// Its balloon did not follow a target: never pushed again.
    Uncooperative,
    /// A balloon is still on its way to its target, or the guest is still
    /// moving into DRAM just given (its resident bytes rising).
    Settling,
    /// Changed less than `cooldown_intervals` ago.
    Cooldown,
    /// The policy decides for it.
    Managed,
}

/// New balloon targets of one VM (bytes), same order as the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Targets {
    pub dram: u64,
    pub slow: u64,
    pub status: VmStatus,
}

/// The host DRAM budget over one interval, in bytes of DRAM given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BudgetSummary {
    pub budget: u64,
    /// Sum over VMs before the round: size - target, or for uncooperative
    /// VMs size - min(target, actual) (what they may hold).
    pub committed_before: u64,
    /// The same after the planned changes (also in dry-run).
    pub committed_after: u64,
    /// DRAM taken from VMs this round.
    pub released: u64,
    /// DRAM handed to VMs this round.
    pub granted: u64,
}

/// Output of one round.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub round: u64,
    /// Targets to apply, one per input VM (unchanged ones included; in
    /// dry-run all unchanged).
    pub targets: Vec<Targets>,
    pub decisions: Vec<Decision>,
    pub budget: BudgetSummary,
}

/// The controller: the policy in force and what it remembers per VM.
#[derive(Debug, Clone)]
pub struct Controller {
    config: Config,
    state: HashMap<String, VmState>,
    /// working_set mode: each VM's last view and its round
    /// (`decide::ws_view`).
    views: HashMap<String, Option<(u64, working_set::View)>>,
    round: u64,
    sequence: u64,
}

impl Controller {
    pub fn new(config: Config) -> Controller {
        Controller {
            config,
            state: HashMap::new(),
            views: HashMap::new(),
            round: 0,
            sequence: 0,
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Replaces the policy; what the controller remembers per VM (cooldown,
    /// uncooperative marks) stays.
    pub fn set_config(&mut self, config: Config) {
        self.config = config;
    }

    /// Clears a VM's uncooperative mark (operator action).
    pub fn forgive(&mut self, vm_id: &str) {
        if let Some(s) = self.state.get_mut(vm_id) {
            *s = VmState::default();
        }
    }

    /// Whether a VM is marked uncooperative.
    pub fn is_uncooperative(&self, vm_id: &str) -> bool {
        self.state.get(vm_id).is_some_and(|s| s.uncooperative)
    }

    /// One interval: decides for every VM in `vms`; VMs not in `vms` are
    /// forgotten. `now_unix_ns` stamps the decisions.
    pub fn decide(&mut self, vms: &[VmObs], now_unix_ns: u64) -> Plan {
        decide::run(self, vms, now_unix_ns)
    }
}
