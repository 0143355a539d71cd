//! The real programs of `bpf/ept.bpf.c`, loaded into this kernel and run
//! through BPF_PROG_TEST_RUN with synthetic tracepoint arguments (as_id,
//! gfn, level, old_spte, new_spte); every assertion is on exact map
//! contents.
//!
//! Custom harness (libtest-mimic): a test whose capability is missing at run
//! time (not root; fexit refused by the kernel) is reported as ignored with
//! the reason, never as passed. A program the verifier rejects fails.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use crate::ept_common;

use std::collections::BTreeMap;

use libtest_mimic::{Completion, Failed, Trial};
use tier_profiler::sampler::ept::{
    EptError, EptOptions, EptProgram, EptPrograms, GfnRange, HEAT_GRANULE_PAGES, MAX_TIERS,
    ProgramStatus, TierCount, VmCounts, current_tid,
};

// Tiers as the tests number them.
const DRAM: u32 = 0;
const CXL: u32 = 1;
const SLOW: u32 = 2;

// VM slots.
const VM_A: u32 = 0;
const VM_B: u32 = 1;

/// A present EPT leaf SPTE: RWX, KVM's MMU-present bit 11, a pfn.
const PRESENT: u64 = 0x0000_0001_2345_6000 | (1 << 11) | 0x7;
/// EPT accessed bit (VMX_EPT_ACCESS_BIT).
const A_BIT: u64 = 1 << 8;
/// EPT dirty bit.
const D_BIT: u64 = 1 << 9;
const YOUNG: u64 = PRESENT | A_BIT;
const OLD: u64 = PRESENT;
/// SHADOW_NONPRESENT_VALUE on x86-64 (what a zap leaves).
const NONPRESENT: u64 = 1 << 63;
/// FROZEN_SPTE (6.12: SHADOW_NONPRESENT_VALUE | 0x5a0) and 6.1's
/// REMOVED_SPTE (0x5a0): not shadow-present (no bit 11), but bit 8 is set.
const FROZEN_OLD: u64 = (1 << 63) | 0x5a0;
const REMOVED_6_1: u64 = 0x5a0;
/// An EPT MMIO SPTE: VMX_EPT_MISCONFIG_WX_VALUE (W|X) and a generation
/// whose low bits (3-10) include bit 8; never shadow-present.
const MMIO: u64 = 0x6 | (1 << 8) | (1 << 5);

fn tc(checked: u64, young: u64, events: u64) -> TierCount {
    TierCount {
        checked_pages: checked,
        young_pages: young,
        events,
    }
}

fn range(start_gfn: u64, end_gfn: u64, tier: u32) -> GfnRange {
    GfnRange {
        start_gfn,
        end_gfn,
        tier,
    }
}

fn tracepoint_only(heat: bool) -> EptOptions {
    EptOptions {
        tracepoint: true,
        fexit: false,
        empty_baseline: false,
        attach: false,
        heat,
        ..EptOptions::default()
    }
}

fn load(options: EptOptions) -> EptPrograms {
    let p = EptPrograms::load(&options).unwrap();
    assert_eq!(
        p.status(EptProgram::SpteChanged),
        &ProgramStatus::Loaded,
        "raw_tp program"
    );
    p
}

/// One kvm_tdp_mmu_spte_changed event through BPF_PROG_TEST_RUN on this
/// thread (so bpf_get_current_pid_tgid() is this thread's tid).
fn spte(p: &EptPrograms, as_id: u64, gfn: u64, level: u64, old: u64, new: u64) {
    let ret = p
        .test_run(EptProgram::SpteChanged, &[as_id, gfn, level, old, new])
        .unwrap();
    assert_eq!(ret, 0, "program return value");
}

/// The ageing of a young 4 KiB SPTE.
fn age(p: &EptPrograms, gfn: u64) {
    spte(p, 0, gfn, 1, YOUNG, OLD);
}

/// Expected counters of a VM: (tier, count) pairs, all others zero.
fn vm(tiers: &[(u32, TierCount)], unmapped: TierCount) -> VmCounts {
    let mut v = VmCounts {
        unmapped,
        ..VmCounts::default()
    };
    for (t, c) in tiers {
        v.tiers[*t as usize] = *c;
    }
    v
}

