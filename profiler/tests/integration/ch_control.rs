//! The in-process controller and SetBalloonTargets driving a
//! cloud-hypervisor VM's per-tier balloon through its API, against a
//! stand-in VMM on a unix socket that answers with responses recorded
//! from the patched binary (controller/tests/fixtures/ch-v53-tierd/).
//! Where a test needs a state the recording VM could not reach (its PVH
//! guest has no balloon driver, so `tiers_negotiated` is always false),
//! the recorded `vm.info` body is changed in that one field (and
//! `Content-Length` fixed), and the test says so.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
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
use tier_profiler::ch::{ChHandle, Fleet};
use tier_profiler::server::{Shared, TierServer};
use tier_proto::v1::tier_service_server::TierService;
use tier_proto::v1::*;
use tier_test_support::fake_http::{ch_fixture as recorded, read_request};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixListener;

use crate::ch_common;
use ch_common::{controller, update, wait_sunk};

const M: u64 = 1 << 20;
const VM_ID: &str = "ch:4242:30";

/// A recorded response with its body passed through `edit`.
fn edited(name: &str, edit: impl Fn(&str) -> String) -> Vec<u8> {
    let raw = recorded(name);
    let at = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8(raw[..at].to_vec()).unwrap();
    let body = edit(std::str::from_utf8(&raw[at..]).unwrap());
    let head: String = head
        .split("\r\n")
        .map(|l| {
            if l.to_ascii_lowercase().starts_with("content-length:") {
                format!("Content-Length: {}", body.len())
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

fn body_of(response: &[u8]) -> &[u8] {
    let at = response.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    &response[at..]
}

/// Recorded vm.info right after boot (targets 0, not negotiated).
fn info_initial() -> Vec<u8> {
    recorded("02-vm.info-initial.response")
}

/// The same with `tiers_negotiated` true (a guest with the driver).
fn info_negotiated(name: &str) -> Vec<u8> {
    edited(name, |b| {
        assert!(b.contains("\"tiers_negotiated\":false"));
        b.replace("\"tiers_negotiated\":false", "\"tiers_negotiated\":true")
    })
}

/// The stand-in VMM: answers vm.info with `info`, vm.counters with the
/// recording, vm.resize with the queued replies (else the recorded 204),
/// and logs every request line and body.
struct Vmm {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    info: Arc<Mutex<Vec<u8>>>,
    resize: Arc<Mutex<VecDeque<Vec<u8>>>>,
    seen: Arc<Mutex<Vec<(String, String)>>>,
}

impl Vmm {
    async fn start(info: Vec<u8>) -> Vmm {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("vm.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let vmm = Vmm {
            _dir: dir,
            socket,
            info: Arc::new(Mutex::new(info)),
            resize: Arc::new(Mutex::new(VecDeque::new())),
            seen: Arc::new(Mutex::new(Vec::new())),
        };
        let (info, resize, seen) = (vmm.info.clone(), vmm.resize.clone(), vmm.seen.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let (info, resize, seen) = (info.clone(), resize.clone(), seen.clone());
                tokio::spawn(async move {
                    let req = read_request(&mut s).await;
                    if req.is_empty() {
                        return; // a connect-only probe
                    }
                    let text = String::from_utf8_lossy(&req).into_owned();
                    let line = text.lines().next().unwrap_or_default().to_string();
                    let body = text
                        .split("\r\n\r\n")
                        .nth(1)
                        .unwrap_or_default()
                        .to_string();
                    seen.lock().unwrap().push((line.clone(), body));
                    let reply = if line.starts_with("GET /api/v1/vm.info ") {
                        info.lock().unwrap().clone()
                    } else if line.starts_with("GET /api/v1/vm.counters ") {
                        recorded("03-vm.counters-initial.response")
                    } else if line.starts_with("PUT /api/v1/vm.resize ") {
                        resize
                            .lock()
                            .unwrap()
                            .pop_front()
                            .unwrap_or_else(|| recorded("04-vm.resize-ok.response"))
                    } else {
                        b"HTTP/1.1 404 \r\nContent-Length: 0\r\n\r\n".to_vec()
                    };
                    s.write_all(&reply).await.unwrap();
                    // micro-http keeps the connection: the client must not wait.
                    tokio::time::sleep(Duration::from_secs(5)).await;
                });
            }
        });
        vmm
    }

    fn set_info(&self, info: Vec<u8>) {
        *self.info.lock().unwrap() = info;
    }

    fn resizes(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(l, _)| l.starts_with("PUT /api/v1/vm.resize"))
            .map(|(_, b)| b.clone())
            .collect()
    }
}

fn handle(socket: &Path, id: &str, info: &[u8]) -> Arc<ChHandle> {
    let info: VmInfo = serde_json::from_slice(body_of(info)).unwrap();
    Arc::new(ChHandle::new(
        id.into(),
        4242,
        socket.to_path_buf(),
        Duration::from_millis(500),
        info,
    ))
}

/// The VM of the recording: zones dram and slow, 256 MiB each.
fn vm(id: &str) -> Vm {
    let tier = |name: &str, kind: TierKind, gpa: u64| Tier {
        name: name.into(),
        kind: kind as i32,
        size_bytes: 256 * M,
        ranges: vec![GpaRange {
            gpa_start: gpa,
            length: 256 * M,
            hva_start: 0,
        }],
        ..Default::default()
    };
    Vm {
        id: id.into(),
        name: id.into(),
        tiers: vec![
            tier("dram", TierKind::Dram, 0),
            tier("slow", TierKind::Cxl, 256 * M),
        ],
        source: VmSource::CloudHypervisor as i32,
        ..Default::default()
    }
}

#[tokio::test]
async fn not_actuable_until_negotiated_then_decisions_are_applied_through_vm_resize() {
    let vmm = Vmm::start(info_initial()).await;
    let fleet = Fleet::default();
    fleet.insert(handle(&vmm.socket, VM_ID, &info_initial()));
    let (mut c, sunk) = controller(&fleet, &default_policy());
    let vms = [vm(VM_ID)];

    // Recorded: the PVH guest never negotiated the per-tier balloon.
    let d = c.step(&vms, &update(&[VM_ID], 1));
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].reason(), DecisionReason::Uncooperative);
    assert_eq!(d[0].outcome(), DecisionOutcome::Skipped);
    assert!(
        d[0].detail.contains("has not negotiated"),
        "{}",
        d[0].detail
    );
    assert!(c.is_uncooperative(VM_ID));
    assert!(
        c.step(&vms, &update(&[VM_ID], 2)).is_empty(),
        "reported once"
    );

    // Edited: a guest whose driver negotiated the tiers.
    vmm.set_info(info_negotiated("02-vm.info-initial.response"));
    fleet.get(VM_ID).unwrap().refresh().await.unwrap();
    let now = c.step(&vms, &update(&[VM_ID], 3));
    assert!(!c.is_uncooperative(VM_ID), "forgiven once drivable");
    assert!(
        now.is_empty(),
        "the applied decision comes through the sink: {now:?}"
    );
    let d = wait_sunk(&sunk, 1).await;
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].outcome(), DecisionOutcome::Applied, "{}", d[0].detail);
    let change = d[0].changes.iter().find(|c| c.tier == "dram").unwrap();
    assert_eq!(change.old_target_bytes, 0);
    assert!(change.new_target_bytes > 0 && change.new_target_bytes <= 64 * M);
    assert_eq!(change.new_target_bytes % 4096, 0);
    let expected: Vec<String> = vec![format!(
        "{{\"desired_balloon_zones\":{{{}}}}}",
        d[0].changes
            .iter()
            .map(|c| format!("\"{}\":{}", c.tier, c.new_target_bytes))
            .collect::<Vec<_>>()
            .join(",")
    )];
    assert_eq!(vmm.resizes(), expected);
    // The handle read vm.info back after the change.
    let last = vmm.seen.lock().unwrap().last().unwrap().0.clone();
    assert!(
        last.starts_with("GET /api/v1/vm.counters") || last.starts_with("GET /api/v1/vm.info"),
        "{last}"
    );
}

