//! The fexit hook's attribution (age_account() in bpf/tier_common.h) on the
//! real program `ept_age_test`, through BPF_PROG_TEST_RUN with the
//! arguments fexit/kvm_age_gfn would pass (tid, kvm, as_id, start, end,
//! young): VMs keyed by the `struct kvm *` learned from a scan owner,
//! counting gated on the scan owner, ageing of a known VM by anybody else
//! counted as foreign, the rest unattributed. fexit itself cannot load on
//! this machine (bpf_ept's `fexit_kvm_age_gfn_loads` says why).
//!
//! Custom harness: without the privilege to load BPF, reported as ignored
//! with the reason.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use crate::ept_common;

use ept_common::*;
use libtest_mimic::Trial;
use tier_profiler::sampler::ept::{
    EptProgram, EptPrograms, GfnRange, SpteMasks, TierCount, VmCounts, current_tid,
};

const VM_A: u32 = 0;
const VM_B: u32 = 1;
const DRAM: usize = 0;
const CXL: usize = 1;
/// Two `struct kvm *` values as the kernel would pass them.
const KVM_A: u64 = 0xffff_8881_0a00_0000;
const KVM_B: u64 = 0xffff_8881_0b00_0000;
const KVM_OTHER: u64 = 0xffff_8881_0c00_0000;
/// A tid that is not this thread (a kdamond, say).
const KDAMOND: u32 = 4_000_000;
const RECLAIM: u32 = 4_000_001;

/// kvm_age_gfn(kvm, [start, end) of memslot as_id) returned `young`, on
/// thread `tid`.
fn age(p: &EptPrograms, tid: u32, kvm: u64, as_id: u64, start: u64, end: u64, young: bool) {
    let ret = p
        .test_run(
            EptProgram::AgeTest,
            &[u64::from(tid), kvm, as_id, start, end, u64::from(young)],
        )
        .unwrap();
    assert_eq!(ret, 0);
}

/// VM A: dram [0, 0x1000), cxl [0x1000, 0x2000); VM B: dram [0, 0x2000).
fn two_vms() -> EptPrograms {
    let mut p = load(SpteMasks::EPT_AD);
    let r = |s, e, tier| GfnRange {
        start_gfn: s,
        end_gfn: e,
        tier,
    };
    p.set_vm(VM_A, &[r(0, 0x1000, 0), r(0x1000, 0x2000, 1)])
        .unwrap();
    p.set_vm(VM_B, &[r(0, 0x2000, 0)]).unwrap();
    p
}

fn counts(p: &EptPrograms, slot: u32) -> VmCounts {
    p.vm_counts(slot).unwrap()
}

/// The owner's first ageing of a kvm teaches kvm -> slot; later ageing of
/// it by threads that own nothing is foreign for that VM, of unknown kvms
/// unattributed; nothing of either reaches the tier counts.
fn owner_teaches_the_kvm_others_are_foreign() {
    let mut p = two_vms();
    let me = current_tid();
    p.set_scan_owner(me, VM_A).unwrap();
    // Before anything is learned, reclaim's ageing is unattributed.
    age(&p, RECLAIM, KVM_A, 0, 0x10, 0x11, true);
    assert_eq!(p.unattributed().unwrap(), tc(1, 1, 1));
    assert_eq!(p.learned_kvms().unwrap(), vec![]);

    age(&p, me, KVM_A, 0, 0x10, 0x11, true);
    age(&p, me, KVM_A, 0, 0x1010, 0x1011, false);
    assert_eq!(p.learned_kvms().unwrap(), vec![(KVM_A, VM_A)]);
    let a = counts(&p, VM_A);
    assert_eq!(a.tiers[DRAM], tc(1, 1, 1));
    assert_eq!(a.tiers[CXL], tc(1, 0, 1), "checked, not young");

    // Reclaim, khugepaged, someone's DAMON: foreign for A, never a reading.
    age(&p, RECLAIM, KVM_A, 0, 0x20, 0x21, true);
    age(&p, RECLAIM, KVM_A, 0, 0x200, 0x400, false);
    let a = counts(&p, VM_A);
    assert_eq!(a.foreign, tc(0x201, 1, 2));
    assert_eq!(a.tiers[DRAM], tc(1, 1, 1));
    // A VM tierd does not know: unattributed.
    age(&p, RECLAIM, KVM_OTHER, 0, 0x20, 0x21, true);
    assert_eq!(p.unattributed().unwrap(), tc(2, 2, 2));
    assert_eq!(counts(&p, VM_B), VmCounts::default());
    // take_vm_counts hands out foreign deltas too.
    assert_eq!(p.take_vm_counts(VM_A).unwrap().foreign, tc(0x201, 1, 2));
    age(&p, RECLAIM, KVM_A, 0, 0x20, 0x21, true);
    assert_eq!(p.take_vm_counts(VM_A).unwrap().foreign, tc(1, 1, 1));
    p.reset_vm_counts(VM_A).unwrap();
    assert_eq!(counts(&p, VM_A), VmCounts::default());
}