fn zero() -> TierCount {
    TierCount::default()
}

/// VM A: dram [0, 0x10000), slow [0x10000, 0x20000).
/// VM B: dram [0, 0x8000), cxl [0x8000, 0x10000), slow [0x10000, 0x30000):
/// the same gfns as A, told apart only by who is scanning.
fn two_vms(p: &mut EptPrograms) {
    p.set_vm(
        VM_A,
        &[range(0, 0x10000, DRAM), range(0x10000, 0x20000, SLOW)],
    )
    .unwrap();
    p.set_vm(
        VM_B,
        &[
            range(0, 0x8000, DRAM),
            range(0x8000, 0x10000, CXL),
            range(0x10000, 0x30000, SLOW),
        ],
    )
    .unwrap();
}

fn two_vms_three_tiers() {
    let mut p = load(tracepoint_only(false));
    two_vms(&mut p);
    let tid = current_tid();

    p.set_scan_owner(tid, VM_A).unwrap();
    for gfn in [0, 0x5, 0xffff, 0x10000, 0x1ffff, 0x20000] {
        age(&p, gfn);
    }
    p.set_scan_owner(tid, VM_B).unwrap();
    for gfn in [0x7fff, 0x8000, 0xffff, 0x10000, 0x2ffff, 0x30000] {
        age(&p, gfn);
    }
    p.clear_scan_owner(tid).unwrap();

    assert_eq!(
        p.vm_counts(VM_A).unwrap(),
        vm(&[(DRAM, tc(3, 3, 3)), (SLOW, tc(2, 2, 2))], tc(1, 1, 1)),
        "VM A"
    );
    assert_eq!(
        p.vm_counts(VM_B).unwrap(),
        vm(
            &[(DRAM, tc(1, 1, 1)), (CXL, tc(2, 2, 2)), (SLOW, tc(2, 2, 2))],
            tc(1, 1, 1)
        ),
        "VM B"
    );
    assert_eq!(p.vm_counts(2).unwrap(), VmCounts::default(), "unused slot");
    assert_eq!(p.unattributed().unwrap(), zero());
    assert_eq!(p.heat().unwrap(), BTreeMap::new(), "heat is off");
    assert_eq!(p.heat_dropped().unwrap(), 0);
}

fn range_boundaries() {
    let mut p = load(tracepoint_only(false));
    // Adjacent dram/cxl, then a gap, then slow.
    p.set_vm(
        VM_A,
        &[
            range(0x100, 0x200, DRAM),
            range(0x200, 0x300, CXL),
            range(0x400, 0x500, SLOW),
        ],
    )
    .unwrap();
    let _owner = p.scan_as(VM_A).unwrap();
    let cases: [(u64, Option<u32>); 10] = [
        (0xff, None),
        (0x100, Some(DRAM)),
        (0x1ff, Some(DRAM)),
        (0x200, Some(CXL)),
        (0x2ff, Some(CXL)),
        (0x300, None),
        (0x3ff, None),
        (0x400, Some(SLOW)),
        (0x4ff, Some(SLOW)),
        (0x500, None),
    ];
    let mut want = VmCounts::default();
    for (gfn, tier) in cases {
        age(&p, gfn);
        let slot = match tier {
            Some(t) => &mut want.tiers[t as usize],
            None => &mut want.unmapped,
        };
        *slot = tc(
            slot.checked_pages + 1,
            slot.young_pages + 1,
            slot.events + 1,
        );
        assert_eq!(p.vm_counts(VM_A).unwrap(), want, "after gfn {gfn:#x}");
    }
    assert_eq!(
        want,
        vm(
            &[(DRAM, tc(2, 2, 2)), (CXL, tc(2, 2, 2)), (SLOW, tc(2, 2, 2))],
            tc(4, 4, 4)
        )
    );
}

