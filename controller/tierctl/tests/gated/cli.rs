#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose
//! tierctl's batch commands and errors, as a user runs them: the binary
//! against a real tierd (with the demo VM where a VM is needed), a fake
//! daemon speaking another protocol version, and a socket it may not use.
//!
//! Custom harness (libtest-mimic): a test whose requirement is missing
//! (/dev/kvm for the demo VM; root and setpriv to drop privileges) is
//! reported as ignored with the reason, never as passed.

use std::os::unix::fs::PermissionsExt;
use std::pin::Pin;

use crate::cli_common::{Tierd, run_tierctl, start_tierd};
use libtest_mimic::{Completion, Failed, Trial};
use tier_proto::v1::tier_service_server::{TierService, TierServiceServer};
use tier_proto::v1::*;
use tier_test_support::kvm_missing;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

const SCHEMA: &str = include_str!("../../schema/top.schema.json");

fn daemon_not_running() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("none.sock");
    let (out, _, err) = run_tierctl(sock.to_str().unwrap(), &["vms"]);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!(
            "tierd is not running: no socket at {}",
            sock.display()
        )),
        "{err}"
    );
    // A stale socket file nobody listens on reads the same.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let (_, _, err) = run_tierctl(sock.to_str().unwrap(), &["top", "--once"]);
    assert!(err.contains("tierd is not running"), "{err}");
    let (_, _, err) = run_tierctl("tcp:nowhere", &["info"]);
    assert!(err.contains("bad endpoint \"tcp:nowhere\""), "{err}");
}

/// As nobody, on a root:daemon 0660 socket: tierctl names the group.
fn permission_denied_names_the_group() -> Result<Completion, Failed> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(Completion::ignored_with(
            "needs root to give a socket to another group and drop privileges",
        ));
    }
    let Ok(setpriv) = which("setpriv") else {
        return Ok(Completion::ignored_with("needs setpriv (util-linux)"));
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sock = dir.path().join("tierd.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    // Group 1 is `daemon` on Debian; whatever its name, tierctl must say it.
    std::os::unix::fs::chown(&sock, Some(0), Some(1)).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o660)).unwrap();
    let group = tierctl::conn::group_name(1).unwrap_or_else(|| "1".into());
    // The build tree may not be readable by nobody: a copy is.
    let bin = dir.path().join("tierctl");
    std::fs::copy(env!("CARGO_BIN_EXE_tierctl"), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = std::process::Command::new(setpriv)
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .arg("--endpoint")
        .arg(&sock)
        .arg("vms")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!("permission denied on {}", sock.display())),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "the socket belongs to group `{group}` (mode 0660)"
        )) && err.contains(&format!("usermod -aG {group}")),
        "{err}"
    );
    Ok(Completion::Completed)
}

fn which(name: &str) -> Result<std::path::PathBuf, ()> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or(())
}

/// A daemon that answers GetInfo with another protocol version.
struct Future99;

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl TierService for Future99 {
    async fn get_info(&self, _: Request<GetInfoRequest>) -> Result<Response<DaemonInfo>, Status> {
        Ok(Response::new(DaemonInfo {
            protocol_version: 99,
            daemon_version: "9.0.0-future".into(),
            ..Default::default()
        }))
    }
    async fn list_vms(
        &self,
        _: Request<ListVmsRequest>,
    ) -> Result<Response<ListVmsResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn get_vm(&self, _: Request<GetVmRequest>) -> Result<Response<Vm>, Status> {
        Err(Status::unimplemented("fake"))
    }
    type WatchStatsStream = Stream_<StatsUpdate>;
    async fn watch_stats(
        &self,
        _: Request<WatchStatsRequest>,
    ) -> Result<Response<Self::WatchStatsStream>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn get_policy(&self, _: Request<GetPolicyRequest>) -> Result<Response<Policy>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn set_policy(&self, _: Request<SetPolicyRequest>) -> Result<Response<Policy>, Status> {
        Err(Status::unimplemented("fake"))
    }
    type WatchDecisionsStream = Stream_<Decision>;
    async fn watch_decisions(
        &self,
        _: Request<WatchDecisionsRequest>,
    ) -> Result<Response<Self::WatchDecisionsStream>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn set_balloon_targets(
        &self,
        _: Request<SetBalloonTargetsRequest>,
    ) -> Result<Response<SetBalloonTargetsResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
}

