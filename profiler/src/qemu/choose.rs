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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qemu::answers::VirtioMemDev;
    use crate::qemu::handle::TierDevice;
    use crate::qemu::machine::Live;
    use std::path::PathBuf;

    const M: u64 = 1 << 20;

    fn handle(balloon: Option<u64>) -> QemuHandle {
        let dev = VirtioMemDev {
            id: "vmem0".into(),
            memdev: "vm0".into(),
            node: 0,
            memaddr: 1 << 32,
            block: 2 * M,
            plugged: 64 * M,
            requested: 128 * M,
            max: 512 * M,
        };
        QemuHandle::new(
            "qemu:1".into(),
            1,
            PathBuf::from("/nonexistent/q.sock"),
            Duration::from_millis(100),
            vec![TierDevice {
                tier: "node0".into(),
                device: "vmem0".into(),
                boot: 256 * M,
            }],
            Live {
                devices: vec![dev],
                balloon,
            },
        )
    }

    fn pick(h: &QemuHandle, p: Preference, dram: &str) -> Choice {
        choose(
            (p, p != Preference::Auto),
            h,
            &h.snapshot(),
            Duration::from_secs(5),
            dram,
            Some("node1"),
        )
    }

    #[test]
    fn the_dram_nodes_device_is_resized_as_a_zone() {
        let h = handle(Some(512 * M));
        let c = pick(&h, Preference::Auto, "node0");
        assert_eq!(c.actuator, Actuator::ResizeZone);
        let z = c.dram.unwrap();
        assert_eq!(
            (z.boot, z.hotplug, z.requested),
            (256 * M, 512 * M, 128 * M)
        );
        assert_eq!((z.target(), z.actual()), (384 * M, Some(448 * M)));
        assert!(
            c.detail.contains("\"node1\" has no virtio-mem"),
            "{}",
            c.detail
        );
        // Not guessed onto another node's device; the balloon said plainly.
        let c = pick(&h, Preference::Auto, "node1");
        assert_eq!(c.actuator, Actuator::None);
        assert!(
            c.detail.starts_with("only a whole-VM balloon"),
            "{}",
            c.detail
        );
        let c = pick(&h, Preference::Balloon, "node0");
        assert_eq!(c.actuator, Actuator::None);
        assert!(c.detail.contains("no per-tier balloon"), "{}", c.detail);
        assert_eq!(
            pick(&h, Preference::ResizeZone, "node0").actuator,
            Actuator::ResizeZone
        );
    }

    #[tokio::test]
    async fn a_qemu_that_does_not_answer_drives_nothing() {
        let h = handle(None);
        assert!(h.refresh().await.is_err());
        let c = pick(&h, Preference::Auto, "node0");
        assert_eq!(c.actuator, Actuator::None);
        assert!(c.detail.contains("QMP does not answer"), "{}", c.detail);
        let e = h.resize_zone("node0", 256 * M + 3 * M).await.unwrap_err();
        assert!(e.contains("whole"), "{e}");
        let e = h.resize_zone("node0", 256 * M + 4 * M).await.unwrap_err();
        assert!(e.contains("connect"), "{e}");
    }
}
