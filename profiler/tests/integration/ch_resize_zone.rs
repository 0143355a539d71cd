//! The in-process controller driving virtio-mem zones through
//! `vm.resize-zone` (docs/virtio-mem.md), against a stand-in cloud-hypervisor on a
//! unix socket: a real HTTP server that keeps a zone's boot size, region,
//! requested and plugged size, refuses what cloud-hypervisor v53.0 refuses
//! (below the boot size, above boot + hotplug_size, off the block size,
//! equal to the request: `resize_zone`, `virtio_mem::resize`), and answers
//! `vm.info` in the shape of vmm-patch 0009 or, for an upstream build,
//! without `memory_zones`. Its guest plugs at once, or never (a driver
//! that does not answer, or answers errors: the host sees the same).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tier_controller::actuate::VmInfo;
use tier_controller::policy::default_policy as auto_policy;

/// These tests drive actuation with ratio readings: ratio mode, whatever
/// the default mode is.
fn default_policy() -> tier_proto::v1::Policy {
    tier_proto::v1::Policy {
        mode: tier_proto::v1::PolicyMode::Ratio as i32,
        // These tests drive a lone VM's moves (its idle reclaim among
        // them), which on-demand reclaim keeps for a VM that needs them.
        reclaim: tier_proto::v1::ReclaimMode::Eager as i32,
        ..auto_policy()
    }
}
use tier_profiler::actuator::{Preference, Preferences};
use tier_profiler::ch::{ChHandle, Fleet};
use tier_profiler::control::InProcess;
use tier_proto::v1::*;
use tier_test_support::fake_http::read_request;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixListener;

use crate::ch_common;
use ch_common::{Sunk, update, wait_sunk};

const M: u64 = 1 << 20;
const BLOCK: u64 = 2 * M;
const BOOT: u64 = 64 * M;
const REGION: u64 = 256 * M;
const SLOW: u64 = 256 * M;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Guest {
    /// Plugs and unplugs what is requested, at once.
    Follows,
    /// Never changes its plugged size (`virtio_mem=mute` or `error`).
    Stuck,
}

#[derive(Debug)]
struct Zone {
    requested: u64,
    plugged: u64,
    guest: Guest,
    /// vm.info with `memory_zones[].virtio_mem` (vmm-patch 0009).
    patched: bool,
    /// Resizes still to refuse with a 500, whatever they ask.
    refuse: u32,
    /// Bodies of every vm.resize-zone received.
    resizes: Vec<String>,
}

impl Zone {
    fn info(&self) -> String {
        let config = format!(
            r#""config":{{"memory":{{"size":0,"hotplug_method":"VirtioMem","zones":[
            {{"id":"dram","size":{BOOT},"host_numa_node":0,"hotplug_size":{REGION},"hotplugged_size":{}}},
            {{"id":"slow","size":{SLOW},"host_numa_node":0}}]}},"balloon":null}}"#,
            self.requested
        );
        if !self.patched {
            return format!(r#"{{"state":"Running",{config}}}"#);
        }
        format!(
            r#"{{"state":"Running","memory_zones":[
            {{"id":"dram","host_numa_node":0,"guest_numa_node":0,"ranges":[{{"start":0,"size":{BOOT}}}],
              "virtio_mem":{{"start":4294967296,"size":{REGION},"host_address":0,"requested_size":{},"plugged_size":{},"block_size":{BLOCK}}}}},
            {{"id":"slow","host_numa_node":0,"guest_numa_node":1,"ranges":[{{"start":{BOOT},"size":{SLOW}}}]}}],{config}}}"#,
            self.requested, self.plugged
        )
    }

    /// cloud-hypervisor's checks, then the new request.
    fn resize(&mut self, body: &str) -> Result<(), String> {
        self.resizes.push(body.to_string());
        let v: serde_json::Value = serde_json::from_str(body).map_err(|e| e.to_string())?;
        let desired = v["desired_ram"].as_u64().ok_or("no desired_ram")?;
        if v["id"] != "dram" {
            return Err("Unknown memory zone".into());
        }
        if self.refuse > 0 {
            self.refuse -= 1;
            return Err("Failed resizing virtio-mem region".into());
        }
        if desired < BOOT {
            return Err(format!(
                "Invalid resize below boot size ({desired} < {BOOT})"
            ));
        }
        let size = desired - BOOT;
        if size == self.requested {
            return Err(format!(
                "new size {size:#x} and requested_size are identical"
            ));
        }
        if size > REGION || !size.is_multiple_of(BLOCK) {
            return Err(format!(
                "new size {size:#x} is bigger than region_size or not aligned"
            ));
        }
        self.requested = size;
        if self.guest == Guest::Follows {
            self.plugged = size;
        }
        Ok(())
    }
}

