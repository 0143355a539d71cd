//! Opens perf events on vCPU threads (the `perf-event-open` crate):
//! counting ones, read with their enabled/running times ([`read_counter`],
//! what the daemon uses), or sampling ones with `bpf/pmu.bpf.c`'s
//! `perf_event` program attached and the tier index as BPF cookie.
//!
//! Sampling attribution: `vcpu_owner[tid] -> vm slot`
//! ([`PmuPrograms::set_vcpu`]), the tier from the cookie of the event that
//! overflowed. Samples on a thread with no owner go to
//! [`PmuPrograms::unattributed`]; samples of a VM that fit none of its
//! tiers to [`PmuPrograms::no_tier`]. The data_src decoder and the VM's
//! tier per kind ([`PmuPrograms::set_kind_tiers`]) run only in
//! `pmu_account_test` ([`PmuPrograms::test_account`]).
//!
//! The same object holds the KVM_RUN watch ([`PmuPrograms::watch_kvm_run`]):
//! raw tracepoints `kvm_entry` and `kvm_userspace_exit` record which
//! threads run guest code, for VMMs that do not name vCPU threads.

use std::mem::{ManuallyDrop, MaybeUninit};
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, PerfEventOpts};
use perf_event_open::config::{Cpu, Opts, Proc, SampleOn, SampleSkid};
use perf_event_open::count::Counter;
use perf_event_open::event::hw::Hardware;
use perf_event_open::event::raw::Raw;
use perf_event_open::event::sw::Software;

use super::events::{EventEntry, EventType, TierKind};
use super::vcpus::KvmRunThread;
use crate::bpf::pmu::{PmuSkel, PmuSkelBuilder};

/// VM slots (`PMU_MAX_VMS` in `bpf/pmu.bpf.c`).
pub const MAX_VMS: u32 = 64;
/// Tiers per VM (`PMU_MAX_TIERS`).
pub const MAX_TIERS: u32 = 8;
/// Byte size of `struct pmu_count`.
const PMU_COUNT_SIZE: usize = 16;
/// Cookie tier meaning "none" (`PMU_NO_TIER`): a `data_src` entry's
/// samples without data_src go to [`PmuPrograms::no_tier`].
pub const NO_TIER: u32 = 0xff;
/// Cookie flag `PMU_COOKIE_DATA_SRC`.
pub const COOKIE_DATA_SRC: u64 = 1 << 8;
/// Decoded sources (`PMU_SRC_COUNT` in `bpf/pmu_data_src.h`); index of
/// [`PmuPrograms::no_tier`].
pub const SRC_COUNT: u32 = 8;
/// Byte size of `struct kvm_thread`.
const KVM_THREAD_SIZE: usize = 48;
/// Raw tracepoints of the KVM_RUN watch.
pub const KVM_RUN_TRACEPOINTS: [&str; 2] = ["kvm_entry", "kvm_userspace_exit"];

/// Errors of the PMU loader, its maps and its perf events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PmuError {
    #[error("open pmu.bpf.o: {message}")]
    Open { message: String },
    #[error("load pmu.bpf.o: {message}")]
    Load { errno: Option<i32>, message: String },
    #[error("map {map}: {op}: {message}")]
    Map {
        map: &'static str,
        op: &'static str,
        message: String,
    },
    #[error("{event} on thread {tid}: perf_event_open: {message}")]
    PerfOpen {
        event: String,
        tid: u32,
        errno: Option<i32>,
        message: String,
    },
    #[error("{event} on thread {tid}: attach: {message}")]
    Attach {
        event: String,
        tid: u32,
        message: String,
    },
    #[error("{event} on thread {tid}: enable: {message}")]
    Enable {
        event: String,
        tid: u32,
        message: String,
    },
    #[error("{event}: read: {message}")]
    Read { event: String, message: String },
    #[error("{event}: {message}")]
    Unsupported { event: String, message: String },
    #[error("vm slot {slot} out of range (0..{MAX_VMS})")]
    SlotOutOfRange { slot: u32 },
    #[error("tier {tier} out of range (0..{MAX_TIERS})")]
    TierOutOfRange { tier: u32 },
    #[error("raw tracepoint {tracepoint}: attach: {message}")]
    AttachTracepoint {
        tracepoint: &'static str,
        message: String,
    },
    #[error("test run: {message}")]
    TestRun { message: String },
}