/// A persistent owner (tierd's kdamond thread, registered for as long as it
/// runs) is counted like the scanning thread; once unregistered its
/// ageing is foreign. The kvm, once learned, decides the VM even when the
/// owner scans another one (a page shared by two VMs).
fn persistent_owner_and_kvm_first() {
    let p = two_vms();
    p.set_scan_owner(KDAMOND, VM_B).unwrap();
    age(&p, KDAMOND, KVM_B, 0, 0, 0x200, true);
    assert_eq!(counts(&p, VM_B).tiers[DRAM], tc(0x200, 0x200, 1));
    assert_eq!(p.learned_kvms().unwrap(), vec![(KVM_B, VM_B)]);

    // This thread scans A; KVM_B's pages it reaches count for B.
    {
        let _owner = p.scan_as(VM_A).unwrap();
        age(&p, current_tid(), KVM_B, 0, 0x10, 0x11, true);
        age(&p, current_tid(), KVM_A, 0, 0x10, 0x11, true);
    }
    assert_eq!(counts(&p, VM_B).tiers[DRAM], tc(0x201, 0x201, 2));
    assert_eq!(counts(&p, VM_A).tiers[DRAM], tc(1, 1, 1));
    assert_eq!(
        p.learned_kvms().unwrap(),
        vec![(KVM_A, VM_A), (KVM_B, VM_B)]
    );

    // The kdamond stopped: its ageing is foreign now.
    p.clear_scan_owner(KDAMOND).unwrap();
    age(&p, KDAMOND, KVM_B, 0, 0x10, 0x11, true);
    assert_eq!(counts(&p, VM_B).foreign, tc(1, 1, 1));
    assert_eq!(counts(&p, VM_B).tiers[DRAM], tc(0x201, 0x201, 2));
    assert_eq!(p.unattributed().unwrap(), TierCount::default());
}

/// SMM memslots (as_id 1) alias the same memory: ignored entirely, not
/// even learned; empty ranges are ignored; a range over two tiers and past
/// the VM's memory is split, the rest unmapped.
fn smm_empty_and_split_ranges() {
    let p = two_vms();
    let me = current_tid();
    let _owner = p.scan_as(VM_A).unwrap();
    age(&p, me, KVM_A, 1, 0x10, 0x11, true);
    age(&p, RECLAIM, KVM_A, 1, 0x10, 0x11, true);
    age(&p, me, KVM_A, 0, 0x10, 0x10, true);
    assert_eq!(p.learned_kvms().unwrap(), vec![]);
    assert_eq!(counts(&p, VM_A), VmCounts::default());
    assert_eq!(p.unattributed().unwrap(), TierCount::default());

    // [0xe00, 0x2200): 0x200 dram, 0x1000 cxl, 0x200 outside.
    age(&p, me, KVM_A, 0, 0xe00, 0x2200, true);
    let a = counts(&p, VM_A);
    assert_eq!(a.tiers[DRAM], tc(0x200, 0x200, 1));
    assert_eq!(a.tiers[CXL], tc(0x1000, 0x1000, 1));
    assert_eq!(a.unmapped, tc(0x200, 0x200, 1));
}

