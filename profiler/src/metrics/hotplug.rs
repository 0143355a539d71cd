//! virtio-mem zones and the actuator as series (docs/virtio-mem.md): per tier with a
//! hot-pluggable part its region, what was requested and what the guest
//! plugged (absent when the VMM does not report it); per VM which actuator
//! the controller uses, as an info-style gauge.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tier_proto::v1::{Actuator, TierHotplug, TierSample, VmStats};

use super::{TierLabels, VmLabels};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ActuatorLabels {
    vm: String,
    name: String,
    actuator: String,
}

#[derive(Debug, Default)]
pub(super) struct Hotplug {
    region: Family<TierLabels, Gauge>,
    requested: Family<TierLabels, Gauge>,
    plugged: Family<TierLabels, Gauge>,
    attributed: Family<TierLabels, Gauge>,
    actuator: Family<ActuatorLabels, Gauge>,
}

/// `ACTUATOR_RESIZE_ZONE` -> `resize_zone`; None when unspecified.
fn short(a: Actuator) -> Option<String> {
    (a != Actuator::Unspecified).then(|| {
        a.as_str_name()
            .trim_start_matches("ACTUATOR_")
            .to_ascii_lowercase()
    })
}

const ACTUATORS: [Actuator; 3] = [Actuator::None, Actuator::TierBalloon, Actuator::ResizeZone];

fn clamp(b: u64) -> i64 {
    i64::try_from(b).unwrap_or(i64::MAX)
}

impl Hotplug {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "tier_hotplug_region_bytes",
            "Size of the tier's hot-pluggable virtio-mem region (hotplug_size); absent for a tier without one",
            self.region.clone(),
        );
        r.register(
            "tier_hotplug_requested_bytes",
            "Hot-plugged size the VMM was last asked for (vm.resize-zone desired_ram minus the boot size)",
            self.requested.clone(),
        );
        r.register(
            "tier_hotplug_plugged_bytes",
            "What the guest's virtio-mem driver has plugged; absent when the VMM does not report it (upstream cloud-hypervisor)",
            self.plugged.clone(),
        );
        r.register(
            "tier_hotplug_attributed",
            "1 if the virtio-mem region is part of the tier's ranges (host samples of plugged memory count for the tier), 0 if the VMM does not report it",
            self.attributed.clone(),
        );
        r.register(
            "vm_actuator_info",
            "1 for the actuator the controller uses on the VM (tier_balloon, resize_zone, none); absent when no controller runs",
            self.actuator.clone(),
        );
    }

    pub(super) fn tier(&self, tl: &TierLabels, h: Option<TierHotplug>, s: &TierSample) {
        let Some(h) = h else {
            self.forget_tier(tl);
            return;
        };
        self.region.get_or_create(tl).set(clamp(h.region_bytes));
        self.attributed
            .get_or_create(tl)
            .set(i64::from(h.region_attributed));
        match s.hotplug_requested_bytes {
            Some(b) => {
                self.requested.get_or_create(tl).set(clamp(b));
            }
            None => {
                self.requested.remove(tl);
            }
        }
        match s.hotplug_plugged_bytes {
            Some(b) => {
                self.plugged.get_or_create(tl).set(clamp(b));
            }
            None => {
                self.plugged.remove(tl);
            }
        }
    }

    pub(super) fn vm(&self, vl: &VmLabels, s: &VmStats) {
        let now = short(s.actuator());
        for a in ACTUATORS {
            let l = ActuatorLabels {
                vm: vl.vm.clone(),
                name: vl.name.clone(),
                actuator: short(a).unwrap_or_default(),
            };
            if now.as_deref() == Some(l.actuator.as_str()) {
                self.actuator.get_or_create(&l).set(1);
            } else {
                self.actuator.remove(&l);
            }
        }
    }

    pub(super) fn forget_tier(&self, tl: &TierLabels) {
        for f in [
            &self.region,
            &self.requested,
            &self.plugged,
            &self.attributed,
        ] {
            f.remove(tl);
        }
    }

    pub(super) fn forget_vm(&self, vl: &VmLabels) {
        for a in ACTUATORS {
            self.actuator.remove(&ActuatorLabels {
                vm: vl.vm.clone(),
                name: vl.name.clone(),
                actuator: short(a).unwrap_or_default(),
            });
        }
    }
}