/// What to open: one table entry's event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EventSpec {
    pub name: String,
    pub event_type: EventType,
    pub config: u64,
    /// `perf_event_attr.config1` (raw events, e.g. a load-latency threshold).
    pub config1: u64,
    /// Sample period; `None`: [`OpenOptions::sample_period`].
    pub period: Option<u64>,
    /// Precise (`precise_ip` 2) with PERF_SAMPLE_DATA_SRC: the tier comes
    /// from each sample's data_src.
    pub data_src: bool,
}

impl EventSpec {
    /// A counting or sampling event of `event_type`/`config`, nothing else set.
    pub fn new(name: &str, event_type: EventType, config: u64) -> EventSpec {
        EventSpec {
            name: name.into(),
            event_type,
            config,
            ..EventSpec::default()
        }
    }
}

impl From<&EventEntry> for EventSpec {
    fn from(e: &EventEntry) -> EventSpec {
        EventSpec {
            name: e.name.clone(),
            event_type: e.event_type,
            config: e.config,
            config1: e.config1,
            period: Some(e.period),
            data_src: e.data_src,
        }
    }
}

/// The attach cookie of an event counted in `tier` (or [`NO_TIER`]).
pub fn cookie(tier: u32, data_src: bool) -> u64 {
    u64::from(tier & 0xff) | if data_src { COOKIE_DATA_SRC } else { 0 }
}

/// How to open an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenOptions {
    /// Count only while the thread runs guest code (`exclude_host`).
    /// Hardware and raw events only: software events (tests) have no
    /// guest mode and count everything.
    pub guest_only: bool,
    /// Overflow (and run the BPF program) every `sample_period` events
    /// unless the event has its own period; 0: count only.
    pub sample_period: u64,
    /// PERF_SAMPLE_ADDR in samples.
    pub sample_addr: bool,
    /// Start counting at once (otherwise after the program is attached).
    pub enabled: bool,
}

impl Default for OpenOptions {
    fn default() -> OpenOptions {
        OpenOptions {
            guest_only: true,
            sample_period: 0,
            sample_addr: false,
            enabled: false,
        }
    }
}

fn errno_name(n: i32) -> Option<&'static str> {
    Some(match n {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EACCES => "EACCES",
        libc::EINVAL => "EINVAL",
        libc::ENODEV => "ENODEV",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::E2BIG => "E2BIG",
        libc::EBUSY => "EBUSY",
        // Kernel-internal ENOTSUPP, e.g. BPF_PROG_TEST_RUN on a program
        // type without a test run.
        524 => "ENOTSUPP",
        _ => return None,
    })
}

fn describe_io(e: &std::io::Error) -> String {
    match e.raw_os_error().and_then(errno_name) {
        Some(name) => format!("{name}: {e}"),
        None => e.to_string(),
    }
}

/// The crate's event for `spec`, opened at once (its `Counter::new` takes
/// each event type directly).
enum AnyEvent {
    Raw(Raw),
    Software(Software),
    Hardware(Hardware),
}

fn event_of(spec: &EventSpec) -> Result<AnyEvent, PmuError> {
    let unsupported = |message: String| PmuError::Unsupported {
        event: spec.name.clone(),
        message,
    };
    Ok(match spec.event_type {
        EventType::Raw => AnyEvent::Raw(Raw {
            config: spec.config,
            config1: spec.config1,
            config2: 0,
            config3: 0,
        }),
        EventType::Software => AnyEvent::Software(match spec.config {
            0 => Software::CpuClock,
            1 => Software::TaskClock,
            2 => Software::PageFault,
            3 => Software::CtxSwitch,
            4 => Software::CpuMigration,
            5 => Software::MinorPageFault,
            6 => Software::MajorPageFault,
            other => {
                return Err(unsupported(format!(
                    "software config {other} not supported"
                )));
            }
        }),
        EventType::Hardware => AnyEvent::Hardware(match spec.config {
            0 => Hardware::CpuCycle,
            1 => Hardware::Instr,
            2 => Hardware::CacheAccess,
            3 => Hardware::CacheMiss,
            other => {
                return Err(unsupported(format!(
                    "hardware config {other} not supported"
                )));
            }
        }),
    })
}

