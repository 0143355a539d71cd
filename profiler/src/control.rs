//! The controller, in-process: each interval it sees every VM's host-sampled
//! per-tier accesses and balloon state, decides per-tier balloon targets and
//! applies them through the VM's actuator.
//!
//! Actuators: cloud-hypervisor VMs found through their API socket
//! (`crate::ch::Fleet`). For each VM the policy gets `balloon_ok` from the
//! VMM's last `vm.info`: a per-tier balloon with a zone for the VM's DRAM
//! and slow tier, negotiated by the guest driver, read within `max_age`;
//! the targets in force and the balloon sizes come from there too, the size
//! being the device's own count of accepted pages (`host_ballooned`), not
//! what the guest driver claims. A VM with `balloon_ok = false` is reported
//! once (UNCOOPERATIVE / SKIPPED, the reason in the detail) and never
//! pushed; when its balloon becomes drivable (the guest driver loaded, the
//! VMM answers again) it is forgiven and managed from then on. A balloon
//! that does not follow its target for the policy's grace period marks the
//! VM uncooperative until the balloon reaches its target again.
//!
//! Applied decisions are sent on their own task with a deadline and
//! published when the VMM has answered: APPLIED, or FAILED with the error
//! in the detail. Dry-run decisions are never sent.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tier_controller::policy::{ActOn, Config, ConfigError, Controller, TierObs, VmObs, input};

/// The policy's config with `act_on` in its tuning.
fn config(policy: &Policy, act_on: ActOn) -> Result<Config, ConfigError> {
    let mut c = Config::try_from(policy)?;
    c.tuning.act_on = act_on;
    Ok(c)
}
use tier_proto::v1::{Decision, DecisionOutcome, DecisionReason, Policy, StatsUpdate, Vm, VmStats};

use crate::ch::{ChHandle, Fleet};

/// A VM's target DRAM-hit ratio and its hold band.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TargetBand {
    pub target: f64,
    pub low: f64,
    pub high: f64,
}

/// Where decisions that finish later (after the VMM call) are published.
pub type DecisionSink = Arc<dyn Fn(Decision) + Send + Sync>;

const NO_ACTUATOR: &str = "no per-tier balloon tierd can drive on this VM (needs the patched cloud-hypervisor or the vhost-user balloon)";

struct Actuation {
    fleet: Fleet,
    sink: DecisionSink,
    max_age: Duration,
}

/// The in-process controller and the policy it was built from.
pub struct InProcess {
    controller: Controller,
    policy: Policy,
    /// `[controller] act_on`, kept across policy changes.
    act_on: ActOn,
    actuation: Option<Actuation>,
    /// VMs last handed over with `balloon_ok = false`, and why.
    not_actuable: HashMap<String, String>,
}

impl std::fmt::Debug for InProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcess")
            .field("controller", &self.controller)
            .field("policy", &self.policy)
            .field("act_on", &self.act_on)
            .field("actuation", &self.actuation.is_some())
            .field("not_actuable", &self.not_actuable)
            .finish()
    }
}

impl InProcess {
    pub fn new(policy: &Policy) -> Result<InProcess, ConfigError> {
        InProcess::acting_on(policy, ActOn::default())
    }

    /// [`InProcess::new`] deciding on `act_on` (tierd's `[controller]
    /// act_on`; the protocol's `Policy` does not carry it).
    pub fn acting_on(policy: &Policy, act_on: ActOn) -> Result<InProcess, ConfigError> {
        Ok(InProcess {
            controller: Controller::new(config(policy, act_on)?),
            policy: policy.clone(),
            act_on,
            actuation: None,
            not_actuable: HashMap::new(),
        })
    }

    /// Drives the balloons of the VMs in `fleet`; decisions that need a
    /// VMM call go to `sink` once it answered. A `vm.info` older than
    /// `max_age` does not count as the balloon's state.
    pub fn with_actuation(mut self, fleet: Fleet, sink: DecisionSink, max_age: Duration) -> Self {
        self.actuation = Some(Actuation {
            fleet,
            sink,
            max_age,
        });
        self
    }

    /// Takes a new policy (already validated by SetPolicy); a no-op when
    /// unchanged, so per-VM controller state survives.
    pub fn set_policy(&mut self, policy: &Policy) -> Result<(), ConfigError> {
        if *policy != self.policy {
            self.controller.set_config(config(policy, self.act_on)?);
            self.policy = policy.clone();
        }
        Ok(())
    }

    /// The VM's target DRAM-hit ratio and the band around it within which
    /// the controller leaves it alone (target ± epsilon x hold_band,
    /// clamped to [0, 1]); None while the policy is off or excludes the VM.
    pub fn target_band(&self, id: &str, name: &str) -> Option<TargetBand> {
        let c = self.controller.config();
        if !c.enabled {
            return None;
        }
        let o = c.vm(id, name);
        if o.is_some_and(|o| o.excluded) {
            return None;
        }
        let target = o.and_then(|o| o.target).unwrap_or(c.default_target);
        let e = c.hold_epsilon();
        Some(TargetBand {
            target,
            low: (target - e).max(0.0),
            high: (target + e).min(1.0),
        })
    }

    /// Whether the policy in force lets the controller act at all.
    pub fn is_enabled(&self) -> bool {
        self.policy.enabled
    }

