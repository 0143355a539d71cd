//! Contract tests of the cloud-hypervisor client (`actuate::ChApi`) against
//! responses recorded from the patched cloud-hypervisor v53.0
//! (tests/fixtures/ch-v53-tierd/, README.md there says how). A local server
//! on a unix socket stands in for the VMM and replays the recorded response
//! bytes verbatim; the requests the client sends are compared with the
//! recorded requests byte for byte, and the `vm.resize` body with SPEC.md.
//! Tests named `replay_*` replay recordings; the others use synthetic
//! answers (a hang, a dropped connection, a 503) and say so.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tier_controller::actuate::{ActuateError, BALLOON_DEVICE, Backoff, ChApi, TierState, Vmm};
use tier_test_support::fake_http::{ch_fixture as fixture, read_request};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixListener;

const MIB: u64 = 1 << 20;

/// What the stand-in VMM does with the request on each connection, in order.
enum Step {
    /// Writes these bytes verbatim and keeps the connection open, like
    /// micro-http (keep-alive).
    Reply(Vec<u8>),
    /// Reads the request and closes without answering.
    Close,
    /// Reads the request and never answers.
    Hang,
}

/// Each request received, with the time its connection was accepted.
type Seen = Arc<Mutex<Vec<(Instant, Vec<u8>)>>>;

struct Server {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    seen: Seen,
}

impl Server {
    fn requests(&self) -> Vec<Vec<u8>> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(_, r)| r.clone())
            .collect()
    }
    fn accepted(&self) -> Vec<Instant> {
        self.seen.lock().unwrap().iter().map(|(t, _)| *t).collect()
    }
}

async fn serve(steps: Vec<Step>) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ch.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        for step in steps {
            let (mut stream, _) = listener.accept().await.unwrap();
            let at = Instant::now();
            let request = read_request(&mut stream).await;
            log.lock().unwrap().push((at, request));
            match step {
                Step::Reply(bytes) => {
                    stream.write_all(&bytes).await.unwrap();
                    // Keep-alive: the client must not wait for EOF.
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                        drop(stream);
                    });
                }
                Step::Close => drop(stream),
                Step::Hang => {
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                        drop(stream);
                    });
                }
            }
        }
    });
    Server {
        _dir: dir,
        socket,
        seen,
    }
}

fn client(server: &Server) -> ChApi {
    ChApi::new(&server.socket)
        .with_timeout(Duration::from_secs(2))
        .with_backoff(Backoff {
            attempts: 3,
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        })
}

fn body_of(request: &[u8]) -> &[u8] {
    let end = request.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    &request[end + 4..]
}

/// The `vm.resize` example body of SPEC.md section 5.
fn spec_resize_example() -> serde_json::Value {
    let spec =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../vmm-patch/SPEC.md"))
            .unwrap();
    let line = spec
        .lines()
        .find(|l| l.starts_with("{\"desired_balloon_zones\""))
        .expect("SPEC.md has the vm.resize example body");
    serde_json::from_str(line).unwrap()
}

fn spec_targets() -> Vec<(String, u64)> {
    vec![("dram".into(), 64 * MIB), ("slow".into(), 128 * MIB)]
}

#[tokio::test]
async fn replay_resize_ok_sends_the_spec_body() {
    let server = serve(vec![Step::Reply(fixture("04-vm.resize-ok.response"))]).await;
    client(&server)
        .set_tier_targets(&spec_targets())
        .await
        .unwrap();
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    // Byte for byte what the recording sent to the real VMM...
    assert_eq!(
        String::from_utf8_lossy(&requests[0]),
        String::from_utf8_lossy(&fixture("04-vm.resize-ok.request"))
    );
    // ...whose body is SPEC.md's example.
    let body: serde_json::Value = serde_json::from_slice(body_of(&requests[0])).unwrap();
    assert_eq!(body, spec_resize_example());
    assert_eq!(
        body_of(&requests[0]),
        br#"{"desired_balloon_zones":{"dram":67108864,"slow":134217728}}"#
    );
}