#[tokio::test]
async fn a_refused_resize_is_failed_with_the_vmm_message() {
    let vmm = Vmm::start(info_negotiated("02-vm.info-initial.response")).await;
    vmm.resize
        .lock()
        .unwrap()
        .push_back(recorded("07-vm.resize-too-large.response"));
    let fleet = Fleet::default();
    fleet.insert(handle(&vmm.socket, VM_ID, &vmm.info.lock().unwrap()));
    let (mut c, sunk) = controller(&fleet, &default_policy());
    assert!(c.step(&[vm(VM_ID)], &update(&[VM_ID], 1)).is_empty());
    let d = wait_sunk(&sunk, 1).await;
    assert_eq!(d[0].outcome(), DecisionOutcome::Failed);
    assert!(
        d[0].detail.contains("exceeds its 65536 pages") && d[0].detail.contains("HTTP 500"),
        "{}",
        d[0].detail
    );
    assert_eq!(vmm.resizes().len(), 1, "a refused resize is not retried");
}

#[tokio::test]
async fn a_balloon_that_does_not_follow_its_target_is_marked_uncooperative() {
    // Edited recording 05 (targets dram 64M, slow 128M; the device counted
    // nothing): negotiated, so only the lag can mark it.
    let info = info_negotiated("05-vm.info-after-resize.response");
    let vmm = Vmm::start(info.clone()).await;
    let fleet = Fleet::default();
    fleet.insert(handle(&vmm.socket, VM_ID, &info));
    let (mut c, sunk) = controller(&fleet, &default_policy());
    let vms = [vm(VM_ID)];
    let mut marked = None;
    for round in 1..=6 {
        fleet.get(VM_ID).unwrap().refresh().await.unwrap();
        let d = c.step(&vms, &update(&[VM_ID], round));
        if let Some(d) = d
            .iter()
            .find(|d| d.reason() == DecisionReason::Uncooperative)
        {
            marked = Some((round, d.clone()));
            break;
        }
        assert!(
            d.is_empty(),
            "settling: no decision while the balloon lags: {d:?}"
        );
    }
    let (round, d) = marked.expect("marked uncooperative");
    // Grace of 3 intervals (Tuning::default) after the first lagging look.
    assert_eq!(round, 4);
    assert_eq!(d.outcome(), DecisionOutcome::Skipped);
    assert!(
        d.detail.contains("off by more than") && d.detail.contains("actual dram 0B"),
        "{}",
        d.detail
    );
    assert!(c.is_uncooperative(VM_ID));
    assert!(vmm.resizes().is_empty());
    assert!(sunk.lock().unwrap().is_empty());
    // Never pushed again, and never forgiven by actuation.
    for round in 5..8 {
        assert!(c.step(&vms, &update(&[VM_ID], round)).is_empty());
    }
    assert!(c.is_uncooperative(VM_ID));
}

