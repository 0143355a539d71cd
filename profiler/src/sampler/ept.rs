//! Backend `ept` (BPF part): loads `bpf/ept.bpf.c`, fills its attribution
//! maps and reads its per-(VM, tier) counters.
//!
//! Two hook families count young guest pages as KVM ages its accessed bits
//! (`docs/ept.md`):
//! - `raw_tp/kvm_tdp_mmu_spte_changed`: TDP MMU ageing of a young SPTE,
//!   attributed to the VM that tierd's scanning thread (by tid, see
//!   [`EptPrograms::set_scan_owner`]) is ageing at that moment;
//! - `fexit/kvm_age_gfn` and `fexit/kvm_test_age_gfn`: the result of each
//!   ageing call, attributed by `kvm->userspace_pid` ([`EptPrograms::set_vm`]).
//!
//! Each VM lives in a slot (0..[`MAX_VMS`]) with up to [`MAX_RANGES`] gfn
//! ranges, each in a tier (0..[`MAX_TIERS`]). This module does not know how
//! the daemon numbers VMs or tiers, nor what drives the ageing.

use std::collections::BTreeMap;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, ProgramInput};

use crate::bpf::ept::{EptSkel, EptSkelBuilder, OpenEptSkel};

/// VM slots in the maps (`MAX_VMS` in `bpf/tier_common.h`).
pub const MAX_VMS: u32 = 64;
/// Tiers per VM (`MAX_TIERS`).
pub const MAX_TIERS: usize = 8;
/// gfn ranges per VM (`MAX_RANGES`).
pub const MAX_RANGES: usize = 16;
/// Default heat histogram size (`HEAT_MAX_ENTRIES`).
pub const HEAT_MAX_ENTRIES: u32 = 65536;
/// Pages per heat granule (2 MiB of 4 KiB pages).
pub const HEAT_GRANULE_PAGES: u64 = 512;

/// Intel EPT accessed bit: `VMX_EPT_ACCESS_BIT` (arch/x86/include/asm/vmx.h),
/// KVM's `shadow_accessed_mask` when EPT A/D bits are on.
pub const EPT_ACCESSED_MASK: u64 = 1 << 8;
/// Intel EPT present bits: `VMX_EPT_RWX_MASK`.
pub const EPT_PRESENT_MASK: u64 = 0x7;
/// AMD NPT accessed bit: `PT_ACCESSED_MASK`.
pub const NPT_ACCESSED_MASK: u64 = 1 << 5;
/// AMD NPT present bit: `PT_PRESENT_MASK`.
pub const NPT_PRESENT_MASK: u64 = 1;

/// Byte sizes of the shared C structs (`tier_common.h`).
const GFN_RANGE_SIZE: usize = 24;
const VM_RANGES_SIZE: usize = 8 + MAX_RANGES * GFN_RANGE_SIZE;
const TIER_COUNT_SIZE: usize = 24;
const HEAT_KEY_SIZE: usize = 16;

/// The programs of `bpf/ept.bpf.c`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EptProgram {
    /// `raw_tp/kvm_tdp_mmu_spte_changed`.
    SpteChanged,
    /// `fexit/kvm_age_gfn`.
    FexitAgeGfn,
    /// `fexit/kvm_test_age_gfn`.
    FexitTestAgeGfn,
    /// `raw_tp_empty`: does nothing; baseline for the cost benchmark.
    /// Loaded on request, never attached.
    Empty,
}

impl EptProgram {
    pub const ALL: [EptProgram; 4] = [
        EptProgram::SpteChanged,
        EptProgram::FexitAgeGfn,
        EptProgram::FexitTestAgeGfn,
        EptProgram::Empty,
    ];

    /// Section and hook, as the kernel sees it.
    pub fn name(self) -> &'static str {
        match self {
            EptProgram::SpteChanged => "raw_tp/kvm_tdp_mmu_spte_changed",
            EptProgram::FexitAgeGfn => "fexit/kvm_age_gfn",
            EptProgram::FexitTestAgeGfn => "fexit/kvm_test_age_gfn",
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
    /// Load `fexit/kvm_age_gfn` and `fexit/kvm_test_age_gfn`.
    pub fexit: bool,
    /// Load the empty baseline program (benchmarks).
    pub empty_baseline: bool,
    /// Attach what loaded; without it programs only run through
    /// BPF_PROG_TEST_RUN ([`EptPrograms::test_run`]).
    pub attach: bool,
    /// Record the heat histogram.
    pub heat: bool,
    /// Heat histogram capacity (entries); ignored (1) without `heat`.
    pub heat_entries: u32,
    /// SPTE accessed bit(s) ([`EPT_ACCESSED_MASK`], [`NPT_ACCESSED_MASK`]).
    pub accessed_mask: u64,
    /// SPTE present bit(s) ([`EPT_PRESENT_MASK`], [`NPT_PRESENT_MASK`]).
    pub present_mask: u64,
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
            accessed_mask: EPT_ACCESSED_MASK,
            present_mask: EPT_PRESENT_MASK,
        }
    }
}