fn unknown_vm_is_unattributed() {
    let mut p = load(tracepoint_only(true));
    two_vms(&mut p);
    // Another thread owns VM A; this one owns nothing.
    let tid = current_tid();
    p.set_scan_owner(tid.wrapping_add(1_000_000), VM_A).unwrap();
    age(&p, 0);
    age(&p, 0x10000);
    spte(&p, 0, 0x200, 2, YOUNG, OLD); // huge: 512 pages
    assert_eq!(p.unattributed().unwrap(), tc(514, 514, 3));
    assert_eq!(p.vm_counts(VM_A).unwrap(), VmCounts::default());
    assert_eq!(p.vm_counts(VM_B).unwrap(), VmCounts::default());
    assert_eq!(p.heat().unwrap(), BTreeMap::new(), "no heat without a VM");

    // Owned, then released: only the owned event is attributed.
    {
        let _owner = p.scan_as(VM_A).unwrap();
        age(&p, 0);
    }
    age(&p, 0);
    assert_eq!(
        p.vm_counts(VM_A).unwrap(),
        vm(&[(DRAM, tc(1, 1, 1))], zero())
    );
    assert_eq!(p.unattributed().unwrap(), tc(515, 515, 4));
    p.reset_unattributed().unwrap();
    assert_eq!(p.unattributed().unwrap(), zero());
}

fn non_ageing_changes_are_not_counted() {
    let mut p = load(tracepoint_only(true));
    two_vms(&mut p);
    let _owner = p.scan_as(VM_A).unwrap();
    let ignored: &[(&str, u64, u64, u64, u64)] = &[
        ("old not young (e.g. write-protect)", 0, 1, OLD | D_BIT, OLD),
        ("old not young, new young (fault)", 0, 1, OLD, YOUNG),
        ("zap: new not present", 0, 1, YOUNG, NONPRESENT),
        ("zap to 0", 0, 1, YOUNG, 0),
        (
            "freeze (old FROZEN_SPTE has bit 8)",
            0,
            1,
            YOUNG,
            FROZEN_OLD,
        ),
        ("unfreeze", 0, 1, FROZEN_OLD, OLD),
        ("6.1 REMOVED_SPTE to present", 0, 1, REMOVED_6_1, OLD),
        ("MMIO SPTE replaced by an old present one", 0, 1, MMIO, OLD),
        ("young to old with another pfn", 0, 1, YOUNG, OLD + 0x1000),
        (
            "new still young (dirty bit set)",
            0,
            1,
            YOUNG,
            YOUNG | D_BIT,
        ),
        ("new still young (pfn change)", 0, 1, YOUNG, YOUNG + 0x1000),
        ("SMM address space", 1, 1, YOUNG, OLD),
        ("level 0", 0, 0, YOUNG, OLD),
        ("level 5", 0, 5, YOUNG, OLD),
    ];
    for &(what, as_id, level, old, new) in ignored {
        spte(&p, as_id, 0x10, level, old, new);
        assert_eq!(p.vm_counts(VM_A).unwrap(), VmCounts::default(), "{what}");
        assert_eq!(p.unattributed().unwrap(), zero(), "{what}");
    }
    assert_eq!(p.heat().unwrap(), BTreeMap::new());
    // The same program does count a real ageing event (with D bit kept).
    spte(&p, 0, 0x10, 1, YOUNG | D_BIT, OLD | D_BIT);
    assert_eq!(
        p.vm_counts(VM_A).unwrap(),
        vm(&[(DRAM, tc(1, 1, 1))], zero())
    );
}