/// Opens `spec` on thread `tid` (0: the calling thread), any CPU.
pub fn open_event(tid: u32, spec: &EventSpec, opts: &OpenOptions) -> Result<Counter, PmuError> {
    let event = event_of(spec)?;
    let mut o = Opts::default();
    o.exclude.host = opts.guest_only && spec.event_type != EventType::Software;
    o.enable = opts.enabled;
    let period = spec.period.unwrap_or(opts.sample_period);
    if period > 0 {
        o.sample_on = SampleOn::Count(period);
        o.sample_format.data_addr = opts.sample_addr;
    }
    if spec.data_src {
        o.sample_skid = SampleSkid::ReqZero;
        o.sample_format.data_source = true;
    }
    // Counting reads scale by these when counters are multiplexed.
    o.stat_format.time_enabled = true;
    o.stat_format.time_running = true;
    let target = (Proc(tid), Cpu::ALL);
    let counter = match event {
        AnyEvent::Raw(e) => Counter::new(e, target, &o),
        AnyEvent::Software(e) => Counter::new(e, target, &o),
        AnyEvent::Hardware(e) => Counter::new(e, target, &o),
    };
    counter.map_err(|e| PmuError::PerfOpen {
        event: spec.name.clone(),
        tid,
        errno: e.raw_os_error(),
        message: describe_io(&e),
    })
}

/// One read of a counting event: its count and the nanoseconds it was
/// enabled and actually running (below enabled: multiplexed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reading {
    pub count: u64,
    pub enabled_ns: u64,
    pub running_ns: u64,
}

impl Reading {
    /// What happened between `earlier` and this reading.
    pub fn since(&self, earlier: &Reading) -> Reading {
        Reading {
            count: self.count.saturating_sub(earlier.count),
            enabled_ns: self.enabled_ns.saturating_sub(earlier.enabled_ns),
            running_ns: self.running_ns.saturating_sub(earlier.running_ns),
        }
    }
}

/// Reads a counter opened by [`open_event`] (which asks for both times).
pub fn read_counter(counter: &Counter, event: &str) -> Result<Reading, PmuError> {
    let s = counter.stat().map_err(|e| PmuError::Read {
        event: event.into(),
        message: describe_io(&e),
    })?;
    Ok(Reading {
        count: s.count,
        enabled_ns: s.time_enabled.unwrap_or(0),
        running_ns: s.time_running.unwrap_or(0),
    })
}

/// Per-(VM, tier) or unattributed counter, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PmuCount {
    /// Overflows the program saw.
    pub samples: u64,
    /// Sum of their sample periods: events counted.
    pub period: u64,
}

/// One event attached on one thread.
pub struct AttachedEvent {
    pub name: String,
    pub tier: u32,
    counter: Counter,
    _link: Link,
}

impl std::fmt::Debug for AttachedEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachedEvent")
            .field("name", &self.name)
            .field("tier", &self.tier)
            .finish_non_exhaustive()
    }
}

impl AttachedEvent {
    /// The counter's own value (events counted while enabled).
    pub fn count(&self) -> Result<u64, PmuError> {
        self.counter
            .stat()
            .map(|s| s.count)
            .map_err(|e| PmuError::Enable {
                event: self.name.clone(),
                tid: 0,
                message: format!("read: {}", describe_io(&e)),
            })
    }
}

/// The events of one vCPU thread; dropping it detaches and closes them.
#[derive(Debug)]
pub struct ThreadEvents {
    pub tid: u32,
    pub attached: Vec<AttachedEvent>,
    /// Events that could not be opened or attached on this thread.
    pub failed: Vec<PmuError>,
}