impl EptOptions {
    fn requested(&self) -> Vec<EptProgram> {
        EptProgram::ALL
            .into_iter()
            .filter(|p| match p {
                EptProgram::SpteChanged => self.tracepoint,
                EptProgram::FexitAgeGfn | EptProgram::FexitTestAgeGfn => self.fexit,
                EptProgram::Empty => self.empty_baseline,
            })
            .collect()
    }
}

/// Errors of the EPT loader and its maps.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EptError {
    #[error("open ept.bpf.o: {message}")]
    Open { message: String },
    #[error("{program}: load: {message}")]
    Load {
        program: EptProgram,
        errno: Option<i32>,
        message: String,
    },
    #[error("load ept.bpf.o ({programs}): {message}")]
    Object {
        programs: String,
        errno: Option<i32>,
        message: String,
    },
    #[error("{program}: attach: {message}")]
    Attach {
        program: EptProgram,
        errno: Option<i32>,
        message: String,
    },
    #[error("{program} is not loaded")]
    NotLoaded { program: EptProgram },
    #[error("{program}: test run: {message}")]
    TestRun {
        program: EptProgram,
        errno: Option<i32>,
        message: String,
    },
    #[error("map {map}: {op}: {message}")]
    Map {
        map: &'static str,
        op: &'static str,
        message: String,
    },
    #[error("vm slot {slot} out of range (0..{MAX_VMS})")]
    SlotOutOfRange { slot: u32 },
    #[error("gfn ranges: {reason}")]
    BadRanges { reason: String },
    #[error("{what}: {message}")]
    Os { what: &'static str, message: String },
}

impl EptError {
    /// The errno behind the error, where the kernel gave one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            EptError::Load { errno, .. }
            | EptError::Object { errno, .. }
            | EptError::Attach { errno, .. }
            | EptError::TestRun { errno, .. } => *errno,
            _ => None,
        }
    }
}

/// The errno in a libbpf-rs error ("... (os error N)"), which does not
/// expose it otherwise.
fn errno_of(e: &libbpf_rs::Error) -> Option<i32> {
    let text = format!("{e:#}");
    let start = text.rfind("(os error ")? + "(os error ".len();
    let rest = &text[start..];
    rest[..rest.find(')')?].parse().ok()
}

/// "EPERM: Operation not permitted (os error 1)" for the common errnos.
fn describe(e: &libbpf_rs::Error) -> (Option<i32>, String) {
    let errno = errno_of(e);
    let name = errno.and_then(|n| {
        Some(match n {
            libc::EPERM => "EPERM",
            libc::ENOENT => "ENOENT",
            libc::ESRCH => "ESRCH",
            libc::E2BIG => "E2BIG",
            libc::EACCES => "EACCES",
            libc::EBUSY => "EBUSY",
            libc::EINVAL => "EINVAL",
            libc::ENOMEM => "ENOMEM",
            libc::ENOSPC => "ENOSPC",
            libc::EOPNOTSUPP => "EOPNOTSUPP",
            524 => "ENOTSUPP",
            _ => return None,
        })
    });
    let message = match name {
        Some(name) => format!("{name}: {e:#}"),
        None => format!("{e:#}"),
    };
    (errno, message)
}

fn map_err(map: &'static str, op: &'static str) -> impl FnOnce(libbpf_rs::Error) -> EptError {
    move |e| EptError::Map {
        map,
        op,
        message: format!("{e:#}"),
    }
}

/// State of one program after [`EptPrograms::load`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProgramStatus {
    /// Not asked for in [`EptOptions`].
    NotRequested,
    /// Loaded; not attached (`attach: false`, or the empty baseline).
    Loaded,
    /// Loaded and attached to its hook.
    Attached,
    /// Refused by the kernel, at load or attach.
    Failed(EptError),
}

/// One (VM, tier) or unmapped or unattributed counter, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierCount {
    /// Pages the hook examined (= young for the tracepoint, which fires
    /// only for young SPTEs).
    pub checked_pages: u64,
    /// Pages found young (accessed since the previous ageing).
    pub young_pages: u64,
    /// Hook invocations that touched this counter.
    pub events: u64,
}

impl TierCount {
    fn from_bytes(b: &[u8]) -> TierCount {
        TierCount {
            checked_pages: u64_at(b, 0),
            young_pages: u64_at(b, 8),
            events: u64_at(b, 16),
        }
    }