fn protocol_version_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("future.sock");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(async { tokio::net::UnixListener::bind(&sock) })
        .unwrap();
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(TierServiceServer::new(Future99))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    for args in [&["info"][..], &["top", "--once"], &["policy", "get"]] {
        let (out, _, err) = run_tierctl(sock.to_str().unwrap(), args);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            err.contains(
                "protocol version mismatch: tierd 9.0.0-future speaks tier.v1 version 99, this tierctl speaks 1"
            ),
            "{args:?}: {err}"
        );
    }
}

fn completions() {
    // No daemon needed: the endpoint points nowhere.
    for (shell, want) in [
        ("bash", "complete -F _tierctl"),
        ("zsh", "#compdef tierctl"),
        ("fish", "complete -c tierctl"),
    ] {
        let (out, stdout, err) = run_tierctl("/nonexistent.sock", &["completions", shell]);
        assert!(out.status.success(), "{shell}: {err}");
        assert!(stdout.contains(want), "{shell}: {want:?} missing");
        for sub in ["top", "policy", "balloon", "endpoint"] {
            assert!(stdout.contains(sub), "{shell} completes {sub}");
        }
    }
}

fn policy_get_and_set() {
    let tierd = start_tierd(&["--interval-ms", "200"]);
    let ep = tierd.endpoint();
    let get = || {
        let (out, stdout, err) = run_tierctl(&ep, &["policy", "get"]);
        assert!(out.status.success(), "{err}");
        serde_json::from_str::<serde_json::Value>(&stdout).unwrap()
    };
    let before = get();
    assert_eq!(before["default_target"], 0.9, "{before}");
    assert_eq!(before["epsilon"], 0.02);

    // tierd validates; tierctl prints its words and changes nothing.
    let (out, _, err) = run_tierctl(&ep, &["policy", "set", "--epsilon", "0.9"]);
    assert!(!out.status.success());
    assert!(
        err.contains(
            "tierd refused SetPolicy: policy.epsilon: 0.9 is not in [0, 0.5]; the policy in force is unchanged"
        ),
        "{err}"
    );
    assert_eq!(get(), before);

    let (out, stdout, err) = run_tierctl(
        &ep,
        &[
            "policy",
            "set",
            "--default-target",
            "0.8",
            "--epsilon",
            "0.05",
            "--max-step",
            "128M",
        ],
    );
    assert!(out.status.success(), "{err}");
    let now: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (
            &now["default_target"],
            &now["epsilon"],
            &now["max_step_bytes"]
        ),
        (&0.8.into(), &0.05.into(), &(128u64 << 20).into())
    );
    assert_eq!(get(), now);

    // From a file (what `policy get` prints, edited), then flags on top.
    let file = tierd.dir().join("policy.json");
    std::fs::write(
        &file,
        r#"{"dry_run": true, "vms": [{"vm": "demo", "target": 0.7, "limits": [{"tier": "dram", "floor_bytes": 4096}]}]}"#,
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let (out, _, err) = run_tierctl(&ep, &["policy", "set", "-f", f, "--cooldown", "5"]);
    assert!(out.status.success(), "{err}");
    let now = get();
    assert_eq!(now["dry_run"], true);
    assert_eq!(now["cooldown_intervals"], 5);
    assert_eq!(now["default_target"], 0.8, "kept from before");
    assert_eq!(now["vms"][0]["target"], 0.7);
    assert_eq!(now["vms"][0]["limits"][0]["floor_bytes"], 4096);

    // A typo is caught before anything is sent; a bad value by tierd.
    std::fs::write(&file, r#"{"epsilom": 0.05}"#).unwrap();
    let (out, _, err) = run_tierctl(&ep, &["policy", "set", "-f", f]);
    assert!(
        !out.status.success() && err.contains("unknown field `epsilom`"),
        "{err}"
    );
    std::fs::write(&file, r#"{"vms": [{"vm": "a"}, {"vm": "a"}]}"#).unwrap();
    let (_, _, err) = run_tierctl(&ep, &["policy", "set", "-f", f]);
    assert!(
        err.contains("policy.vms[1].vm: \"a\" appears twice"),
        "{err}"
    );
    assert_eq!(get(), now);

    let (out, _, err) = run_tierctl(&ep, &["policy", "set"]);
    assert_eq!(out.status.code(), Some(2), "usage error: {err}");
}

fn demo_tierd() -> Tierd {
    // Every interval sampled (the default sampler budget would skip most
    // of the demo VM's at 200 ms; tier-profiler's daemon tests cover it).
    start_tierd(&["--demo-vm", "--interval-ms", "200", "--cpu-budget-pct", "0"])
}

fn top_json_matches_the_schema_csv_has_a_header() {
    let tierd = demo_tierd();
    let ep = tierd.endpoint();
    let schema: serde_json::Value = serde_json::from_str(SCHEMA).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();

    let (out, stdout, err) = run_tierctl(&ep, &["top", "-n", "4", "--output", "json"]);
    assert!(out.status.success(), "{err}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "one object per update:\n{stdout}");
    let mut seqs = Vec::new();
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{errors:?}\n{l}");
        let tiers: Vec<&str> = v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["tier"].as_str().unwrap())
            .collect();
        assert_eq!(tiers, ["dram", "slow"]);
        seqs.push(v["sequence"].as_u64().unwrap());
        for r in v["rows"].as_array().unwrap() {
            // No zero error beside an interval; no number where the
            // interval says nothing.
            if !r["dram_hit_low"].is_null() {
                assert!(r["dram_hit_error"].is_null(), "{l}");
            }
            if !r["dram_hit_not_measured"].is_null() {
                assert!(
                    r["dram_hit_ratio"].is_null() && r["dram_hit_low"].is_null(),
                    "{l}"
                );
            }
        }
    }
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    // By the last update the host sampler has seen accesses.
    let last: serde_json::Value = serde_json::from_str(lines[3]).unwrap();
    assert_eq!(last["rows"][0]["source"], "hostpte", "{last}");
    assert!(last["rows"][0]["accesses_per_s"].as_f64().unwrap() > 0.0);
    // What accessed bits measure, and what steers the VM (policy mode
    // auto, no PMU here): the demo's 50 DRAM and 96 slow pages.
    let share = last["rows"][0]["hot_set_dram_share"].as_f64();
    assert!(share.is_some_and(|s| (0.2..0.5).contains(&s)), "{last}");
    assert_eq!(last["rows"][0]["signal"], "hot-set", "{last}");

    let (out, stdout, err) = run_tierctl(&ep, &["top", "-n", "2", "--output", "csv"]);
    assert!(out.status.success(), "{err}");
    let mut lines = stdout.lines();
    let header = lines.next().unwrap();
    assert_eq!(
        header,
        "vm_id,vm_name,vcpus,tier,kind,size_bytes,resident_bytes,balloon_target_bytes,balloon_actual_bytes,young_pages,sampled_pages,source,guest_accesses_per_s,dram_hit_ratio,guest_hit_ratio,accesses_per_s,dram_hit_error,dram_hit_target,rate_saturation,pmu_events_per_s,pmu_not_measured,pmu_running_ratio,not_measured,dram_hit_low,dram_hit_high,dram_hit_low_open,dram_hit_high_open,counted_dram_hit_ratio,accesses_low_per_s,accesses_high_per_s,accesses_high_open,saturated_pages,fit_misfit,sampler_coverage,sampler_passes,sampler_passes_allowed,sampler_budget_pct,sampler_spent_pct,sampler_limited,actuator,actuator_detail,hotplug_region_bytes,hotplug_requested_bytes,hotplug_plugged_bytes,hotplug_attributed,cold_bytes,cold_bytes_low,cold_bytes_high,promoted_bytes_per_s,promoted_bytes_per_s_low,promoted_bytes_per_s_high,ages_history_s,ages_not_measured,dram_hit_not_measured,hot_set_dram_share,hot_set_dram_share_low,hot_set_dram_share_high,hot_set_horizon_s,hot_set_from_pass,hot_set_bytes,hot_set_tier_bytes,signal,ws_1s_bytes,ws_1s_bytes_low,ws_1s_bytes_high,ws_10s_bytes,ws_10s_bytes_low,ws_10s_bytes_high,ws_60s_bytes,ws_60s_bytes_low,ws_60s_bytes_high,ws_600s_bytes,ws_600s_bytes_low,ws_600s_bytes_high"
    );
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 4, "2 updates x 2 tiers, one header:\n{stdout}");
    let cols = header.split(',').count();
    for r in &rows {
        assert!(r.starts_with("demo:"), "{r}");
        assert_eq!(r.split(',').count(), cols, "{r}");
    }

    let (out, stdout, _) = run_tierctl(&ep, &["top", "--once"]);
    assert!(out.status.success());
    assert!(
        stdout.starts_with("update #") && stdout.contains("DRAM-HIT") && stdout.contains("STEER"),
        "{stdout}"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.len() >= 4, "title, header, 2 tiers:\n{stdout}");
    // Under the table only notes: why a ratio is not measured, decisions.
    assert!(
        lines[4..]
            .iter()
            .all(|l| l.starts_with("demo: DRAM-HIT not measured: ")
                || l.starts_with("demo: last decision: ")),
        "{stdout}"
    );
    assert!(!stdout.contains("0-100 % ?"), "{stdout}");
}

