//! tierd driven by a generic gRPC client that has never seen tier.proto:
//! grpcurl lists, describes and calls tier.v1 through server reflection,
//! and asks grpc.health.v1, on a real tierd's private unix socket (and the
//! plaintext health-only TCP listener).
//!
//! Custom harness (libtest-mimic): without grpcurl (`cargo xtask deps`
//! installs it) or /dev/kvm for the demo VM, a test is reported as ignored
//! with the reason, never as passed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use libtest_mimic::{Completion, Failed, Trial};
use tier_test_support::Tierd;

/// tierd with `config`, no discovery, no metrics endpoint.
fn start(config: &str, extra: &[&str]) -> Tierd {
    crate::tierd().config(config).args(extra).start()
}

/// grpcurl against the unix socket: `args` then the socket, then `tail`.
fn grpcurl(bin: &Path, socket: &Path, args: &[&str], tail: &[&str]) -> Output {
    let out = Command::new(bin)
        .args(["-plaintext", "-unix"])
        .args(args)
        .arg(socket)
        .args(tail)
        .output()
        .unwrap();
    eprintln!(
        "$ grpcurl -plaintext -unix {} {} {}\n{}{}",
        args.join(" "),
        socket.display(),
        tail.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The health status grpcurl reads for `service` (`SERVING`, ...).
fn health(bin: &Path, socket: &Path, service: &str) -> String {
    let req = format!(r#"{{"service":"{service}"}}"#);
    let o = grpcurl(bin, socket, &["-d", &req], &["grpc.health.v1.Health/Check"]);
    assert!(o.status.success(), "Health/Check failed");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["status"].as_str().unwrap_or_default().to_string()
}

fn lists_describes_and_calls_tier_v1_through_reflection(bin: &Path) {
    // A 2 s interval leaves time to see NOT_SERVING before the first one.
    let tierd = start(
        "",
        &[
            "--demo-vm",
            "--interval-ms",
            "2000",
            "--cpu-budget-pct",
            "0",
        ],
    );
    let sock = tierd.socket();
    for svc in ["", "tier.v1.TierService"] {
        assert_eq!(
            health(bin, sock, svc),
            "NOT_SERVING",
            "{svc:?} before the first interval\n{}",
            tierd.log()
        );
    }

    let list = grpcurl(bin, sock, &[], &["list"]);
    assert!(list.status.success());
    let services: Vec<String> = stdout(&list).lines().map(str::to_string).collect();
    for want in [
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "tier.v1.TierService",
    ] {
        assert!(services.iter().any(|s| s == want), "{want} in {services:?}");
    }

    let describe = grpcurl(bin, sock, &[], &["describe", "tier.v1.TierService"]);
    assert!(describe.status.success());
    let text = stdout(&describe);
    for rpc in [
        "rpc GetInfo",
        "rpc WatchStats",
        "stream .tier.v1.StatsUpdate",
    ] {
        assert!(text.contains(rpc), "{rpc} in:\n{text}");
    }
    // Source info travels too: the comments of tier.proto.
    let msg = grpcurl(bin, sock, &[], &["describe", "tier.v1.StatsUpdate"]);
    assert!(stdout(&msg).contains("Increases by exactly one per interval"));

    let info = grpcurl(bin, sock, &["-d", "{}"], &["tier.v1.TierService/GetInfo"]);
    assert!(info.status.success());
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(info["protocolVersion"], tier_proto::PROTOCOL_VERSION);
    assert_eq!(info["intervalNs"], "2000000000", "{info}");
    assert_eq!(info["daemonVersion"], env!("CARGO_PKG_VERSION"));

    // tier.v1 is SERVING only with a sampler; `auto` picks hostpte here
    // when it works (capabilities say which, if any, was selected).
    let sampler = info["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["selected"] == true);
    tierd.wait_until(
        "\"\" SERVING after the first interval",
        Duration::from_secs(15),
        || (health(bin, sock, "") == "SERVING").then_some(()),
    );
    let want = if sampler { "SERVING" } else { "NOT_SERVING" };
    assert_eq!(
        health(bin, sock, "tier.v1.TierService"),
        want,
        "sampler selected: {sampler}\n{}",
        tierd.log()
    );

    // The stream never ends by itself: -max-time cuts it after 5 s, which
    // grpcurl reports as DeadlineExceeded (a failure status).
    let watch = grpcurl(
        bin,
        sock,
        &["-max-time", "5", "-d", "{}"],
        &["tier.v1.TierService/WatchStats"],
    );
    let text = stdout(&watch);
    let updates: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&text)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert!(
        updates.len() >= 2,
        "{} updates in 5 s:\n{text}",
        updates.len()
    );
    let seq = |u: &serde_json::Value| u["sequence"].as_str().unwrap().parse::<u64>().unwrap();
    assert!(updates.windows(2).all(|w| seq(&w[1]) > seq(&w[0])));
    assert_eq!(updates[0]["vms"][0]["source"], "VM_SOURCE_DEMO");
    assert!(
        String::from_utf8_lossy(&watch.stderr).contains("DeadlineExceeded"),
        "ended by -max-time"
    );
}

fn without_a_sampler_tier_v1_is_not_serving_also_over_plain_tcp(bin: &Path) {
    let tierd = start(
        "[health]\nlisten = \"127.0.0.1:0\"\n",
        &["--backend", "none", "--interval-ms", "200"],
    );
    let sock = tierd.socket();
    let addr = tierd.bound("grpc.health.v1 alone");
    // An interval has been published: a stream's first message.
    let watch = grpcurl(
        bin,
        sock,
        &["-max-time", "1", "-d", "{}"],
        &["tier.v1.TierService/WatchStats"],
    );
    assert!(stdout(&watch).contains("\"sequence\""));
    assert_eq!(health(bin, sock, "tier.v1.TierService"), "NOT_SERVING");
    // The server itself runs and publishes: what a liveness probe asks.
    tierd.wait_until("\"\" SERVING", Duration::from_secs(5), || {
        (health(bin, sock, "") == "SERVING").then_some(())
    });

    // No reflection there: grpcurl gets the health service's descriptors
    // from a file, as the kubelet knows them built in.
    let protoset = tierd.dir().join("health.protoset");
    std::fs::write(&protoset, tonic_health::pb::FILE_DESCRIPTOR_SET).unwrap();
    let tcp = |tail: &[&str]| {
        Command::new(bin)
            .arg("-plaintext")
            .args(tail)
            .output()
            .unwrap()
    };
    let addr = addr.to_string();
    let check = tcp(&[
        "-protoset",
        protoset.to_str().unwrap(),
        "-d",
        r#"{"service":"tier.v1.TierService"}"#,
        &addr,
        "grpc.health.v1.Health/Check",
    ]);
    assert!(check.status.success(), "{check:?}");
    assert!(stdout(&check).contains("NOT_SERVING"), "{check:?}");
    // Health alone there: neither tier.v1 nor reflection.
    let list = tcp(&[&addr, "list"]);
    assert!(!list.status.success(), "{list:?}");
}

/// This file's trials, named `grpcurl::NAME`.
pub fn trials() -> Vec<Trial> {
    let grpcurl = tier_test_support::grpcurl();
    let kvm = tier_test_support::kvm_missing();
    let trial = |name: &'static str, needs_kvm: bool, f: fn(&Path)| {
        let ready = match (&grpcurl, &kvm) {
            (Err(why), _) => Err(why.clone()),
            (Ok(_), Some(why)) if needs_kvm => Err(why.clone()),
            (Ok(bin), _) => Ok(bin.clone()),
        };
        Trial::ignorable_test(name, move || -> Result<Completion, Failed> {
            match &ready {
                Err(reason) => Ok(Completion::ignored_with(reason.clone())),
                Ok(bin) => {
                    f(bin);
                    Ok(Completion::Completed)
                }
            }
        })
    };
    let tests = vec![
        trial(
            "grpcurl::lists_describes_and_calls_tier_v1_through_reflection",
            true,
            lists_describes_and_calls_tier_v1_through_reflection,
        ),
        trial(
            "grpcurl::without_a_sampler_tier_v1_is_not_serving_also_over_plain_tcp",
            false,
            without_a_sampler_tier_v1_is_not_serving_also_over_plain_tcp,
        ),
    ];
    tests
}
