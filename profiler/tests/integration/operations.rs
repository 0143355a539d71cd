//! What an operator touches: config errors (exit 2, key named), socket mode
//! and group, the Prometheus endpoint, gRPC over TCP with TLS.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tier_proto::v1::GetInfoRequest;
use tier_proto::v1::tier_service_client::TierServiceClient;
use tier_test_support::{Tierd, TierdBuilder};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

/// `tierd run` as an operator starts it: the config file and flags
/// decide everything, discovery and the metrics endpoint included.
fn tierd() -> TierdBuilder {
    crate::tierd().metrics_from_config().discover()
}

/// Runs `tierd run` with a config file and flags; returns (status, stderr).
fn run_with(config: &str, flags: &[&str]) -> (Option<i32>, String) {
    let out = tierd().config(config).args(flags).output();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_configs_exit_2_and_name_the_key() {
    let cases: &[(&str, &[&str], &str)] = &[
        ("interval_ms = 5", &[], "interval_ms"),
        ("interval_ms = \"soon\"", &[], "interval_ms"),
        ("intervall_ms = 100", &[], "intervall_ms"),
        ("socket_mode = \"0999\"", &[], "socket_mode"),
        ("socket_group = \"no-such-group-xyz\"", &[], "socket_group"),
        ("backend = \"psychic\"", &[], "backend"),
        ("[tier_kinds]\nslow = \"warp\"", &[], "tier_kinds.slow"),
        (
            "[metrics]\nlisten = \"0.0.0.0:9464\"",
            &[],
            "metrics.listen",
        ),
        ("[tcp]\nlisten = \"127.0.0.1:0\"", &[], "tcp.cert"),
        ("log_format = \"xml\"", &[], "log_format"),
        // A flag is checked like the key it overrides.
        ("", &["--interval-ms", "1"], "interval_ms"),
        ("", &["--tier-kind", "slow=fast"], "tier_kinds.slow"),
    ];
    for (config, flags, key) in cases {
        let (code, err) = run_with(config, flags);
        assert_eq!(code, Some(2), "{config:?} {flags:?}: {err}");
        assert!(
            err.contains(key),
            "{config:?}: message does not name {key}: {err}"
        );
    }
    let out = tierd().config_file("/nonexistent/tierd.toml").output();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/tierd.toml"));
}

/// tierd with `config` and `flags`, no discovery.
fn start(config: &str, flags: &[&str]) -> Tierd {
    tierd()
        .config(config)
        .arg("--no-discover")
        .args(flags)
        .start()
}

#[test]
fn socket_gets_the_configured_mode_and_group() {
    let gid = tier_profiler::config::group_id("daemon").expect("Debian has a daemon group");
    let d = start(
        "socket_mode = \"0640\"\nsocket_group = \"daemon\"\n[metrics]\nlisten = \"\"",
        &[],
    );
    let meta = std::fs::metadata(d.socket()).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o640);
    assert_eq!(meta.gid(), gid);
}

/// The whole answer (status line, headers, body) to an HTTP/1.1 GET.
fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    let (head, body) = tier_test_support::http_get_with(addr, "HTTP/1.1", path, None);
    format!("{head}\r\n\r\n{body}")
}

#[test]
#[cfg_attr(not(has_kvm), ignore = "needs a usable /dev/kvm for the demo VM")]
fn metrics_show_the_demo_vm_per_tier() {
    let d = start(
        "",
        &[
            "--demo-vm",
            "--interval-ms",
            "200",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    let addr = d.bound("metrics on");
    assert!(addr.ip().is_loopback());
    // Wait for a sampled interval (the first one only arms).
    let body = d.wait_until(
        "a sampled interval in /metrics",
        Duration::from_secs(10),
        || {
            let body = http_get(addr, "/metrics");
            body.contains("tierd_vm_hot_set_dram_ratio{")
                .then_some(body)
        },
    );
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    // No Accept header: the classic text format (Prometheus itself asks
    // for OpenMetrics, prometheus.rs here).
    assert!(body.contains("text/plain; version=0.0.4"), "{body}");
    let pid = d.pid();
    for want in [
        format!("tierd_tier_young_pages{{vm=\"demo:{pid}\",tier=\"dram\",kind=\"dram\"}} 50"),
        format!("tierd_tier_young_pages{{vm=\"demo:{pid}\",tier=\"slow\",kind=\"cxl\"}} 96"),
        // The demo guest touches every page faster than a pass resolves:
        // accessed bits measure its hot set's share in DRAM, not its ratio.
        format!("tierd_vm_hot_set_dram_ratio{{vm=\"demo:{pid}\",name=\"demo\"}}"),
        format!("tierd_vm_dram_hit_measured{{vm=\"demo:{pid}\",name=\"demo\"}} 0"),
        "tierd_sampler_active{backend=\"hostpte\"} 1".to_string(),
        "tierd_vms 1".to_string(),
    ] {
        assert!(body.contains(&want), "missing {want:?} in\n{body}");
    }
    // The demo guest touches each of its pages every round, far faster
    // than a pass: the estimate says it cannot count those touches.
    for tier in ["tier=\"dram\",kind=\"dram\"", "tier=\"slow\",kind=\"cxl\""] {
        let key = format!("tierd_tier_rate_saturation_ratio{{vm=\"demo:{pid}\",{tier}}} ");
        let v: f64 = body
            .lines()
            .find_map(|l| l.strip_prefix(&key))
            .unwrap_or_else(|| panic!("missing {key:?} in\n{body}"))
            .trim()
            .parse()
            .unwrap();
        assert!(v > 0.9, "{key}{v}");
    }
    assert!(http_get(addr, "/nope").starts_with("HTTP/1.1 404"));
}

fn write_pem(dir: &Path, name: &str, pem: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, pem).unwrap();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_tcp_requires_tls_with_a_trusted_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let cert_path = write_pem(dir.path(), "cert.pem", &leaf.pem());
    let key_path = write_pem(dir.path(), "key.pem", &key.serialize_pem());
    let config = format!(
        "[metrics]\nlisten = \"\"\n[tcp]\nlisten = \"127.0.0.1:0\"\ncert = \"{}\"\nkey = \"{}\"\n",
        cert_path.display(),
        key_path.display()
    );
    let d = start(&config, &[]);
    let addr = d.bound("over TLS");

    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.pem()))
        .domain_name("localhost");
    let channel = Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let info = TierServiceClient::new(channel)
        .get_info(GetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.protocol_version, tier_proto::PROTOCOL_VERSION);

    // Plain HTTP/2 is refused.
    let plain = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await;
    let refused = match plain {
        Err(_) => true,
        Ok(ch) => TierServiceClient::new(ch)
            .get_info(GetInfoRequest {})
            .await
            .is_err(),
    };
    assert!(refused, "plaintext gRPC must not work on the TLS port");
}