fn huge_sptes_count_their_pages() {
    let mut p = load(tracepoint_only(false));
    // dram [0, 0x300), cxl [0x300, 0x1100): 2 MiB SPTEs at 0x200 and 0x1000
    // straddle the cxl start and the end of memory.
    p.set_vm(VM_A, &[range(0, 0x300, DRAM), range(0x300, 0x1100, CXL)])
        .unwrap();
    p.set_vm(VM_B, &[range(0, 0x80000, SLOW)]).unwrap();
    let tid = current_tid();

    p.set_scan_owner(tid, VM_A).unwrap();
    spte(&p, 0, 0x400, 2, YOUNG, OLD);
    assert_eq!(
        p.vm_counts(VM_A).unwrap(),
        vm(&[(CXL, tc(512, 512, 1))], zero()),
        "level 2 = 512 pages"
    );
    spte(&p, 0, 0x200, 2, YOUNG, OLD);
    spte(&p, 0, 0x1000, 2, YOUNG, OLD);
    assert_eq!(
        p.vm_counts(VM_A).unwrap(),
        vm(
            &[(DRAM, tc(0x100, 0x100, 1)), (CXL, tc(1024, 1024, 3))],
            tc(0x100, 0x100, 1)
        ),
        "straddling huge SPTEs split per tier"
    );

    p.set_scan_owner(tid, VM_B).unwrap();
    spte(&p, 0, 0x40000, 3, YOUNG, OLD);
    assert_eq!(
        p.vm_counts(VM_B).unwrap(),
        vm(&[(SLOW, tc(1 << 18, 1 << 18, 1))], zero()),
        "level 3 = 512^2 pages"
    );

    // A huge SPTE that starts before the first range.
    const VM_C: u32 = 2;
    p.set_vm(VM_C, &[range(0x100, 0x300, DRAM)]).unwrap();
    p.set_scan_owner(tid, VM_C).unwrap();
    spte(&p, 0, 0, 2, YOUNG, OLD);
    assert_eq!(
        p.vm_counts(VM_C).unwrap(),
        vm(&[(DRAM, tc(0x100, 0x100, 1))], tc(0x100, 0x100, 1)),
        "head unmapped, tail in dram"
    );

    // Two adjacent ranges of one tier under one huge SPTE: one event.
    const VM_D: u32 = 3;
    p.set_vm(
        VM_D,
        &[
            range(0, 0x100, DRAM),
            range(0x100, 0x180, DRAM),
            range(0x180, 0x400, CXL),
        ],
    )
    .unwrap();
    p.set_scan_owner(tid, VM_D).unwrap();
    spte(&p, 0, 0, 2, YOUNG, OLD);
    assert_eq!(
        p.vm_counts(VM_D).unwrap(),
        vm(
            &[(DRAM, tc(0x180, 0x180, 1)), (CXL, tc(0x80, 0x80, 1))],
            zero()
        ),
        "one event per tier"
    );
}

fn heat_histogram_buckets() {
    let mut p = load(tracepoint_only(true));
    two_vms(&mut p);
    let tid = current_tid();
    p.set_scan_owner(tid, VM_A).unwrap();
    age(&p, 0);
    age(&p, 0x1ff); // same granule as 0
    age(&p, 0x200); // granule 1
    spte(&p, 0, 0x400, 2, YOUNG, OLD); // granule 2, 512 pages
    age(&p, 0x20000); // unmapped gfn: counted as unmapped, no heat
    spte(&p, 0, 0x600, 1, OLD, YOUNG); // not ageing: nothing
    p.set_scan_owner(tid, VM_B).unwrap();
    age(&p, 0x1); // VM B granule 0
    p.clear_scan_owner(tid).unwrap();
    age(&p, 0x800); // unattributed: no heat

    let want: BTreeMap<(u32, u64), u64> = [
        ((VM_A, 0), 2),
        ((VM_A, 1), 1),
        ((VM_A, 2), HEAT_GRANULE_PAGES),
        ((VM_B, 0), 1),
    ]
    .into_iter()
    .collect();
    assert_eq!(p.heat().unwrap(), want);
    assert_eq!(p.heat_dropped().unwrap(), 0);
    assert_eq!(
        p.drain_heat().unwrap(),
        want,
        "drain returns what was there"
    );
    assert_eq!(p.heat().unwrap(), BTreeMap::new(), "and empties it");
    // Counters are untouched by the drain.
    assert_eq!(
        p.vm_counts(VM_A).unwrap(),
        vm(&[(DRAM, tc(515, 515, 4))], tc(1, 1, 1))
    );
    // clear_vm drops the VM's heat, not the other VM's.
    p.set_scan_owner(tid, VM_A).unwrap();
    age(&p, 0);
    p.set_scan_owner(tid, VM_B).unwrap();
    age(&p, 0);
    p.clear_scan_owner(tid).unwrap();
    p.clear_vm(VM_A).unwrap();
    assert_eq!(
        p.heat().unwrap(),
        [((VM_B, 0), 1)].into_iter().collect::<BTreeMap<_, _>>()
    );
    assert_eq!(p.vm_counts(VM_A).unwrap(), VmCounts::default());
    // A new VM in the slot starts from empty heat slots, though the kernel
    // held VM A's old sums in them.
    p.set_vm(VM_A, &[range(0, 0x400, DRAM)]).unwrap();
    assert_eq!(
        p.heat().unwrap(),
        [((VM_B, 0), 1)].into_iter().collect::<BTreeMap<_, _>>()
    );
}