    fn add(self, o: TierCount) -> TierCount {
        TierCount {
            checked_pages: self.checked_pages.wrapping_add(o.checked_pages),
            young_pages: self.young_pages.wrapping_add(o.young_pages),
            events: self.events.wrapping_add(o.events),
        }
    }

    fn since(self, base: TierCount) -> TierCount {
        TierCount {
            checked_pages: self.checked_pages.wrapping_sub(base.checked_pages),
            young_pages: self.young_pages.wrapping_sub(base.young_pages),
            events: self.events.wrapping_sub(base.events),
        }
    }
}

/// All counters of one VM slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VmCounts {
    /// Indexed by tier.
    pub tiers: [TierCount; MAX_TIERS],
    /// Pages of the VM outside every one of its ranges.
    pub unmapped: TierCount,
}

impl VmCounts {
    fn since(&self, base: &VmCounts) -> VmCounts {
        let mut out = VmCounts {
            unmapped: self.unmapped.since(base.unmapped),
            ..VmCounts::default()
        };
        for (o, (a, b)) in out.tiers.iter_mut().zip(self.tiers.iter().zip(&base.tiers)) {
            *o = a.since(*b);
        }
        out
    }
}

/// `[start_gfn, end_gfn)` of guest-physical memory lying in `tier`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GfnRange {
    pub start_gfn: u64,
    pub end_gfn: u64,
    pub tier: u32,
}

/// In-kernel run statistics of one program (needs [`enable_run_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunStats {
    pub run_cnt: u64,
    pub run_time_ns: u64,
}

/// Keeps BPF run-time statistics (`run_cnt`, `run_time_ns` of every
/// program) on while alive, like `kernel.bpf_stats_enabled=1` but undone
/// when dropped.
#[derive(Debug)]
pub struct RunStatsGuard {
    _fd: OwnedFd,
}

/// Turns on BPF run-time statistics (BPF_ENABLE_STATS) until the guard drops.
pub fn enable_run_stats() -> Result<RunStatsGuard, EptError> {
    // SAFETY: a plain syscall wrapper without pointers.
    let fd = unsafe {
        libbpf_rs::libbpf_sys::bpf_enable_stats(libbpf_rs::libbpf_sys::BPF_STATS_RUN_TIME)
    };
    if fd < 0 {
        return Err(EptError::Os {
            what: "BPF_ENABLE_STATS",
            message: std::io::Error::from_raw_os_error(-fd).to_string(),
        });
    }
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(RunStatsGuard { _fd: fd })
}

/// The calling thread's id, the key of [`EptPrograms::set_scan_owner`].
pub fn current_tid() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    tid as u32
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        v.copy_from_slice(s);
    }
    u64::from_ne_bytes(v)
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
    /// Slot -> pid registered in vm_by_pid.
    pids: [Option<u32>; MAX_VMS as usize],
    /// Slot -> counters at the last take.
    taken: Vec<VmCounts>,
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
            .field("pids", &self.pids)
            .finish_non_exhaustive()
    }
}

impl Drop for EptPrograms {
    fn drop(&mut self) {
        self.links.clear();
        // SAFETY: dropped once, here; nothing uses the skeleton afterwards.
        unsafe { ManuallyDrop::drop(&mut self.skel) };
        // SAFETY: `storage` came from Box::into_raw in `load_object` and the
        // skeleton that borrowed it is gone.
        drop(unsafe { Box::from_raw(self.storage.as_ptr()) });
    }
}

/// Opens the skeleton with `programs` set to autoload, applies the options
/// and loads it. On success the returned storage must outlive the skeleton.
fn load_object(
    options: &EptOptions,
    programs: &[EptProgram],
) -> Result<(NonNull<MaybeUninit<OpenObject>>, EptSkel<'static>), EptError> {
    let raw = Box::into_raw(Box::new(MaybeUninit::<OpenObject>::uninit()));
    // SAFETY: `raw` is a fresh allocation; the only reference made from it
    // is handed to the skeleton, and the allocation is freed either below
    // (after the failed skeleton is dropped) or in EptPrograms::drop (after
    // the skeleton is dropped).
    let storage: &'static mut MaybeUninit<OpenObject> = unsafe { &mut *raw };
    let result = open_configure_load(storage, options, programs);
    match result {
        Ok(skel) => {
            // SAFETY: Box::into_raw never returns null.
            Ok((unsafe { NonNull::new_unchecked(raw) }, skel))
        }
        Err(e) => {
            // SAFETY: the skeleton that borrowed `raw` was dropped inside
            // open_configure_load when it failed.
            drop(unsafe { Box::from_raw(raw) });
            Err(e)
        }
    }
}