struct Vmm {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    zone: Arc<Mutex<Zone>>,
}

impl Vmm {
    async fn start(guest: Guest, patched: bool, requested: u64) -> Vmm {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("vm.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let zone = Arc::new(Mutex::new(Zone {
            requested,
            plugged: requested,
            guest,
            patched,
            refuse: 0,
            resizes: Vec::new(),
        }));
        let z = zone.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let z = z.clone();
                tokio::spawn(async move {
                    let req = read_request(&mut s).await;
                    if req.is_empty() {
                        return;
                    }
                    let text = String::from_utf8_lossy(&req).into_owned();
                    let line = text.lines().next().unwrap_or_default().to_string();
                    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
                    let (status, reply) = if line.starts_with("GET /api/v1/vm.info ") {
                        (200, z.lock().unwrap().info())
                    } else if line.starts_with("PUT /api/v1/vm.resize-zone ") {
                        match z.lock().unwrap().resize(body) {
                            Ok(()) => (204, String::new()),
                            Err(e) => (500, format!(r#"["Error from API","{e}"]"#)),
                        }
                    } else {
                        (404, String::new())
                    };
                    let head = format!(
                        "HTTP/1.1 {status} \r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                        reply.len()
                    );
                    s.write_all(head.as_bytes()).await.unwrap();
                    s.write_all(reply.as_bytes()).await.unwrap();
                    tokio::time::sleep(Duration::from_secs(5)).await;
                });
            }
        });
        Vmm {
            _dir: dir,
            socket,
            zone,
        }
    }

    fn resizes(&self) -> Vec<String> {
        self.zone.lock().unwrap().resizes.clone()
    }

    fn info(&self) -> VmInfo {
        serde_json::from_str(&self.zone.lock().unwrap().info()).unwrap()
    }
}

fn handle(vmm: &Vmm, id: &str) -> Arc<ChHandle> {
    Arc::new(ChHandle::new(
        id.into(),
        4242,
        vmm.socket.clone(),
        Duration::from_millis(500),
        vmm.info(),
    ))
}

/// The VM as tierd's tier map has it: dram = boot + region (0009), slow.
fn vm(id: &str) -> Vm {
    let tier = |name: &str, kind: TierKind, size: u64| Tier {
        name: name.into(),
        kind: kind as i32,
        size_bytes: size,
        ..Default::default()
    };
    Vm {
        id: id.into(),
        name: id.into(),
        tiers: vec![
            tier("dram", TierKind::Dram, BOOT + REGION),
            tier("slow", TierKind::Cxl, SLOW),
        ],
        source: VmSource::CloudHypervisor as i32,
        ..Default::default()
    }
}

fn controller(fleet: &Fleet, prefs: Preferences) -> (InProcess, Sunk) {
    let (c, sunk) = ch_common::controller(fleet, &default_policy());
    (c.with_actuators(prefs, Duration::from_millis(100)), sunk)
}

fn desired_of(body: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["id"], "dram", "{body}");
    v["desired_ram"].as_u64().unwrap()
}

