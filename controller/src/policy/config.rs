//! The policy as the decision function uses it: a validated copy of the
//! proto `Policy`, plus tunables the protocol does not carry (yet).

use std::collections::HashMap;

use tier_proto::v1::{Policy, PolicyMode, ReclaimMode};

use super::hit_interval::ActOn;

/// Balloon granularity; sizes, steps and limits are multiples of it.
pub const PAGE: u64 = 4096;

/// A policy field that is out of range: names the field and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("policy.{field}: {reason}")]
pub struct ConfigError {
    pub field: String,
    pub reason: String,
}

fn err(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Bounds of one tier in bytes left to the guest (size minus balloon).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub floor: u64,
    /// `None`: the tier size.
    pub ceiling: Option<u64>,
}

impl Limits {
    /// `(floor, ceiling)` for a tier of `size` bytes; both <= size.
    pub fn resolve(self, size: u64) -> (u64, u64) {
        let ceiling = self.ceiling.unwrap_or(size).min(size);
        (self.floor.min(ceiling), ceiling)
    }
}

/// What the controller keeps a VM at (`PolicyMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// The DRAM-hit ratio at its target.
    #[default]
    Ratio,
    /// The hot working set in DRAM, slow-tier promotion under the SLO,
    /// reclaim by cold age first (`working_set`). A VM without ages, or
    /// with an exact PMU count, stays in ratio mode.
    WorkingSet,
    /// Per VM and interval, the mode its signal supports (`resolve`).
    Auto,
}

impl Mode {
    fn of(field: &str, v: i32) -> Result<Mode, ConfigError> {
        match PolicyMode::try_from(v) {
            Ok(PolicyMode::Ratio) => Ok(Mode::Ratio),
            Ok(PolicyMode::WorkingSet) => Ok(Mode::WorkingSet),
            Ok(PolicyMode::Auto) => Ok(Mode::Auto),
            Err(_) => Err(err(field, format!("{v} is not a PolicyMode"))),
        }
    }

    pub fn to_proto(self) -> PolicyMode {
        match self {
            Mode::Ratio => PolicyMode::Ratio,
            Mode::WorkingSet => PolicyMode::WorkingSet,
            Mode::Auto => PolicyMode::Auto,
        }
    }

    /// The mode a VM is decided in: an explicit mode stands; `Auto` is
    /// ratio on a PMU count (exact) and working_set otherwise, as accessed
    /// bits measure the hot set well and the ratio only within wide
    /// intervals.
    pub fn resolve(self, counted: bool) -> Mode {
        match self {
            Mode::Auto if counted => Mode::Ratio,
            Mode::Auto => Mode::WorkingSet,
            m => m,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Ratio => "ratio",
            Mode::WorkingSet => "working_set",
            Mode::Auto => "auto",
        }
    }
}

/// When DRAM a VM holds but does not need is taken back
/// (`Policy.reclaim`, docs/controller.md "Reclaim on demand").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reclaim {
    /// As soon as a rule finds it (idle, cold, above the target).
    #[default]
    Eager,
    /// Only as much as VMs short of DRAM need beyond the free pool: pages
    /// pushed to the slow tier come back only at the guest's promotion
    /// rate, so DRAM no one asks for stays where it is.
    OnDemand,
}

impl Reclaim {
    fn of(v: i32) -> Result<Reclaim, ConfigError> {
        match ReclaimMode::try_from(v) {
            Ok(ReclaimMode::Eager) => Ok(Reclaim::Eager),
            Ok(ReclaimMode::OnDemand) => Ok(Reclaim::OnDemand),
            Err(_) => Err(err("reclaim", format!("{v} is not a ReclaimMode"))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Reclaim::Eager => "eager",
            Reclaim::OnDemand => "on_demand",
        }
    }
}

/// The working_set mode's knobs (`Policy.hot_horizon_seconds`,
/// `Policy.promotion_slo`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct WorkingSet {
    /// Seconds; 0: each VM's shortest horizon. A horizon the VM does not
    /// report sends it to ratio mode (said in the decision's detail).
    pub hot_horizon: f64,
    /// Most slow-tier promotion per minute, as a share of the working set
    /// within the longest horizon; 0: no limit.
    pub promotion_slo: f64,
}

/// Per-VM overrides.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct VmOverride {
    pub target: Option<f64>,
    /// By tier name.
    pub limits: HashMap<String, Limits>,
    pub excluded: bool,
    /// `None`: `Config::mode`.
    pub mode: Option<Mode>,
}