#[tokio::test]
async fn replay_vm_info_after_resize_gives_per_zone_target_and_actual() {
    let server = serve(vec![Step::Reply(fixture(
        "05-vm.info-after-resize.response",
    ))])
    .await;
    let state = client(&server).tier_state().await.unwrap();
    assert_eq!(
        state,
        vec![
            TierState {
                zone: "dram".into(),
                target: 64 * MIB,
                actual: 0,
                host_ballooned: 0
            },
            TierState {
                zone: "slow".into(),
                target: 128 * MIB,
                actual: 0,
                host_ballooned: 0
            },
        ]
    );
    assert_eq!(
        server.requests(),
        vec![fixture("05-vm.info-after-resize.request")]
    );
}

#[tokio::test]
async fn replay_vm_info_initial_sections() {
    let server = serve(vec![Step::Reply(fixture("02-vm.info-initial.response"))]).await;
    let info = client(&server).vm_info().await.unwrap();
    assert_eq!(info.state, "Running");
    assert_eq!(info.memory_actual_size, Some(512 * MIB));
    let balloon = info.balloon.unwrap();
    assert!(balloon.tiers_offered);
    assert!(
        !balloon.tiers_negotiated,
        "the PVH guest has no balloon driver"
    );
    assert_eq!(
        balloon
            .zones
            .iter()
            .map(|z| (z.id.as_str(), z.tier, z.target, z.actual))
            .collect::<Vec<_>>(),
        vec![("dram", 0, 0, 0), ("slow", 1, 0, 0)]
    );
    let zones = info.memory_zones.unwrap();
    assert_eq!(zones.len(), 2);
    assert_eq!(zones[1].id, "slow");
    assert_eq!(zones[1].guest_numa_node, Some(1));
    assert_eq!(zones[1].ranges[0].start, 256 * MIB);
    assert_eq!(zones[1].ranges[0].size, 256 * MIB);
}

#[tokio::test]
async fn replay_vm_info_after_rejected_resizes_is_unchanged() {
    let server = serve(vec![Step::Reply(fixture(
        "09-vm.info-after-rejected.response",
    ))])
    .await;
    let state = client(&server).tier_state().await.unwrap();
    let targets: Vec<_> = state.iter().map(|t| (t.zone.as_str(), t.target)).collect();
    assert_eq!(targets, vec![("dram", 64 * MIB), ("slow", 128 * MIB)]);
}

#[tokio::test]
async fn replay_counters_and_ping() {
    let server = serve(vec![
        Step::Reply(fixture("06-vm.counters-after-resize.response")),
        Step::Reply(fixture("01-vmm.ping.response")),
    ])
    .await;
    let api = client(&server);
    let counters = api.counters().await.unwrap();
    let balloon = &counters[BALLOON_DEVICE];
    assert_eq!(balloon["tier0_target_bytes"], 64 * MIB);
    assert_eq!(balloon["tier1_target_bytes"], 128 * MIB);
    assert_eq!(balloon["tier1_actual_bytes"], 0);
    let ping = api.ping().await.unwrap();
    assert_eq!(ping.version, "53.0.0");
    assert!(ping.build_version.starts_with("v53.0-4-g"));
    assert_eq!(
        server.requests(),
        vec![
            fixture("06-vm.counters-after-resize.request"),
            fixture("01-vmm.ping.request")
        ]
    );
}

#[tokio::test]
async fn replay_resize_too_large_is_a_vmm_error_not_retried() {
    let server = serve(vec![Step::Reply(fixture(
        "07-vm.resize-too-large.response",
    ))])
    .await;
    let err = client(&server)
        .set_tier_targets(&[("slow".into(), 256 * MIB + 4096)])
        .await
        .unwrap_err();
    match &err {
        ActuateError::Vmm {
            endpoint,
            status,
            message,
        } => {
            assert_eq!(*endpoint, "PUT /api/v1/vm.resize");
            assert_eq!(*status, 500);
            assert!(
                message.ends_with("Balloon tier 1 target of 65537 pages exceeds its 65536 pages"),
                "{message}"
            );
        }
        other => panic!("expected Vmm, got {other:?}"),
    }
    assert!(err.to_string().contains("PUT /api/v1/vm.resize"));
    // A rejected resize is the VMM's verdict: one request, no retry.
    assert_eq!(
        server.requests(),
        vec![fixture("07-vm.resize-too-large.request")]
    );
}