fn open_configure_load(
    storage: &'static mut MaybeUninit<OpenObject>,
    options: &EptOptions,
    programs: &[EptProgram],
) -> Result<EptSkel<'static>, EptError> {
    let mut open: OpenEptSkel<'static> =
        EptSkelBuilder::default()
            .open(storage)
            .map_err(|e| EptError::Open {
                message: format!("{e:#}"),
            })?;
    let on = |p| programs.contains(&p);
    open.progs
        .ept_spte_changed
        .set_autoload(on(EptProgram::SpteChanged));
    open.progs
        .ept_fexit_age_gfn
        .set_autoload(on(EptProgram::FexitAgeGfn));
    open.progs
        .ept_fexit_test_age_gfn
        .set_autoload(on(EptProgram::FexitTestAgeGfn));
    open.progs.raw_tp_empty.set_autoload(on(EptProgram::Empty));
    let entries = if options.heat {
        options.heat_entries.max(1)
    } else {
        1
    };
    open.maps
        .heat
        .set_max_entries(entries)
        .map_err(map_err("heat", "set_max_entries"))?;
    let rodata = open.maps.rodata_data.as_deref_mut().ok_or(EptError::Open {
        message: "no .rodata in ept.bpf.o".into(),
    })?;
    rodata.heat_enabled = options.heat;
    rodata.accessed_mask = options.accessed_mask;
    rodata.present_mask = options.present_mask;
    open.load().map_err(|e| {
        let (errno, message) = describe(&e);
        match programs {
            [one] => EptError::Load {
                program: *one,
                errno,
                message,
            },
            [] => EptError::Object {
                programs: "maps only".into(),
                errno,
                message,
            },
            _ => EptError::Object {
                programs: programs
                    .iter()
                    .map(|p| p.name())
                    .collect::<Vec<_>>()
                    .join(", "),
                errno,
                message,
            },
        }
    })
}

impl EptPrograms {
    /// Loads the requested programs and attaches those that load (when
    /// `options.attach`). A program the kernel refuses does not stop the
    /// others: each is then tried alone to find out which one, and why
    /// ([`EptPrograms::status`]). Errors only when the object itself (its
    /// maps) cannot be loaded.
    pub fn load(options: &EptOptions) -> Result<EptPrograms, EptError> {
        let requested = options.requested();
        let mut status: [ProgramStatus; 4] = std::array::from_fn(|_| ProgramStatus::NotRequested);
        let loaded = match load_object(options, &requested) {
            Ok(loaded) => {
                for p in &requested {
                    status[p.index()] = ProgramStatus::Loaded;
                }
                loaded
            }
            Err(e @ EptError::Open { .. }) => return Err(e),
            Err(only @ EptError::Load { .. }) => {
                // One program requested, and refused.
                if let [p] = requested.as_slice() {
                    status[p.index()] = ProgramStatus::Failed(only);
                }
                load_object(options, &[])?
            }
            Err(first) => {
                // Which one was refused: try each alone.
                let mut good = Vec::new();
                for p in &requested {
                    match load_object(options, std::slice::from_ref(p)) {
                        Ok(one) => {
                            drop(Self::from_parts(one, options, status.clone()));
                            good.push(*p);
                            status[p.index()] = ProgramStatus::Loaded;
                        }
                        Err(e) => status[p.index()] = ProgramStatus::Failed(e),
                    }
                }
                if good.len() == requested.len() {
                    // Each loads alone but not together: report that.
                    return Err(first);
                }
                load_object(options, &good)?
            }
        };
        let mut progs = Self::from_parts(loaded, options, status);
        if options.attach {
            progs.attach_loaded();
        }
        Ok(progs)
    }

