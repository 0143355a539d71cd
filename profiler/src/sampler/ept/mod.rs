//! Backend `ept` (BPF part): loads `bpf/ept.bpf.c`, fills its attribution
//! maps and reads its per-(VM, tier) counters.
//!
//! Two hook families count young guest pages as KVM ages its accessed bits
//! (`docs/ept.md`):
//! - `raw_tp/kvm_tdp_mmu_spte_changed`: TDP MMU ageing of a young SPTE,
//!   attributed to the VM that tierd's scanning thread (by tid, see
//!   [`EptPrograms::set_scan_owner`]) is ageing at that moment;
//! - `fexit/kvm_age_gfn`: the result of each ageing call, attributed by the
//!   `struct kvm *` the program learns while a scan owner ages it; ageing of
//!   a known VM by anybody else counts as `foreign` ([`VmCounts::foreign`]).
//!
//! [`HostMode`] reads which MMU the host runs and gives the SPTE masks.
//!
//! Each VM lives in a slot (0..[`MAX_VMS`]) with up to [`MAX_RANGES`] gfn
//! ranges, each in a tier (0..[`MAX_TIERS`]). This module does not know how
//! the daemon numbers VMs or tiers, nor what drives the ageing.

mod counts;
mod error;
mod heat;
mod host;
mod load;
mod maps;
mod owners;
mod ranges;

use std::mem::{ManuallyDrop, MaybeUninit};
use std::ptr::NonNull;

use libbpf_rs::{Link, OpenObject};

use crate::bpf::ept::EptSkel;

pub use counts::{RunStats, RunStatsGuard, TierCount, VmCounts, current_tid, enable_run_stats};
pub use error::EptError;
use error::map_err;
pub use host::{Ageing, HostMode, HostModeError, Vendor};
pub use load::ProgramStatus;
pub(crate) use load::configure;
pub use owners::ScanGuard;
pub use ranges::GfnRange;

/// VM slots in the maps (`MAX_VMS` in `bpf/tier_common.h`).
pub const MAX_VMS: u32 = 64;
/// Tiers per VM (`MAX_TIERS`).
pub const MAX_TIERS: usize = 8;
/// gfn ranges per VM (`MAX_RANGES`).
pub const MAX_RANGES: usize = 16;
/// Entries of the direct-mapped scan owner cache (`SCAN_OWNER_CACHE`).
const SCAN_OWNER_CACHE: u32 = 1024;
/// Default heat histogram size (`HEAT_MAX_ENTRIES`).
pub const HEAT_MAX_ENTRIES: u32 = 65536;
/// Pages per heat granule (2 MiB of 4 KiB pages).
pub const HEAT_GRANULE_PAGES: u64 = 512;

/// Intel EPT accessed bit: `VMX_EPT_ACCESS_BIT` (arch/x86/include/asm/vmx.h),
/// KVM's `shadow_accessed_mask` when EPT A/D bits are on.
pub const EPT_ACCESSED_MASK: u64 = 1 << 8;
/// Intel EPT read/write/execute bits: `VMX_EPT_RWX_MASK`, KVM's
/// `shadow_acc_track_mask` with EPT.
pub const EPT_RWX_MASK: u64 = 0x7;
/// AMD NPT accessed bit: `PT_ACCESSED_MASK` (arch/x86/kvm/mmu.h).
pub const NPT_ACCESSED_MASK: u64 = 1 << 5;

/// What makes a shadow-present SPTE young, as KVM's is_accessed_spte()
/// decides (arch/x86/kvm/mmu/spte.h): `accessed` when the SPTE has A/D
/// bits, any of `access_track` when it carries SPTE_TDP_AD_DISABLED.
/// KVM's own values: kvm_mmu_set_ept_masks() and
/// kvm_mmu_reset_all_pte_masks() (arch/x86/kvm/mmu/spte.c).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpteMasks {
    /// `shadow_accessed_mask`.
    pub accessed: u64,
    /// `shadow_acc_track_mask`.
    pub access_track: u64,
}

impl SpteMasks {
    /// Intel EPT with A/D bits (`kvm_intel.eptad=Y`).
    pub const EPT_AD: SpteMasks = SpteMasks {
        accessed: EPT_ACCESSED_MASK,
        access_track: EPT_RWX_MASK,
    };
    /// Intel EPT without A/D bits: ageing is access tracking.
    pub const EPT_ACCESS_TRACK: SpteMasks = SpteMasks {
        accessed: 0,
        access_track: EPT_RWX_MASK,
    };
    /// AMD NPT (always has an accessed bit).
    pub const NPT: SpteMasks = SpteMasks {
        accessed: NPT_ACCESSED_MASK,
        access_track: 0,
    };
}