/// The loaded `pmu_sample` program and its maps.
pub struct PmuPrograms {
    /// KVM_RUN watch links; dropped before the skeleton.
    kvm_links: Vec<Link>,
    skel: ManuallyDrop<PmuSkel<'static>>,
    storage: NonNull<MaybeUninit<OpenObject>>,
}

// SAFETY: `storage` is uniquely owned by this value (only the skeleton
// borrows it); the skeleton and the Object in `storage` are Send (libbpf
// objects are not bound to a thread).
unsafe impl Send for PmuPrograms {}

impl std::fmt::Debug for PmuPrograms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PmuPrograms").finish_non_exhaustive()
    }
}

impl Drop for PmuPrograms {
    fn drop(&mut self) {
        self.kvm_links.clear();
        // SAFETY: dropped once, here; nothing uses the skeleton afterwards.
        unsafe { ManuallyDrop::drop(&mut self.skel) };
        // SAFETY: `storage` came from Box::into_raw in `load` and the
        // skeleton that borrowed it is gone.
        drop(unsafe { Box::from_raw(self.storage.as_ptr()) });
    }
}

fn map_err(map: &'static str, op: &'static str) -> impl FnOnce(libbpf_rs::Error) -> PmuError {
    move |e| PmuError::Map {
        map,
        op,
        message: format!("{e:#}"),
    }
}

/// A libbpf error with its errno named where known.
fn describe_bpf(e: &libbpf_rs::Error) -> String {
    match errno_of(e).and_then(errno_name) {
        Some(n) => format!("{n}: {e:#}"),
        None => format!("{e:#}"),
    }
}

fn errno_of(e: &libbpf_rs::Error) -> Option<i32> {
    let text = format!("{e:#}");
    let start = text.rfind("(os error ")? + "(os error ".len();
    let rest = &text[start..];
    rest[..rest.find(')')?].parse().ok()
}

fn open_and_load(
    storage: &'static mut MaybeUninit<OpenObject>,
    test_program: bool,
) -> Result<PmuSkel<'static>, PmuError> {
    let mut open = PmuSkelBuilder::default()
        .open(storage)
        .map_err(|e| PmuError::Open {
            message: format!("{e:#}"),
        })?;
    open.progs.pmu_account_test.set_autoload(test_program);
    open.load().map_err(|e| PmuError::Load {
        errno: errno_of(&e),
        message: describe_bpf(&e),
    })
}

impl PmuPrograms {
    /// Loads the programs and their maps (nothing is attached yet).
    pub fn load() -> Result<PmuPrograms, PmuError> {
        PmuPrograms::load_inner(false)
    }

    /// [`PmuPrograms::load`] plus `pmu_account_test`, for
    /// [`PmuPrograms::test_account`].
    pub fn load_with_test_program() -> Result<PmuPrograms, PmuError> {
        PmuPrograms::load_inner(true)
    }

    fn load_inner(test_program: bool) -> Result<PmuPrograms, PmuError> {
        let raw = Box::into_raw(Box::new(MaybeUninit::<OpenObject>::uninit()));
        // SAFETY: `raw` is a fresh allocation; the only reference made from
        // it goes to the skeleton, and it is freed below (after a failed
        // skeleton is gone) or in Drop (after the skeleton is dropped).
        let storage: &'static mut MaybeUninit<OpenObject> = unsafe { &mut *raw };
        match open_and_load(storage, test_program) {
            Ok(skel) => Ok(PmuPrograms {
                kvm_links: Vec::new(),
                skel: ManuallyDrop::new(skel),
                // SAFETY: Box::into_raw never returns null.
                storage: unsafe { NonNull::new_unchecked(raw) },
            }),
            Err(e) => {
                // SAFETY: the skeleton that borrowed `raw` was dropped
                // inside open_and_load when it failed.
                drop(unsafe { Box::from_raw(raw) });
                Err(e)
            }
        }
    }

