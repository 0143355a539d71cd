//! The controller policy as JSON, for `tierctl policy get|set`. The
//! generated tier.v1 types carry no serde, so the mapping is spelled out
//! here, with the proto's field names.

use serde::{Deserialize, Serialize};
use tier_proto::v1::{Policy, PolicyMode, ReclaimMode, TierLimits, VmPolicy};

use crate::cli::PolicySetArgs;

#[derive(Debug, thiserror::Error)]
pub enum PolicyFileError {
    #[error("policy JSON: {0}")]
    Parse(#[from] serde_json::Error),
}

/// `PolicyMode` in JSON: "ratio", "working_set" or "auto"; a number this tierctl
/// does not know (a newer tierd) is "unknown(N)", never shown as another
/// mode, and a file carrying it sends N back unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ModeJson {
    Ratio,
    WorkingSet,
    Auto,
    Unknown(i32),
}

const MODE_NAMES: &[&str] = &["ratio", "working_set", "auto"];

impl ModeJson {
    fn of(v: i32) -> ModeJson {
        match PolicyMode::try_from(v) {
            Ok(PolicyMode::Ratio) => ModeJson::Ratio,
            Ok(PolicyMode::WorkingSet) => ModeJson::WorkingSet,
            Ok(PolicyMode::Auto) => ModeJson::Auto,
            Err(_) => ModeJson::Unknown(v),
        }
    }

    fn to_proto(self) -> i32 {
        match self {
            ModeJson::Ratio => PolicyMode::Ratio as i32,
            ModeJson::WorkingSet => PolicyMode::WorkingSet as i32,
            ModeJson::Auto => PolicyMode::Auto as i32,
            ModeJson::Unknown(v) => v,
        }
    }

    fn name(self) -> String {
        match self {
            ModeJson::Ratio => "ratio".into(),
            ModeJson::WorkingSet => "working_set".into(),
            ModeJson::Auto => "auto".into(),
            ModeJson::Unknown(v) => format!("unknown({v})"),
        }
    }

    fn parse(s: &str) -> Option<ModeJson> {
        match s {
            "ratio" => Some(ModeJson::Ratio),
            "working_set" => Some(ModeJson::WorkingSet),
            "auto" => Some(ModeJson::Auto),
            _ => s
                .strip_prefix("unknown(")?
                .strip_suffix(')')?
                .parse()
                .ok()
                .map(ModeJson::of),
        }
    }
}

impl Serialize for ModeJson {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

impl<'de> Deserialize<'de> for ModeJson {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ModeJson, D::Error> {
        let s = String::deserialize(d)?;
        ModeJson::parse(&s).ok_or_else(|| serde::de::Error::unknown_variant(&s, MODE_NAMES))
    }
}

/// `ReclaimMode` in JSON: "eager" or "on_demand"; an unknown number is
/// "unknown(N)" and goes back unchanged, as `ModeJson`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ReclaimJson(i32);

const RECLAIM_NAMES: &[&str] = &["eager", "on_demand"];

impl ReclaimJson {
    fn name(self) -> String {
        match ReclaimMode::try_from(self.0) {
            Ok(ReclaimMode::Eager) => "eager".into(),
            Ok(ReclaimMode::OnDemand) => "on_demand".into(),
            Err(_) => format!("unknown({})", self.0),
        }
    }

