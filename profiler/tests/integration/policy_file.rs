//! `[controller] policy_file`: a policy set with SetPolicy survives a
//! `kill -9` of tierd, a policy that cannot be saved is not put in force,
//! and a damaged file stops tierd at start with the reason.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::path::{Path, PathBuf};

use tier_proto::Endpoint;
use tier_proto::v1::*;
use tier_test_support::{Tierd, TierdBuilder};

struct Setup {
    dir: tempfile::TempDir,
    socket: PathBuf,
    policy: PathBuf,
    config: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let policy = state.join("policy.pb");
        let config = dir.path().join("tierd.toml");
        std::fs::write(
            &config,
            format!(
                "[controller]\npolicy_file = {:?}\n",
                policy.display().to_string()
            ),
        )
        .unwrap();
        Setup {
            socket: dir.path().join("tierd.sock"),
            dir,
            policy,
            config,
        }
    }

    /// tierd in the setup's directory with its config file.
    fn tierd(&self) -> TierdBuilder {
        crate::tierd()
            .dir(self.dir.path())
            .config_file(&self.config)
            .metrics("127.0.0.1:0")
            .args(["--interval-ms", "100"])
    }

    fn start(&self) -> Tierd {
        let _ = std::fs::remove_file(&self.socket);
        self.tierd().start()
    }
}

async fn policy(socket: &Path) -> Policy {
    let mut c = tier_proto::connect(&Endpoint::Unix(socket.to_path_buf()))
        .await
        .unwrap();
    c.get_policy(GetPolicyRequest {})
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn a_set_policy_survives_kill_9_and_an_unsaved_one_is_not_in_force() {
    let s = Setup::new();
    let mut tierd = s.start();
    let default = policy(&s.socket).await;
    assert!(!s.policy.exists(), "nothing written before SetPolicy");
    let mine = Policy {
        default_target: 0.8,
        host_dram_budget_bytes: 48 << 20,
        max_step_bytes: 8 << 20,
        ..default.clone()
    };
    let mut c = tier_proto::connect(&Endpoint::Unix(s.socket.clone()))
        .await
        .unwrap();
    c.set_policy(SetPolicyRequest {
        policy: Some(mine.clone()),
    })
    .await
    .unwrap();
    assert!(s.policy.exists(), "SetPolicy answered before it was saved");
    drop(c);
    tierd.kill9();

    let mut tierd = s.start();
    assert_eq!(policy(&s.socket).await, mine, "the policy after kill -9");
    let log = tierd.log();
    assert!(
        log.contains("policy restored from the policy file"),
        "{log}"
    );

    // The directory is gone: the policy cannot be saved, so it is refused
    // and the one in force stays.
    std::fs::remove_dir_all(s.policy.parent().unwrap()).unwrap();
    let mut c = tier_proto::connect(&Endpoint::Unix(s.socket.clone()))
        .await
        .unwrap();
    let e = c
        .set_policy(SetPolicyRequest {
            policy: Some(Policy {
                default_target: 0.7,
                ..mine.clone()
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(
        e.message().contains("policy.pb") && e.message().contains("unchanged"),
        "{}",
        e.message()
    );
    assert_eq!(policy(&s.socket).await, mine);
    assert!(tierd.terminate().success());
}

#[test]
fn a_damaged_policy_file_stops_tierd_at_start_with_the_reason() {
    let s = Setup::new();
    std::fs::write(
        &s.policy,
        b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff garbage",
    )
    .unwrap();
    let out = s.tierd().output();
    assert_eq!(
        out.status.code(),
        Some(2),
        "status 2: not restarted by systemd"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("policy_file") && err.contains("policy.pb"),
        "{err}"
    );
    assert!(
        !s.socket.exists(),
        "no socket from a tierd that refused to start"
    );
    // The file is left as it was, for the operator to look at.
    assert!(std::fs::read(&s.policy).unwrap().ends_with(b"garbage"));
}

#[test]
fn a_relative_policy_file_is_a_config_error() {
    let s = Setup::new();
    std::fs::write(&s.config, "[controller]\npolicy_file = \"policy.pb\"\n").unwrap();
    let out = s.tierd().output();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("controller.policy_file") && err.contains("absolute"),
        "{err}"
    );
}
