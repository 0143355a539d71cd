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
//!
//! Which actuator drives a VM is chosen per interval (`crate::actuator`):
//! the per-tier balloon, or `vm.resize-zone` of a virtio-mem zone (issue
//! 33), whose balloon-style target is `hotplug_size - requested` and whose
//! actual is `hotplug_size - plugged`, so a guest that does not follow is
//! marked uncooperative after the grace period like a balloon, and the
//! zone's boot part is a floor (`TierObs::reach`). A refused resize holds
//! the VM's resizes back for a doubling number of intervals.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tier_controller::actuate::ResizableZone;
use tier_controller::policy::{ActOn, Config, ConfigError, Controller, TierObs, VmObs, input};

/// The policy's config with `act_on` in its tuning.
fn config(policy: &Policy, act_on: ActOn) -> Result<Config, ConfigError> {
    let mut c = Config::try_from(policy)?;
    c.tuning.act_on = act_on;
    Ok(c)
}
use tier_proto::human_bytes;
use tier_proto::v1::{
    Actuator, Decision, DecisionOutcome, DecisionReason, Policy, StatsUpdate, Vm,
};

use crate::IdMap;
use crate::actuator::{self, Choice, Preferences};
use crate::ch::{ChHandle, Fleet};
use crate::qemu::QemuHandle;

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
    qemu: crate::qemu::Fleet,
    sink: DecisionSink,
    max_age: Duration,
}

/// A VM's VMM as the controller reaches it.
#[derive(Clone)]
enum Handle {
    Ch(Arc<ChHandle>),
    Qemu(Arc<QemuHandle>),
}

impl Handle {
    /// Resizes tier `zone` to `desired_ram` bytes (boot + plugged).
    async fn resize_zone(&self, zone: &str, desired_ram: u64) -> Result<(), String> {
        match self {
            Handle::Ch(h) => h
                .resize_zone(zone, desired_ram)
                .await
                .map_err(|e| e.to_string()),
            Handle::Qemu(h) => h.resize_zone(zone, desired_ram).await,
        }
    }
}

/// How a VM is driven this interval.
enum Drive {
    Balloon(Arc<ChHandle>),
    Resize {
        h: Handle,
        dram: ResizableZone,
        slow: Option<ResizableZone>,
    },
}

/// Resizes of a VM held back after the VMM refused one: until when, and
/// how many refusals in a row (the hold doubles with each).
#[derive(Debug, Clone, Copy)]
struct Hold {
    until: Instant,
    refusals: u32,
}

/// Shared with the tasks that send resizes.
type Holds = Arc<Mutex<HashMap<String, Hold>>>;

/// The longest a VM's resizes are held after refusals.
const MAX_HOLD_INTERVALS: u32 = 64;

/// The in-process controller and the policy it was built from.
pub struct InProcess {
    controller: Controller,
    policy: Policy,
    /// `[controller] act_on`, kept across policy changes.
    act_on: ActOn,
    actuation: Option<Actuation>,
    /// VMs last handed over with `balloon_ok = false`, and why.
    not_actuable: IdMap<String, String>,
    /// `[controller] actuator` and its per-VM overrides.
    prefs: Preferences,
    /// Each VM's actuator at the last step, and the step's number (kept
    /// in place: no table of every VM's choice allocated per interval).
    choices: IdMap<String, (u64, Choice)>,
    steps: u64,
    holds: Holds,
    /// The sampling interval (resize holds are counted in it).
    interval: Duration,
    /// What `annotate` chose for the update it saw last.
    annotated: Option<Annotated>,
}

/// The actuator `annotate` chose for each VM of one update (in the order
/// of its stats; `None`: not a VM the controller reads).
#[derive(Debug)]
struct Annotated {
    sequence: u64,
    choices: Vec<Option<Choice>>,
}