/// A scanning thread whose cache entry another tid holds is found in the
/// hash; freeing the entry moves it back to the cache.
fn scan_owner_cache_collisions() {
    let mut p = load(tracepoint_only(false));
    two_vms(&mut p);
    let me = current_tid();
    // Same cache entry as this thread (SCAN_OWNER_CACHE = 1024).
    let other = me ^ 1024;
    p.set_scan_owner(other, VM_B).unwrap();
    p.set_scan_owner(me, VM_A).unwrap();
    age(&p, 0);
    p.clear_scan_owner(other).unwrap();
    age(&p, 0);
    p.set_scan_owner(me, VM_A).unwrap();
    age(&p, 0);
    assert_eq!(
        p.vm_counts(VM_A).unwrap(),
        vm(&[(DRAM, tc(3, 3, 3))], zero())
    );
    assert_eq!(p.vm_counts(VM_B).unwrap(), VmCounts::default());
    p.clear_scan_owner(me).unwrap();
    age(&p, 0);
    assert_eq!(p.unattributed().unwrap(), tc(1, 1, 1));
    assert!(matches!(p.set_scan_owner(0, VM_A), Err(EptError::TidZero)));
}

/// Ranges that start mid-granule and spans that cross ranges.
fn heat_granules_follow_the_ranges() {
    let mut p = load(tracepoint_only(true));
    p.set_vm(VM_A, &[range(0x100, 0x300, DRAM), range(0x300, 0x800, CXL)])
        .unwrap();
    let _owner = p.scan_as(VM_A).unwrap();
    age(&p, 0x100); // granule 0, first range
    age(&p, 0x2ff); // granule 1, first range
    age(&p, 0x300); // granule 1, second range: same granule, summed
    spte(&p, 0, 0x200, 2, YOUNG, OLD); // 512 pages over both ranges
    let want: BTreeMap<(u32, u64), u64> = [((VM_A, 0), 1), ((VM_A, 1), 2 + 256 + 256)]
        .into_iter()
        .collect();
    assert_eq!(p.heat().unwrap(), want);
    assert_eq!(p.heat_dropped().unwrap(), 0);
}

fn heat_overflow_is_counted() {
    let mut p = load(EptOptions {
        heat_entries: 4,
        ..tracepoint_only(true)
    });
    two_vms(&mut p);
    let _owner = p.scan_as(VM_A).unwrap();
    for granule in 0..6u64 {
        age(&p, granule * HEAT_GRANULE_PAGES);
    }
    // A full map still adds to granules it holds.
    age(&p, 1);
    spte(&p, 0, 0x1000, 2, YOUNG, OLD); // granule 8: dropped, 512 pages
    let heat = p.heat().unwrap();
    assert_eq!(heat.len(), 4, "{heat:?}");
    assert_eq!(heat.values().sum::<u64>(), 5, "{heat:?}");
    assert_eq!(heat.get(&(VM_A, 0)), Some(&2), "{heat:?}");
    assert_eq!(p.heat_dropped().unwrap(), 2 + 512);
    // Counters do not depend on the histogram.
    assert_eq!(
        p.vm_counts(VM_A).unwrap(),
        vm(&[(DRAM, tc(519, 519, 8))], zero())
    );
    p.reset_heat_dropped().unwrap();
    assert_eq!(p.heat_dropped().unwrap(), 0);
}

