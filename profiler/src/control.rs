//! The controller, in-process: each interval it sees every VM's host-sampled
//! per-tier accesses and balloon state and decides per-tier balloon targets.
//!
//! No VM has a per-tier balloon tierd can drive yet (that needs the patched
//! cloud-hypervisor or the vhost-user balloon backend), so every VM is
//! handed to the policy with `balloon_ok = false`: the policy then reports it
//! once as not actuable (reason UNCOOPERATIVE, outcome SKIPPED, with the
//! reason in the detail) and never pushes it. Nothing is faked as applied.

use tier_controller::policy::{Config, ConfigError, Controller, input};
use tier_proto::v1::{Decision, Policy, StatsUpdate, Vm};

/// The in-process controller and the policy it was built from.
#[derive(Debug)]
pub struct InProcess {
    controller: Controller,
    policy: Policy,
}

impl InProcess {
    pub fn new(policy: &Policy) -> Result<InProcess, ConfigError> {
        Ok(InProcess {
            controller: Controller::new(Config::try_from(policy)?),
            policy: policy.clone(),
        })
    }

    /// Takes a new policy (already validated by SetPolicy); a no-op when
    /// unchanged, so per-VM controller state survives.
    pub fn set_policy(&mut self, policy: &Policy) -> Result<(), ConfigError> {
        if *policy != self.policy {
            self.controller.set_config(Config::try_from(policy)?);
            self.policy = policy.clone();
        }
        Ok(())
    }

    /// One interval: decisions for the VMs of `update` (`vms` is the full VM
    /// list, as the update may leave it out when unchanged).
    pub fn step(&mut self, vms: &[Vm], update: &StatsUpdate) -> Vec<Decision> {
        if !self.policy.enabled {
            return Vec::new();
        }
        let obs: Vec<_> = update
            .stats
            .iter()
            .filter_map(|s| {
                let vm = vms.iter().find(|v| v.id == s.vm_id)?;
                let mut o = input::from_proto(vm, s).ok()?;
                // No actuator for any VM yet: see the module comment.
                o.balloon_ok = false;
                Some(o)
            })
            .collect();
        for d in &update.departed_vm_ids {
            self.controller.forgive(d);
        }
        let mut plan = self.controller.decide(&obs, update.timestamp_unix_ns);
        for d in &mut plan.decisions {
            if d.detail.starts_with("actuation reports") {
                d.detail = format!(
                    "no per-tier balloon tierd can drive on this VM (needs the patched cloud-hypervisor or the vhost-user balloon); {}",
                    d.detail
                );
            }
        }
        plan.decisions
    }
}
