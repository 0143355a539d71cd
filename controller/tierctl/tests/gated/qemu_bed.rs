//! tierctl against tierd watching a real QEMU: Debian's 6.12 on the Linux
//! bed (docs/linux-bed.md), found through a QMP socket of its own. `tierctl
//! vms` lists it as a QEMU VM with its two NUMA tiers, and `tierctl top`
//! shows per-tier rows sampled by hostpte.
//!
//! Needs `TIERD_BED_KERNELS` (`cargo xtask test` sets it) and QEMU;
//! reported as ignored with the reason otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::time::Duration;

use crate::cli_common::run_tierctl;
use libtest_mimic::Trial;
use tier_linux_bed::{Bed, Kernel};
use tier_test_support::{Tierd, gated};

fn kernel() -> Result<Kernel, String> {
    tier_linux_bed::kernel::from_env("6.12")
}

fn vms_and_top_show_the_qemu_vm() {
    let work = tempfile::tempdir().unwrap();
    let (mut machine, log) = tier_linux_bed::prepare(&kernel().unwrap(), &[], work.path()).unwrap();
    let qmp = work.path().join("bed.qmp");
    machine.extra_args = vec![
        "-qmp".into(),
        format!("unix:{},server=on,wait=off", qmp.display()),
    ];
    let bed = Bed::start(&machine, &log, tier_linux_bed::BOOT_TIMEOUT).unwrap();
    // Only this bed's QEMU: other VMMs on the host (another test's) are
    // not looked up by their command line or their kvm-vm fd.
    let config = format!(
        "backend = \"hostpte\"\ninterval_ms = 500\n[discovery]\nch_api_dir = \"\"\nch_cmdline = false\nkvm_fd = false\nqemu_qmp = [{:?}]\n[tier_kinds]\nnode0 = \"dram\"\nnode1 = \"cxl\"\n",
        qmp.display().to_string()
    );
    let tierd = Tierd::builder()
        .dir(work.path())
        .config(config)
        .discover()
        .start();
    let ep = tierd.endpoint();
    let vms = tierd.wait_until("tierctl vms to list a VM", Duration::from_secs(60), || {
        let (out, stdout, err) = run_tierctl(&ep, &["vms", "--output", "json"]);
        assert!(out.status.success(), "{err}");
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        (v.as_array().is_some_and(|a| !a.is_empty())
            || v["vms"].as_array().is_some_and(|a| !a.is_empty()))
        .then_some(v)
    });
    eprintln!("tierctl vms --output json: {vms}");
    let list = vms.as_array().or_else(|| vms["vms"].as_array()).unwrap();
    let vm = list
        .iter()
        .find(|v| v["id"] == format!("qemu:{}", bed.pid()))
        .unwrap_or_else(|| panic!("no qemu:{} in {vms}", bed.pid()));
    assert_eq!(vm["source"], "qemu", "{vm}");
    let names: Vec<&str> = vm["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["node0", "node1"], "{vm}");
    let (out, table, err) = run_tierctl(&ep, &["vms"]);
    assert!(out.status.success(), "{err}");
    eprintln!("tierctl vms:\n{table}");
    assert!(
        table.contains("node0(dram") && table.contains("node1(cxl"),
        "{table}"
    );

    let (out, stdout, err) = run_tierctl(&ep, &["top", "-n", "3", "--output", "json"]);
    assert!(out.status.success(), "{err}");
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let rows = last["rows"].as_array().unwrap();
    let tiers: Vec<&str> = rows.iter().map(|r| r["tier"].as_str().unwrap()).collect();
    assert_eq!(tiers, ["node0", "node1"], "{last}");
    assert!(rows.iter().all(|r| r["source"] == "hostpte"), "{last}");
    assert!(
        rows.iter()
            .any(|r| r["resident_bytes"].as_u64().unwrap_or(0) > 0),
        "{last}"
    );
}

/// This file's trials, named `qemu_bed::NAME`.
pub fn trials() -> Vec<Trial> {
    let needs = vec![
        tier_linux_bed::missing().map_or(Ok(()), Err),
        kernel().map(drop),
    ];
    vec![gated(
        "qemu_bed::tierctl_vms_and_top_show_a_qemu_vm_6_12",
        needs,
        vms_and_top_show_the_qemu_vm,
    )]
}
