//! The SPTE masks and ageing modes on the real tracepoint program, through
//! BPF_PROG_TEST_RUN: EPT with A/D bits, EPT without them (access
//! tracking) and AMD NPT; each vendor's ageing counted with its own masks
//! and not with the others'; masks chosen by HostMode from stand-in
//! `/sys/module` trees (this machine has neither kvm_intel nor kvm_amd).
//!
//! Custom harness: without the privilege to load BPF, reported as ignored
//! with the reason.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use crate::ept_common;

use std::path::Path;

use ept_common::*;
use libtest_mimic::Trial;
use tier_profiler::sampler::ept::{
    EptPrograms, GfnRange, HostMode, HostModeError, SpteMasks, TierCount, current_tid,
};

const VM: u32 = 0;
const PFN: u64 = 0x12_3456;

/// One VM, one dram tier over the first 1 GiB, owned by this thread.
fn vm_of(masks: SpteMasks) -> EptPrograms {
    let mut p = load(masks);
    p.set_vm(
        VM,
        &[GfnRange {
            start_gfn: 0,
            end_gfn: 0x40000,
            tier: 0,
        }],
    )
    .unwrap();
    p.set_scan_owner(current_tid(), VM).unwrap();
    p
}

fn dram(p: &EptPrograms) -> TierCount {
    p.vm_counts(VM).unwrap().tiers[0]
}

/// The ageing transition of one vendor mode: (name, old, new).
fn ageing_of(mode: &str) -> (u64, u64) {
    match mode {
        "ept-ad" => {
            let old = ept_ad_young(PFN);
            (old, mark_for_access_track(old, SpteMasks::EPT_AD))
        }
        "ept-access-track" => {
            let old = ept_noad_young(PFN);
            (old, mark_for_access_track(old, SpteMasks::EPT_ACCESS_TRACK))
        }
        "npt" => {
            let old = npt_young(PFN);
            (old, mark_for_access_track(old, SpteMasks::NPT))
        }
        other => panic!("{other}"),
    }
}

fn ept_ad_ageing_is_counted() {
    let p = vm_of(SpteMasks::EPT_AD);
    let (old, new) = ageing_of("ept-ad");
    assert_eq!(new, old & !EPT_A, "A/D ageing clears bit 8 only");
    spte(&p, 0, 0x10, 1, old, new);
    // A 2 MiB SPTE (level 2) ages 512 pages at once.
    spte(&p, 0, 0x200, 2, old, new);
    assert_eq!(dram(&p), tc(513, 513, 2));
}

/// kvm_intel.eptad=N: ageing is mark_spte_for_access_track(); it and only
/// it is counted, not the other changes an access-tracked SPTE goes
/// through.
fn access_track_ageing_is_counted() {
    let masks = SpteMasks::EPT_ACCESS_TRACK;
    let p = vm_of(masks);
    let (old, tracked) = ageing_of("ept-access-track");
    assert_eq!(tracked & EPT_RWX, 0, "RWX cleared");
    assert_eq!(
        (tracked >> SAVED_SHIFT) & SAVED_BITS,
        SAVED_BITS,
        "R, X saved"
    );
    // W is not saved: fast_page_fault() sets it again from MMU-writable.
    assert_eq!(restore_acc_track(tracked), old & !EPT_W, "restore");
    let ignored: &[(&str, u64, u64)] = &[
        (
            "fast page fault restores R and X",
            tracked,
            restore_acc_track(tracked),
        ),
        ("... and W", tracked, old),
        ("already tracked", tracked, tracked),
        (
            "write-protect (W and MMU-writable cleared)",
            old,
            old & !(EPT_W | EPT_WRITABLE),
        ),
        (
            "dirty clearing without A/D bits clears W",
            old,
            old & !EPT_W,
        ),
        ("zap", old, 1 << 63),
        ("freeze", old, (1 << 63) | 0x5a0),
        (
            "prefetch makes a tracked SPTE from nothing",
            1 << 63,
            tracked,
        ),
        ("tracked SPTE zapped", tracked, 1 << 63),
    ];
    for &(what, o, n) in ignored {
        spte(&p, 0, 0x10, 1, o, n);
        assert_eq!(dram(&p), TierCount::default(), "{what}");
    }
    spte(&p, 1, 0x10, 1, old, tracked);
    assert_eq!(dram(&p), TierCount::default(), "SMM address space");
    spte(&p, 0, 0x10, 1, old, tracked);
    // A read-only page (W clear) ages the same way.
    let ro = old & !(EPT_W | EPT_WRITABLE);
    spte(&p, 0, 0x11, 1, ro, mark_for_access_track(ro, masks));
    assert_eq!(dram(&p), tc(2, 2, 2));
    assert_eq!(p.unattributed().unwrap(), TierCount::default());
}