    /// From now on, samples on thread `tid` count for the VM in `slot`.
    pub fn set_vcpu(&self, tid: u32, slot: u32) -> Result<(), PmuError> {
        if slot >= MAX_VMS {
            return Err(PmuError::SlotOutOfRange { slot });
        }
        self.skel
            .maps
            .vcpu_owner
            .update(&tid.to_ne_bytes(), &slot.to_ne_bytes(), MapFlags::ANY)
            .map_err(map_err("vcpu_owner", "update"))
    }

    /// Samples on `tid` are unattributed again (a vCPU thread went away).
    pub fn clear_vcpu(&self, tid: u32) -> Result<(), PmuError> {
        match self.skel.maps.vcpu_owner.delete(&tid.to_ne_bytes()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(map_err("vcpu_owner", "delete")(e)),
        }
    }

    /// Opens each `(event, tier)` on thread `tid`, attaches the program with
    /// the tier as cookie ([`cookie`]; `tier` may be [`NO_TIER`] for a
    /// `data_src` event), then enables the event. Failures are collected
    /// per event in [`ThreadEvents::failed`]; the others keep running.
    pub fn attach_thread(
        &self,
        tid: u32,
        events: &[(EventSpec, u32)],
        opts: &OpenOptions,
    ) -> ThreadEvents {
        let mut out = ThreadEvents {
            tid,
            attached: Vec::new(),
            failed: Vec::new(),
        };
        let opts = OpenOptions {
            enabled: false,
            ..*opts
        };
        for (spec, tier) in events {
            match self.attach_one(tid, spec, *tier, &opts) {
                Ok(a) => out.attached.push(a),
                Err(e) => out.failed.push(e),
            }
        }
        out
    }

    fn attach_one(
        &self,
        tid: u32,
        spec: &EventSpec,
        tier: u32,
        opts: &OpenOptions,
    ) -> Result<AttachedEvent, PmuError> {
        if tier >= MAX_TIERS && tier != NO_TIER {
            return Err(PmuError::TierOutOfRange { tier });
        }
        let counter = open_event(tid, spec, opts)?;
        let link = self
            .skel
            .progs
            .pmu_sample
            .attach_perf_event_with_opts(
                counter.file().as_raw_fd(),
                PerfEventOpts {
                    cookie: cookie(tier, spec.data_src),
                    ..PerfEventOpts::default()
                },
            )
            .map_err(|e| PmuError::Attach {
                event: spec.name.clone(),
                tid,
                message: format!("{e:#}"),
            })?;
        counter.enable().map_err(|e| PmuError::Enable {
            event: spec.name.clone(),
            tid,
            message: describe_io(&e),
        })?;
        Ok(AttachedEvent {
            name: spec.name.clone(),
            tier,
            counter,
            _link: link,
        })
    }

    fn percpu_sum(
        &self,
        map: &libbpf_rs::MapMut<'static>,
        name: &'static str,
        key: u32,
    ) -> Result<PmuCount, PmuError> {
        let values = map
            .lookup_percpu(&key.to_ne_bytes(), MapFlags::ANY)
            .map_err(map_err(name, "lookup"))?
            .unwrap_or_default();
        Ok(values.iter().fold(PmuCount::default(), |acc, v| PmuCount {
            samples: acc.samples.wrapping_add(u64_at(v, 0)),
            period: acc.period.wrapping_add(u64_at(v, 8)),
        }))
    }

    /// Counts of VM `slot`, indexed by tier, summed over CPUs.
    pub fn vm_counts(&self, slot: u32) -> Result<[PmuCount; MAX_TIERS as usize], PmuError> {
        if slot >= MAX_VMS {
            return Err(PmuError::SlotOutOfRange { slot });
        }
        let mut out = [PmuCount::default(); MAX_TIERS as usize];
        for (tier, c) in out.iter_mut().enumerate() {
            *c = self.percpu_sum(
                &self.skel.maps.pmu_counts,
                "pmu_counts",
                slot * MAX_TIERS + tier as u32,
            )?;
        }
        Ok(out)
    }

    /// Samples on threads with no owner (or a bad cookie).
    pub fn unattributed(&self) -> Result<PmuCount, PmuError> {
        self.percpu_sum(&self.skel.maps.pmu_unattributed, "pmu_unattributed", 0)
    }

