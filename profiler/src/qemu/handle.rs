//! One discovered QEMU VM's QMP as tierd drives it: the virtio-mem devices
//! and balloon read once per interval in the background, each tier's
//! device resized (`requested-size`), the balloon set; and the fleet of
//! them by VM id.
//!
//! QEMU serves one QMP client per socket at a time, so every call is its
//! own short session (connect, negotiate, command, close) with a deadline:
//! tierd never holds the socket from other users, and a QEMU that stops
//! answering costs its own VM a stale snapshot and errors, nothing else.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tier_controller::actuate::ResizableZone;

use super::answers::VirtioMemDev;
use super::machine::{self, Live};
use super::qmp::{Qmp, QmpError};

/// A tier's virtio-mem device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierDevice {
    pub tier: String,
    pub device: String,
    /// The node's boot memory (never moved).
    pub boot: u64,
}

/// What tierd last learnt from one QEMU.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub live: Option<Live>,
    pub read_at: Option<Instant>,
    /// Why the last read failed; `None` if it answered.
    pub error: Option<String>,
}

impl Snapshot {
    /// The last read, if it answered within `max_age`; otherwise why not.
    pub fn fresh(&self, max_age: Duration) -> Result<&Live, String> {
        if let Some(e) = &self.error {
            return Err(format!("its QMP does not answer: {e}"));
        }
        let (Some(live), Some(at)) = (&self.live, self.read_at) else {
            return Err("no query-memory-devices read yet".into());
        };
        if at.elapsed() > max_age {
            return Err(format!(
                "query-memory-devices last read {:.1} s ago",
                at.elapsed().as_secs_f64()
            ));
        }
        Ok(live)
    }

    fn device(&self, id: &str) -> Option<&VirtioMemDev> {
        self.live.as_ref()?.devices.iter().find(|d| d.id == id)
    }
}

/// One VM's QMP.
#[derive(Debug)]
pub struct QemuHandle {
    vm_id: String,
    pid: u32,
    socket: PathBuf,
    timeout: Duration,
    /// The tiers with exactly one virtio-mem device.
    devices: Vec<TierDevice>,
    /// Every virtio-mem device's id at discovery, sorted: the tier map
    /// was built from these.
    known: Vec<String>,
    state: Mutex<Snapshot>,
    refreshing: AtomicBool,
    /// One change at a time per VM, in order.
    writes: tokio::sync::Mutex<()>,
}

impl QemuHandle {
    pub fn new(
        vm_id: String,
        pid: u32,
        socket: PathBuf,
        timeout: Duration,
        devices: Vec<TierDevice>,
        live: Live,
    ) -> QemuHandle {
        QemuHandle {
            vm_id,
            pid,
            socket,
            timeout,
            devices,
            known: device_ids(&live),
            state: Mutex::new(Snapshot {
                live: Some(live),
                read_at: Some(Instant::now()),
                error: None,
            }),
            refreshing: AtomicBool::new(false),
            writes: tokio::sync::Mutex::new(()),
        }
    }

    pub fn vm_id(&self) -> &str {
        &self.vm_id
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn snapshot(&self) -> Snapshot {
        self.state.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Tier `tier`'s device, balloon-style as the controller drives it
    /// (from the last read, however old).
    pub fn resizable(&self, snap: &Snapshot, tier: &str) -> Option<ResizableZone> {
        let td = self.devices.iter().find(|d| d.tier == tier)?;
        let d = snap.device(&td.device)?;
        Some(ResizableZone {
            id: tier.to_string(),
            boot: td.boot,
            hotplug: d.max,
            block: d.block.max(1),
            requested: d.requested,
            plugged: Some(d.plugged),
            plugged_total: None,
        })
    }

    /// How the virtio-mem devices differ from those the tier map was
    /// built from (added or removed since, e.g. by `device_add`), if they
    /// do: the map misses or holds memory that is no longer there.
    pub fn devices_changed(&self) -> Option<String> {
        let now = device_ids(self.snapshot().live.as_ref()?);
        if now == self.known {
            return None;
        }
        let added: Vec<&String> = now.iter().filter(|d| !self.known.contains(d)).collect();
        let removed: Vec<&String> = self.known.iter().filter(|d| !now.contains(d)).collect();
        Some(format!(
            "virtio-mem devices added {added:?}, removed {removed:?}"
        ))
    }

    /// A short session: connect, then `f`, within about three timeouts.
    async fn session<T>(
        &self,
        what: &str,
        f: impl AsyncFnOnce(&mut Qmp) -> Result<T, QmpError>,
    ) -> Result<T, String> {
        let run = async {
            let mut q = Qmp::connect(&self.socket, self.timeout).await?;
            if q.pid() != self.pid {
                return Err(QmpError::Malformed {
                    socket: self.socket.clone(),
                    command: what.into(),
                    detail: format!(
                        "the socket is now served by pid {}, not the VM's QEMU {}",
                        q.pid(),
                        self.pid
                    ),
                });
            }
            f(&mut q).await
        };
        match tokio::time::timeout(self.timeout * 3, run).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!(
                "QMP {}: {what}: no answer within {:?}",
                self.socket.display(),
                self.timeout * 3
            )),
        }
    }