#[tokio::test]
async fn dry_run_decides_but_never_calls_the_vmm() {
    let vmm = Vmm::start(info_negotiated("02-vm.info-initial.response")).await;
    let fleet = Fleet::default();
    fleet.insert(handle(&vmm.socket, VM_ID, &vmm.info.lock().unwrap()));
    let mut policy = default_policy();
    policy.dry_run = true;
    let (mut c, sunk) = controller(&fleet, &policy);
    let d = c.step(&[vm(VM_ID)], &update(&[VM_ID], 1));
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].outcome(), DecisionOutcome::DryRun);
    assert!(!d[0].changes.is_empty());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(vmm.resizes().is_empty());
    assert!(sunk.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_dead_vmm_socket_is_an_error_for_its_vm_only() {
    let vmm = Vmm::start(info_negotiated("02-vm.info-initial.response")).await;
    let dead_dir = tempfile::tempdir().unwrap();
    let dead = dead_dir.path().join("dead.sock");
    drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
    let fleet = Fleet::default();
    let info = vmm.info.lock().unwrap().clone();
    fleet.insert(handle(&vmm.socket, VM_ID, &info));
    fleet.insert(handle(&dead, "ch:4243:30", &info));
    let e = fleet
        .get("ch:4243:30")
        .unwrap()
        .refresh()
        .await
        .unwrap_err();
    assert!(e.contains("dead.sock"), "{e}");
    let (mut c, sunk) = controller(&fleet, &default_policy());
    let ids = [VM_ID, "ch:4243:30"];
    let d = c.step(&[vm(VM_ID), vm("ch:4243:30")], &update(&ids, 1));
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].vm_id, "ch:4243:30");
    assert_eq!(d[0].reason(), DecisionReason::Uncooperative);
    assert!(d[0].detail.contains("does not answer"), "{}", d[0].detail);
    let applied = wait_sunk(&sunk, 1).await;
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0].vm_id, VM_ID);
    assert_eq!(applied[0].outcome(), DecisionOutcome::Applied);
}