    /// Samples of VM `slot` that went to none of its tiers, by decoded
    /// source (index: `PMU_SRC_*`, 0 unknown / no data_src, 1..4 a tier
    /// kind the VM has no tier of, 5 cache, 6 I/O, 7 uncached).
    pub fn no_tier(&self, slot: u32) -> Result<[PmuCount; SRC_COUNT as usize], PmuError> {
        if slot >= MAX_VMS {
            return Err(PmuError::SlotOutOfRange { slot });
        }
        let mut out = [PmuCount::default(); SRC_COUNT as usize];
        for (src, c) in out.iter_mut().enumerate() {
            *c = self.percpu_sum(
                &self.skel.maps.pmu_no_tier,
                "pmu_no_tier",
                slot * SRC_COUNT + src as u32,
            )?;
        }
        Ok(out)
    }

    /// Which tier of VM `slot` a precise sample of each kind counts in:
    /// `tiers[i]` is the kind of tier i; the first tier of a kind wins.
    pub fn set_kind_tiers(&self, slot: u32, tiers: &[TierKind]) -> Result<(), PmuError> {
        if slot >= MAX_VMS {
            return Err(PmuError::SlotOutOfRange { slot });
        }
        for src in 0..SRC_COUNT {
            let value = tiers
                .iter()
                .take(MAX_TIERS as usize)
                .position(|k| *k != TierKind::Unknown && *k as u32 == src)
                .map_or(0u32, |i| i as u32 + 1);
            let key = slot * SRC_COUNT + src;
            self.skel
                .maps
                .kind_tier
                .update(&key.to_ne_bytes(), &value.to_ne_bytes(), MapFlags::ANY)
                .map_err(map_err("kind_tier", "update"))?;
        }
        Ok(())
    }

    /// Zeroes the counters of `slot` and forgets its tier kinds.
    pub fn reset_vm(&self, slot: u32) -> Result<(), PmuError> {
        if slot >= MAX_VMS {
            return Err(PmuError::SlotOutOfRange { slot });
        }
        let cpus = libbpf_rs::num_possible_cpus().map_err(map_err("pmu_counts", "cpus"))?;
        let zeros = vec![vec![0u8; PMU_COUNT_SIZE]; cpus];
        for tier in 0..MAX_TIERS {
            let key = slot * MAX_TIERS + tier;
            self.skel
                .maps
                .pmu_counts
                .update_percpu(&key.to_ne_bytes(), &zeros, MapFlags::ANY)
                .map_err(map_err("pmu_counts", "update"))?;
        }
        for src in 0..SRC_COUNT {
            let key = slot * SRC_COUNT + src;
            self.skel
                .maps
                .pmu_no_tier
                .update_percpu(&key.to_ne_bytes(), &zeros, MapFlags::ANY)
                .map_err(map_err("pmu_no_tier", "update"))?;
        }
        self.set_kind_tiers(slot, &[])
    }

    /// Attaches the KVM_RUN watch: one result per tracepoint of
    /// [`KVM_RUN_TRACEPOINTS`]. Attached ones stay attached until drop;
    /// calling it again attaches only what is not attached yet.
    pub fn watch_kvm_run(&mut self) -> Vec<(&'static str, Result<(), PmuError>)> {
        let mut out = Vec::new();
        let already = self.kvm_links.len();
        if already == KVM_RUN_TRACEPOINTS.len() {
            return KVM_RUN_TRACEPOINTS.iter().map(|t| (*t, Ok(()))).collect();
        }
        self.kvm_links.clear();
        for tp in KVM_RUN_TRACEPOINTS {
            let prog = match tp {
                "kvm_entry" => &self.skel.progs.pmu_kvm_entry,
                _ => &self.skel.progs.pmu_kvm_userspace_exit,
            };
            match prog.attach_raw_tracepoint(tp) {
                Ok(link) => {
                    self.kvm_links.push(link);
                    out.push((tp, Ok(())));
                }
                Err(e) => out.push((
                    tp,
                    Err(PmuError::AttachTracepoint {
                        tracepoint: tp,
                        message: describe_bpf(&e),
                    }),
                )),
            }
        }
        out
    }

