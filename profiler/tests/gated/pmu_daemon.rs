//! The pmu source inside tierd, as a real process on a temporary socket.
//!
//! - With a test event table that maps *software* events to tiers in place
//!   of the hardware memory-source events (this machine has no hardware
//!   PMU): tierd discovers a VMM-like process (`tier-demo-vm`, a real KVM
//!   guest whose vCPU thread is *not* named vcpuN, so it is found through
//!   the KVM_RUN watch) and streams per-tier PMU counts for it.
//! - With the real (built-in) table on a host where none of its events
//!   opens: tierd logs the PMU as unavailable and keeps serving hostpte
//!   stats.
//!
//! Custom harness (libtest-mimic): a missing capability (root, /dev/kvm, a
//! host without a PMU for the second test) is reported as ignored with the
//! reason.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use libtest_mimic::Trial;
use tier_profiler::sampler::pmu::events::{CpuId, EventTable};
use tier_profiler::sampler::pmu::events_status;
use tier_proto::v1::*;
use tier_test_support::Tierd;
use tokio_stream::StreamExt;

/// `period` of the two software events: for sampling only, which the
/// daemon does not do (it counts); kept to show it is ignored.
const TASK_CLOCK_PERIOD: u64 = 1_000_000;
const CPU_CLOCK_PERIOD: u64 = 2_000_000;

