//! Shared by the EPT BPF tests: the capability check that turns a missing
//! privilege into an ignored test, and SPTEs built as KVM builds them
//! (arch/x86/kvm/mmu/spte.{c,h}, 6.1 and 6.12), so the programs see the
//! transitions the kernel really makes.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use libtest_mimic::{Completion, Trial};
use tier_profiler::sampler::ept::{
    EptOptions, EptProgram, EptPrograms, ProgramStatus, SpteMasks, TierCount,
};

/// Whether this process may load BPF at all; `Err` (the ignore reason) only
/// for a missing privilege, anything else must fail the tests.
pub fn capability() -> Result<(), String> {
    match EptPrograms::load(&options(SpteMasks::EPT_AD)) {
        Ok(p) => match p.status(EptProgram::SpteChanged) {
            ProgramStatus::Failed(e) if e.errno() == Some(libc::EPERM) => Err(format!(
                "raw_tp: EPERM at program load, needs root/CAP_BPF ({e})"
            )),
            _ => Ok(()),
        },
        Err(e) if e.errno() == Some(libc::EPERM) => {
            Err(format!("BPF: EPERM, needs root/CAP_BPF ({e})"))
        }
        Err(_) => Ok(()),
    }
}

/// A trial that runs `f`, or is ignored with the capability's reason.
pub fn trial(name: &'static str, ready: &Result<(), String>, f: fn()) -> Trial {
    let ready = ready.clone();
    Trial::ignorable_test(name, move || match ready {
        Err(reason) => Ok(Completion::ignored_with(reason)),
        Ok(()) => {
            f();
            Ok(Completion::Completed)
        }
    })
}

/// The tracepoint program and the fexit attribution test program, not
/// attached (run through BPF_PROG_TEST_RUN only).
pub fn options(masks: SpteMasks) -> EptOptions {
    EptOptions {
        tracepoint: true,
        fexit: false,
        age_test: true,
        empty_baseline: false,
        attach: false,
        heat: false,
        masks,
        ..EptOptions::default()
    }
}

pub fn load(masks: SpteMasks) -> EptPrograms {
    let p = EptPrograms::load(&options(masks)).unwrap();
    for prog in [EptProgram::SpteChanged, EptProgram::AgeTest] {
        assert_eq!(p.status(prog), &ProgramStatus::Loaded, "{prog}");
    }
    p
}

pub fn tc(checked: u64, young: u64, events: u64) -> TierCount {
    TierCount {
        checked_pages: checked,
        young_pages: young,
        events,
    }
}

/// One kvm_tdp_mmu_spte_changed event on this thread.
pub fn spte(p: &EptPrograms, as_id: u64, gfn: u64, level: u64, old: u64, new: u64) {
    let ret = p
        .test_run(EptProgram::SpteChanged, &[as_id, gfn, level, old, new])
        .unwrap();
    assert_eq!(ret, 0, "program return value");
}

// --- SPTEs as KVM makes them ------------------------------------------------

/// SPTE_MMU_PRESENT_MASK: is_shadow_present_pte().
pub const MMU_PRESENT: u64 = 1 << 11;
/// SPTE_TDP_AD_DISABLED (make_spte() when role.ad_disabled).
pub const AD_DISABLED: u64 = 1 << 52;
/// SHADOW_ACC_TRACK_SAVED_BITS_SHIFT.
pub const SAVED_SHIFT: u32 = 54;
/// SHADOW_ACC_TRACK_SAVED_BITS_MASK: EPT readable | executable.
pub const SAVED_BITS: u64 = 0x1 | 0x4;
/// EPT: VMX_EPT_RWX_MASK, write bit, A bit, D bit, WB memtype (6 << 3),
/// EPT_SPTE_HOST_WRITABLE / EPT_SPTE_MMU_WRITABLE.
pub const EPT_RWX: u64 = 0x7;
pub const EPT_W: u64 = 0x2;
pub const EPT_A: u64 = 1 << 8;
pub const EPT_D: u64 = 1 << 9;
pub const EPT_WB: u64 = 6 << 3;
pub const EPT_WRITABLE: u64 = (1 << 57) | (1 << 58);
/// NPT (x86 PTE bits): present, writable, user, accessed, dirty; the
/// DEFAULT_SPTE_HOST_WRITABLE / DEFAULT_SPTE_MMU_WRITABLE bits 9 and 10.
pub const NPT_PRW_US: u64 = 0x7;
pub const NPT_A: u64 = 1 << 5;
pub const NPT_D: u64 = 1 << 6;
pub const NPT_WRITABLE: u64 = (1 << 9) | (1 << 10);

fn pfn_bits(pfn: u64) -> u64 {
    (pfn << 12) & (((1 << 52) - 1) & !0xfff)
}

/// A young writable EPT leaf with A/D bits (kvm_intel.eptad=Y).
pub fn ept_ad_young(pfn: u64) -> u64 {
    MMU_PRESENT | EPT_RWX | EPT_WB | EPT_A | EPT_D | EPT_WRITABLE | pfn_bits(pfn)
}

/// A (young: RWX set) writable EPT leaf without A/D bits (eptad=N).
pub fn ept_noad_young(pfn: u64) -> u64 {
    MMU_PRESENT | AD_DISABLED | EPT_RWX | EPT_WB | EPT_WRITABLE | pfn_bits(pfn)
}

/// A young writable NPT leaf.
pub fn npt_young(pfn: u64) -> u64 {
    MMU_PRESENT | NPT_PRW_US | NPT_A | NPT_D | NPT_WRITABLE | pfn_bits(pfn)
}

/// mark_spte_for_access_track() (arch/x86/kvm/mmu/spte.c) with KVM's
/// masks for the vendor: A/D SPTEs lose the accessed bit, others RWX,
/// keeping R and X in bits 54 and 56.
pub fn mark_for_access_track(spte: u64, masks: SpteMasks) -> u64 {
    if spte & (3 << 52) != AD_DISABLED {
        return spte & !masks.accessed;
    }
    if spte & masks.access_track == 0 {
        return spte;
    }
    let saved = (spte & SAVED_BITS) << SAVED_SHIFT;
    (spte | saved) & !masks.access_track
}

/// restore_acc_track_spte() (arch/x86/kvm/mmu/spte.h): what a
/// fast page fault does to an access-tracked SPTE.
pub fn restore_acc_track(spte: u64) -> u64 {
    let saved = (spte >> SAVED_SHIFT) & SAVED_BITS;
    (spte & !(SAVED_BITS << SAVED_SHIFT)) | saved
}

/// A stand-in /sys/module tree: `params` are (module/parameters/name, value).
pub fn stand_in(params: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, value) in params {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, format!("{value}\n")).unwrap();
    }
    dir
}