    fn from_parts(
        (storage, skel): (NonNull<MaybeUninit<OpenObject>>, EptSkel<'static>),
        options: &EptOptions,
        status: [ProgramStatus; 4],
    ) -> EptPrograms {
        EptPrograms {
            links: Vec::new(),
            skel: ManuallyDrop::new(skel),
            storage,
            status,
            options: *options,
            pids: [None; MAX_VMS as usize],
            taken: vec![VmCounts::default(); MAX_VMS as usize],
        }
    }

    fn attach_loaded(&mut self) {
        for p in [
            EptProgram::SpteChanged,
            EptProgram::FexitAgeGfn,
            EptProgram::FexitTestAgeGfn,
        ] {
            if self.status[p.index()] != ProgramStatus::Loaded {
                continue;
            }
            let progs = &self.skel.progs;
            let prog = match p {
                EptProgram::SpteChanged => &progs.ept_spte_changed,
                EptProgram::FexitAgeGfn => &progs.ept_fexit_age_gfn,
                EptProgram::FexitTestAgeGfn => &progs.ept_fexit_test_age_gfn,
                EptProgram::Empty => continue,
            };
            self.status[p.index()] = match prog.attach() {
                Ok(link) => {
                    self.links.push(link);
                    ProgramStatus::Attached
                }
                Err(e) => {
                    let (errno, message) = describe(&e);
                    ProgramStatus::Failed(EptError::Attach {
                        program: p,
                        errno,
                        message,
                    })
                }
            };
        }
    }

    /// The options it was loaded with.
    pub fn options(&self) -> &EptOptions {
        &self.options
    }

    /// What happened to `program`.
    pub fn status(&self, program: EptProgram) -> &ProgramStatus {
        &self.status[program.index()]
    }

    /// Every program with its status, in [`EptProgram::ALL`] order.
    pub fn statuses(&self) -> Vec<(EptProgram, &ProgramStatus)> {
        EptProgram::ALL
            .into_iter()
            .map(|p| (p, self.status(p)))
            .collect()
    }

    fn prog(&self, program: EptProgram) -> Result<&libbpf_rs::ProgramMut<'static>, EptError> {
        match self.status(program) {
            ProgramStatus::Loaded | ProgramStatus::Attached => {}
            _ => return Err(EptError::NotLoaded { program }),
        }
        let progs = &self.skel.progs;
        Ok(match program {
            EptProgram::SpteChanged => &progs.ept_spte_changed,
            EptProgram::FexitAgeGfn => &progs.ept_fexit_age_gfn,
            EptProgram::FexitTestAgeGfn => &progs.ept_fexit_test_age_gfn,
            EptProgram::Empty => &progs.raw_tp_empty,
        })
    }

    /// Runs a loaded raw_tp program once through BPF_PROG_TEST_RUN on the
    /// calling thread's CPU, with `args` as the tracepoint arguments (one
    /// u64 each; for `kvm_tdp_mmu_spte_changed`: as_id, gfn, level,
    /// old_spte, new_spte). Returns the program's return value.
    pub fn test_run(&self, program: EptProgram, args: &[u64]) -> Result<u32, EptError> {
        self.test_run_repeat(program, args, 0).map(|(ret, _)| ret)
    }

    /// [`EptPrograms::test_run`] with the kernel's own timing loop: `repeat`
    /// runs and their mean duration. Raw tracepoint programs do not support
    /// it (the kernel answers EINVAL to any `repeat` other than 0; see the
    /// bpf-cost bench, which uses [`EptPrograms::run_stats`] instead).
    pub fn test_run_repeat(
        &self,
        program: EptProgram,
        args: &[u64],
        repeat: u32,
    ) -> Result<(u32, std::time::Duration), EptError> {
        let prog = self.prog(program)?;
        let mut ctx: Vec<u8> = args.iter().flat_map(|a| a.to_ne_bytes()).collect();
        let input = ProgramInput {
            context_in: Some(&mut ctx),
            repeat,
            ..ProgramInput::default()
        };
        prog.test_run(input)
            .map(|out| (out.return_value, out.duration))
            .map_err(|e| {
                let (errno, message) = describe(&e);
                EptError::TestRun {
                    program,
                    errno,
                    message,
                }
            })
    }

    /// In-kernel run count and time of `program` (counted only while
    /// [`enable_run_stats`] is on).
    pub fn run_stats(&self, program: EptProgram) -> Result<RunStats, EptError> {
        let prog = self.prog(program)?;
        let mut info = libbpf_rs::libbpf_sys::bpf_prog_info::default();
        let mut len = std::mem::size_of_val(&info) as u32;
        // SAFETY: `info` and `len` are valid for writes and `len` is the
        // size of `info`; the fd is the program's, alive for the call.
        let rc = unsafe {
            libbpf_rs::libbpf_sys::bpf_prog_get_info_by_fd(
                prog.as_fd().as_raw_fd(),
                &mut info,
                &mut len,
            )
        };
        if rc != 0 {
            return Err(EptError::Os {
                what: "bpf_prog_get_info_by_fd",
                message: std::io::Error::from_raw_os_error(-rc).to_string(),
            });
        }
        Ok(RunStats {
            run_cnt: info.run_cnt,
            run_time_ns: info.run_time_ns,
        })
    }

    fn check_slot(slot: u32) -> Result<(), EptError> {
        if slot < MAX_VMS {
            Ok(())
        } else {
            Err(EptError::SlotOutOfRange { slot })
        }
    }