/// Byte size of `struct tier_count` (`tier_common.h`).
const TIER_COUNT_SIZE: usize = 24;

/// The programs of `bpf/ept.bpf.c`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EptProgram {
    /// `raw_tp/kvm_tdp_mmu_spte_changed`.
    SpteChanged,
    /// `fexit/kvm_age_gfn`.
    FexitAgeGfn,
    /// `raw_tp ept_age_test`: the fexit hook's attribution on arguments
    /// given to BPF_PROG_TEST_RUN. Loaded on request, never attached.
    AgeTest,
    /// `raw_tp_empty`: does nothing; baseline for the cost benchmark.
    /// Loaded on request, never attached.
    Empty,
}

impl EptProgram {
    pub const ALL: [EptProgram; 4] = [
        EptProgram::SpteChanged,
        EptProgram::FexitAgeGfn,
        EptProgram::AgeTest,
        EptProgram::Empty,
    ];

    /// Section and hook, as the kernel sees it.
    pub fn name(self) -> &'static str {
        match self {
            EptProgram::SpteChanged => "raw_tp/kvm_tdp_mmu_spte_changed",
            EptProgram::FexitAgeGfn => "fexit/kvm_age_gfn",
            EptProgram::AgeTest => "raw_tp ept_age_test",
            EptProgram::Empty => "raw_tp_empty",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for EptProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What to load, and the `.rodata` constants set before load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EptOptions {
    /// Load `raw_tp/kvm_tdp_mmu_spte_changed`.
    pub tracepoint: bool,
    /// Load `fexit/kvm_age_gfn`.
    pub fexit: bool,
    /// Load `ept_age_test` (tests: the fexit attribution through
    /// BPF_PROG_TEST_RUN).
    pub age_test: bool,
    /// Load the empty baseline program (benchmarks).
    pub empty_baseline: bool,
    /// Attach what loaded; without it programs only run through
    /// BPF_PROG_TEST_RUN ([`EptPrograms::test_run`]).
    pub attach: bool,
    /// Record the heat histogram.
    pub heat: bool,
    /// Heat histogram capacity (entries); ignored (1) without `heat`.
    pub heat_entries: u32,
    /// The host's SPTE masks ([`HostMode::tracepoint_masks`]).
    pub masks: SpteMasks,
}

impl Default for EptOptions {
    fn default() -> EptOptions {
        EptOptions {
            tracepoint: true,
            fexit: true,
            empty_baseline: false,
            attach: true,
            heat: false,
            heat_entries: HEAT_MAX_ENTRIES,
            age_test: false,
            masks: SpteMasks::EPT_AD,
        }
    }
}

impl EptOptions {
    fn requested(&self) -> Vec<EptProgram> {
        EptProgram::ALL
            .into_iter()
            .filter(|p| match p {
                EptProgram::SpteChanged => self.tracepoint,
                EptProgram::FexitAgeGfn => self.fexit,
                EptProgram::AgeTest => self.age_test,
                EptProgram::Empty => self.empty_baseline,
            })
            .collect()
    }
}

/// Loaded EPT programs and their maps.
///
/// Owns the skeleton's object storage: the skeleton borrows it, so it is a
/// heap allocation freed in `Drop` after the skeleton.
pub struct EptPrograms {
    links: Vec<Link>,
    skel: ManuallyDrop<EptSkel<'static>>,
    storage: NonNull<MaybeUninit<OpenObject>>,
    status: [ProgramStatus; 4],
    options: EptOptions,
    /// Slot -> counters at the last take.
    taken: Vec<VmCounts>,
    /// Heat slots handed to each VM's ranges, and readings at the last drain.
    heat: heat::HeatSlots,
}

// SAFETY: `storage` is uniquely owned by this value (no other pointer to it
// escapes, and only the skeleton borrows it); the skeleton, the links and
// the Object in `storage` are Send themselves (libbpf-rs declares them so:
// libbpf objects are not bound to a thread).
unsafe impl Send for EptPrograms {}

impl std::fmt::Debug for EptPrograms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EptPrograms")
            .field("status", &self.status)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}