    fn parse(s: &str) -> Option<ReclaimJson> {
        match s {
            "eager" => Some(ReclaimJson(ReclaimMode::Eager as i32)),
            "on_demand" => Some(ReclaimJson(ReclaimMode::OnDemand as i32)),
            _ => s
                .strip_prefix("unknown(")?
                .strip_suffix(')')?
                .parse()
                .ok()
                .map(ReclaimJson),
        }
    }
}

impl Serialize for ReclaimJson {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

impl<'de> Deserialize<'de> for ReclaimJson {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ReclaimJson, D::Error> {
        let s = String::deserialize(d)?;
        ReclaimJson::parse(&s).ok_or_else(|| serde::de::Error::unknown_variant(&s, RECLAIM_NAMES))
    }
}

/// `policy set --file`: every key optional (a missing key keeps the value
/// in force); unknown keys are refused so a typo does not pass silently.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyPatch {
    enabled: Option<bool>,
    dry_run: Option<bool>,
    default_target: Option<f64>,
    epsilon: Option<f64>,
    host_dram_budget_bytes: Option<u64>,
    max_step_bytes: Option<u64>,
    cooldown_intervals: Option<u32>,
    idle_threshold: Option<f64>,
    mode: Option<ModeJson>,
    hot_horizon_seconds: Option<f64>,
    promotion_slo: Option<f64>,
    reclaim: Option<ReclaimJson>,
    /// Replaces the whole per-VM list when present.
    vms: Option<Vec<VmPolicyJson>>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct VmPolicyJson {
    vm: String,
    #[serde(default)]
    target: Option<f64>,
    #[serde(default)]
    limits: Vec<LimitsJson>,
    #[serde(default)]
    excluded: bool,
    /// Unset: the policy's mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mode: Option<ModeJson>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsJson {
    tier: String,
    #[serde(default)]
    floor_bytes: u64,
    #[serde(default)]
    ceiling_bytes: u64,
}

#[derive(Debug, Serialize)]
struct PolicyJson {
    enabled: bool,
    dry_run: bool,
    default_target: f64,
    epsilon: f64,
    host_dram_budget_bytes: u64,
    max_step_bytes: u64,
    cooldown_intervals: u32,
    idle_threshold: f64,
    mode: ModeJson,
    hot_horizon_seconds: f64,
    promotion_slo: f64,
    reclaim: ReclaimJson,
    vms: Vec<VmPolicyJson>,
}

/// The policy as pretty JSON (what `policy get` prints and `--file` reads).
pub fn to_json(p: &Policy) -> serde_json::Value {
    let j = PolicyJson {
        enabled: p.enabled,
        dry_run: p.dry_run,
        default_target: p.default_target,
        epsilon: p.epsilon,
        host_dram_budget_bytes: p.host_dram_budget_bytes,
        max_step_bytes: p.max_step_bytes,
        cooldown_intervals: p.cooldown_intervals,
        idle_threshold: p.idle_threshold,
        mode: ModeJson::of(p.mode),
        hot_horizon_seconds: p.hot_horizon_seconds,
        promotion_slo: p.promotion_slo,
        reclaim: ReclaimJson(p.reclaim),
        vms: p
            .vms
            .iter()
            .map(|v| VmPolicyJson {
                vm: v.vm.clone(),
                target: v.target,
                limits: v
                    .limits
                    .iter()
                    .map(|l| LimitsJson {
                        tier: l.tier.clone(),
                        floor_bytes: l.floor_bytes,
                        ceiling_bytes: l.ceiling_bytes,
                    })
                    .collect(),
                excluded: v.excluded,
                mode: v.mode.map(ModeJson::of),
            })
            .collect(),
    };
    serde_json::to_value(j).unwrap_or(serde_json::Value::Null)
}

/// Applies a JSON file's keys onto `base`.
pub fn apply_file(base: &mut Policy, json: &str) -> Result<(), PolicyFileError> {
    let p: PolicyPatch = serde_json::from_str(json)?;
    set(&mut base.enabled, p.enabled);
    set(&mut base.dry_run, p.dry_run);
    set(&mut base.default_target, p.default_target);
    set(&mut base.epsilon, p.epsilon);
    set(&mut base.host_dram_budget_bytes, p.host_dram_budget_bytes);
    set(&mut base.max_step_bytes, p.max_step_bytes);
    set(&mut base.cooldown_intervals, p.cooldown_intervals);
    set(&mut base.idle_threshold, p.idle_threshold);
    set(&mut base.mode, p.mode.map(ModeJson::to_proto));
    set(&mut base.hot_horizon_seconds, p.hot_horizon_seconds);
    set(&mut base.promotion_slo, p.promotion_slo);
    set(&mut base.reclaim, p.reclaim.map(|r| r.0));
    if let Some(vms) = p.vms {
        base.vms = vms
            .into_iter()
            .map(|v| VmPolicy {
                vm: v.vm,
                target: v.target,
                mode: v.mode.map(ModeJson::to_proto),
                limits: v
                    .limits
                    .into_iter()
                    .map(|l| TierLimits {
                        tier: l.tier,
                        floor_bytes: l.floor_bytes,
                        ceiling_bytes: l.ceiling_bytes,
                    })
                    .collect(),
                excluded: v.excluded,
            })
            .collect();
    }
    Ok(())
}

/// Applies `policy set` flags onto `base` (after the file, if any).
pub fn apply_flags(base: &mut Policy, a: &PolicySetArgs) {
    set(&mut base.enabled, a.enabled);
    set(&mut base.dry_run, a.dry_run);
    set(&mut base.default_target, a.default_target);
    set(&mut base.epsilon, a.epsilon);
    set(&mut base.host_dram_budget_bytes, a.budget);
    set(&mut base.max_step_bytes, a.max_step);
    set(&mut base.cooldown_intervals, a.cooldown);
    set(&mut base.idle_threshold, a.idle_threshold);
    set(&mut base.mode, a.mode.map(|m| PolicyMode::from(m) as i32));
    set(&mut base.hot_horizon_seconds, a.hot_horizon);
    set(&mut base.promotion_slo, a.promotion_slo);
    set(
        &mut base.reclaim,
        a.reclaim.map(|r| ReclaimMode::from(r) as i32),
    );
}

fn set<T>(field: &mut T, v: Option<T>) {
    if let Some(v) = v {
        *field = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            enabled: true,
            default_target: 0.9,
            epsilon: 0.02,
            max_step_bytes: 64 << 20,
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
            ..Default::default()
        }
    }