    /// Puts a VM in `slot`: its gfn ranges with their tiers, and the
    /// `kvm->userspace_pid` the fexit hooks know it by (the tid of the
    /// thread that issued KVM_CREATE_VM, also the number in its
    /// `/sys/kernel/debug/kvm/<pid>-<fd>` directory). Ranges must not
    /// overlap; any order. Replaces what the slot held; counters are kept (use
    /// [`EptPrograms::clear_vm`] for a new VM).
    pub fn set_vm(
        &mut self,
        slot: u32,
        pid: Option<u32>,
        ranges: &[GfnRange],
    ) -> Result<(), EptError> {
        Self::check_slot(slot)?;
        validate_ranges(ranges)?;
        // The program binary-searches them: sorted by start.
        let mut sorted = ranges.to_vec();
        sorted.sort_by_key(|r| r.start_gfn);
        let mut value = vec![0u8; VM_RANGES_SIZE];
        value[0..4].copy_from_slice(&(sorted.len() as u32).to_ne_bytes());
        for (i, r) in sorted.iter().enumerate() {
            let at = 8 + i * GFN_RANGE_SIZE;
            value[at..at + 8].copy_from_slice(&r.start_gfn.to_ne_bytes());
            value[at + 8..at + 16].copy_from_slice(&r.end_gfn.to_ne_bytes());
            value[at + 16..at + 20].copy_from_slice(&r.tier.to_ne_bytes());
        }
        self.skel
            .maps
            .vm_ranges
            .update(&slot.to_ne_bytes(), &value, MapFlags::ANY)
            .map_err(map_err("vm_ranges", "update"))?;
        let old = self.pids[slot as usize];
        if let Some(old) = old
            && Some(old) != pid
        {
            self.delete_pid(old)?;
        }
        if let Some(pid) = pid {
            // A pid names one VM: a slot that had it loses it.
            for (other, p) in self.pids.iter_mut().enumerate() {
                if *p == Some(pid) && other != slot as usize {
                    *p = None;
                }
            }
            self.skel
                .maps
                .vm_by_pid
                .update(&pid.to_ne_bytes(), &slot.to_ne_bytes(), MapFlags::ANY)
                .map_err(map_err("vm_by_pid", "update"))?;
        }
        self.pids[slot as usize] = pid;
        Ok(())
    }

    /// The slot the fexit hooks attribute `kvm->userspace_pid == pid` to.
    pub fn slot_of_pid(&self, pid: u32) -> Result<Option<u32>, EptError> {
        Ok(self
            .skel
            .maps
            .vm_by_pid
            .lookup(&pid.to_ne_bytes(), MapFlags::ANY)
            .map_err(map_err("vm_by_pid", "lookup"))?
            .map(|v| u32_at(&v, 0)))
    }

    fn delete_pid(&self, pid: u32) -> Result<(), EptError> {
        match self.skel.maps.vm_by_pid.delete(&pid.to_ne_bytes()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(map_err("vm_by_pid", "delete")(e)),
        }
    }

    /// Empties `slot`: no ranges (events of its owner count as unmapped),
    /// no pid, counters and heat zeroed.
    pub fn clear_vm(&mut self, slot: u32) -> Result<(), EptError> {
        self.set_vm(slot, None, &[])?;
        self.reset_vm_counts(slot)?;
        let keys = self.heat_keys()?;
        for k in keys.iter().filter(|k| u32_at(k, 0) == slot) {
            match self.skel.maps.heat.delete(k) {
                Ok(()) => {}
                Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => {}
                Err(e) => return Err(map_err("heat", "delete")(e)),
            }
        }
        Ok(())
    }

    /// From now on, ageing events on thread `tid` count for the VM in `slot`.
    pub fn set_scan_owner(&self, tid: u32, slot: u32) -> Result<(), EptError> {
        Self::check_slot(slot)?;
        self.skel
            .maps
            .scan_owner
            .update(&tid.to_ne_bytes(), &slot.to_ne_bytes(), MapFlags::ANY)
            .map_err(map_err("scan_owner", "update"))
    }

    /// Ageing events on thread `tid` are unattributed again.
    pub fn clear_scan_owner(&self, tid: u32) -> Result<(), EptError> {
        match self.skel.maps.scan_owner.delete(&tid.to_ne_bytes()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(map_err("scan_owner", "delete")(e)),
        }
    }

