//! The controller policy tierd starts with. Validation of `SetPolicy` is the
//! controller's own (`tier_controller::policy::Config::try_from`), so the
//! daemon and the controller can never disagree on what is valid.

use tier_proto::v1::Policy;

/// The policy tierd starts with.
pub fn default_policy() -> Policy {
    Policy {
        enabled: true,
        dry_run: false,
        default_target: 0.9,
        epsilon: 0.02,
        host_dram_budget_bytes: 0,
        max_step_bytes: 64 << 20,
        cooldown_intervals: 2,
        idle_threshold: 0.5,
        vms: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_for_the_controller() {
        tier_controller::policy::Config::try_from(&default_policy()).unwrap();
    }
}