impl std::fmt::Debug for InProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcess")
            .field("controller", &self.controller)
            .field("policy", &self.policy)
            .field("act_on", &self.act_on)
            .field("actuation", &self.actuation.is_some())
            .field("not_actuable", &self.not_actuable)
            .field("prefs", &self.prefs)
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
            not_actuable: IdMap::default(),
            prefs: Preferences::default(),
            choices: IdMap::default(),
            steps: 0,
            holds: Holds::default(),
            interval: Duration::from_secs(1),
            annotated: None,
        })
    }

    /// Chooses actuators by `prefs` (`[controller] actuator`); resize
    /// holds are counted in `interval`s.
    pub fn with_actuators(mut self, prefs: Preferences, interval: Duration) -> Self {
        self.prefs = prefs;
        self.interval = interval;
        self
    }

    /// The actuator of each VM in `update`, from what its VMM reports now
    /// (`VmStats.actuator`, `actuator_detail`): called before the update
    /// is published, so the stream shows what the step will use. The
    /// choices are kept for the step on the same update, which uses them
    /// rather than choosing again.
    pub fn annotate(&mut self, vms: &[Vm], update: &mut StatsUpdate) {
        // By id once: a search of the list per VM was quadratic in the
        // fleet (13 % of tierd's CPU at 1000 VMs; `bench tierd-scale`).
        let by_id: IdMap<&str, &Vm> = vms.iter().map(|v| (v.id.as_str(), v)).collect();
        let mut choices = Vec::with_capacity(update.stats.len());
        for s in &mut update.stats {
            let o = by_id
                .get(s.vm_id.as_str())
                .and_then(|vm| input::from_proto(vm, s).ok());
            let c = o.map(|o| self.choice(&o));
            if let Some(c) = &c {
                s.actuator = c.actuator as i32;
                s.actuator_detail.clone_from(&c.detail);
            }
            choices.push(c);
        }
        self.annotated = Some(Annotated {
            sequence: update.sequence,
            choices,
        });
    }

    /// The VMM handle of VM `id`, and how old its state may be.
    fn handle(&self, id: &str) -> Option<(Handle, Duration)> {
        let a = self.actuation.as_ref()?;
        let h = match a.fleet.get(id) {
            Some(h) => Handle::Ch(h),
            None => Handle::Qemu(a.qemu.get(id)?),
        };
        Some((h, a.max_age))
    }

    /// The actuator of one VM now.
    fn choice(&self, o: &VmObs) -> Choice {
        let Some((h, max_age)) = self.handle(&o.id) else {
            return Choice {
                actuator: Actuator::None,
                detail: NO_ACTUATOR.into(),
                dram: None,
                slow: None,
            };
        };
        let slow = (o.slow.size > 0).then_some(o.slow.name.as_str());
        let pref = self.prefs.of(&o.id, &o.name);
        match h {
            Handle::Ch(h) => actuator::choose(pref, &h.snapshot(), max_age, &o.dram.name, slow),
            Handle::Qemu(h) => {
                crate::qemu::choose::choose(pref, &h, &h.snapshot(), max_age, &o.dram.name, slow)
            }
        }
    }

    /// The actuator each VM had at the last step.
    pub fn actuator(&self, vm_id: &str) -> Option<&Choice> {
        self.choices.get(vm_id).map(|(_, c)| c)
    }

    /// Drives the balloons of the VMs in `fleet`; decisions that need a
    /// VMM call go to `sink` once it answered. A `vm.info` older than
    /// `max_age` does not count as the balloon's state.
    pub fn with_actuation(mut self, fleet: Fleet, sink: DecisionSink, max_age: Duration) -> Self {
        self.actuation = Some(Actuation {
            fleet,
            qemu: crate::qemu::Fleet::default(),
            sink,
            max_age,
        });
        self
    }

    /// Also drives the QEMU VMs in `fleet` (their virtio-mem devices);
    /// after [`InProcess::with_actuation`].
    pub fn with_qemu(mut self, fleet: crate::qemu::Fleet) -> Self {
        if let Some(a) = self.actuation.as_mut() {
            a.qemu = fleet;
        }
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

    /// Fills the balloon (or zone) state of `o` from its VMM; the reason
    /// if nothing can drive it now.
    fn readiness(&self, o: &mut VmObs, c: &Choice) -> Result<Drive, String> {
        let Some((h, max_age)) = self.handle(&o.id) else {
            return Err(NO_ACTUATOR.into());
        };
        // Idle bytes are the ages' measured cold bytes (`input::from_proto`),
        // whatever the actuator makes of the tier's size.
        match c.actuator {
            Actuator::ResizeZone => {
                let dram = c.dram.clone().ok_or_else(|| c.detail.clone())?;
                let zone = |t: &mut TierObs, z: &ResizableZone| {
                    t.size = z.size();
                    t.balloon_target = z.target();
                    // Upstream: the plugged size from memory_actual_size
                    // where it tells (one hot-pluggable zone, no
                    // balloon), so memory a guest never unplugs stays in
                    // the budget; else taken as followed, and the
                    // actuator detail says so.
                    t.balloon_actual = z.actual_or_total().unwrap_or(t.balloon_target);
                    t.reach = Some(z.reach());
                    t.granule = z.block;
                };
                zone(&mut o.dram, &dram);
                if dram.plugged.is_none() {
                    // Upstream: samples cover the boot part only, so what
                    // is idle in plugged memory is unknown, not all of it.
                    o.dram.idle_bytes = 0;
                }
                match &c.slow {
                    Some(z) => zone(&mut o.slow, z),
                    None => {
                        // No actuator on the slow tier: it stays as it is.
                        o.slow.balloon_target = 0;
                        o.slow.balloon_actual = 0;
                        o.slow.reach = Some(0);
                    }
                }
                Ok(Drive::Resize {
                    h,
                    dram,
                    slow: c.slow.clone(),
                })
            }
            Actuator::TierBalloon => {
                let Handle::Ch(h) = h else {
                    return Err(c.detail.clone());
                };
                let snap = h.snapshot();
                let mut tiers = vec![o.dram.name.as_str()];
                if o.slow.size > 0 {
                    tiers.push(o.slow.name.as_str());
                }
                let balloon = snap
                    .drivable(max_age, &tiers)
                    .map_err(|e| format!("per-tier balloon not drivable: {e}"))?;
                let fill = |t: &mut TierObs| {
                    if let Some(z) = balloon.zones.iter().find(|z| z.id == t.name) {
                        t.balloon_target = z.target;
                        t.balloon_actual = z.host_ballooned;
                    }
                };
                fill(&mut o.dram);
                if o.slow.size > 0 {
                    fill(&mut o.slow);
                }
                Ok(Drive::Balloon(h.clone()))
            }
            _ => Err(c.detail.clone()),
        }
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
        // Keyed by the update's ids: no key copied per VM and interval.
        let mut handles: IdMap<&str, Drive> = IdMap::default();
        let mut why_not: IdMap<&str, String> = IdMap::default();
        why_not.reserve(update.stats.len());
        // By id once: a search of the list per VM was quadratic in the
        // fleet (7 % of tierd's CPU at 1000 VMs once the fits were cheap;
        // `bench tierd-scale`).
        let by_id: IdMap<&str, &Vm> = vms.iter().map(|v| (v.id.as_str(), v)).collect();
        // The choices annotate made for this update, if it saw it.
        let mut annotated = self
            .annotated
            .take()
            .filter(|a| a.sequence == update.sequence && a.choices.len() == update.stats.len())
            .map(|a| a.choices);
        self.steps += 1;
        let step = self.steps;
        let mut choices = std::mem::take(&mut self.choices);
        let mut changed = Vec::new();
        let obs: Vec<VmObs> = update
            .stats
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let vm = *by_id.get(s.vm_id.as_str())?;
                let mut o = input::from_proto(vm, s).ok()?;
                let c = annotated
                    .as_mut()
                    .and_then(|a| a.get_mut(i)?.take())
                    .unwrap_or_else(|| self.choice(&o));
                match self.readiness(&mut o, &c) {
                    Ok(h) => {
                        o.balloon_ok = true;
                        handles.insert(s.vm_id.as_str(), h);
                    }
                    Err(why) => {
                        o.balloon_ok = false;
                        why_not.insert(s.vm_id.as_str(), why);
                    }
                }
                match choices.get_mut(&o.id) {
                    Some(slot) => {
                        // Another actuator means other targets: start the
                        // VM afresh.
                        if slot.1.actuator != c.actuator {
                            tracing::info!(vm = %o.id, from = ?slot.1.actuator, to = ?c.actuator, detail = %c.detail, "actuator changed");
                            changed.push(i);
                        }
                        *slot = (step, c);
                    }
                    None => {
                        choices.insert(o.id.clone(), (step, c));
                    }
                }
                Some(o)
            })
            .collect();
        for i in changed {
            if let Some(s) = update.stats.get(i) {
                self.controller.forgive(&s.vm_id);
            }
        }
        // VMs not in this update have no actuator now.
        choices.retain(|_, (s, _)| *s == step);
        self.choices = choices;
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
            let why = why_not.get(d.vm_id.as_str());
            if d.reason() == DecisionReason::Uncooperative
                && d.detail.starts_with("actuation reports")
                && let Some(why) = why
            {
                d.detail = format!("{why}; {}", d.detail);
            }
            if d.reason() == DecisionReason::Uncooperative
                && let Some(Drive::Resize { dram, slow, .. }) = handles.get(d.vm_id.as_str())
            {
                d.detail = format!("{}; {}", not_following(dram, slow.as_ref()), d.detail);
            }
            if d.outcome() == DecisionOutcome::Applied {
                let rt = tokio::runtime::Handle::try_current().is_ok();
                match (handles.get(d.vm_id.as_str()), self.actuation.as_ref()) {
                    (Some(Drive::Balloon(h)), Some(a)) if rt => {
                        tokio::spawn(apply(h.clone(), d, a.sink.clone()));
                        continue;
                    }
                    (Some(Drive::Resize { h, dram, slow }), Some(a)) if rt => {
                        if let Some(wait) = self.held(&d.vm_id) {
                            d.outcome = DecisionOutcome::Skipped as i32;
                            d.detail = format!(
                                "not sent: resizes of this VM held {:.1} s more after the VMM refused one; {}",
                                wait.as_secs_f64(),
                                d.detail
                            );
                        } else {
                            let resize = Resize {
                                h: h.clone(),
                                dram: dram.clone(),
                                slow: slow.clone(),
                                holds: self.holds.clone(),
                                interval: self.interval,
                            };
                            tokio::spawn(resize.apply(d, a.sink.clone()));
                            continue;
                        }
                    }
                    (Some(_), _) => fail(&mut d, "no async runtime to call the VMM from"),
                    (None, _) => fail(&mut d, NO_ACTUATOR),
                }
            }
            now.push(d);
        }
        for (id, why) in why_not {
            match self.not_actuable.get_mut(id) {
                Some(w) => *w = why,
                None => {
                    self.not_actuable.insert(id.to_string(), why);
                }
            }
        }
        now
    }
}