    /// Every thread the KVM_RUN watch has seen (and not forgotten).
    pub fn kvm_threads(&self) -> Result<Vec<KvmRunThread>, PmuError> {
        let map = &self.skel.maps.kvm_threads;
        let mut out = Vec::new();
        for key in map.keys() {
            // The entry may have been evicted since the key was listed.
            let Some(v) = map
                .lookup(&key, MapFlags::ANY)
                .map_err(map_err("kvm_threads", "lookup"))?
            else {
                continue;
            };
            if v.len() < KVM_THREAD_SIZE || key.len() < 4 {
                continue;
            }
            let tid = u32::from_ne_bytes([key[0], key[1], key[2], key[3]]);
            let u32_at = |at: usize| u32::from_ne_bytes([v[at], v[at + 1], v[at + 2], v[at + 3]]);
            let vcpu_id = u32_at(4) as i32;
            out.push(KvmRunThread {
                tid,
                tgid: u32_at(0),
                vcpu_id: u32::try_from(vcpu_id).ok(),
                start_boottime_ns: u64_at(&v, 16),
                entries: u64_at(&v, 32),
                exits: u64_at(&v, 40),
            });
        }
        out.sort_by_key(|t| t.tid);
        Ok(out)
    }

    /// Deletes the watch's entry of `tid` (its thread exited).
    pub fn forget_kvm_thread(&self, tid: u32) -> Result<(), PmuError> {
        match self.skel.maps.kvm_threads.delete(&tid.to_ne_bytes()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(map_err("kvm_threads", "delete")(e)),
        }
    }

    /// Tries BPF_PROG_TEST_RUN on `pmu_sample` itself with an empty
    /// `bpf_perf_event_data`. Kernels up to at least 6.18 have no test run
    /// for perf_event programs and refuse; the tests record the answer
    /// (hence [`PmuPrograms::test_account`]).
    pub fn test_run_sample(&self) -> Result<u32, PmuError> {
        // struct bpf_perf_event_data: pt_regs (21 u64), sample_period, addr.
        let mut ctx = vec![0u8; 23 * 8];
        let input = libbpf_rs::ProgramInput {
            context_in: Some(&mut ctx),
            ..libbpf_rs::ProgramInput::default()
        };
        self.skel
            .progs
            .pmu_sample
            .test_run(input)
            .map(|out| out.return_value)
            .map_err(|e| PmuError::TestRun {
                message: describe_bpf(&e),
            })
    }

    /// Runs the attribution of `pmu_sample` once through BPF_PROG_TEST_RUN
    /// (`pmu_account_test`, only with [`PmuPrograms::load_with_test_program`])
    /// as if thread `tid` overflowed with this cookie, data_src and period;
    /// returns the source the BPF decoder made of `data_src` (`PMU_SRC_*`).
    pub fn test_account(
        &self,
        tid: u32,
        cookie: u64,
        has_data_src: bool,
        data_src: u64,
        period: u64,
    ) -> Result<u32, PmuError> {
        let mut ctx: Vec<u8> = [
            u64::from(tid),
            cookie,
            u64::from(has_data_src),
            data_src,
            period,
        ]
        .iter()
        .flat_map(|a| a.to_ne_bytes())
        .collect();
        let input = libbpf_rs::ProgramInput {
            context_in: Some(&mut ctx),
            ..libbpf_rs::ProgramInput::default()
        };
        self.skel
            .progs
            .pmu_account_test
            .test_run(input)
            .map_err(|e| PmuError::TestRun {
                message: describe_bpf(&e),
            })?;
        let bss = self
            .skel
            .maps
            .bss_data
            .as_deref()
            .ok_or(PmuError::TestRun {
                message: "no .bss".into(),
            })?;
        // SAFETY: a plain u32 in the mmapped .bss, which the program
        // writes; read volatile so the fresh value is read.
        Ok(unsafe { std::ptr::read_volatile(&bss.pmu_test_source) })
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        v.copy_from_slice(s);
    }
    u64::from_ne_bytes(v)
}
