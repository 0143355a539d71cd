//! The cloud-hypervisor client against the real patched binary: a VM with
//! two 256 MiB zones (dram, slow) and `--balloon size=0,tiers=on,stats=on`,
//! booted from a PVH ELF (no balloon driver: targets move, actuals stay 0).
//!
//! Custom harness (libtest-mimic): runs only when `TIERD_CH_BIN` names the
//! patched cloud-hypervisor and `TIERD_CH_KERNEL` a PVH guest
//! (e.g. /work/pvh/tiny.elf), with /dev/kvm; otherwise reported as ignored
//! with the reason, never as passed. CI has no such binary.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use tier_controller::actuate::{ActuateError, BALLOON_DEVICE, ChApi, Vmm};

const MIB: u64 = 1 << 20;

fn capability() -> Result<(PathBuf, PathBuf), String> {
    let bin = tier_test_support::ch_kvm()?;
    let kernel = std::env::var_os("TIERD_CH_KERNEL")
        .map(PathBuf::from)
        .ok_or("TIERD_CH_KERNEL is not set (a PVH guest ELF, e.g. /work/pvh/tiny.elf)")?;
    if !kernel.is_file() {
        return Err(format!(
            "TIERD_CH_KERNEL={} is not a file",
            kernel.display()
        ));
    }
    Ok((bin, kernel))
}

async fn live(bin: PathBuf, kernel: PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ch.sock");
    let serial = dir.path().join("serial.log");
    let mut child = tokio::process::Command::new(&bin)
        .arg("--api-socket")
        .arg(format!("path={}", socket.display()))
        .arg("--kernel")
        .arg(&kernel)
        .args(["--cpus", "boot=1", "--memory", "size=0"])
        .args(["--memory-zone", "id=dram,size=256M"])
        .args(["--memory-zone", "id=slow,size=256M"])
        .args(["--numa", "guest_numa_id=0,memory_zones=dram"])
        .args(["--numa", "guest_numa_id=1,memory_zones=slow"])
        .args(["--balloon", "size=0,tiers=on,stats=on"])
        .arg("--serial")
        .arg(format!("file={}", serial.display()))
        .args(["--console", "off"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let api = ChApi::new(&socket).with_timeout(Duration::from_secs(5));

    // Up when it answers and the VM is running.
    let start = Instant::now();
    let ping = loop {
        match api.ping().await {
            Ok(p) => break p,
            Err(e) if start.elapsed() > Duration::from_secs(20) => panic!("VMM never came up: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    eprintln!(
        "vmm.ping: version {} build {}",
        ping.version, ping.build_version
    );
    let state = loop {
        match api.tier_state().await {
            Ok(s) => break s,
            // The API answers before the VM is created from the command line (404).
            Err(ActuateError::NotTiered { .. } | ActuateError::Rejected { status: 404, .. })
                if start.elapsed() < Duration::from_secs(20) =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("vm.info: {e}"),
        }
    };
    eprintln!("tier_state at boot: {state:?}");
    assert_eq!(
        state
            .iter()
            .map(|t| (t.zone.as_str(), t.target))
            .collect::<Vec<_>>(),
        vec![("dram", 0), ("slow", 0)]
    );

    let targets = vec![
        ("dram".to_string(), 64 * MIB),
        ("slow".to_string(), 128 * MIB),
    ];
    api.set_tier_targets(&targets).await.unwrap();
    let state = api.tier_state().await.unwrap();
    eprintln!("tier_state after set_tier_targets(dram 64M, slow 128M): {state:?}");
    assert_eq!(
        state
            .iter()
            .map(|t| (t.zone.as_str(), t.target, t.actual))
            .collect::<Vec<_>>(),
        vec![("dram", 64 * MIB, 0), ("slow", 128 * MIB, 0)],
        "no guest driver: actual stays 0"
    );
    // Idempotent: the same absolute targets again.
    api.set_tier_targets(&targets).await.unwrap();

    let too_large = api
        .set_tier_targets(&[("slow".into(), 256 * MIB + 4096)])
        .await
        .unwrap_err();
    eprintln!("too large: {too_large}");
    assert!(matches!(too_large, ActuateError::Vmm { status: 500, .. }));
    assert!(
        too_large
            .vmm_message()
            .unwrap()
            .contains("exceeds its 65536 pages")
    );

    let unknown = api
        .set_tier_targets(&[("dram".into(), 0), ("pmem".into(), 4096)])
        .await
        .unwrap_err();
    eprintln!("unknown zone: {unknown}");
    assert!(unknown.vmm_message().unwrap().ends_with("pmem"));

    // All or nothing: dram was not set to 0 by the rejected call.
    let state = api.tier_state().await.unwrap();
    assert_eq!(state[0].target, 64 * MIB);
    assert_eq!(state[1].target, 128 * MIB);

    let counters = api.counters().await.unwrap();
    let balloon = &counters[BALLOON_DEVICE];
    eprintln!(
        "counters: tier0_target_bytes={} tier1_target_bytes={} tier0_actual_bytes={}",
        balloon["tier0_target_bytes"], balloon["tier1_target_bytes"], balloon["tier0_actual_bytes"]
    );
    assert_eq!(balloon["tier0_target_bytes"], 64 * MIB);
    assert_eq!(balloon["tier1_target_bytes"], 128 * MIB);

    child.kill().await.unwrap();
}

fn main() {
    let args = Arguments::from_args();
    let ready = capability();
    let trial = Trial::ignorable_test("live_patched_ch_per_zone_targets", move || match ready {
        Err(reason) => Ok(Completion::ignored_with(reason)),
        Ok((bin, kernel)) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Failed::from(e.to_string()))?;
            rt.block_on(live(bin, kernel));
            Ok(Completion::Completed)
        }
    });
    libtest_mimic::run(&args, vec![trial]).exit();
}