#[tokio::test]
async fn replay_resize_unknown_zone_is_a_vmm_error() {
    let server = serve(vec![Step::Reply(fixture(
        "08-vm.resize-unknown-zone.response",
    ))])
    .await;
    let err = client(&server)
        .set_tier_targets(&[("pmem".into(), 4096)])
        .await
        .unwrap_err();
    assert!(
        matches!(err, ActuateError::Vmm { status: 500, .. }),
        "{err:?}"
    );
    assert_eq!(
        err.vmm_message(),
        Some(
            "Error from API: The VM could not be resized: Error from device manager: \
             Unknown memory zone for the per-zone balloon: pmem"
        )
    );
    assert_eq!(
        server.requests(),
        vec![fixture("08-vm.resize-unknown-zone.request")]
    );
}

#[tokio::test]
async fn replay_bad_request_is_rejected() {
    // The recorded 400 answered a string target, which the client cannot
    // send; replayed here to map the status and message.
    let server = serve(vec![Step::Reply(fixture("10-vm.resize-bad-body.response"))]).await;
    let err = client(&server)
        .set_tier_targets(&[("dram".into(), 64 * MIB)])
        .await
        .unwrap_err();
    match &err {
        ActuateError::Rejected {
            endpoint,
            status: 400,
            message,
        } => {
            assert_eq!(*endpoint, "PUT /api/v1/vm.resize");
            assert!(
                message.starts_with("Failed to deserialize JSON: invalid type"),
                "{message}"
            );
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn synthetic_hang_times_out_on_every_attempt() {
    let server = serve(vec![Step::Hang, Step::Hang]).await;
    let api = ChApi::new(&server.socket)
        .with_timeout(Duration::from_millis(200))
        .with_backoff(Backoff {
            attempts: 2,
            initial: Duration::from_millis(10),
            max: Duration::from_millis(10),
        });
    let start = Instant::now();
    let err = api.tier_state().await.unwrap_err();
    let took = start.elapsed();
    match err {
        ActuateError::Timeout {
            endpoint,
            timeout,
            attempts,
            ..
        } => {
            assert_eq!(endpoint, "GET /api/v1/vm.info");
            assert_eq!(timeout, Duration::from_millis(200));
            assert_eq!(attempts, 2);
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(took >= Duration::from_millis(410), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn synthetic_get_fails_twice_then_answers_with_backoff() {
    let unavailable =
        b"HTTP/1.1 503 \r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n[\"try again\"]"
            .to_vec();
    let server = serve(vec![
        Step::Close,
        Step::Reply(unavailable),
        Step::Reply(fixture("05-vm.info-after-resize.response")),
    ])
    .await;
    let state = client(&server).tier_state().await.unwrap();
    assert_eq!(state[0].target, 64 * MIB);
    let at = server.accepted();
    assert_eq!(at.len(), 3, "two failures, then the answer");
    let (first, second) = (at[1] - at[0], at[2] - at[1]);
    // Backoff 100 ms then 200 ms.
    assert!(first >= Duration::from_millis(100), "{first:?}");
    assert!(second >= Duration::from_millis(200), "{second:?}");
    // The same request each time.
    assert!(
        server
            .requests()
            .iter()
            .all(|r| *r == fixture("05-vm.info-after-resize.request"))
    );
}

#[tokio::test]
async fn synthetic_get_5xx_until_attempts_run_out() {
    let failing = || {
        Step::Reply(b"HTTP/1.1 500 \r\nContent-Length: 21\r\n\r\n[\"VM is not running\"]".to_vec())
    };
    let server = serve(vec![failing(), failing(), failing()]).await;
    let err = client(&server).vm_info().await.unwrap_err();
    assert!(
        matches!(err, ActuateError::Vmm { status: 500, .. }),
        "{err:?}"
    );
    assert_eq!(err.vmm_message(), Some("VM is not running"));
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn synthetic_resize_retried_after_a_dropped_connection() {
    // Absolute targets: re-sending after a transport failure is safe.
    let server = serve(vec![
        Step::Close,
        Step::Reply(fixture("04-vm.resize-ok.response")),
    ])
    .await;
    client(&server)
        .set_tier_targets(&spec_targets())
        .await
        .unwrap();
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert!(
        requests
            .iter()
            .all(|r| *r == fixture("04-vm.resize-ok.request"))
    );
}

#[tokio::test]
async fn synthetic_chunked_answer_and_no_tiers() {
    let body = br#"{"state":"Running","balloon":null}"#;
    let mut answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    answer.extend_from_slice(b"10\r\n");
    answer.extend_from_slice(&body[..16]);
    answer.extend_from_slice(format!("\r\n{:x}\r\n", body.len() - 16).as_bytes());
    answer.extend_from_slice(&body[16..]);
    answer.extend_from_slice(b"\r\n0\r\n\r\n");
    let server = serve(vec![Step::Reply(answer)]).await;
    let err = client(&server).tier_state().await.unwrap_err();
    assert!(
        matches!(
            err,
            ActuateError::NotTiered {
                endpoint: "GET /api/v1/vm.info"
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn no_vmm_is_a_transport_error_naming_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("absent.sock");
    let api = ChApi::new(&socket).with_backoff(Backoff {
        attempts: 2,
        initial: Duration::from_millis(1),
        max: Duration::from_millis(1),
    });
    let err = api.tier_state().await.unwrap_err();
    assert!(
        matches!(err, ActuateError::Transport { attempts: 2, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("absent.sock"), "{err}");
}

#[tokio::test]
async fn invalid_targets_are_refused_before_any_io() {
    let api = ChApi::new("/nonexistent/ch.sock");
    let err = api
        .set_tier_targets(&[("dram".into(), 0), ("dram".into(), 4096)])
        .await
        .unwrap_err();
    assert!(matches!(err, ActuateError::InvalidTargets(_)), "{err:?}");
    // Nothing to set: no call at all.
    api.set_tier_targets(&[]).await.unwrap();
}

#[tokio::test]
async fn synthetic_resize_zone_sends_the_zone_total_and_a_refusal_is_not_retried() {
    // Synthetic answers in cloud-hypervisor's shapes: 204 for a resize it
    // took, 500 with the error chain for one below the boot size.
    let server = serve(vec![
        Step::Reply(b"HTTP/1.1 204 \r\nContent-Length: 0\r\n\r\n".to_vec()),
        Step::Reply(
            b"HTTP/1.1 500 \r\nContent-Length: 74\r\n\r\n[\"Error from API\",\"Invalid resize below boot size (67108864 < 134217728)\"]"
                .to_vec(),
        ),
        Step::Reply(b"HTTP/1.1 204 \r\nContent-Length: 0\r\n\r\n".to_vec()),
    ])
    .await;
    let api = client(&server);
    api.resize_zone("dram", 192 * MIB).await.unwrap();
    let err = api.resize_zone("dram", 64 * MIB).await.unwrap_err();
    match &err {
        ActuateError::Vmm {
            endpoint,
            status: 500,
            message,
        } => {
            assert_eq!(*endpoint, "PUT /api/v1/vm.resize-zone");
            assert!(message.contains("below boot size"), "{message}");
        }
        other => panic!("expected Vmm, got {other:?}"),
    }
    let reqs = server.requests();
    // The refusal is final: two requests, no retry.
    assert_eq!(reqs.len(), 2);
    assert!(reqs[0].starts_with(b"PUT /api/v1/vm.resize-zone HTTP/1.1\r\n"));
    let body: serde_json::Value = serde_json::from_slice(body_of(&reqs[0])).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"id": "dram", "desired_ram": 192 * MIB})
    );
}

#[tokio::test]
async fn synthetic_resize_zone_retried_after_a_dropped_connection() {
    // Absolute, so re-sending after a transport failure is safe.
    let server = serve(vec![
        Step::Close,
        Step::Reply(b"HTTP/1.1 204 \r\nContent-Length: 0\r\n\r\n".to_vec()),
    ])
    .await;
    client(&server).resize_zone("dram", 96 * MIB).await.unwrap();
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(body_of(&reqs[0]), body_of(&reqs[1]));
}