/// clear_vm forgets the kvm (its address may be reused by the next VM):
/// its ageing is then unattributed, and a new owner learns it afresh.
fn clear_vm_forgets_the_kvm() {
    let mut p = two_vms();
    let me = current_tid();
    p.set_scan_owner(me, VM_A).unwrap();
    age(&p, me, KVM_A, 0, 0x10, 0x11, true);
    p.set_scan_owner(me, VM_B).unwrap();
    age(&p, me, KVM_B, 0, 0x10, 0x11, true);
    p.clear_scan_owner(me).unwrap();
    p.clear_vm(VM_A).unwrap();
    assert_eq!(p.learned_kvms().unwrap(), vec![(KVM_B, VM_B)]);
    age(&p, RECLAIM, KVM_A, 0, 0x10, 0x11, true);
    assert_eq!(p.unattributed().unwrap(), tc(1, 1, 1));
    assert_eq!(counts(&p, VM_A), VmCounts::default());
    // set_vm (new ranges, same VM) keeps what was learned.
    p.set_vm(
        VM_B,
        &[GfnRange {
            start_gfn: 0,
            end_gfn: 0x100,
            tier: 1,
        }],
    )
    .unwrap();
    assert_eq!(p.learned_kvms().unwrap(), vec![(KVM_B, VM_B)]);
    // A slot out of range is refused.
    assert!(p.forget_kvms(64).is_err());
}

/// Threads of a real process: one owns the scan, another (standing for
/// reclaim) owns nothing; each runs the program with its own tid.
fn threads_owner_and_other() {
    let p = two_vms();
    // Another thread (standing for reclaim) owns nothing.
    let on_other_thread = |p: EptPrograms| {
        std::thread::spawn(move || {
            let tid = current_tid();
            age(&p, tid, KVM_A, 0, 0x10, 0x11, true);
            (p, tid)
        })
        .join()
        .unwrap()
    };
    let (p, other) = on_other_thread(p);
    assert_ne!(other, current_tid());
    {
        let _owner = p.scan_as(VM_A).unwrap();
        age(&p, current_tid(), KVM_A, 0, 0x10, 0x11, true);
    }
    let (p, _) = on_other_thread(p);
    assert_eq!(p.unattributed().unwrap(), tc(1, 1, 1), "before learning");
    let a = counts(&p, VM_A);
    assert_eq!(a.tiers[DRAM], tc(1, 1, 1));
    assert_eq!(a.foreign, tc(1, 1, 1), "after learning");
}

/// This file's trials, named `bpf_ept_attribution::NAME`.
pub fn trials() -> Vec<Trial> {
    let ready = capability();
    let tests = vec![
        trial(
            "bpf_ept_attribution::owner_teaches_the_kvm_others_are_foreign",
            &ready,
            owner_teaches_the_kvm_others_are_foreign,
        ),
        trial(
            "bpf_ept_attribution::persistent_owner_and_kvm_first",
            &ready,
            persistent_owner_and_kvm_first,
        ),
        trial(
            "bpf_ept_attribution::smm_empty_and_split_ranges",
            &ready,
            smm_empty_and_split_ranges,
        ),
        trial(
            "bpf_ept_attribution::clear_vm_forgets_the_kvm",
            &ready,
            clear_vm_forgets_the_kvm,
        ),
        trial(
            "bpf_ept_attribution::threads_owner_and_other",
            &ready,
            threads_owner_and_other,
        ),
    ];
    tests
}
