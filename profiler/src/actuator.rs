//! Which actuator moves a VM's memory between tiers (docs/virtio-mem.md): the
//! per-tier balloon where the guest negotiated VIRTIO_BALLOON_F_TIERS;
//! else `vm.resize-zone` where the VM's DRAM tier is a virtio-mem zone
//! (upstream cloud-hypervisor and stock Linux guests); else nothing, said
//! plainly (a whole-VM balloon cannot move DRAM per tier). Automatic,
//! overridable with `[controller] actuator` and per VM (docs/config.md).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Deserialize;
use tier_controller::actuate::{LINUX_MEMORY_BLOCK, ResizableZone};
use tier_proto::v1::Actuator;

use crate::ch::Snapshot;

/// `[controller] actuator` and its per-VM overrides.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Preference {
    /// The per-tier balloon if negotiated, else zone resize if the DRAM
    /// tier has a virtio-mem zone.
    #[default]
    Auto,
    /// Only the per-tier balloon.
    Balloon,
    /// Only `vm.resize-zone`.
    ResizeZone,
}

impl Preference {
    pub fn name(self) -> &'static str {
        match self {
            Preference::Auto => "auto",
            Preference::Balloon => "balloon",
            Preference::ResizeZone => "resize-zone",
        }
    }
}

/// The preference of each VM: by VM name or id, else the default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Preferences {
    pub default: Preference,
    pub per_vm: BTreeMap<String, Preference>,
}

impl Preferences {
    pub fn of(&self, id: &str, name: &str) -> (Preference, bool) {
        match self.per_vm.get(name).or_else(|| self.per_vm.get(id)) {
            Some(p) => (*p, true),
            None => (self.default, self.default != Preference::Auto),
        }
    }
}

/// What drives a VM, the zones a resize uses, and why, for humans.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub actuator: Actuator,
    pub detail: String,
    /// Resize: the DRAM tier's zone, and the slow tier's if it has one.
    pub dram: Option<ResizableZone>,
    pub slow: Option<ResizableZone>,
}

impl Choice {
    fn none(detail: String) -> Choice {
        Choice {
            actuator: Actuator::None,
            detail,
            dram: None,
            slow: None,
        }
    }
}

fn mib(b: u64) -> String {
    tier_proto::human_bytes(b)
}

/// One zone's resize, as `top` and the logs say it.
pub fn describe(z: &ResizableZone) -> String {
    let mut d = format!(
        "zone {:?}: boot {} + hot-pluggable {} (block {}; a Linux guest offlines in {} memory blocks), requested {}",
        z.id,
        mib(z.boot),
        mib(z.hotplug),
        mib(z.block),
        mib(LINUX_MEMORY_BLOCK),
        mib(z.requested)
    );
    match (z.plugged, z.plugged_total) {
        (Some(p), _) => {
            let _ = write!(d, ", plugged {}", mib(p));
        }
        (None, Some(p)) => {
            let _ = write!(
                d,
                ", plugged {} (from memory_actual_size: this VMM does not report the zone's region, no vmm-patch 0009), so plugged memory is not attributed to a tier",
                mib(p)
            );
        }
        (None, None) => d.push_str(
            ", plugged unknown: this VMM does not report it (no vmm-patch 0009), so plugged memory is not attributed to a tier and a guest that does not follow cannot be detected",
        ),
    }
    d
}