/// Knobs that `Policy` does not carry; defaults are what docs/controller.md
/// describes.
#[derive(Debug, Clone, PartialEq)]
pub struct Tuning {
    /// A VM that reversed the direction of its DRAM changes does not
    /// reverse again for this many intervals (hysteresis).
    pub hysteresis_window: u32,
    /// A balloon within this many bytes of its target has arrived.
    pub balloon_tolerance: u64,
    /// Intervals a lagging balloon may make no progress before the VM is
    /// marked uncooperative.
    pub grace_intervals: u32,
    /// Releases smaller than this are not worth a balloon round trip;
    /// `None`: max(PAGE, max_step / 64).
    pub min_step: Option<u64>,
    /// Share of a multi-step move, as fitted by the model, kept back from
    /// the steps taken without a new assessment: the model extrapolates,
    /// so the last part is sized from a settled sample (0..=1).
    pub move_reserve: f64,
    /// Share of epsilon within which a VM is left alone (0..=1): the
    /// observed ratio carries sampling noise, so the controller acts before
    /// the observation reaches epsilon, and always aims at the target.
    pub hold_band: f64,
    /// A hot set (bytes accessed, both tiers) that changed by more than this
    /// share since a reversal is a new load, not an oscillation: the
    /// flip-back guard is lifted.
    pub new_load: f64,
    /// Which part of the DRAM-hit interval decides a move (default: the
    /// whole interval must lie outside the band).
    pub act_on: ActOn,
    /// Intervals at most that a VM given DRAM is left to move into it
    /// while its DRAM-resident bytes keep rising (`state::Fill`).
    pub fill_max_intervals: u32,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            hysteresis_window: 10,
            balloon_tolerance: 4 << 20,
            grace_intervals: 3,
            min_step: None,
            move_reserve: 0.2,
            hold_band: 0.75,
            new_load: 0.25,
            act_on: ActOn::Interval,
            fill_max_intervals: 20,
        }
    }
}

/// The validated policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub enabled: bool,
    pub dry_run: bool,
    pub default_target: f64,
    pub epsilon: f64,
    /// `None`: the sum of the VMs' DRAM tier sizes.
    pub budget: Option<u64>,
    pub max_step: u64,
    pub cooldown_intervals: u32,
    pub idle_threshold: f64,
    /// By VM id or name.
    pub vms: HashMap<String, VmOverride>,
    pub tuning: Tuning,
    /// The default mode; `VmOverride::mode` overrides it.
    pub mode: Mode,
    pub working_set: WorkingSet,
    pub reclaim: Reclaim,
}

impl Config {
    /// The override for a VM, by id first, then by name.
    pub fn vm(&self, id: &str, name: &str) -> Option<&VmOverride> {
        self.vms.get(id).or_else(|| self.vms.get(name))
    }

    /// The mode a VM is configured for (before any fallback to ratio mode
    /// for lack of ages).
    pub fn mode_of(&self, id: &str, name: &str) -> Mode {
        self.vm(id, name).and_then(|o| o.mode).unwrap_or(self.mode)
    }

    /// Half-width of the band within which a VM is left alone:
    /// epsilon x `hold_band`.
    pub fn hold_epsilon(&self) -> f64 {
        self.epsilon * self.tuning.hold_band.clamp(0.0, 1.0)
    }

    pub fn min_step(&self) -> u64 {
        self.tuning
            .min_step
            .unwrap_or((self.max_step / 64 / PAGE * PAGE).max(PAGE))
    }
}

fn ratio(field: &str, v: f64, max: f64) -> Result<f64, ConfigError> {
    if !v.is_finite() || !(0.0..=max).contains(&v) {
        return Err(err(field, format!("{v} is not in [0, {max}]")));
    }
    Ok(v)
}

fn pages(field: &str, v: u64) -> Result<u64, ConfigError> {
    if !v.is_multiple_of(PAGE) {
        return Err(err(field, format!("{v} is not a multiple of {PAGE}")));
    }
    Ok(v)
}

impl TryFrom<&Policy> for Config {
    type Error = ConfigError;