    /// Reads the devices and balloon into the snapshot.
    pub async fn refresh(&self) -> Result<(), String> {
        let r = self
            .session("query-memory-devices", async |q| {
                machine::read_live(q).await
            })
            .await;
        let Ok(mut s) = self.state.lock() else {
            return Err("snapshot lock poisoned".into());
        };
        match r {
            Ok(live) => {
                s.live = Some(live);
                s.read_at = Some(Instant::now());
                s.error = None;
                Ok(())
            }
            Err(e) => {
                s.error = Some(e.clone());
                Err(e)
            }
        }
    }

    /// Starts a refresh on its own task unless one is still running.
    pub fn spawn_refresh(self: &Arc<Self>) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let h = self.clone();
        tokio::spawn(async move {
            let _done = ClearOnDrop(&h.refreshing);
            let _ = h.refresh().await;
        });
    }

    /// Resizes tier `tier` to `desired_ram` bytes in all (boot + plugged):
    /// its device's `requested-size` set to `desired_ram - boot`, which
    /// must be whole blocks within max-size; then reads back.
    pub async fn resize_zone(&self, tier: &str, desired_ram: u64) -> Result<(), String> {
        let _one_at_a_time = self.writes.lock().await;
        let snap = self.snapshot();
        let z = self
            .resizable(&snap, tier)
            .ok_or_else(|| format!("tier {tier:?} has no virtio-mem device tierd knows"))?;
        let td = self.devices.iter().find(|d| d.tier == tier);
        let device = td.map(|d| d.device.clone()).unwrap_or_default();
        let want = desired_ram.checked_sub(z.boot).ok_or_else(|| {
            format!(
                "{desired_ram} bytes is below tier {tier:?}'s boot memory ({} bytes)",
                z.boot
            )
        })?;
        if want > z.hotplug || !want.is_multiple_of(z.block) {
            return Err(format!(
                "requested-size {want} of {device:?} is not whole {}-byte blocks within max-size {}",
                z.block, z.hotplug
            ));
        }
        let r = self
            .session("qom-set requested-size", async |q| {
                q.set_requested_size(&device, want).await
            })
            .await;
        let _ = self.refresh().await;
        r
    }

    /// Sets the whole-VM balloon: leave the guest `bytes` (QMP `balloon`).
    pub async fn set_balloon(&self, bytes: u64) -> Result<(), String> {
        let _one_at_a_time = self.writes.lock().await;
        let r = self
            .session("balloon", async |q| q.balloon(bytes).await)
            .await;
        let _ = self.refresh().await;
        r
    }
}

fn device_ids(live: &Live) -> Vec<String> {
    let mut ids: Vec<String> = live.devices.iter().map(|d| d.id.clone()).collect();
    ids.sort();
    ids
}

/// Clears a flag when dropped (a refresh task that panics included).
struct ClearOnDrop<'a>(&'a AtomicBool);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The discovered QEMU VMs by VM id.
#[derive(Debug, Clone, Default)]
pub struct Fleet {
    inner: Arc<RwLock<HashMap<String, Arc<QemuHandle>>>>,
}

impl Fleet {
    pub fn get(&self, vm_id: &str) -> Option<Arc<QemuHandle>> {
        self.inner.read().ok()?.get(vm_id).cloned()
    }

    pub fn insert(&self, h: Arc<QemuHandle>) {
        if let Ok(mut m) = self.inner.write() {
            m.insert(h.vm_id.clone(), h);
        }
    }

    /// Keeps the VMs for which `keep(id)` holds; returns the others.
    pub fn retain(&self, mut keep: impl FnMut(&str) -> bool) -> Vec<Arc<QemuHandle>> {
        let Ok(mut m) = self.inner.write() else {
            return Vec::new();
        };
        let gone: Vec<String> = m.keys().filter(|id| !keep(id)).cloned().collect();
        gone.iter().filter_map(|id| m.remove(id)).collect()
    }

    pub fn all(&self) -> Vec<Arc<QemuHandle>> {
        self.inner
            .read()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(id: &str) -> VirtioMemDev {
        VirtioMemDev {
            id: id.into(),
            memdev: format!("b-{id}"),
            node: 1,
            memaddr: 1 << 32,
            block: 2 << 20,
            plugged: 0,
            requested: 0,
            max: 128 << 20,
        }
    }

    #[test]
    fn a_device_added_or_removed_after_discovery_is_a_change() {
        let live = |ids: &[&str]| Live {
            devices: ids.iter().map(|i| dev(i)).collect(),
            balloon: None,
        };
        let h = QemuHandle::new(
            "qemu:1".into(),
            1,
            PathBuf::from("/nonexistent/q.sock"),
            Duration::from_millis(100),
            Vec::new(),
            live(&["vmem1", "vmem0"]),
        );
        assert_eq!(h.devices_changed(), None);
        let set = |l: Live| h.state.lock().unwrap().live = Some(l);
        set(live(&["vmem0", "vmem1"]));
        assert_eq!(h.devices_changed(), None, "order does not matter");
        set(live(&["vmem0", "vmem1", "vmem2"]));
        let c = h.devices_changed().unwrap();
        assert!(c.contains("added [\"vmem2\"]"), "{c}");
        set(live(&["vmem1"]));
        let c = h.devices_changed().unwrap();
        assert!(c.contains("removed [\"vmem0\"]"), "{c}");
    }
}