/// tierd with `config`, discovery as the test asks, in `dir`.
fn start(dir: &Path, config: &str, extra: &[&str]) -> Tierd {
    crate::tierd_in(dir, config)
        .args(["--no-controller", "--interval-ms", "250"])
        .args(extra)
        .start()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The test table: two software events standing in for memory-source
/// events, selected for this CPU like real entries. task-clock counts in
/// `dram`, cpu-clock in `cxl`; both count the ns the vCPU thread ran, so
/// their counts must agree.
fn software_table(cpu: &CpuId) -> String {
    let head = format!(
        "vendor = {:?}\nfamily = {}\nmodels = [{}]\ntype = \"software\"\n",
        cpu.vendor, cpu.family, cpu.model
    );
    format!(
        "[[event]]\nname = \"sw.task_clock\"\n{head}config = 1\nperiod = {TASK_CLOCK_PERIOD}\ntier = \"dram\"\nsource = \"PERF_COUNT_SW_TASK_CLOCK (test stand-in for a DRAM event)\"\n\n\
         [[event]]\nname = \"sw.cpu_clock\"\n{head}config = 0\nperiod = {CPU_CLOCK_PERIOD}\ntier = \"cxl\"\nsource = \"PERF_COUNT_SW_CPU_CLOCK (test stand-in for a CXL event)\"\n"
    )
}

fn pmu_source(t: &TierSample) -> Option<&SourceCount> {
    t.sources.iter().find(|s| s.source() == Backend::Pmu)
}

fn tierd_counts_per_tier_pmu_events_using_software_events_in_place_of_hardware_ones() {
    let dir = tempfile::tempdir().unwrap();
    let cpu = CpuId::current().unwrap();
    let table = dir.path().join("software-events.toml");
    std::fs::write(&table, software_table(&cpu)).unwrap();

    // The VMM-like process: a real KVM guest, vCPU thread "guest-cpu".
    let (vm, ready) = tier_test_support::spawn_ready_line(
        Command::new(env!("CARGO_BIN_EXE_tier-demo-vm")).args(["--vcpu-thread-name", "guest-cpu"]),
    );
    assert!(ready.starts_with("ready"), "{ready:?}");
    let pid = vm.id();

    let tierd = start(
        dir.path(),
        &format!("pmu = \"on\"\npmu_events = [\"{}\"]\n", table.display()),
        &["--tier-kind", "slow=cxl"],
    );
    let rt = runtime();
    rt.block_on(async {
        let mut client = tier_test_support::stream::client(tierd.socket()).await;
        let info = client.get_info(GetInfoRequest {}).await.unwrap().into_inner();
        let pmu = info.capabilities.iter().find(|c| c.name == "pmu").unwrap();
        println!("  capability pmu: available {}, selected {}, {}", pmu.available, pmu.selected, pmu.reason);
        assert!(pmu.selected, "the pmu source runs: {pmu:?}");

        let mut stream = tier_test_support::watch_stats(&mut client).await;
        let prefix = format!("kvm:{pid}:");
        let mut vms: Vec<Vm> = Vec::new();
        let mut counted = 0;
        tierd.within(&format!("PMU counts for {prefix}*"), Duration::from_secs(60), async {
        while counted < 3 {
            let u = stream.next().await.unwrap().unwrap();
            if !u.vms_unchanged {
                vms = u.vms.clone();
            }
            let health = u.health.iter().find(|h| h.backend() == Backend::Pmu);
            assert!(health.is_some_and(|h| h.active), "{:?}", u.health);
            let Some(v) = vms.iter().find(|v| v.id.starts_with(&prefix)) else {
                continue;
            };
            let kinds: Vec<TierKind> = v.tiers.iter().map(|t| t.kind()).collect();
            assert_eq!(kinds, [TierKind::Dram, TierKind::Cxl]);
            let Some(s) = u.stats.iter().find(|s| s.vm_id == v.id) else {
                continue;
            };
            let (Some(dram), Some(cxl)) = (pmu_source(&s.tiers[0]), pmu_source(&s.tiers[1])) else {
                continue;
            };
            println!(
                "  update {}: dram {} events (raw {}, running {:.3}), cxl {} events (raw {}, running {:.3}); hostpte young {:?}",
                u.sequence,
                dram.events,
                dram.raw_events,
                dram.running_ratio,
                cxl.events,
                cxl.raw_events,
                cxl.running_ratio,
                s.tiers.iter().map(|t| t.young_pages).collect::<Vec<_>>()
            );
            // Counted, not sampled: no overflows; software counters are
            // never multiplexed, so nothing is scaled.
            // The interval the counters were opened in is not measured
            // (it covers part of an interval), never a 0.
            if !dram.not_measured.is_empty() || !cxl.not_measured.is_empty() {
                for c in [dram, cxl] {
                    assert!(c.not_measured.contains("opened in this interval") && c.events == 0, "{c:?}");
                }
                continue;
            }
            for c in [dram, cxl] {
                assert!(c.samples == 0, "{c:?}");
                assert_eq!(c.events, c.raw_events, "{c:?}");
                assert!(c.raw_events == 0 || c.running_ratio == 1.0, "{c:?}");
                // One vCPU thread cannot run longer than the span read.
                assert!(c.seconds > 0.0, "{c:?}");
                assert!((c.events as f64) <= c.seconds * 1.02e9 + 5e6, "{c:?}");
            }
            if dram.events > 1_000_000 && cxl.events > 1_000_000 {
                // Both clocks count the same thread's run time, read a
                // moment apart.
                let (a, b) = (dram.events as f64, cxl.events as f64);
                assert!((a - b).abs() <= 0.05 * a.max(b) + 2e6, "task-clock {a} vs cpu-clock {b}");
                counted += 1;
            }
        }
        })
        .await;
    });
    let log = tierd.log();
    assert!(log.contains("pmu source running"), "{log}");
    assert!(
        log.lines()
            .any(|l| l.contains("pmu: counting on vCPU threads")
                && l.contains(&format!("kvm:{pid}:"))
                && l.contains("found=KvmRun")),
        "the vCPU thread was found through the KVM_RUN watch:\n{log}"
    );
    // Built-in events for this CPU that do not open are named in the log.
    let builtin = EventTable::builtin().unwrap();
    for e in builtin.select(&cpu, false) {
        let opens = events_status(&cpu, &builtin, false)
            .iter()
            .any(|(label, r)| label.starts_with(&e.name) && r.is_ok());
        if !opens {
            assert!(
                log.lines()
                    .any(|l| l.contains("WARN") && l.contains(&format!("event {}", e.name))),
                "{} not reported:\n{log}",
                e.name
            );
        }
    }
    drop(vm);
}

fn tierd_with_the_real_event_table_logs_the_pmu_unavailable_and_keeps_serving_hostpte() {
    let dir = tempfile::tempdir().unwrap();
    let tierd = start(
        dir.path(),
        "pmu = \"on\"\n",
        &["--demo-vm", "--no-discover"],
    );
    let rt = runtime();
    let reason = rt.block_on(async {
        let mut client = tier_test_support::stream::client(tierd.socket()).await;
        let info = client
            .get_info(GetInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        let pmu = info.capabilities.iter().find(|c| c.name == "pmu").unwrap();
        assert!(
            !pmu.available && !pmu.selected && !pmu.reason.is_empty(),
            "{pmu:?}"
        );
        let mut stream = tier_test_support::watch_stats(&mut client).await;
        let mut sampled = 0;
        let mut reason = String::new();
        tierd
            .within("hostpte stats", Duration::from_secs(60), async {
                while sampled < 2 {
                    let u = stream.next().await.unwrap().unwrap();
                    let pmu = u
                        .health
                        .iter()
                        .find(|h| h.backend() == Backend::Pmu)
                        .unwrap();
                    assert!(!pmu.active && !pmu.error.is_empty(), "{pmu:?}");
                    reason = pmu.error.clone();
                    let Some(s) = u.stats.iter().find(|s| s.vm_id.starts_with("demo")) else {
                        continue;
                    };
                    assert!(s.tiers.iter().all(|t| t.sources.is_empty()), "{s:?}");
                    if s.tiers
                        .iter()
                        .all(|t| t.source() == Backend::Hostpte && t.young_pages > 0)
                    {
                        sampled += 1;
                    }
                }
            })
            .await;
        reason
    });
    println!("  pmu health: {reason}");
    let log = tierd.log();
    let line = log
        .lines()
        .find(|l| l.contains("pmu source unavailable"))
        .unwrap_or_else(|| panic!("no pmu line in\n{log}"));
    println!("  log: {line}");
    assert!(line.contains("ERROR") && line.contains(&reason), "{line}");
}

/// A user table asking for precise data_src samples of a guest-only event:
/// tierd refuses to start, naming the file, the entry and why.
fn tierd_refuses_a_guest_only_data_src_table_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("precise.toml");
    std::fs::write(
        &table,
        "[[event]]\nname = \"MEM_TRANS_RETIRED.LOAD_LATENCY_GT_64\"\nvendor = \"GenuineIntel\"\nfamily = 6\nmodels = [0x8F]\nconfig = 0x01CD\nconfig1 = 64\ndata_src = true\nsource = \"user table\"\n",
    )
    .unwrap();
    let out = crate::tierd_in(
        dir.path(),
        &format!("pmu = \"on\"\npmu_events = [\"{}\"]\n", table.display()),
    )
    .arg("--no-controller")
    .output();
    let err = String::from_utf8_lossy(&out.stderr);
    println!("  exit {}; stderr: {}", out.status, err.trim());
    assert_eq!(out.status.code(), Some(2), "tierd must not start: {err}");
    assert!(
        err.contains(&format!(
            "{}: event #0 (\"MEM_TRANS_RETIRED.LOAD_LATENCY_GT_64\")",
            table.display()
        )) && err.contains("data_src = true asks for precise"),
        "{err}"
    );
    assert!(
        !dir.path().join("tierd.sock").exists(),
        "no socket was made"
    );
}

/// This file's trials, named `pmu_daemon::NAME`.
pub fn trials() -> Vec<Trial> {
    // SAFETY: geteuid has no arguments and cannot fail.
    let root = if unsafe { libc::geteuid() } == 0 {
        Ok(())
    } else {
        Err("needs root (BPF, perf_event_open on another process)".to_string())
    };
    let kvm = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map(drop)
        .map_err(|e| format!("needs a usable /dev/kvm for the demo VM: {e}"));
    // The second test is about a host where the built-in events do not open.
    let no_pmu = match CpuId::current() {
        Ok(cpu) => {
            let table = EventTable::builtin().unwrap();
            match events_status(&cpu, &table, false)
                .into_iter()
                .find(|(_, r)| r.is_ok())
            {
                Some((event, _)) => Err(format!(
                    "{event} opens here: this host has a PMU, the test is for one without"
                )),
                None => Ok(()),
            }
        }
        Err(e) => Err(format!("cpu model: {e}")),
    };
    let trial = tier_test_support::gated;
    let tests = vec![
        trial(
            "pmu_daemon::tierd_refuses_a_guest_only_data_src_table_at_start",
            vec![],
            tierd_refuses_a_guest_only_data_src_table_at_start,
        ),
        trial(
            "pmu_daemon::tierd_counts_per_tier_pmu_events_using_software_events_in_place_of_hardware_ones",
            vec![root.clone(), kvm.clone()],
            tierd_counts_per_tier_pmu_events_using_software_events_in_place_of_hardware_ones,
        ),
        trial(
            "pmu_daemon::tierd_with_the_real_event_table_logs_the_pmu_unavailable_and_keeps_serving_hostpte",
            vec![kvm, no_pmu],
            tierd_with_the_real_event_table_logs_the_pmu_unavailable_and_keeps_serving_hostpte,
        ),
    ];
    tests
}
