#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose
//! Our Linux driver, tier_balloon.ko (vmm-patch/guests/linux-driver, built by
//! `cargo xtask linux-driver`), in Debian's user-mode-linux 6.1 against
//! tier-balloon offering F_TIERS with two tiers over UML's guest-physical
//! memory: per-tier targets are honoured, no PFN is rejected, and a smaller
//! target deflates that tier only. UML has no NUMA, so this runs the
//! driver's span allocation. Ignored, with the reason, where linux.uml or
//! the module is missing.

use std::path::PathBuf;
use std::time::Duration;

mod uml_common;

use libtest_mimic::{Completion, Failed};
use serde_json::{Value, json};
use tier_uml::{Options, Uml, hog};

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(60);

/// `<target>/linux-driver/uml/tier_balloon.ko`, beside this build's
/// `<target>/<profile>/tier-balloon`.
fn module() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_tier-balloon"));
    let target = bin.parent().and_then(|p| p.parent()).unwrap();
    target.join("linux-driver/uml/tier_balloon.ko")
}

fn zone<'a>(st: &'a Value, id: &str) -> &'a Value {
    st["zones"]
        .as_array()
        .unwrap()
        .iter()
        .find(|z| z["id"] == id)
        .unwrap()
}

/// UML's guest-physical memory is `[end of its brk + 4 MiB, mem)` and
/// grows by the "exec-shield gap" between its image and brk, which ASLR
/// makes random (setup_physmem() and uml_reserved in
/// arch/um/kernel/um_arch.c, 6.1): without randomisation, as `setarch -R`,
/// it is [0xaa8000, 0x8000000) for mem=128M, so fixed tier ranges fit. The
/// personality is inherited by the processes this test starts, and by
/// nothing else (this binary runs only this test).
fn no_aslr() -> Result<(), Failed> {
    // SAFETY: personality(2) only changes flags of this process, read by
    // later execve() calls; 0xffffffff queries the current value.
    let cur = unsafe { libc::personality(0xffff_ffff) };
    if cur < 0 {
        return Err("personality(query) failed".into());
    }
    // SAFETY: as above; sets ADDR_NO_RANDOMIZE on top of the current flags.
    let rc = unsafe { libc::personality((cur | libc::ADDR_NO_RANDOMIZE) as libc::c_ulong) };
    if rc < 0 {
        return Err(format!(
            "personality(ADDR_NO_RANDOMIZE): {}",
            std::io::Error::last_os_error()
        )
        .into());
    }
    Ok(())
}

fn tier_targets(uml: &Uml, low: u64, high: u64) {
    uml.control(&json!({"op": "set_targets", "targets": {"low": low, "high": high}}))
        .unwrap();
}

/// Both tiers reach their targets; then a smaller `high` target deflates
/// `high` only.
fn start(deflate_on_oom: bool) -> Result<Uml, Failed> {
    let mut o = Options::new(env!("CARGO_BIN_EXE_tier-balloon"));
    o.deflate_on_oom = deflate_on_oom;
    // UML's guest-physical memory is [end of kernel image, mem); the low
    // tier covers its unmapped start, which the driver never hands out.
    o.tiers = vec![
        "name=low,ranges=0x0-0x4000000".into(),
        "name=high,ranges=0x4000000-0x8000000".into(),
    ];
    o.modules = vec![module()];
    no_aslr()?;
    Ok(Uml::start(&o)?)
}

fn per_tier_targets() -> Result<Completion, Failed> {
    let mut uml = start(false)?;
    let st = uml.state()?;
    assert_eq!(st["tiers_negotiated"], true, "{st}");
    // Both tiers lie in the guest memory UML told the backend about.
    assert!(
        zone(&st, "low")["mapped_bytes"].as_u64() > Some(32 * MIB),
        "{st}"
    );
    assert_eq!(zone(&st, "high")["mapped_bytes"], 64 * MIB, "{st}");
    let lsmod = uml.sh("cat /proc/modules", Duration::from_secs(10))?;
    assert!(lsmod.contains("tier_balloon"), "{lsmod}");

    tier_targets(&uml, 8 * MIB, 16 * MIB);
    let st = uml.wait_state("low 8 MiB, high 16 MiB", WAIT, |s| {
        zone(s, "low")["actual"] == 8 * MIB && zone(s, "high")["actual"] == 16 * MIB
    })?;
    for (id, bytes) in [("low", 8 * MIB), ("high", 16 * MIB)] {
        let z = zone(&st, id);
        assert_eq!(z["host_ballooned"], bytes, "{id}: {z}");
        assert_eq!(z["inflated_pfns"], bytes / 4096, "{id}: {z}");
        assert_eq!(z["rejected_pfns"], 0, "{id}: {z}");
    }
    assert_eq!(st["legacy_actual"], 0, "{st}");

    tier_targets(&uml, 8 * MIB, 4 * MIB);
    let st = uml.wait_state("high deflated to 4 MiB", WAIT, |s| {
        zone(s, "high")["actual"] == 4 * MIB
    })?;
    let (low, high) = (zone(&st, "low"), zone(&st, "high"));
    assert_eq!(high["host_ballooned"], 4 * MIB, "{high}");
    assert_eq!(high["deflated_pfns"], 12 * MIB / 4096, "{high}");
    assert_eq!(low["actual"], 8 * MIB, "{low}");
    assert_eq!(low["deflated_pfns"], 0, "low tier untouched: {low}");
    assert_eq!(low["rejected_pfns"], 0, "{low}");
    assert_eq!(high["rejected_pfns"], 0, "{high}");
    Ok(Completion::Completed)
}