    /// Makes the calling thread the scan owner of `slot` until the guard
    /// drops.
    pub fn scan_as(&self, slot: u32) -> Result<ScanGuard<'_>, EptError> {
        let tid = current_tid();
        self.set_scan_owner(tid, slot)?;
        Ok(ScanGuard { progs: self, tid })
    }

    fn percpu_sum(
        &self,
        map: &libbpf_rs::MapMut<'static>,
        name: &'static str,
        key: u32,
    ) -> Result<TierCount, EptError> {
        let values = map
            .lookup_percpu(&key.to_ne_bytes(), MapFlags::ANY)
            .map_err(map_err(name, "lookup"))?
            .unwrap_or_default();
        Ok(values
            .iter()
            .map(|v| TierCount::from_bytes(v))
            .fold(TierCount::default(), TierCount::add))
    }

    fn percpu_zero(
        &self,
        map: &libbpf_rs::MapMut<'static>,
        name: &'static str,
        key: u32,
        size: usize,
    ) -> Result<(), EptError> {
        let cpus = libbpf_rs::num_possible_cpus().map_err(map_err(name, "num_possible_cpus"))?;
        let zeros = vec![vec![0u8; size]; cpus];
        map.update_percpu(&key.to_ne_bytes(), &zeros, MapFlags::ANY)
            .map_err(map_err(name, "update"))
    }

    /// Totals of `slot` since load or the last reset, summed over CPUs.
    pub fn vm_counts(&self, slot: u32) -> Result<VmCounts, EptError> {
        Self::check_slot(slot)?;
        let mut out = VmCounts::default();
        for (tier, c) in out.tiers.iter_mut().enumerate() {
            let key = slot * MAX_TIERS as u32 + tier as u32;
            *c = self.percpu_sum(&self.skel.maps.tier_counts, "tier_counts", key)?;
        }
        out.unmapped = self.percpu_sum(&self.skel.maps.unmapped, "unmapped", slot)?;
        Ok(out)
    }

    /// One (VM, tier) counter as each possible CPU holds it.
    pub fn tier_count_per_cpu(&self, slot: u32, tier: u32) -> Result<Vec<TierCount>, EptError> {
        Self::check_slot(slot)?;
        if tier as usize >= MAX_TIERS {
            return Err(EptError::BadRanges {
                reason: format!("tier {tier} out of range (0..{MAX_TIERS})"),
            });
        }
        let key = slot * MAX_TIERS as u32 + tier;
        Ok(self
            .skel
            .maps
            .tier_counts
            .lookup_percpu(&key.to_ne_bytes(), MapFlags::ANY)
            .map_err(map_err("tier_counts", "lookup"))?
            .unwrap_or_default()
            .iter()
            .map(|v| TierCount::from_bytes(v))
            .collect())
    }

    /// Counts of `slot` since the previous take (or reset): read and reset
    /// without losing events that land meanwhile, as the kernel's counters
    /// only grow and the previous reading is kept here.
    pub fn take_vm_counts(&mut self, slot: u32) -> Result<VmCounts, EptError> {
        let now = self.vm_counts(slot)?;
        let base = std::mem::replace(&mut self.taken[slot as usize], now);
        Ok(now.since(&base))
    }

    /// Zeroes the counters of `slot` on every CPU.
    pub fn reset_vm_counts(&mut self, slot: u32) -> Result<(), EptError> {
        Self::check_slot(slot)?;
        for tier in 0..MAX_TIERS as u32 {
            let key = slot * MAX_TIERS as u32 + tier;
            self.percpu_zero(
                &self.skel.maps.tier_counts,
                "tier_counts",
                key,
                TIER_COUNT_SIZE,
            )?;
        }
        self.percpu_zero(&self.skel.maps.unmapped, "unmapped", slot, TIER_COUNT_SIZE)?;
        self.taken[slot as usize] = VmCounts::default();
        Ok(())
    }

    /// Ageing events no VM could be found for, summed over CPUs.
    pub fn unattributed(&self) -> Result<TierCount, EptError> {
        self.percpu_sum(&self.skel.maps.unattributed, "unattributed", 0)
    }

    /// Zeroes [`EptPrograms::unattributed`].
    pub fn reset_unattributed(&self) -> Result<(), EptError> {
        self.percpu_zero(
            &self.skel.maps.unattributed,
            "unattributed",
            0,
            TIER_COUNT_SIZE,
        )
    }

    /// Young pages not recorded because the heat histogram was full.
    pub fn heat_dropped(&self) -> Result<u64, EptError> {
        let values = self
            .skel
            .maps
            .heat_dropped
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .map_err(map_err("heat_dropped", "lookup"))?
            .unwrap_or_default();
        Ok(values
            .iter()
            .map(|v| u64_at(v, 0))
            .fold(0u64, u64::wrapping_add))
    }

    /// Zeroes [`EptPrograms::heat_dropped`].
    pub fn reset_heat_dropped(&self) -> Result<(), EptError> {
        self.percpu_zero(&self.skel.maps.heat_dropped, "heat_dropped", 0, 8)
    }

    fn heat_keys(&self) -> Result<Vec<Vec<u8>>, EptError> {
        Ok(self
            .skel
            .maps
            .heat
            .keys()
            .filter(|k| k.len() == HEAT_KEY_SIZE)
            .collect())
    }

    /// The heat histogram: (vm slot, 2 MiB granule = gfn / 512) -> young
    /// pages since load or the last drain.
    pub fn heat(&self) -> Result<BTreeMap<(u32, u64), u64>, EptError> {
        self.read_heat(false)
    }

    /// Like [`EptPrograms::heat`], removing each entry atomically as it is
    /// read (young pages added later start a new entry).
    pub fn drain_heat(&self) -> Result<BTreeMap<(u32, u64), u64>, EptError> {
        self.read_heat(true)
    }

    fn read_heat(&self, drain: bool) -> Result<BTreeMap<(u32, u64), u64>, EptError> {
        let map = &self.skel.maps.heat;
        let mut out = BTreeMap::new();
        for k in self.heat_keys()? {
            let v = if drain {
                map.lookup_and_delete(&k)
                    .map_err(map_err("heat", "lookup_and_delete"))?
            } else {
                map.lookup(&k, MapFlags::ANY)
                    .map_err(map_err("heat", "lookup"))?
            };
            if let Some(v) = v {
                out.insert((u32_at(&k, 0), u64_at(&k, 8)), u64_at(&v, 0));
            }
        }
        Ok(out)
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut v = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        v.copy_from_slice(s);
    }
    u32::from_ne_bytes(v)
}