    /// Checks every field; the first bad one is reported.
    fn try_from(p: &Policy) -> Result<Self, ConfigError> {
        let default_target = ratio("default_target", p.default_target, 1.0)?;
        let epsilon = ratio("epsilon", p.epsilon, 0.5)?;
        let idle_threshold = ratio("idle_threshold", p.idle_threshold, 1.0)?;
        if p.max_step_bytes == 0 {
            return Err(err("max_step_bytes", "must be > 0"));
        }
        let max_step = pages("max_step_bytes", p.max_step_bytes)?;
        let budget = match pages("host_dram_budget_bytes", p.host_dram_budget_bytes)? {
            0 => None,
            b => Some(b),
        };
        let mut vms = HashMap::new();
        for (i, vm) in p.vms.iter().enumerate() {
            let at = |f: &str| format!("vms[{i}].{f}");
            if vm.vm.is_empty() {
                return Err(err(at("vm"), "must name a VM id or name"));
            }
            let target = match vm.target {
                Some(t) => Some(ratio(&at("target"), t, 1.0)?),
                None => None,
            };
            let mut limits = HashMap::new();
            for (j, l) in vm.limits.iter().enumerate() {
                let at = |f: &str| format!("vms[{i}].limits[{j}].{f}");
                if l.tier.is_empty() {
                    return Err(err(at("tier"), "must name a tier"));
                }
                let floor = pages(&at("floor_bytes"), l.floor_bytes)?;
                let ceiling = pages(&at("ceiling_bytes"), l.ceiling_bytes)?;
                if ceiling != 0 && ceiling < floor {
                    return Err(err(
                        at("ceiling_bytes"),
                        format!("{ceiling} is below floor_bytes {floor}"),
                    ));
                }
                let ceiling = (ceiling != 0).then_some(ceiling);
                if limits
                    .insert(l.tier.clone(), Limits { floor, ceiling })
                    .is_some()
                {
                    return Err(err(at("tier"), format!("{:?} appears twice", l.tier)));
                }
            }
            let mode = match vm.mode {
                Some(m) => Some(Mode::of(&at("mode"), m)?),
                None => None,
            };
            let o = VmOverride {
                target,
                limits,
                excluded: vm.excluded,
                mode,
            };
            if vms.insert(vm.vm.clone(), o).is_some() {
                return Err(err(at("vm"), format!("{:?} appears twice", vm.vm)));
            }
        }
        let mode = Mode::of("mode", p.mode)?;
        // Whether the horizon is one the VMs report is known only per VM
        // and interval: a VM that does not report it is decided in ratio
        // mode, and the decision says so.
        let h = p.hot_horizon_seconds;
        if !h.is_finite() || h < 0.0 {
            return Err(err(
                "hot_horizon_seconds",
                format!("{h} is not a horizon in seconds (>= 0; 0: the shortest)"),
            ));
        }
        let promotion_slo = ratio("promotion_slo", p.promotion_slo, 1.0)?;
        let reclaim = Reclaim::of(p.reclaim)?;
        Ok(Config {
            enabled: p.enabled,
            dry_run: p.dry_run,
            default_target,
            epsilon,
            budget,
            max_step,
            cooldown_intervals: p.cooldown_intervals,
            idle_threshold,
            vms,
            tuning: Tuning::default(),
            mode,
            working_set: WorkingSet {
                hot_horizon: h,
                promotion_slo,
            },
            reclaim,
        })
    }
}