    #[test]
    fn get_then_set_round_trips() {
        let mut p = policy();
        p.mode = PolicyMode::WorkingSet as i32;
        p.hot_horizon_seconds = 10.0;
        p.promotion_slo = 0.002;
        p.vms[0].mode = Some(PolicyMode::Ratio as i32);
        p.reclaim = ReclaimMode::OnDemand as i32;
        let text = serde_json::to_string_pretty(&to_json(&p)).unwrap();
        assert!(text.contains(r#""reclaim": "on_demand""#), "{text}");
        let mut q = Policy::default();
        apply_file(&mut q, &text).unwrap();
        assert_eq!(q, p);
    }

    #[test]
    fn file_is_a_patch_and_refuses_typos() {
        let mut p = policy();
        apply_file(&mut p, r#"{"epsilon": 0.05}"#).unwrap();
        assert_eq!((p.epsilon, p.default_target, p.vms.len()), (0.05, 0.9, 1));
        apply_file(&mut p, r#"{"vms": []}"#).unwrap();
        assert!(p.vms.is_empty());
        let e = apply_file(&mut p, r#"{"epsilom": 0.05}"#).unwrap_err();
        assert!(e.to_string().contains("epsilom"), "{e}");
        apply_file(
            &mut p,
            r#"{"mode": "working_set", "hot_horizon_seconds": 60, "promotion_slo": 0.002,
                "vms": [{"vm": "b", "mode": "ratio"}]}"#,
        )
        .unwrap();
        assert_eq!(p.mode, PolicyMode::WorkingSet as i32);
        assert_eq!((p.hot_horizon_seconds, p.promotion_slo), (60.0, 0.002));
        assert_eq!(p.vms[0].mode, Some(PolicyMode::Ratio as i32));
        let j = to_json(&p);
        assert_eq!(j["mode"], "working_set");
        assert_eq!(j["vms"][0]["mode"], "ratio");
        let e = apply_file(&mut p, r#"{"mode": "hot"}"#).unwrap_err();
        assert!(e.to_string().contains("unknown variant"), "{e}");
        apply_file(&mut p, r#"{"reclaim": "on_demand"}"#).unwrap();
        assert_eq!(p.reclaim, ReclaimMode::OnDemand as i32);
        let e = apply_file(&mut p, r#"{"reclaim": "lazy"}"#).unwrap_err();
        assert!(e.to_string().contains("unknown variant"), "{e}");
        assert_eq!(p.reclaim, ReclaimMode::OnDemand as i32);
    }

    /// A mode number from a newer tierd shows as unknown(N), not as ratio,
    /// and a get-then-set sends it back unchanged.
    #[test]
    fn unknown_mode_is_shown_as_unknown() {
        let mut p = policy();
        p.mode = 7;
        p.vms[0].mode = Some(9);
        let j = to_json(&p);
        assert_eq!(j["mode"], "unknown(7)");
        assert_eq!(j["vms"][0]["mode"], "unknown(9)");
        let mut q = Policy::default();
        apply_file(&mut q, &j.to_string()).unwrap();
        assert_eq!((q.mode, q.vms[0].mode), (7, Some(9)));
        // "unknown(1)" is a known number: read as what it is.
        apply_file(&mut q, r#"{"mode": "unknown(1)"}"#).unwrap();
        assert_eq!(q.mode, PolicyMode::WorkingSet as i32);
        for bad in [r#"{"mode": "unknown"}"#, r#"{"mode": "unknown(x)"}"#] {
            let e = apply_file(&mut q, bad).unwrap_err();
            assert!(e.to_string().contains("unknown variant"), "{e}");
        }
    }

    #[test]
    fn flags_override() {
        let mut p = policy();
        apply_flags(
            &mut p,
            &PolicySetArgs {
                default_target: Some(0.95),
                dry_run: Some(true),
                mode: Some(crate::cli::ModeArg::WorkingSet),
                promotion_slo: Some(0.01),
                reclaim: Some(crate::cli::ReclaimArg::Eager),
                ..Default::default()
            },
        );
        assert_eq!(p.reclaim, ReclaimMode::Eager as i32);
        assert_eq!((p.default_target, p.dry_run, p.epsilon), (0.95, true, 0.02));
        assert_eq!(p.mode, PolicyMode::WorkingSet as i32);
        assert_eq!((p.promotion_slo, p.hot_horizon_seconds), (0.01, 0.0));
    }
}
