//! Which actuator moves a QEMU VM's memory: its DRAM tier's virtio-mem
//! device (`requested-size`), as `vm.resize-zone` on cloud-hypervisor; a
//! per-tier balloon QEMU has not, and its whole-VM balloon cannot move DRAM
//! between tiers, so it is not the controller's (crate::actuator).

use std::fmt::Write as _;
use std::time::Duration;

use tier_proto::v1::Actuator;

use super::handle::{QemuHandle, Snapshot};
use crate::actuator::{Choice, Preference, describe};

/// The actuator for a QEMU VM whose DRAM tier is `dram` (slow tier `slow`).
pub fn choose(
    pref: (Preference, bool),
    h: &QemuHandle,
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
    let none = |detail: String| Choice {
        actuator: Actuator::None,
        detail,
        dram: None,
        slow: None,
    };
    let live = match snap.fresh(max_age) {
        Ok(l) => l,
        Err(e) => return none(format!("not actuable: {e}")),
    };
    if pref == Preference::Balloon {
        return none(format!(
            "QEMU has no per-tier balloon{by}; virtio-mem resize not used because of the configuration"
        ));
    }
    let Some(z) = h.resizable(snap, dram) else {
        let whole = if live.balloon.is_some() {
            "only a whole-VM balloon: it cannot move DRAM between tiers, so tierd does not drive it; "
        } else {
            ""
        };
        return none(format!(
            "{whole}tier {dram:?} has no virtio-mem device (one per guest node) to resize{by}"
        ));
    };
    let rz_slow = slow.and_then(|s| h.resizable(snap, s));
    let mut d = format!(
        "virtio-mem resize (QMP qom-set requested-size){by}: {}",
        describe(&z)
    );
    match (&rz_slow, slow) {
        (Some(s), _) => {
            let _ = write!(d, "; slow {}", describe(s));
        }
        (None, Some(s)) => {
            let _ = write!(
                d,
                "; slow tier {s:?} has no virtio-mem device and stays as it is"
            );
        }
        (None, None) => {}
    }
    Choice {
        actuator: Actuator::ResizeZone,
        detail: d,
        dram: Some(z),
        slow: rz_slow,
    }
}
