//! `actuate::VhostBalloon` against the real control server of the
//! `tier-balloon` backend (`tier_balloon::control`, in process, on a real
//! unix socket), plus synthetic sockets for the failure paths (a dropped
//! connection in front of the real server, a hang, no socket), which say so.

use std::os::unix::net::UnixListener as StdListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tier_balloon::device::{Balloon, DeviceOptions};
use tier_balloon::spec::parse_tier;
use tier_controller::actuate::{ActuateError, Backoff, TierState, VhostBalloon, Vmm};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;

const MIB: u64 = 1 << 20;

fn device() -> Balloon {
    Balloon::new(
        vec![
            parse_tier("name=dram,ranges=0x0-0x10000000,node=0").unwrap(),
            parse_tier("name=slow,ranges=0x10000000-0x20000000,node=1").unwrap(),
        ],
        DeviceOptions::default(),
    )
    .unwrap()
}

/// The real control server on a socket in a temp dir.
struct Backend {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    device: Balloon,
}

fn backend() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ctl.sock");
    let listener = StdListener::bind(&socket).unwrap();
    let device = device();
    tier_balloon::control::spawn(device.clone(), listener).unwrap();
    Backend {
        _dir: dir,
        socket,
        device,
    }
}

fn client(socket: &std::path::Path) -> VhostBalloon {
    VhostBalloon::new(socket)
        .with_timeout(Duration::from_millis(500))
        .with_backoff(Backoff {
            attempts: 3,
            initial: Duration::from_millis(20),
            max: Duration::from_millis(100),
        })
}

#[tokio::test]
async fn targets_round_trip_through_the_backend() {
    let b = backend();
    let c = client(&b.socket);
    let ping = c.ping().await.unwrap();
    assert_eq!(ping.protocol, 1);
    assert_eq!(ping.tiers, vec!["dram".to_string(), "slow".to_string()]);

    c.set_tier_targets(&[("slow".into(), 128 * MIB), ("dram".into(), 64 * MIB + 123)])
        .await
        .unwrap();
    let tiers = c.tier_state().await.unwrap();
    assert_eq!(
        tiers,
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
    // The device's own view agrees, and its config space carries the
    // targets in pages (SPEC section 2).
    let space = b.device.config_space();
    assert_eq!(&space[0x18..0x1c], &(16384u32).to_le_bytes());
    assert_eq!(&space[0x38..0x3c], &(32768u32).to_le_bytes());

    // Applying the same targets again is the same as applying them once.
    c.set_tier_targets(&[("dram".into(), 64 * MIB)])
        .await
        .unwrap();
    assert_eq!(c.tier_state().await.unwrap(), tiers);

    c.set_legacy_target(32 * MIB).await.unwrap();
    let st = c.state().await.unwrap();
    assert_eq!(st.legacy_target, 32 * MIB);
    assert!(st.tiers_offered);
    assert!(!st.tiers_negotiated, "no frontend yet");
    assert!(!st.frontend.connected);
    assert_eq!(st.zones[1].zone_bytes, 256 * MIB);
    assert_eq!(st.zones[0].rejected.get("wrong_tier"), Some(&0));
    assert_eq!(st.config.changes_sent, 0);
}

#[tokio::test]
async fn refused_targets_are_rejected_and_change_nothing() {
    let b = backend();
    let c = client(&b.socket);
    c.set_tier_targets(&[("dram".into(), 4096)]).await.unwrap();
    for (targets, needle) in [
        (
            vec![("dram".to_string(), 0), ("fast".to_string(), 0)],
            "unknown zone",
        ),
        (
            vec![("slow".to_string(), 257 * MIB)],
            "exceeds the zone size",
        ),
    ] {
        let e = c.set_tier_targets(&targets).await.unwrap_err();
        match &e {
            ActuateError::Rejected {
                status: 422,
                message,
                ..
            } => assert!(message.contains(needle), "{e}"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(c.tier_state().await.unwrap()[0].target, 4096);
    // A duplicate never leaves the client.
    let e = c
        .set_tier_targets(&[("dram".into(), 1), ("dram".into(), 2)])
        .await
        .unwrap_err();
    assert!(matches!(e, ActuateError::InvalidTargets(_)), "{e:?}");
}

/// Synthetic: the first connection is dropped without an answer, the
/// second is handed to the real request handler. The client retries after
/// its backoff and the target is applied once.
#[tokio::test]
async fn retries_after_a_dropped_connection() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("flaky.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let device = device();
    let served = Arc::new(AtomicUsize::new(0));
    let (d, s) = (device.clone(), Arc::clone(&served));
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            if s.fetch_add(1, Ordering::SeqCst) == 0 {
                drop(stream);
                continue;
            }
            let (r, mut w) = stream.into_split();
            let mut line = String::new();
            BufReader::new(r).read_line(&mut line).await.unwrap();
            let answer = tier_balloon::control::handle_line(&d, line.trim_end());
            w.write_all(format!("{answer}\n").as_bytes()).await.unwrap();
        }
    });
    let c = client(&socket);
    c.set_tier_targets(&[("slow".into(), 8 * MIB)])
        .await
        .unwrap();
    assert_eq!(served.load(Ordering::SeqCst), 2);
    assert_eq!(device.snapshot().zones[1].target, 8 * MIB);
}

/// Synthetic: a socket that accepts and never answers: every attempt times
/// out, and the error says how many.
#[tokio::test]
async fn a_hung_backend_times_out_on_every_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("hang.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let a = Arc::clone(&accepted);
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            a.fetch_add(1, Ordering::SeqCst);
            held.push(stream);
        }
    });
    let c = VhostBalloon::new(&socket)
        .with_timeout(Duration::from_millis(100))
        .with_backoff(Backoff {
            attempts: 2,
            initial: Duration::from_millis(10),
            max: Duration::from_millis(10),
        });
    let e = c.tier_state().await.unwrap_err();
    assert!(
        matches!(e, ActuateError::Timeout { attempts: 2, .. }),
        "{e:?}"
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn no_backend_is_a_transport_error_naming_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("absent.sock");
    let e = client(&socket).tier_state().await.unwrap_err();
    assert!(
        matches!(e, ActuateError::Transport { attempts: 3, .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("absent.sock"), "{e}");
}