    /// Why the controller cannot drive the VM's balloon, if it could not at
    /// the last step (no per-tier balloon, a stale `vm.info`, ...).
    pub fn not_actuable(&self, vm_id: &str) -> Option<&str> {
        self.not_actuable.get(vm_id).map(String::as_str)
    }

    /// Whether the policy has marked the VM uncooperative.
    pub fn is_uncooperative(&self, vm_id: &str) -> bool {
        self.controller.is_uncooperative(vm_id)
    }

    /// Fills the balloon state of `o` from its VMM; the reason if its
    /// balloon cannot be driven now.
    fn readiness(&self, o: &mut VmObs, s: &VmStats) -> Result<Arc<ChHandle>, String> {
        let h = self
            .actuation
            .as_ref()
            .and_then(|a| a.fleet.get(&o.id).map(|h| (h, a.max_age)));
        let Some((h, max_age)) = h else {
            return Err(NO_ACTUATOR.into());
        };
        let snap = h.snapshot();
        let mut tiers = vec![o.dram.name.as_str()];
        if o.slow.size > 0 {
            tiers.push(o.slow.name.as_str());
        }
        let balloon = snap
            .drivable(max_age, &tiers)
            .map_err(|e| format!("per-tier balloon not drivable: {e}"))?;
        // Idle is only known for a tier that has been through an ageing pass.
        let aged = |name: &str| s.tiers.iter().any(|x| x.tier == name && x.passes > 0);
        let fill = |t: &mut TierObs| {
            if let Some(z) = balloon.zones.iter().find(|z| z.id == t.name) {
                t.balloon_target = z.target;
                t.balloon_actual = z.host_ballooned;
                if aged(&t.name) {
                    t.idle_bytes = t.held().saturating_sub(t.accessed_bytes);
                }
            }
        };
        fill(&mut o.dram);
        if o.slow.size > 0 {
            fill(&mut o.slow);
        }
        Ok(h.clone())
    }

    /// One interval: decisions for the VMs of `update` (`vms` is the full VM
    /// list, as the update may leave it out when unchanged). Returns the
    /// decisions to publish now; those sent to a VMM are published through
    /// the sink when it has answered.
    pub fn step(&mut self, vms: &[Vm], update: &StatsUpdate) -> Vec<Decision> {
        for d in &update.departed_vm_ids {
            self.controller.forgive(d);
            self.not_actuable.remove(d);
        }
        if !self.policy.enabled {
            return Vec::new();
        }
        let mut handles = HashMap::new();
        let mut why_not = HashMap::new();
        // By id once: a search of the list per VM was quadratic in the
        // fleet (7 % of tierd's CPU at 1000 VMs once the fits were cheap;
        // issue 23).
        let by_id: HashMap<&str, &Vm> = vms.iter().map(|v| (v.id.as_str(), v)).collect();
        let obs: Vec<VmObs> = update
            .stats
            .iter()
            .filter_map(|s| {
                let vm = *by_id.get(s.vm_id.as_str())?;
                let mut o = input::from_proto(vm, s).ok()?;
                match self.readiness(&mut o, s) {
                    Ok(h) => {
                        o.balloon_ok = true;
                        handles.insert(o.id.clone(), h);
                    }
                    Err(why) => {
                        o.balloon_ok = false;
                        why_not.insert(o.id.clone(), why);
                    }
                }
                Some(o)
            })
            .collect();
        for o in obs.iter().filter(|o| o.balloon_ok) {
            // Not actuable before, drivable now: manage it from here on.
            if let Some(was) = self.not_actuable.remove(&o.id)
                && self.controller.is_uncooperative(&o.id)
            {
                tracing::info!(vm = %o.id, was = %was, "per-tier balloon drivable now; the controller manages the VM");
                self.controller.forgive(&o.id);
            }
        }
        let plan = self.controller.decide(&obs, update.timestamp_unix_ns);
        let mut now = Vec::new();
        for mut d in plan.decisions {
            let why = why_not.get(&d.vm_id);
            if d.reason() == DecisionReason::Uncooperative
                && d.detail.starts_with("actuation reports")
                && let Some(why) = why
            {
                d.detail = format!("{why}; {}", d.detail);
            }
            if d.outcome() == DecisionOutcome::Applied {
                match handles.get(&d.vm_id) {
                    Some(h) => match self.actuation.as_ref() {
                        Some(a) if tokio::runtime::Handle::try_current().is_ok() => {
                            tokio::spawn(apply(h.clone(), d, a.sink.clone()));
                            continue;
                        }
                        _ => fail(&mut d, "no async runtime to call the VMM from"),
                    },
                    None => fail(&mut d, NO_ACTUATOR),
                }
            }
            now.push(d);
        }
        self.not_actuable.extend(why_not);
        now
    }
}

fn fail(d: &mut Decision, why: impl std::fmt::Display) {
    d.outcome = DecisionOutcome::Failed as i32;
    d.detail = format!("not applied: {why}; {}", d.detail);
}

/// Sends one decision's targets and publishes it with the outcome.
async fn apply(h: Arc<ChHandle>, mut d: Decision, sink: DecisionSink) {
    let targets: Vec<(String, u64)> = d
        .changes
        .iter()
        .map(|c| (c.tier.clone(), c.new_target_bytes))
        .collect();
    if let Err(e) = h.set_targets(&targets).await {
        fail(&mut d, e);
    }
    sink(d);
}
