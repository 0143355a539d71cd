//! Loads `bpf/pmu.bpf.c`, opens perf events on vCPU threads (the
//! `perf-event-open` crate) and attaches the `perf_event` program to each
//! with the tier index as BPF cookie; reads the per-(VM, tier) counters.
//!
//! Attribution: `vcpu_owner[tid] -> vm slot` ([`PmuPrograms::set_vcpu`]),
//! the tier from the cookie of the event that overflowed. Samples on a
//! thread with no owner go to [`PmuPrograms::unattributed`].

use std::mem::{ManuallyDrop, MaybeUninit};
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, PerfEventOpts};
use perf_event_open::config::{Cpu, Opts, Proc, SampleOn};
use perf_event_open::count::Counter;
use perf_event_open::event::hw::Hardware;
use perf_event_open::event::raw::Raw;
use perf_event_open::event::sw::Software;

use super::events::{EventEntry, EventType};
use crate::bpf::pmu::{PmuSkel, PmuSkelBuilder};

/// VM slots (`PMU_MAX_VMS` in `bpf/pmu.bpf.c`).
pub const MAX_VMS: u32 = 64;
/// Tiers per VM (`PMU_MAX_TIERS`).
pub const MAX_TIERS: u32 = 8;
/// Byte size of `struct pmu_count`.
const PMU_COUNT_SIZE: usize = 16;

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
    #[error("{event}: {message}")]
    Unsupported { event: String, message: String },
    #[error("vm slot {slot} out of range (0..{MAX_VMS})")]
    SlotOutOfRange { slot: u32 },
    #[error("tier {tier} out of range (0..{MAX_TIERS})")]
    TierOutOfRange { tier: u32 },
}

/// What to open: one table entry's event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventSpec {
    pub name: String,
    pub event_type: EventType,
    pub config: u64,
}

impl From<&EventEntry> for EventSpec {
    fn from(e: &EventEntry) -> EventSpec {
        EventSpec {
            name: e.name.clone(),
            event_type: e.event_type,
            config: e.config,
        }
    }
}

/// How to open an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenOptions {
    /// Count only while the thread runs guest code (`exclude_host`).
    pub guest_only: bool,
    /// Overflow (and run the BPF program) every `sample_period` events;
    /// 0: count only.
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
            config1: 0,
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
    o.exclude.host = opts.guest_only;
    o.enable = opts.enabled;
    if opts.sample_period > 0 {
        o.sample_on = SampleOn::Count(opts.sample_period);
        o.sample_format.data_addr = opts.sample_addr;
    }
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

fn errno_of(e: &libbpf_rs::Error) -> Option<i32> {
    let text = format!("{e:#}");
    let start = text.rfind("(os error ")? + "(os error ".len();
    let rest = &text[start..];
    rest[..rest.find(')')?].parse().ok()
}

fn open_and_load(
    storage: &'static mut MaybeUninit<OpenObject>,
) -> Result<PmuSkel<'static>, PmuError> {
    let open = PmuSkelBuilder::default()
        .open(storage)
        .map_err(|e| PmuError::Open {
            message: format!("{e:#}"),
        })?;
    open.load().map_err(|e| {
        let errno = errno_of(&e);
        let message = match errno.and_then(errno_name) {
            Some(n) => format!("{n}: {e:#}"),
            None => format!("{e:#}"),
        };
        PmuError::Load { errno, message }
    })
}

impl PmuPrograms {
    /// Loads the program and its maps (nothing is attached yet).
    pub fn load() -> Result<PmuPrograms, PmuError> {
        let raw = Box::into_raw(Box::new(MaybeUninit::<OpenObject>::uninit()));
        // SAFETY: `raw` is a fresh allocation; the only reference made from
        // it goes to the skeleton, and it is freed below (after a failed
        // skeleton is gone) or in Drop (after the skeleton is dropped).
        let storage: &'static mut MaybeUninit<OpenObject> = unsafe { &mut *raw };
        match open_and_load(storage) {
            Ok(skel) => Ok(PmuPrograms {
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
    /// the tier as cookie, then enables the event. Failures are collected
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
        if tier >= MAX_TIERS {
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
                    cookie: u64::from(tier),
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

    /// Zeroes the counters of `slot`.
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
        Ok(())
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        v.copy_from_slice(s);
    }
    u64::from_ne_bytes(v)
}