fn vms_vm_and_balloon() {
    let tierd = demo_tierd();
    let ep = tierd.endpoint();
    let (out, stdout, _) = run_tierctl(&ep, &["vms"]);
    assert!(out.status.success());
    assert!(
        stdout.contains("dram(dram, 16.0M) slow(cxl, 16.0M)"),
        "{stdout}"
    );
    let (_, stdout, _) = run_tierctl(&ep, &["vms", "--output", "json"]);
    let vms: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let id = vms[0]["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("demo:"), "{vms}");
    assert_eq!(vms[0]["source"], "demo");

    // `vm` by id and by name.
    for key in [id.as_str(), "demo"] {
        let (out, stdout, err) = run_tierctl(&ep, &["vm", key]);
        assert!(out.status.success(), "{err}");
        let vm: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(vm["id"], id.as_str());
        assert_eq!(vm["tiers"][1]["kind"], "cxl");
    }
    let (out, _, err) = run_tierctl(&ep, &["vm", "nope"]);
    assert!(!out.status.success());
    assert!(
        err.contains("tierd knows no VM with id or name \"nope\""),
        "{err}"
    );

    // Balloons: tierd validates the targets, then refuses honestly.
    let balloon = |tiers: &[&str]| {
        let mut args = vec!["balloon", "set", "demo"];
        for t in tiers {
            args.extend(["--tier", t]);
        }
        run_tierctl(&ep, &args)
    };
    let (out, _, err) = balloon(&["dram=12Q"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("unknown unit \"Q\""), "{err}");
    let (_, _, err) = balloon(&["dram=8M", "slow=2G"]);
    assert!(
        err.contains("balloon slow=2147483648 bytes is larger than the tier (16777216 bytes)"),
        "{err}"
    );
    let (_, _, err) = balloon(&["fast=8M"]);
    assert!(
        err.contains("has no tier \"fast\"; its tiers: dram, slow"),
        "{err}"
    );
    let (_, _, err) = balloon(&["dram=8M", "dram=4M"]);
    assert!(err.contains("tier \"dram\" is given twice"), "{err}");
    // Valid targets: tierd cannot drive this VM's balloon and says so.
    let (out, stdout, err) = balloon(&["dram=8M", "slow=512K"]);
    assert!(!out.status.success() && stdout.is_empty());
    assert!(
        err.contains("tierd refused SetBalloonTargets")
            && err.contains("no per-tier balloon tierd can drive")
            && err.contains("nothing was changed")
            && err.contains(&format!("{id} dram=8.0M slow=512.0K")),
        "{err}"
    );
}

/// This file's trials, named `cli::NAME`.
pub fn trials() -> Vec<Trial> {
    let kvm = kvm_missing();
    let plain = |name: &'static str, f: fn()| {
        Trial::test(name, move || {
            f();
            Ok(())
        })
    };
    let demo = |name: &'static str, f: fn()| {
        let kvm = kvm.clone();
        Trial::ignorable_test(name, move || match kvm {
            Some(reason) => Ok(Completion::ignored_with(reason)),
            None => {
                f();
                Ok(Completion::Completed)
            }
        })
    };
    let tests = vec![
        plain("cli::cli_daemon_not_running", daemon_not_running),
        Trial::ignorable_test(
            "cli::cli_permission_denied_names_the_group",
            permission_denied_names_the_group,
        ),
        plain(
            "cli::cli_protocol_version_mismatch",
            protocol_version_mismatch,
        ),
        plain("cli::cli_completions", completions),
        plain("cli::cli_policy_get_and_set", policy_get_and_set),
        demo(
            "cli::cli_top_json_matches_the_schema_csv_has_a_header",
            top_json_matches_the_schema_csv_has_a_header,
        ),
        demo("cli::cli_vms_vm_and_balloon", vms_vm_and_balloon),
    ];
    tests
}