/// The actuator for a VM whose DRAM tier is `dram` (and slow tier `slow`).
pub fn choose(
    pref: (Preference, bool),
    snap: &Snapshot,
    max_age: Duration,
    dram: &str,
    slow: Option<&str>,
) -> Choice {
    let (pref, configured) = pref;
    let by = if configured {
        format!(" (configured: actuator = {:?})", pref.name())
    } else {
        String::new()
    };
    let info = match snap.fresh(max_age) {
        Ok(i) => i,
        Err(e) => return Choice::none(format!("not actuable: {e}")),
    };
    let mut tiers = vec![dram];
    tiers.extend(slow);
    let balloon = snap.drivable(max_age, &tiers);
    let rz = snap.resizable(dram);
    let rz_slow = slow.and_then(|s| snap.resizable(s));
    let resize = |why_not_balloon: Option<&str>| {
        let z = rz.clone()?;
        let mut d = format!("zone resize (vm.resize-zone){by}: {}", describe(&z));
        match (&rz_slow, slow) {
            (Some(s), _) => {
                let _ = write!(d, "; slow {}", describe(s));
            }
            (None, Some(s)) => {
                let _ = write!(
                    d,
                    "; slow tier {s:?} has no virtio-mem part and stays as it is"
                );
            }
            (None, None) => {}
        }
        if let Some(w) = why_not_balloon {
            let _ = write!(d, "; no per-tier balloon: {w}");
        }
        Some(Choice {
            actuator: Actuator::ResizeZone,
            detail: d,
            dram: Some(z),
            slow: rz_slow.clone(),
        })
    };
    let whole_vm = info.balloon.is_some()
        || info
            .config
            .as_ref()
            .is_some_and(|c| c.balloon.as_ref().is_some_and(|b| !b.is_null()));
    let nothing = |why_not_balloon: &str| {
        let mut d = if whole_vm {
            "only a whole-VM balloon: it cannot move DRAM between tiers, so tierd does not drive it"
                .to_string()
        } else {
            "no balloon and no virtio-mem zone tierd can drive".to_string()
        };
        let _ = write!(
            d,
            "{by}; per-tier balloon: {why_not_balloon}; tier {dram:?} has no virtio-mem part (hotplug_size with hotplug_method=virtio-mem)"
        );
        Choice::none(d)
    };
    match (pref, balloon) {
        (Preference::Auto | Preference::Balloon, Ok(_)) => Choice {
            actuator: Actuator::TierBalloon,
            detail: format!("per-tier balloon (VIRTIO_BALLOON_F_TIERS negotiated){by}"),
            dram: None,
            slow: None,
        },
        (Preference::Auto, Err(e)) => resize(Some(&e)).unwrap_or_else(|| nothing(&e)),
        (Preference::Balloon, Err(e)) => Choice::none(format!(
            "per-tier balloon not drivable{by}: {e}; zone resize not used because of the configuration"
        )),
        (Preference::ResizeZone, b) => resize(None).unwrap_or_else(|| {
            let mut d = format!(
                "tier {dram:?} has no virtio-mem zone (hotplug_size with hotplug_method=virtio-mem) to resize{by}"
            );
            if b.is_ok() {
                d.push_str("; the per-tier balloon is not used because of the configuration");
            }
            Choice::none(d)
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;
    use tier_controller::actuate::VmInfo;

    const BALLOON: &str = r#""balloon":{"tiers_offered":true,"tiers_negotiated":NEG,"legacy_target":0,"legacy_actual":0,"zones":[
        {"id":"dram","tier":0,"target":0,"actual":0,"host_ballooned":0,"inflated_pfns":0,"deflated_pfns":0,"rejected_pfns":0},
        {"id":"slow","tier":1,"target":0,"actual":0,"host_ballooned":0,"inflated_pfns":0,"deflated_pfns":0,"rejected_pfns":0}]},"#;
    const VIRTIO_MEM: &str = r#""memory_zones":[{"id":"dram","host_numa_node":0,"guest_numa_node":0,
        "ranges":[{"start":0,"size":67108864}],
        "virtio_mem":{"start":4294967296,"size":268435456,"host_address":1,"requested_size":0,"plugged_size":0,"block_size":2097152}},
        {"id":"slow","host_numa_node":0,"guest_numa_node":1,"ranges":[{"start":67108864,"size":134217728}]}],"#;

    fn snap(balloon: Option<bool>, virtio_mem: bool, legacy: bool) -> Snapshot {
        let mut j = String::from("{");
        if let Some(neg) = balloon {
            j.push_str(&BALLOON.replace("NEG", &neg.to_string()));
        }
        if virtio_mem {
            j.push_str(VIRTIO_MEM);
        }
        if legacy {
            j.push_str(r#""config":{"balloon":{"size":0}},"#);
        }
        j.push_str(r#""state":"Running"}"#);
        let info: VmInfo = serde_json::from_str(&j).unwrap();
        Snapshot {
            info: Some(info),
            read_at: Some(Instant::now()),
            ..Default::default()
        }
    }

    fn pick(p: Preference, configured: bool, s: &Snapshot) -> Choice {
        choose(
            (p, configured),
            s,
            Duration::from_secs(5),
            "dram",
            Some("slow"),
        )
    }

    #[test]
    fn auto_prefers_the_negotiated_balloon_then_zone_resize_then_nothing() {
        let both = snap(Some(true), true, false);
        assert_eq!(
            pick(Preference::Auto, false, &both).actuator,
            Actuator::TierBalloon
        );
        // Offered but not negotiated (a stock guest): zone resize.
        let stock = snap(Some(false), true, false);
        let c = pick(Preference::Auto, false, &stock);
        assert_eq!(c.actuator, Actuator::ResizeZone);
        assert_eq!(c.dram.as_ref().unwrap().hotplug, 256 << 20);
        assert!(c.detail.contains("not negotiated"), "{}", c.detail);
        assert!(c.detail.contains("128.0M memory blocks"), "{}", c.detail);
        assert!(
            c.detail.contains("\"slow\" has no virtio-mem part"),
            "{}",
            c.detail
        );
        // Only a whole-VM balloon: said plainly.
        let legacy = snap(None, false, true);
        let c = pick(Preference::Auto, false, &legacy);
        assert_eq!(c.actuator, Actuator::None);
        assert!(
            c.detail.starts_with("only a whole-VM balloon"),
            "{}",
            c.detail
        );
        let bare = snap(None, false, false);
        assert!(
            pick(Preference::Auto, false, &bare)
                .detail
                .starts_with("no balloon and no virtio-mem zone")
        );
    }

    #[test]
    fn configuration_overrides_the_choice_and_says_so() {
        let both = snap(Some(true), true, false);
        let c = pick(Preference::ResizeZone, true, &both);
        assert_eq!(c.actuator, Actuator::ResizeZone);
        assert!(c.detail.contains("configured: actuator = \"resize-zone\""));
        let stock = snap(Some(false), true, false);
        let c = pick(Preference::Balloon, true, &stock);
        assert_eq!(c.actuator, Actuator::None);
        assert!(c.detail.contains("not negotiated"), "{}", c.detail);
        let plain = snap(Some(true), false, false);
        let c = pick(Preference::ResizeZone, true, &plain);
        assert_eq!(c.actuator, Actuator::None);
        assert!(c.detail.contains("balloon is not used"), "{}", c.detail);
        // A VMM that stopped answering drives nothing, whatever is set.
        let mut failing = both.clone();
        failing.error = Some("connection refused".into());
        let c = pick(Preference::Auto, false, &failing);
        assert_eq!(c.actuator, Actuator::None);
        assert!(c.detail.contains("connection refused"));
    }

    #[test]
    fn per_vm_preferences_by_name_or_id() {
        let p = Preferences {
            default: Preference::Auto,
            per_vm: BTreeMap::from([
                ("vm1".to_string(), Preference::ResizeZone),
                ("ch:1:2".to_string(), Preference::Balloon),
            ]),
        };
        assert_eq!(p.of("ch:9:9", "vm1"), (Preference::ResizeZone, true));
        assert_eq!(p.of("ch:1:2", "x"), (Preference::Balloon, true));
        assert_eq!(p.of("ch:3:3", "y"), (Preference::Auto, false));
    }
}
