//! tierd's metrics, rules and dashboard checked by the real Prometheus
//! tools (Debian's `prometheus` package, installed by `cargo xtask deps`):
//! `promtool check metrics` on a live `/metrics`, `promtool check rules` and
//! `test rules`, and a Prometheus server on loopback that scrapes a tierd
//! running the demo VM, evaluates the rules, and answers PromQL with the
//! same numbers tierd's gRPC stream carries.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tier_proto::v1::StatsUpdate;
use tier_test_support::{Check, ChildGuard, http_get, try_wait_until, wait_until};
use tokio_stream::StreamExt;

fn deploy(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(rel)
}

/// A tool of the prometheus package; fails (not skips) without it: the
/// package is one of the project's dependencies.
fn tool(name: &str) -> Command {
    tier_test_support::tool(name, "Debian's prometheus package")
}

fn run_ok(mut c: Command) -> String {
    let out = c.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{c:?}: {}\n{text}", out.status);
    text
}

#[test]
fn promtool_checks_the_rules_and_runs_their_unit_tests() {
    let mut check = tool("promtool");
    check
        .args(["check", "rules", "--lint=all"])
        .arg(deploy("prometheus/tierd.rules.yml"));
    let out = run_ok(check);
    assert!(out.contains("SUCCESS"), "{out}");
    let mut test = tool("promtool");
    test.args(["test", "rules"])
        .arg(deploy("prometheus/tierd.rules.test.yml"));
    let out = run_ok(test);
    assert!(out.contains("SUCCESS"), "{out}");
}

/// A child process ended by PID when dropped, with its output in `log`.
struct Proc {
    _child: ChildGuard,
    log: PathBuf,
}

impl Proc {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// [`wait_until`] with the process's log in the panic message.
    fn wait_until<T, C: Check<T>>(&self, what: &str, timeout: Duration, f: impl FnMut() -> C) -> T {
        try_wait_until(what, timeout, f).unwrap_or_else(|e| panic!("{e}\nits log:\n{}", self.log()))
    }
}

fn spawn(mut c: Command, log: PathBuf) -> Proc {
    let child = tier_test_support::spawn_logged(&mut c, &log);
    Proc { _child: child, log }
}

fn urlencode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A PromQL query through the HTTP API: the parsed answer (status and all).
fn query(prom: SocketAddr, q: &str) -> serde_json::Value {
    let (head, body) = http_get(prom, &format!("/api/v1/query?query={}", urlencode(q)), None);
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{q}: {e}: {head}\n{body}"))
}

/// (labels, value) of each sample of an instant vector.
fn samples(v: &serde_json::Value) -> Vec<(serde_json::Value, f64)> {
    v["data"]["result"]
        .as_array()
        .map(|r| {
            r.iter()
                .map(|s| {
                    let value = s["value"][1].as_str().unwrap().parse().unwrap();
                    (s["metric"].clone(), value)
                })
                .collect()
        })
        .unwrap_or_default()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Every PromQL expression of the dashboard with its template variables
/// filled as Grafana would for "All".
fn dashboard_exprs() -> Vec<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(o) => {
                for (k, v) in o {
                    match (k.as_str(), v) {
                        ("expr", serde_json::Value::String(s)) => out.push(s.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let text = std::fs::read_to_string(deploy("grafana/tierd.json")).unwrap();
    let mut out = Vec::new();
    walk(&serde_json::from_str(&text).unwrap(), &mut out);
    out.iter()
        .map(|e| {
            e.replace("$instance", ".*")
                .replace("$vm", ".*")
                .replace("$__rate_interval", "1m")
        })
        .collect()
}

/// Collects the stream's updates until the channel's receiver is dropped.
fn watch(socket: PathBuf) -> std::sync::mpsc::Receiver<StatsUpdate> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let (_client, mut stream) = tier_test_support::open_watch_stats(&socket).await;
            while let Some(Ok(u)) = stream.next().await {
                if tx.send(u).is_err() {
                    return;
                }
            }
        });
    });
    rx
}