#[tokio::test]
async fn a_stock_guest_is_driven_by_zone_resize_within_its_hotplug_part() {
    let vmm = Vmm::start(Guest::Follows, true, REGION).await;
    let fleet = Fleet::default();
    fleet.insert(handle(&vmm, "a"));
    let (mut c, sunk) = controller(&fleet, Preferences::default());
    let vms = [vm("a")];

    // The stream says which actuator and why before the step uses it.
    let mut u = update(&["a"], 1);
    c.annotate(&vms, &mut u);
    assert_eq!(u.stats[0].actuator(), Actuator::ResizeZone);
    assert!(
        u.stats[0]
            .actuator_detail
            .contains("boot 64.0M + hot-pluggable 256.0M"),
        "{}",
        u.stats[0].actuator_detail
    );

    assert!(c.step(&vms, &u).is_empty(), "sent on its own task");
    let d = wait_sunk(&sunk, 1).await;
    assert_eq!(d[0].outcome(), DecisionOutcome::Applied, "{}", d[0].detail);
    let r = vmm.resizes();
    assert_eq!(r.len(), 1, "{r:?}");
    let desired = desired_of(&r[0]);
    let change = d[0].changes.iter().find(|c| c.tier == "dram").unwrap();
    // The decision carries what was sent: size - target, block-aligned.
    assert_eq!(change.old_target_bytes, 0);
    assert_eq!(change.new_target_bytes, BOOT + REGION - desired);
    assert!((BOOT..BOOT + REGION).contains(&desired), "{desired}");
    assert_eq!((desired - BOOT) % BLOCK, 0);
    assert!(
        d[0].detail
            .starts_with("vm.resize-zone \"dram\" desired_ram="),
        "{}",
        d[0].detail
    );
    // No slow change was asked of a tier without a virtio-mem part.
    assert!(
        d[0].changes.iter().all(|c| c.tier == "dram"),
        "{:?}",
        d[0].changes
    );
    assert_eq!(vmm.zone.lock().unwrap().plugged, desired - BOOT);

    // Round after round, the boot part is never asked for.
    for seq in 2..40 {
        fleet.get("a").unwrap().refresh().await.unwrap();
        c.step(&vms, &update(&["a"], seq));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let all = vmm.resizes();
    assert!(all.len() > 1, "{all:?}");
    assert!(all.iter().all(|b| desired_of(b) >= BOOT), "{all:?}");
    assert!(!c.is_uncooperative("a"));
}

#[tokio::test]
async fn a_guest_that_never_plugs_is_reported_once_and_the_other_vm_is_served() {
    let stuck = Vmm::start(Guest::Stuck, true, REGION).await;
    let good = Vmm::start(Guest::Follows, true, REGION).await;
    let fleet = Fleet::default();
    fleet.insert(handle(&stuck, "mute"));
    fleet.insert(handle(&good, "good"));
    let (mut c, sunk) = controller(&fleet, Preferences::default());
    let vms = [vm("mute"), vm("good")];
    let mut marked = Vec::new();
    for seq in 1..=30 {
        for id in ["mute", "good"] {
            let _ = fleet.get(id).unwrap().refresh().await;
        }
        let now = c.step(&vms, &update(&["mute", "good"], seq));
        marked.extend(
            now.into_iter()
                .filter(|d| d.vm_id == "mute" && d.reason() == DecisionReason::Uncooperative),
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    // Bounded: the first resize, then nothing while it does not follow.
    let calls = stuck.resizes();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(c.is_uncooperative("mute"));
    assert_eq!(marked.len(), 1, "reported once: {marked:?}");
    let detail = &marked[0].detail;
    assert!(
        detail.contains("zone \"dram\" requested") && detail.contains("guest plugged 256.0M"),
        "{detail}"
    );
    // The other VM kept being driven.
    assert!(!c.is_uncooperative("good"));
    assert!(good.resizes().len() > 1, "{:?}", good.resizes());
    let applied = wait_sunk(&sunk, 1)
        .await
        .iter()
        .filter(|d| d.vm_id == "good" && d.outcome() == DecisionOutcome::Applied)
        .count();
    assert!(applied > 1, "{applied}");
}

#[tokio::test]
async fn a_refused_resize_fails_with_the_message_and_holds_the_vm_back() {
    let vmm = Vmm::start(Guest::Follows, true, REGION).await;
    vmm.zone.lock().unwrap().refuse = 100;
    let fleet = Fleet::default();
    fleet.insert(handle(&vmm, "a"));
    let (mut c, sunk) = controller(&fleet, Preferences::default());
    let vms = [vm("a")];
    assert!(c.step(&vms, &update(&["a"], 1)).is_empty());
    let d = wait_sunk(&sunk, 1).await;
    assert_eq!(d[0].outcome(), DecisionOutcome::Failed);
    assert!(
        d[0].detail.contains("Failed resizing virtio-mem region")
            && d[0].detail.contains("held for 0.2 s"),
        "{}",
        d[0].detail
    );
    // Held for 2 intervals (200 ms), then 4, 8, ...: in 30 rounds of
    // 20 ms (600 ms) at most a few calls, never one per round.
    for seq in 2..=31 {
        let _ = fleet.get("a").unwrap().refresh().await;
        for d in c.step(&vms, &update(&["a"], seq)) {
            if d.outcome() == DecisionOutcome::Skipped {
                assert!(d.detail.contains("held"), "{}", d.detail);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let n = vmm.resizes().len();
    assert!((2..=5).contains(&n), "{n} resize calls");
}

#[tokio::test]
async fn an_upstream_vmm_is_resized_and_the_attribution_gap_is_said() {
    let vmm = Vmm::start(Guest::Follows, false, REGION).await;
    let fleet = Fleet::default();
    fleet.insert(handle(&vmm, "up"));
    let (mut c, sunk) = controller(&fleet, Preferences::default());
    // Upstream: the tier map has only the boot part of dram.
    let mut v = vm("up");
    v.tiers[0].size_bytes = BOOT;
    let vms = [v];
    let mut u = update(&["up"], 1);
    c.annotate(&vms, &mut u);
    assert_eq!(u.stats[0].actuator(), Actuator::ResizeZone);
    assert!(
        u.stats[0]
            .actuator_detail
            .contains("plugged memory is not attributed to a tier"),
        "{}",
        u.stats[0].actuator_detail
    );
    c.step(&vms, &u);
    let d = wait_sunk(&sunk, 1).await;
    assert_eq!(d[0].outcome(), DecisionOutcome::Applied, "{}", d[0].detail);
    let r = vmm.resizes();
    assert_eq!(r.len(), 1);
    assert!(desired_of(&r[0]) >= BOOT);
    // The VMM's config follows the request (cloud-hypervisor stores it).
    fleet.get("up").unwrap().refresh().await.unwrap();
    let snap = fleet.get("up").unwrap().snapshot();
    let z = snap.resizable("dram").unwrap();
    assert_eq!(z.requested_ram(), desired_of(&r[0]));
    assert_eq!(z.plugged, None);
}

#[tokio::test]
async fn the_configured_balloon_actuator_drives_nothing_here_and_says_why() {
    let vmm = Vmm::start(Guest::Follows, true, REGION).await;
    let fleet = Fleet::default();
    fleet.insert(handle(&vmm, "a"));
    let prefs = Preferences {
        default: Preference::Balloon,
        ..Default::default()
    };
    let (mut c, _sunk) = controller(&fleet, prefs);
    let d = c.step(&[vm("a")], &update(&["a"], 1));
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].reason(), DecisionReason::Uncooperative);
    assert!(d[0].detail.contains("configured"), "{}", d[0].detail);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(vmm.resizes().is_empty());
}