/// Balloon compaction moves ballooned pages: each moved page must reach
/// the device on its own tier's queues (inflate the new page, deflate the
/// old), so every tier still holds exactly its target and nothing is
/// rejected. `compact_memory` is the guest's own knob.
fn compaction_rereports_on_the_tier() -> Result<Completion, Failed> {
    let mut uml = start(false)?;
    tier_targets(&uml, 16 * MIB, 24 * MIB);
    uml.wait_state("low 16 MiB, high 24 MiB", WAIT, |s| {
        zone(s, "low")["actual"] == 16 * MIB && zone(s, "high")["actual"] == 24 * MIB
    })?;
    let migrated = |uml: &mut Uml| -> u64 {
        let out = uml
            .sh(
                "grep '^balloon_migrate ' /proc/vmstat || echo balloon_migrate 0",
                WAIT,
            )
            .unwrap();
        out.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let before = migrated(&mut uml);
    // Fragment the guest first so compaction has ballooned pages to move.
    uml.sh("echo 1 > /proc/sys/vm/compact_memory", WAIT)?;
    let moved = migrated(&mut uml) - before;
    if moved == 0 {
        return Ok(Completion::ignored_with(
            "compaction moved no ballooned page in this guest (nothing to check)",
        ));
    }
    let deflated = |s: &Value| {
        zone(s, "low")["deflated_pfns"].as_u64().unwrap()
            + zone(s, "high")["deflated_pfns"].as_u64().unwrap()
    };
    let st = uml.wait_state("every moved page re-reported", WAIT, |s| {
        deflated(s) >= moved
    })?;
    for (id, bytes) in [("low", 16 * MIB), ("high", 24 * MIB)] {
        let z = zone(&st, id);
        let (inf, def) = (
            z["inflated_pfns"].as_u64().unwrap(),
            z["deflated_pfns"].as_u64().unwrap(),
        );
        assert_eq!((inf - def) * 4096, bytes, "{id} holds its target: {z}");
        assert_eq!(z["host_ballooned"], bytes, "{id}: {z}");
        assert_eq!(z["rejected_pfns"], 0, "{id}: {z}");
    }
    assert_eq!(
        st["legacy"]["inflated_pfns"], 0,
        "no legacy queue used: {st}"
    );
    eprintln!(
        "compaction: balloon_migrate +{moved}, re-reported {}",
        deflated(&st)
    );
    Ok(Completion::Completed)
}

/// With DEFLATE_ON_OOM, a guest out of memory takes pages back from the
/// tiers (nothing is in the legacy balloon): the device sees tier deflates
/// it never asked for, none rejected, and the allocation succeeds.
fn tiers_deflate_on_oom() -> Result<Completion, Failed> {
    let mut uml = start(true)?;
    tier_targets(&uml, 24 * MIB, 56 * MIB);
    uml.wait_state("low 24 MiB, high 56 MiB", WAIT, |s| {
        zone(s, "low")["actual"] == 24 * MIB && zone(s, "high")["actual"] == 56 * MIB
    })?;
    let (rc, out) = uml.sh_rc(&hog(40), Duration::from_secs(90))?;
    let st = uml.state()?;
    let (low, high) = (zone(&st, "low"), zone(&st, "high"));
    // Compaction may migrate balloon pages under the hog's pressure: each
    // move is an inflate of the new page and a deflate of the old one, so
    // what the host holds is inflated - deflated per tier, and the OOM
    // deflates are what is missing from the 80 MiB.
    for z in [low, high] {
        let (inflated, deflated) = (
            z["inflated_pfns"].as_u64().unwrap(),
            z["deflated_pfns"].as_u64().unwrap(),
        );
        assert_eq!(z["host_ballooned"], (inflated - deflated) * 4096, "{z}");
    }
    let held = low["host_ballooned"].as_u64().unwrap() + high["host_ballooned"].as_u64().unwrap();
    assert!(held < 80 * MIB, "no tier deflate on OOM: {st}\n{out}");
    assert_eq!(low["rejected_pfns"], 0, "{low}");
    assert_eq!(high["rejected_pfns"], 0, "{high}");
    assert_eq!(st["legacy"]["deflated_pfns"], 0, "{st}");
    assert_eq!(rc, 0, "the allocation should succeed from the tiers: {out}");
    assert_eq!(out.trim(), (40 * MIB).to_string(), "all of it written");
    uml.sh("true", WAIT)?;
    Ok(Completion::Completed)
}

fn main() {
    let missing = tier_uml::missing().or_else(|| {
        (!module().exists()).then(|| {
            format!(
                "{} missing: cargo xtask linux-driver --flavour uml",
                module().display()
            )
        })
    });
    uml_common::run(
        missing,
        &[
            ("tier_balloon_ko_honours_per_tier_targets", per_tier_targets),
            ("tier_balloon_ko_tiers_deflate_on_oom", tiers_deflate_on_oom),
            (
                "tier_balloon_ko_compaction_rereports_on_the_tier",
                compaction_rereports_on_the_tier,
            ),
        ],
    )
}