/// CPUs this thread may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is valid for writes of its own size.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    assert_eq!(rc, 0, "sched_getaffinity");
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: i < CPU_SETSIZE.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
}

/// Moves this thread onto `cpu`; the kernel migrates it before returning.
fn pin(cpu: usize) {
    // SAFETY: as above.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: cpu < CPU_SETSIZE (it came from allowed_cpus).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    assert_eq!(rc, 0, "sched_setaffinity({cpu})");
    // SAFETY: no arguments.
    let now = unsafe { libc::sched_getcpu() };
    assert_eq!(now, cpu as i32, "running on the pinned CPU");
}

fn per_cpu_values_are_summed(cpus: Vec<usize>) {
    let (c0, c1) = (cpus[0], cpus[1]);
    let mut p = load(tracepoint_only(false));
    two_vms(&mut p);
    let before = allowed_cpus();
    let _owner = p.scan_as(VM_A).unwrap();
    pin(c0);
    for gfn in [1, 2, 3] {
        age(&p, gfn);
    }
    pin(c1);
    age(&p, 4);
    age(&p, 5);
    age(&p, 0x10000);
    // Restore the thread's affinity for the harness.
    // SAFETY: as in pin().
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for c in before {
        // SAFETY: c < CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };

    let dram = p.tier_count_per_cpu(VM_A, DRAM).unwrap();
    let slow = p.tier_count_per_cpu(VM_A, SLOW).unwrap();
    for (cpu, (d, s)) in dram.iter().zip(&slow).enumerate() {
        let (want_d, want_s) = if cpu == c0 {
            (tc(3, 3, 3), zero())
        } else if cpu == c1 {
            (tc(2, 2, 2), tc(1, 1, 1))
        } else {
            (zero(), zero())
        };
        assert_eq!((*d, *s), (want_d, want_s), "cpu {cpu}");
    }
    assert_eq!(
        p.vm_counts(VM_A).unwrap(),
        vm(&[(DRAM, tc(5, 5, 5)), (SLOW, tc(1, 1, 1))], zero()),
        "sum over CPUs"
    );
}

fn take_and_reset() {
    let mut p = load(tracepoint_only(false));
    two_vms(&mut p);
    let owner = p.scan_as(VM_A).unwrap();
    age(&p, 0);
    age(&p, 0x10000);
    drop(owner);
    let first = p.take_vm_counts(VM_A).unwrap();
    assert_eq!(
        first,
        vm(&[(DRAM, tc(1, 1, 1)), (SLOW, tc(1, 1, 1))], zero())
    );
    let owner = p.scan_as(VM_A).unwrap();
    age(&p, 1);
    drop(owner);
    assert_eq!(
        p.take_vm_counts(VM_A).unwrap(),
        vm(&[(DRAM, tc(1, 1, 1))], zero()),
        "only what came since the last take"
    );
    assert_eq!(
        p.take_vm_counts(VM_A).unwrap(),
        VmCounts::default(),
        "nothing new"
    );
    assert_eq!(
        p.vm_counts(VM_A).unwrap(),
        vm(&[(DRAM, tc(2, 2, 2)), (SLOW, tc(1, 1, 1))], zero()),
        "totals kept in the map"
    );
    p.reset_vm_counts(VM_A).unwrap();
    assert_eq!(p.vm_counts(VM_A).unwrap(), VmCounts::default());
    for cpu in p.tier_count_per_cpu(VM_A, DRAM).unwrap() {
        assert_eq!(cpu, zero());
    }
    let owner = p.scan_as(VM_A).unwrap();
    age(&p, 2);
    drop(owner);
    assert_eq!(
        p.take_vm_counts(VM_A).unwrap(),
        vm(&[(DRAM, tc(1, 1, 1))], zero()),
        "take after reset"
    );
}

fn sixteen_ranges_and_slot_reuse() {
    let mut p = load(tracepoint_only(false));
    // 16 ranges of 0x100 pages with a 0x100 gap, tiers 0..7 twice.
    let ranges: Vec<GfnRange> = (0..16u64)
        .map(|i| range(i * 0x200, i * 0x200 + 0x100, (i % MAX_TIERS as u64) as u32))
        .collect();
    // Given in reverse: the loader sorts them for the program's search.
    let reversed: Vec<GfnRange> = ranges.iter().rev().copied().collect();
    p.set_vm(VM_A, &reversed).unwrap();
    {
        let _owner = p.scan_as(VM_A).unwrap();
        for r in &ranges {
            age(&p, r.start_gfn);
            age(&p, r.end_gfn - 1);
            age(&p, r.end_gfn); // gap
        }
    }
    let got = p.vm_counts(VM_A).unwrap();
    for t in 0..MAX_TIERS {
        assert_eq!(got.tiers[t], tc(4, 4, 4), "tier {t}");
    }
    assert_eq!(got.unmapped, tc(16, 16, 16));

    // A new VM in the same slot starts from zero, without ranges.
    p.clear_vm(VM_A).unwrap();
    assert_eq!(p.vm_counts(VM_A).unwrap(), VmCounts::default());
    {
        let _owner = p.scan_as(VM_A).unwrap();
        age(&p, 0);
    }
    assert_eq!(p.vm_counts(VM_A).unwrap(), vm(&[], tc(1, 1, 1)));

    // Bad input is refused before it reaches the maps.
    assert!(matches!(
        p.set_vm(64, &[]),
        Err(EptError::SlotOutOfRange { slot: 64 })
    ));
    assert!(matches!(
        p.set_vm(VM_B, &[range(0, 0x10, 0), range(0xf, 0x20, 1)]),
        Err(EptError::BadRanges { .. })
    ));
    let mut seventeen = ranges.clone();
    seventeen.push(range(0x10000, 0x10001, 0));
    assert!(matches!(
        p.set_vm(VM_B, &seventeen),
        Err(EptError::BadRanges { .. })
    ));
    assert!(matches!(
        p.set_scan_owner(current_tid(), 64),
        Err(EptError::SlotOutOfRange { slot: 64 })
    ));
}

/// raw_tp program loads and attaches to the real tracepoint; the empty
/// baseline loads and runs.
fn raw_tp_loads_and_attaches() {
    let p = EptPrograms::load(&EptOptions {
        tracepoint: true,
        fexit: false,
        empty_baseline: true,
        attach: true,
        heat: true,
        ..EptOptions::default()
    })
    .unwrap();
    assert_eq!(p.status(EptProgram::SpteChanged), &ProgramStatus::Attached);
    assert_eq!(p.status(EptProgram::Empty), &ProgramStatus::Loaded);
    assert_eq!(
        p.status(EptProgram::FexitAgeGfn),
        &ProgramStatus::NotRequested
    );
    assert_eq!(
        p.test_run(EptProgram::Empty, &[0, 0, 1, YOUNG, OLD])
            .unwrap(),
        0
    );
    assert_eq!(
        p.test_run(EptProgram::SpteChanged, &[0, 0, 1, YOUNG, OLD])
            .unwrap(),
        0
    );
}

/// Everything requested at once: a refused fexit does not take the
/// tracepoint down with it.
fn all_programs_load_what_they_can() {
    let p = EptPrograms::load(&EptOptions::default()).unwrap();
    assert_eq!(p.status(EptProgram::SpteChanged), &ProgramStatus::Attached);
    let f = EptProgram::FexitAgeGfn;
    match p.status(f) {
        ProgramStatus::Attached => {}
        ProgramStatus::Failed(EptError::Load { program, .. }) => assert_eq!(*program, f),
        other => panic!("{f}: {other:?}"),
    }
    // Test-only programs are loaded on request only.
    assert_eq!(p.status(EptProgram::AgeTest), &ProgramStatus::NotRequested);
}

/// Errnos that mean "this kernel does not let fexit attach here", as
/// opposed to a program the verifier rejects (EINVAL, EACCES).
fn fexit_refused(errno: Option<i32>) -> bool {
    matches!(
        errno,
        Some(libc::EPERM)
            | Some(libc::ESRCH)
            | Some(libc::ENOENT)
            | Some(libc::EOPNOTSUPP)
            | Some(524)
    )
}

fn fexit_loads(program: EptProgram) -> Result<Completion, Failed> {
    let p = EptPrograms::load(&EptOptions {
        tracepoint: false,
        fexit: true,
        empty_baseline: false,
        attach: true,
        heat: false,
        ..EptOptions::default()
    })
    .map_err(|e| format!("{e}"))?;
    match p.status(program) {
        ProgramStatus::Attached => Ok(Completion::Completed),
        ProgramStatus::Failed(e) if fexit_refused(e.errno()) => {
            let stage = match e {
                EptError::Load { .. } => "program load",
                _ => "attach",
            };
            let name = match e.errno() {
                Some(libc::EPERM) => "EPERM",
                Some(libc::ESRCH) => "ESRCH",
                Some(libc::ENOENT) => "ENOENT",
                _ => "not supported",
            };
            Ok(Completion::ignored_with(format!(
                "fexit: {name} at {stage} ({e})"
            )))
        }
        other => Err(format!("{program}: {other:?}").into()),
    }
}

/// This file's trials, named `bpf_ept::NAME`.
pub fn trials() -> Vec<Trial> {
    let ready = ept_common::capability();

    let raw_tp = |name: &'static str, f: fn()| ept_common::trial(name, &ready, f);
    let cpus = allowed_cpus();
    let per_cpu = {
        let ready = ready.clone();
        Trial::ignorable_test("bpf_ept::per_cpu_values_are_summed", move || {
            if let Err(reason) = ready {
                return Ok(Completion::ignored_with(reason));
            }
            if cpus.len() < 2 {
                return Ok(Completion::ignored_with(format!(
                    "needs 2 CPUs to run on, this thread may use {cpus:?}"
                )));
            }
            per_cpu_values_are_summed(cpus);
            Ok(Completion::Completed)
        })
    };
    let fexit = |name: &'static str, program: EptProgram| {
        let ready = ready.clone();
        Trial::ignorable_test(name, move || match ready {
            Err(reason) => Ok(Completion::ignored_with(reason)),
            Ok(()) => fexit_loads(program),
        })
    };

    let tests = vec![
        raw_tp(
            "bpf_ept::raw_tp_loads_and_attaches",
            raw_tp_loads_and_attaches,
        ),
        raw_tp(
            "bpf_ept::all_programs_load_what_they_can",
            all_programs_load_what_they_can,
        ),
        fexit("bpf_ept::fexit_kvm_age_gfn_loads", EptProgram::FexitAgeGfn),
        raw_tp("bpf_ept::two_vms_three_tiers", two_vms_three_tiers),
        raw_tp(
            "bpf_ept::range_boundaries_start_in_end_out",
            range_boundaries,
        ),
        raw_tp(
            "bpf_ept::unknown_vm_is_unattributed",
            unknown_vm_is_unattributed,
        ),
        raw_tp(
            "bpf_ept::non_ageing_changes_are_not_counted",
            non_ageing_changes_are_not_counted,
        ),
        raw_tp(
            "bpf_ept::huge_sptes_count_their_pages",
            huge_sptes_count_their_pages,
        ),
        raw_tp("bpf_ept::heat_histogram_buckets", heat_histogram_buckets),
        raw_tp(
            "bpf_ept::heat_overflow_is_counted",
            heat_overflow_is_counted,
        ),
        raw_tp(
            "bpf_ept::scan_owner_cache_collisions",
            scan_owner_cache_collisions,
        ),
        raw_tp(
            "bpf_ept::heat_granules_follow_the_ranges",
            heat_granules_follow_the_ranges,
        ),
        per_cpu,
        raw_tp("bpf_ept::take_and_reset", take_and_reset),
        raw_tp(
            "bpf_ept::sixteen_ranges_and_slot_reuse",
            sixteen_ranges_and_slot_reuse,
        ),
    ];
    tests
}