impl InProcess {
    /// How much longer the VM's resizes are held, if they are.
    fn held(&self, vm_id: &str) -> Option<Duration> {
        let holds = self.holds.lock().ok()?;
        let h = holds.get(vm_id)?;
        h.until.checked_duration_since(Instant::now())
    }
}

/// Target against plugged, for a VM whose zone does not follow.
fn not_following(dram: &ResizableZone, slow: Option<&ResizableZone>) -> String {
    let one = |z: &ResizableZone| match z.plugged {
        Some(p) => format!(
            "zone {:?} requested {} hot-plugged, guest plugged {}",
            z.id,
            human_bytes(z.requested),
            human_bytes(p)
        ),
        None => format!(
            "zone {:?} requested {} hot-plugged, plugged not reported by this VMM",
            z.id,
            human_bytes(z.requested)
        ),
    };
    let mut s = one(dram);
    if let Some(z) = slow {
        s.push_str("; ");
        s.push_str(&one(z));
    }
    s
}

/// One decision's zone resizes and what they need.
struct Resize {
    h: Handle,
    dram: ResizableZone,
    slow: Option<ResizableZone>,
    holds: Holds,
    interval: Duration,
}

impl Resize {
    /// Sends each changed tier's `vm.resize-zone` (targets mapped to
    /// `desired_ram`, the change's new target set to what was sent) and
    /// publishes the decision with the outcome. A move smaller than a
    /// block is not sent (SKIPPED); a refusal holds the VM's resizes for
    /// 2, 4, ... up to 64 intervals.
    async fn apply(self, mut d: Decision, sink: DecisionSink) {
        let mut sent = Vec::new();
        let mut small = Vec::new();
        let mut error = None;
        for c in &mut d.changes {
            let z = match (&self.slow, c.tier == self.dram.id) {
                (_, true) => &self.dram,
                (Some(s), false) if s.id == c.tier => s,
                _ => {
                    error = Some(format!(
                        "tier {:?} has no virtio-mem zone to resize",
                        c.tier
                    ));
                    break;
                }
            };
            let desired = z.desired_ram(c.new_target_bytes);
            if desired == z.requested_ram() {
                small.push(format!(
                    "{:?} less than a block ({}) from the size requested now",
                    z.id,
                    human_bytes(z.block)
                ));
                c.new_target_bytes = c.old_target_bytes;
                continue;
            }
            if let Err(e) = self.h.resize_zone(&z.id, desired).await {
                error = Some(e);
                break;
            }
            c.new_target_bytes = z.target_of(desired);
            sent.push(format!(
                "vm.resize-zone {:?} desired_ram={desired} ({} boot + {} hot-plugged)",
                z.id,
                human_bytes(z.boot),
                human_bytes(desired - z.boot)
            ));
        }
        if let Some(e) = error {
            let wait = self.refused(&d.vm_id);
            let mut why = e;
            if !sent.is_empty() {
                why = format!("{why} (after {})", sent.join("; "));
            }
            fail(
                &mut d,
                format!(
                    "{why}; resizes of this VM held for {:.1} s",
                    wait.as_secs_f64()
                ),
            );
        } else {
            if let Ok(mut holds) = self.holds.lock() {
                holds.remove(&d.vm_id);
            }
            if sent.is_empty() {
                d.outcome = DecisionOutcome::Skipped as i32;
                d.detail = format!("not sent: {}; {}", small.join("; "), d.detail);
            } else {
                sent.extend(small.into_iter().map(|s| format!("not sent: {s}")));
                d.detail = format!("{}; {}", sent.join("; "), d.detail);
            }
        }
        sink(d);
    }

    /// Records a refusal; how long the VM's resizes are held now.
    fn refused(&self, vm_id: &str) -> Duration {
        let Ok(mut holds) = self.holds.lock() else {
            return Duration::ZERO;
        };
        let refusals = holds.get(vm_id).map_or(0, |h| h.refusals) + 1;
        let intervals = 2u32
            .checked_pow(refusals)
            .unwrap_or(u32::MAX)
            .min(MAX_HOLD_INTERVALS);
        let wait = self.interval.saturating_mul(intervals);
        holds.insert(
            vm_id.to_string(),
            Hold {
                until: Instant::now() + wait,
                refusals,
            },
        );
        wait
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