#[test]
#[cfg_attr(not(has_kvm), ignore = "needs a usable /dev/kvm for the demo VM")]
fn a_real_prometheus_scrapes_tierd_and_agrees_with_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let tierd = crate::tierd()
        .dir(dir.path())
        .metrics("127.0.0.1:0")
        .args(["--demo-vm", "--interval-ms", "500"])
        // Every interval sampled, so the stream and the scrapes agree (the
        // budget would leave the ratio absent in most intervals).
        .args(["--cpu-budget-pct", "0"])
        .start_within(Duration::from_secs(20));
    let metrics = tierd.metrics_addr();
    let updates = watch(tierd.socket().to_path_buf());

    // promtool lints a live scrape in the classic text format, once the
    // VM's series are there.
    let text = tierd.wait_until(
        "the hot-set share on /metrics",
        Duration::from_secs(20),
        || {
            let (head, body) = http_get(metrics, "/metrics", None);
            // The demo guest's ratio is not measured by accessed bits (0-100 %
            // interval): its hot set's share in DRAM is the VM's series.
            if !body.contains("tierd_vm_hot_set_dram_ratio{") {
                return Err(body);
            }
            assert!(head.contains("text/plain; version=0.0.4"), "{head}");
            Ok(body)
        },
    );
    let file = dir.path().join("scrape.txt");
    std::fs::write(&file, &text).unwrap();
    let mut check = tool("promtool");
    check
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&file).unwrap());
    let lint = run_ok(check);
    assert!(lint.trim().is_empty(), "promtool lint: {lint}");

    // A Prometheus server scraping it every second, with tierd's rules.
    let prom: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: tierd\n    static_configs:\n      - targets: ['{metrics}']\n",
            deploy("prometheus/tierd.rules.yml").display()
        ),
    )
    .unwrap();
    let mut c = tool("prometheus");
    c.arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("tsdb").display()
        ))
        .arg(format!("--web.listen-address={prom}"));
    let server = spawn(c, dir.path().join("prometheus.log"));
    // The port opens before the TSDB is up (queries get 503 until then).
    server.wait_until("Prometheus to be ready", Duration::from_secs(60), || {
        (std::net::TcpStream::connect(prom).is_ok()
            && http_get(prom, "/-/ready", None).0.contains(" 200 "))
        .then_some(())
    });

    // The VM's hot-set share and DRAM bytes, once scraped.
    let (ratio, dram) = server.wait_until(
        "tierd's series in Prometheus",
        Duration::from_secs(60),
        || {
            let r = samples(&query(prom, "tierd_vm_hot_set_dram_ratio{job=\"tierd\"}"));
            let b = samples(&query(
                prom,
                "tierd_tier_resident_bytes{job=\"tierd\",tier=\"dram\"}",
            ));
            match (r.first(), b.first()) {
                (Some(r), Some(b)) => Some((r.clone(), b.1)),
                _ => None,
            }
        },
    );
    assert_eq!(ratio.0["name"], "demo", "{ratio:?}");
    // The same numbers are in some update of the stream (the scrape and the
    // stream see the same intervals; which one Prometheus holds is its
    // timing).
    // tierd updates its metrics just before it publishes the interval, so
    // the stream may deliver the scraped interval a moment later.
    let mut seen: Vec<StatsUpdate> = Vec::new();
    wait_until(
        "Prometheus's numbers in the stream",
        Duration::from_secs(10),
        || {
            seen.extend(updates.try_iter());
            let ratios: Vec<f64> = seen
                .iter()
                .flat_map(|u| u.stats.iter())
                .filter_map(|s| s.hot_set_dram.as_ref().map(|h| h.share))
                .collect();
            let bytes: Vec<u64> = seen
                .iter()
                .flat_map(|u| u.stats.iter())
                .flat_map(|s| s.tiers.iter().filter(|t| t.tier == "dram"))
                .map(|t| t.resident_bytes)
                .collect();
            let ratio_seen = ratios.iter().any(|r| (r - ratio.1).abs() < 1e-9);
            let bytes_seen = bytes.iter().any(|b| *b as f64 == dram);
            if ratio_seen && bytes_seen {
                return Ok(());
            }
            Err(format!(
                "hot-set share {} / dram bytes {dram} not in the stream: shares {ratios:?}, bytes {bytes:?}",
                ratio.1
            ))
        },
    );

    // The rules evaluate without errors on real series, and the recording
    // rules produce what the dashboard reads.
    wait_until("the rules evaluated", Duration::from_secs(30), || {
        let (_, body) = http_get(prom, "/api/v1/rules", None);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let rules: Vec<&serde_json::Value> = v["data"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap())
            .collect();
        assert!(rules.len() >= 10, "{body}");
        for r in &rules {
            assert_ne!(r["health"], "err", "rule failed: {r}");
        }
        // The ratio is not measured here, so its width rule has no input.
        let width = samples(&query(prom, "vm:tierd_dram_hit_interval_width:ratio"));
        assert!(
            width.is_empty(),
            "a width of a ratio not measured: {width:?}"
        );
        if rules.iter().all(|r| r["health"] == "ok") {
            Ok(())
        } else {
            Err(body.clone())
        }
    });

    // Every dashboard query is valid PromQL for this server, and those about
    // the VM's ratio find it.
    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 20);
    for e in &exprs {
        let v = query(prom, e);
        assert_eq!(v["status"], "success", "dashboard query {e}: {v}");
    }
    let point = exprs
        .iter()
        .find(|e| e.starts_with("tierd_vm_hot_set_dram_ratio{"))
        .unwrap();
    assert!(!samples(&query(prom, point)).is_empty(), "{point}");
    drop(server);
    drop(tierd);
}
