//! What each watcher of WatchStats gets of an interval's update: the
//! update itself, encoded once on first demand and shared by every watcher
//! that takes it whole, or one made for that watcher (its first message,
//! which carries the VM list, or a filtered stream). `server` publishes the
//! updates and streams the frames; `watch` sends them encoded.

use std::sync::{Arc, OnceLock};

use prost::Message;
use prost::bytes::Bytes;

use tier_proto::v1::{StatsUpdate, Vm};

/// One interval's update as published, with its encoding once a watcher
/// asked for it.
#[derive(Debug)]
pub struct Published {
    pub update: Arc<StatsUpdate>,
    encoded: OnceLock<Bytes>,
}

impl Published {
    pub fn new(update: Arc<StatsUpdate>) -> Published {
        Published {
            update,
            encoded: OnceLock::new(),
        }
    }

    /// The update's protobuf encoding, made by the first watcher that
    /// needs it and shared by the rest.
    pub fn encoded(&self) -> Bytes {
        self.encoded
            .get_or_init(|| Bytes::from(self.update.encode_to_vec()))
            .clone()
    }
}

/// One message of a watcher's stream.
#[derive(Debug)]
pub enum Frame {
    /// The interval's whole update, as every unfiltered watcher gets it.
    Whole(Arc<Published>),
    /// An update made for this watcher (filtered, or its first).
    Own(StatsUpdate),
}

impl Frame {
    pub fn into_update(self) -> StatsUpdate {
        match self {
            Frame::Whole(p) => (*p.update).clone(),
            Frame::Own(u) => u,
        }
    }

    pub fn into_bytes(self) -> Bytes {
        match self {
            Frame::Whole(p) => p.encoded(),
            Frame::Own(u) => Bytes::from(u.encode_to_vec()),
        }
    }
}

/// The part of an update a watcher asked for.
fn filter(update: &StatsUpdate, ids: &[String]) -> StatsUpdate {
    if ids.is_empty() {
        return update.clone();
    }
    let wanted = |id: &String| ids.contains(id);
    StatsUpdate {
        vms: update
            .vms
            .iter()
            .filter(|v| wanted(&v.id))
            .cloned()
            .collect(),
        stats: update
            .stats
            .iter()
            .filter(|s| wanted(&s.vm_id))
            .cloned()
            .collect(),
        departed_vm_ids: update
            .departed_vm_ids
            .iter()
            .filter(|i| wanted(i))
            .cloned()
            .collect(),
        ..update.clone()
    }
}

/// What a watcher of `ids` (empty: all VMs) gets of `p`. A stream's first
/// message always carries the VM list (`vms`, the current one): `sent_vms`
/// says whether this stream's did.
pub fn frame(
    p: &Arc<Published>,
    ids: &[String],
    sent_vms: &mut bool,
    vms: impl FnOnce() -> Arc<Vec<Vm>>,
) -> Frame {
    let first = !std::mem::replace(sent_vms, true);
    let u = &p.update;
    if ids.is_empty() && !(first && u.vms_unchanged) {
        return Frame::Whole(p.clone());
    }
    let mut out = filter(u, ids);
    if first && out.vms_unchanged {
        let all = StatsUpdate {
            vms: vms().to_vec(),
            ..Default::default()
        };
        out.vms = filter(&all, ids).vms;
        out.vms_unchanged = false;
    }
    Frame::Own(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tier_proto::v1::VmStats;

    fn update(seq: u64, vms_unchanged: bool) -> StatsUpdate {
        StatsUpdate {
            sequence: seq,
            vms: if vms_unchanged {
                Vec::new()
            } else {
                vec![Vm {
                    id: "a".into(),
                    ..Default::default()
                }]
            },
            stats: ["a", "b"]
                .map(|id| VmStats {
                    vm_id: id.into(),
                    dram_hit_ratio: 0.25,
                    ..Default::default()
                })
                .to_vec(),
            vms_unchanged,
            ..Default::default()
        }
    }

    #[test]
    fn watchers_of_every_vm_share_one_encoding_of_the_update() {
        let listed: Arc<Vec<Vm>> = Arc::new(
            ["a", "b"]
                .map(|id| Vm {
                    id: id.into(),
                    ..Default::default()
                })
                .to_vec(),
        );
        let vms = || listed.clone();
        let p = Arc::new(Published::new(Arc::new(update(7, true))));
        // After its first message a whole-update watcher gets the shared
        // bytes: the same for every watcher, and the update once decoded.
        let mut sent = true;
        let Frame::Whole(w) = frame(&p, &[], &mut sent, vms) else {
            panic!("not shared")
        };
        let (a, b) = (w.encoded(), p.encoded());
        assert_eq!(a.as_ptr(), b.as_ptr(), "encoded twice");
        assert_eq!(StatsUpdate::decode(a).ok().as_ref(), Some(&*p.update));
        // A stream's first message carries the VM list; a filtered one
        // only its VMs: both made for that watcher, as before.
        let mut first = false;
        let own = frame(&p, &[], &mut first, vms).into_bytes();
        let own = StatsUpdate::decode(own).unwrap();
        assert!(first && !own.vms_unchanged);
        assert_eq!(own.vms.len(), 2);
        assert_eq!(own.stats, p.update.stats);
        let ids = vec!["b".to_string()];
        let mut sent = true;
        let only_b = frame(&p, &ids, &mut sent, vms).into_update();
        assert_eq!(only_b.stats.len(), 1);
        assert_eq!(only_b.stats[0].vm_id, "b");
        assert!(only_b.vms_unchanged && only_b.vms.is_empty());
        // An update that carries the VM list anyway is shared from the
        // first message on.
        let with_list = Arc::new(Published::new(Arc::new(update(8, false))));
        let mut first = false;
        assert!(matches!(
            frame(&with_list, &[], &mut first, vms),
            Frame::Whole(_)
        ));
    }
}