fn server(fleet: &Fleet, vms: Vec<Vm>) -> TierServer {
    let shared = Shared::new(DaemonInfo::default());
    shared.set_vms(vms);
    shared.set_fleet(fleet.clone());
    TierServer::new(shared)
}

fn req(id: &str, targets: &[(&str, u64)]) -> tonic::Request<SetBalloonTargetsRequest> {
    tonic::Request::new(SetBalloonTargetsRequest {
        vm_id: id.into(),
        targets: targets
            .iter()
            .map(|(t, b)| BalloonTarget {
                tier: t.to_string(),
                target_bytes: *b,
            })
            .collect(),
    })
}

#[tokio::test]
async fn set_balloon_targets_goes_through_the_vmm() {
    // Recorded: the VMM accepts targets without a guest driver (204) and
    // vm.info then reports them (05: dram 64M, slow 128M).
    let vmm = Vmm::start(info_initial()).await;
    let fleet = Fleet::default();
    fleet.insert(handle(&vmm.socket, VM_ID, &info_initial()));
    let srv = server(&fleet, vec![vm(VM_ID)]);
    vmm.set_info(recorded("05-vm.info-after-resize.response"));
    let r = srv
        .set_balloon_targets(req(VM_ID, &[("dram", 64 * M), ("slow", 128 * M)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.vm_id, VM_ID);
    let got: Vec<(&str, u64)> = r
        .targets
        .iter()
        .map(|t| (t.tier.as_str(), t.target_bytes))
        .collect();
    assert_eq!(got, vec![("dram", 64 * M), ("slow", 128 * M)]);
    assert_eq!(
        vmm.resizes(),
        vec![r#"{"desired_balloon_zones":{"dram":67108864,"slow":134217728}}"#.to_string()]
    );

    // Recorded 500: the VMM's refusal, nothing changed.
    vmm.resize
        .lock()
        .unwrap()
        .push_back(recorded("07-vm.resize-too-large.response"));
    let e = srv
        .set_balloon_targets(req(VM_ID, &[("slow", 128 * M)]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("exceeds its 65536 pages"),
        "{}",
        e.message()
    );

    // Checked before the VMM is asked.
    let e = srv
        .set_balloon_targets(req(VM_ID, &[("pmem", 4096)]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(vmm.resizes().len(), 2);

    // Edited: a VMM without --balloon tiers=on reports no balloon section.
    let plain = Vmm::start(edited("02-vm.info-initial.response", |b| {
        let mut v: serde_json::Value = serde_json::from_str(b).unwrap();
        v.as_object_mut().unwrap().remove("balloon").unwrap();
        v.to_string()
    }))
    .await;
    let fleet2 = Fleet::default();
    fleet2.insert(handle(&plain.socket, VM_ID, &plain.info.lock().unwrap()));
    let e = server(&fleet2, vec![vm(VM_ID)])
        .set_balloon_targets(req(VM_ID, &[("dram", 4096)]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("tiers=on"), "{}", e.message());
    assert!(plain.resizes().is_empty());

    // A VMM that is gone: unavailable, for this VM.
    let dead_dir = tempfile::tempdir().unwrap();
    let dead = dead_dir.path().join("dead.sock");
    drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
    let fleet3 = Fleet::default();
    fleet3.insert(handle(&dead, VM_ID, &info_initial()));
    let e = server(&fleet3, vec![vm(VM_ID)])
        .set_balloon_targets(req(VM_ID, &[("dram", 4096)]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable);
    assert!(
        e.message().contains("nothing was changed"),
        "{}",
        e.message()
    );
}