/// The policy tierd starts with (and `tierctl policy` documents).
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
        mode: tier_proto::v1::PolicyMode::Auto as i32,
        hot_horizon_seconds: 0.0,
        promotion_slo: 0.0,
        reclaim: ReclaimMode::Eager as i32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tier_proto::v1::{TierLimits, VmPolicy};

    #[test]
    fn the_default_policy_is_valid() {
        Config::try_from(&default_policy()).unwrap();
    }

    fn policy() -> Policy {
        Policy {
            vms: vec![VmPolicy {
                vm: "a".into(),
                target: Some(0.8),
                limits: vec![TierLimits {
                    tier: "dram".into(),
                    floor_bytes: 1 << 20,
                    ceiling_bytes: 0,
                }],
                excluded: false,
                mode: None,
            }],
            ..default_policy()
        }
    }

    #[test]
    fn converts_a_good_policy() {
        let c = Config::try_from(&policy()).unwrap();
        assert_eq!(c.budget, None);
        assert_eq!(c.min_step(), 1 << 20);
        let a = c.vm("x", "a").unwrap();
        assert_eq!(a.target, Some(0.8));
        assert_eq!(c.mode_of("x", "a"), Mode::Auto);
        let l = a.limits["dram"];
        assert_eq!(l.resolve(16 << 20), (1 << 20, 16 << 20));
        assert_eq!(l.resolve(4096), (4096, 4096));
    }

    #[test]
    fn names_the_first_bad_field() {
        let bad = |f: fn(&mut Policy)| {
            let mut p = policy();
            f(&mut p);
            Config::try_from(&p).unwrap_err().field
        };
        assert_eq!(bad(|p| p.default_target = f64::NAN), "default_target");
        assert_eq!(bad(|p| p.epsilon = 0.6), "epsilon");
        assert_eq!(bad(|p| p.idle_threshold = 1.5), "idle_threshold");
        assert_eq!(bad(|p| p.max_step_bytes = 0), "max_step_bytes");
        assert_eq!(bad(|p| p.max_step_bytes = 100), "max_step_bytes");
        assert_eq!(
            bad(|p| p.host_dram_budget_bytes = 1),
            "host_dram_budget_bytes"
        );
        assert_eq!(bad(|p| p.vms[0].vm.clear()), "vms[0].vm");
        assert_eq!(bad(|p| p.vms[0].target = Some(-0.1)), "vms[0].target");
        assert_eq!(
            bad(|p| p.vms[0].limits[0].ceiling_bytes = 4096),
            "vms[0].limits[0].ceiling_bytes"
        );
        assert_eq!(
            bad(|p| p.vms[0].limits[0].floor_bytes = 5),
            "vms[0].limits[0].floor_bytes"
        );
        assert_eq!(
            bad(|p| {
                let l = p.vms[0].limits[0].clone();
                p.vms[0].limits.push(l);
            }),
            "vms[0].limits[1].tier"
        );
        assert_eq!(
            bad(|p| {
                let v = p.vms[0].clone();
                p.vms.push(v);
            }),
            "vms[1].vm"
        );
        assert_eq!(bad(|p| p.mode = 9), "mode");
        assert_eq!(bad(|p| p.vms[0].mode = Some(-1)), "vms[0].mode");
        assert_eq!(bad(|p| p.hot_horizon_seconds = -1.0), "hot_horizon_seconds");
        assert_eq!(
            bad(|p| p.hot_horizon_seconds = f64::INFINITY),
            "hot_horizon_seconds"
        );
        assert_eq!(bad(|p| p.promotion_slo = 1.5), "promotion_slo");
        assert_eq!(bad(|p| p.promotion_slo = f64::NAN), "promotion_slo");
        assert_eq!(bad(|p| p.reclaim = 7), "reclaim");
    }

    #[test]
    fn working_set_mode_and_a_per_vm_override() {
        let mut p = policy();
        p.mode = PolicyMode::WorkingSet as i32;
        p.hot_horizon_seconds = 10.0;
        p.promotion_slo = 0.002;
        p.vms[0].mode = Some(PolicyMode::Ratio as i32);
        let c = Config::try_from(&p).unwrap();
        assert_eq!(c.mode_of("x", "other"), Mode::WorkingSet);
        assert_eq!(c.mode_of("x", "a"), Mode::Ratio);
        // An explicit mode stands whatever the signal.
        assert_eq!(c.mode_of("x", "a").resolve(false), Mode::Ratio);
        assert_eq!(c.mode_of("x", "other").resolve(true), Mode::WorkingSet);
        assert_eq!(
            c.working_set,
            WorkingSet {
                hot_horizon: 10.0,
                promotion_slo: 0.002
            }
        );
    }

    #[test]
    fn the_default_mode_follows_the_signal() {
        let c = Config::try_from(&default_policy()).unwrap();
        assert_eq!(c.mode, Mode::Auto);
        assert_eq!(c.mode_of("x", "a").resolve(true), Mode::Ratio);
        assert_eq!(c.mode_of("x", "a").resolve(false), Mode::WorkingSet);
    }

    #[test]
    fn reclaim_is_eager_by_default_and_when_unset() {
        let c = Config::try_from(&default_policy()).unwrap();
        assert_eq!(c.reclaim, Reclaim::Eager);
        let p = Policy {
            reclaim: ReclaimMode::OnDemand as i32,
            ..default_policy()
        };
        assert_eq!(Config::try_from(&p).unwrap().reclaim, Reclaim::OnDemand);
        // An older sender's complete policy lacks the field: as before.
        let p = Policy {
            reclaim: 0,
            ..default_policy()
        };
        assert_eq!(Config::try_from(&p).unwrap().reclaim, Reclaim::Eager);
    }
}
