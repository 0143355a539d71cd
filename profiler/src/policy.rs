//! The controller policy as tierd stores it: defaults and validation of
//! `SetPolicy` requests. A rejected policy leaves the one in force unchanged.

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

/// A policy field that is out of range: names the field and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct PolicyError {
    pub field: String,
    pub reason: String,
}

fn err(field: impl Into<String>, reason: impl Into<String>) -> PolicyError {
    PolicyError {
        field: field.into(),
        reason: reason.into(),
    }
}

fn ratio(field: &str, v: f64, max: f64) -> Result<(), PolicyError> {
    if !v.is_finite() || !(0.0..=max).contains(&v) {
        return Err(err(field, format!("{v} is not in [0, {max}]")));
    }
    Ok(())
}

/// Checks every field; the first bad one is reported.
pub fn validate(p: &Policy) -> Result<(), PolicyError> {
    ratio("default_target", p.default_target, 1.0)?;
    ratio("epsilon", p.epsilon, 0.5)?;
    ratio("idle_threshold", p.idle_threshold, 1.0)?;
    if p.max_step_bytes == 0 {
        return Err(err("max_step_bytes", "must be > 0"));
    }
    if !p.max_step_bytes.is_multiple_of(4096) {
        return Err(err("max_step_bytes", "must be a multiple of 4096"));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, vm) in p.vms.iter().enumerate() {
        let at = |f: &str| format!("vms[{i}].{f}");
        if vm.vm.is_empty() {
            return Err(err(at("vm"), "must name a VM id or name"));
        }
        if !seen.insert(vm.vm.as_str()) {
            return Err(err(at("vm"), format!("{:?} appears twice", vm.vm)));
        }
        if let Some(t) = vm.target {
            ratio(&at("target"), t, 1.0)?;
        }
        for (j, l) in vm.limits.iter().enumerate() {
            let at = |f: &str| format!("vms[{i}].limits[{j}].{f}");
            if l.tier.is_empty() {
                return Err(err(at("tier"), "must name a tier"));
            }
            if l.ceiling_bytes != 0 && l.ceiling_bytes < l.floor_bytes {
                return Err(err(
                    at("ceiling_bytes"),
                    format!("{} is below floor_bytes {}", l.ceiling_bytes, l.floor_bytes),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tier_proto::v1::{TierLimits, VmPolicy};

    #[test]
    fn default_is_valid() {
        validate(&default_policy()).unwrap();
    }

    #[test]
    fn bad_fields_are_named() {
        let bad = |f: fn(&mut Policy)| {
            let mut p = default_policy();
            f(&mut p);
            validate(&p).unwrap_err().field
        };
        assert_eq!(bad(|p| p.default_target = 1.5), "default_target");
        assert_eq!(bad(|p| p.default_target = f64::NAN), "default_target");
        assert_eq!(bad(|p| p.epsilon = 0.6), "epsilon");
        assert_eq!(bad(|p| p.idle_threshold = -0.1), "idle_threshold");
        assert_eq!(bad(|p| p.max_step_bytes = 0), "max_step_bytes");
        assert_eq!(bad(|p| p.max_step_bytes = 4097), "max_step_bytes");
        assert_eq!(bad(|p| p.vms = vec![VmPolicy::default()]), "vms[0].vm");
        assert_eq!(
            bad(|p| p.vms = vec![VmPolicy {
                vm: "a".into(),
                target: Some(2.0),
                ..Default::default()
            }]),
            "vms[0].target"
        );
        assert_eq!(
            bad(|p| p.vms = vec![VmPolicy {
                vm: "a".into(),
                limits: vec![TierLimits {
                    tier: "dram".into(),
                    floor_bytes: 10,
                    ceiling_bytes: 5
                }],
                ..Default::default()
            }]),
            "vms[0].limits[0].ceiling_bytes"
        );
        let named = || VmPolicy {
            vm: "a".into(),
            ..Default::default()
        };
        let mut p = default_policy();
        p.vms = vec![named(), named()];
        assert_eq!(validate(&p).unwrap_err().field, "vms[1].vm");
    }
}