fn npt_ageing_is_counted() {
    let p = vm_of(SpteMasks::NPT);
    let (old, new) = ageing_of("npt");
    assert_eq!(new, old & !NPT_A, "NPT ageing clears bit 5 only");
    spte(&p, 0, 0x10, 1, old, new);
    // Not ageing under NPT: bit 8 (EPT's A bit) clearing, D clearing,
    // write-protect, a zap.
    let ignored: &[(&str, u64, u64)] = &[
        ("bit 8 cleared", old | EPT_A, old),
        ("dirty cleared", old, old & !NPT_D),
        ("write-protect", old, old & !(0x2 | NPT_WRITABLE)),
        ("zap", old, 1 << 63),
        ("6.1 REMOVED_SPTE (bit 5 set, not present)", 0x5a0, new),
    ];
    for &(what, o, n) in ignored {
        spte(&p, 0, 0x10, 1, o, n);
        assert_eq!(dram(&p), tc(1, 1, 1), "{what}");
    }
}

/// Each vendor's ageing through each vendor's masks: counted only with its
/// own (the "zero on AMD": Intel masks on NPT count nothing). EPT
/// A/D masks also count access-tracked SPTEs, as KVM's is_accessed_spte()
/// decides per SPTE by SPTE_TDP_AD_DISABLED.
fn masks_count_only_their_vendor() {
    let modes = ["ept-ad", "ept-access-track", "npt"];
    let masks = [
        ("EPT_AD", SpteMasks::EPT_AD, [true, true, false]),
        (
            "EPT_ACCESS_TRACK",
            SpteMasks::EPT_ACCESS_TRACK,
            [false, true, false],
        ),
        ("NPT", SpteMasks::NPT, [false, false, true]),
    ];
    for (name, m, want) in masks {
        let p = vm_of(m);
        for (mode, counted) in modes.iter().zip(want) {
            let before = dram(&p).young_pages;
            let (old, new) = ageing_of(mode);
            spte(&p, 0, 0x10, 1, old, new);
            let got = dram(&p).young_pages - before;
            assert_eq!(got, u64::from(counted), "{mode} ageing with {name} masks");
        }
    }
}

fn masks_of(root: &Path) -> Result<SpteMasks, HostModeError> {
    HostMode::detect(root).unwrap().tracepoint_masks()
}

/// HostMode reads a stand-in tree per vendor and mode; the masks it gives
/// make the real program count that host's ageing and not the others'.
fn stand_in_sysfs_masks_count_the_host_ageing() {
    let hosts = [
        (
            "ept-ad",
            vec![
                ("kvm/parameters/tdp_mmu", "Y"),
                ("kvm_intel/parameters/ept", "Y"),
                ("kvm_intel/parameters/eptad", "Y"),
            ],
        ),
        (
            "ept-access-track",
            vec![
                ("kvm/parameters/tdp_mmu", "Y"),
                ("kvm_intel/parameters/ept", "Y"),
                ("kvm_intel/parameters/eptad", "N"),
            ],
        ),
        (
            "npt",
            vec![
                ("kvm/parameters/tdp_mmu", "Y"),
                ("kvm_amd/parameters/npt", "Y"),
            ],
        ),
    ];
    for (host, params) in &hosts {
        let tree = stand_in(params);
        let masks = masks_of(tree.path()).unwrap();
        let p = vm_of(masks);
        for mode in ["ept-ad", "ept-access-track", "npt"] {
            let before = dram(&p).young_pages;
            let (old, new) = ageing_of(mode);
            spte(&p, 0, 0x10, 1, old, new);
            let got = dram(&p).young_pages - before;
            // EPT A/D hosts count access tracking too (per-SPTE A/D bits).
            let want = mode == *host || (*host == "ept-ad" && mode == "ept-access-track");
            assert_eq!(got, u64::from(want), "{mode} ageing on a {host} host");
        }
    }
}

/// This file's trials, named `bpf_ept_modes::NAME`.
pub fn trials() -> Vec<Trial> {
    let ready = capability();
    let tests = vec![
        trial(
            "bpf_ept_modes::ept_ad_ageing_is_counted",
            &ready,
            ept_ad_ageing_is_counted,
        ),
        trial(
            "bpf_ept_modes::access_track_ageing_is_counted",
            &ready,
            access_track_ageing_is_counted,
        ),
        trial(
            "bpf_ept_modes::npt_ageing_is_counted",
            &ready,
            npt_ageing_is_counted,
        ),
        trial(
            "bpf_ept_modes::masks_count_only_their_vendor",
            &ready,
            masks_count_only_their_vendor,
        ),
        trial(
            "bpf_ept_modes::stand_in_sysfs_masks_count_the_host_ageing",
            &ready,
            stand_in_sysfs_masks_count_the_host_ageing,
        ),
    ];
    tests
}