fn validate_ranges(ranges: &[GfnRange]) -> Result<(), EptError> {
    let bad = |reason: String| Err(EptError::BadRanges { reason });
    if ranges.len() > MAX_RANGES {
        return bad(format!("{} ranges, at most {MAX_RANGES}", ranges.len()));
    }
    for r in ranges {
        if r.start_gfn >= r.end_gfn {
            return bad(format!(
                "empty range [{:#x}, {:#x})",
                r.start_gfn, r.end_gfn
            ));
        }
        if r.tier as usize >= MAX_TIERS {
            return bad(format!("tier {} out of range (0..{MAX_TIERS})", r.tier));
        }
    }
    let mut sorted: Vec<&GfnRange> = ranges.iter().collect();
    sorted.sort_by_key(|r| r.start_gfn);
    for w in sorted.windows(2) {
        if w[1].start_gfn < w[0].end_gfn {
            return bad(format!(
                "[{:#x}, {:#x}) overlaps [{:#x}, {:#x})",
                w[0].start_gfn, w[0].end_gfn, w[1].start_gfn, w[1].end_gfn
            ));
        }
    }
    Ok(())
}

/// Scan ownership of the calling thread, cleared on drop.
#[derive(Debug)]
pub struct ScanGuard<'a> {
    progs: &'a EptPrograms,
    tid: u32,
}

impl Drop for ScanGuard<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.progs.clear_scan_owner(self.tid) {
            tracing::warn!("clearing scan owner {}: {e}", self.tid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_validated() {
        let r = |s, e, t| GfnRange {
            start_gfn: s,
            end_gfn: e,
            tier: t,
        };
        assert!(validate_ranges(&[r(0, 10, 0), r(10, 20, 1)]).is_ok());
        assert!(validate_ranges(&[r(10, 20, 1), r(0, 10, 0)]).is_ok());
        assert!(validate_ranges(&[r(0, 11, 0), r(10, 20, 1)]).is_err());
        assert!(validate_ranges(&[r(5, 5, 0)]).is_err());
        assert!(validate_ranges(&[r(0, 1, 8)]).is_err());
        let many: Vec<GfnRange> = (0..17).map(|i| r(i * 2, i * 2 + 1, 0)).collect();
        assert!(validate_ranges(&many).is_err());
        assert!(validate_ranges(&many[..16]).is_ok());
    }

    #[test]
    fn errno_is_read_from_libbpf_errors() {
        let e = libbpf_rs::Error::from_raw_os_error(libc::EPERM);
        assert_eq!(errno_of(&e), Some(libc::EPERM));
        let (errno, msg) = describe(&e);
        assert_eq!(errno, Some(1));
        assert!(msg.starts_with("EPERM: "), "{msg}");
    }

    #[test]
    fn counts_subtract_per_field() {
        let a = TierCount {
            checked_pages: 10,
            young_pages: 5,
            events: 2,
        };
        let b = TierCount {
            checked_pages: 4,
            young_pages: 1,
            events: 1,
        };
        assert_eq!(
            a.since(b),
            TierCount {
                checked_pages: 6,
                young_pages: 4,
                events: 1
            }
        );
    }
}
