//! The vhost-user balloon device of SPEC.md: per-tier inflate/deflate
//! queues, the legacy queues, the stats queue, the config space, targets
//! from the control socket and the config-change message.
//!
//! One worker thread serves every queue (vhost-user-backend's default), and
//! all device state sits behind one mutex: a chain costs a few
//! microseconds plus its release calls, so there is nothing to gain from
//! finer locking, and one lock makes the control socket's view consistent.
//!
//! Guest memory: every `SET_MEM_TABLE` / `ADD_MEM_REG` / `REM_MEM_REG`
//! rebuilds the engine ([`crate::release`]): each tier's regions are its
//! ranges (from the command line) intersected with what the frontend
//! mapped, adopted from vhost-user-backend's own `MAP_SHARED` mappings of
//! the frontend's memfds, so a release is one `fallocate(PUNCH_HOLE)` on
//! the frontend's fd at the region's offset plus one `madvise` on our
//! mapping. The legacy queues serve any mapped guest page (v53.0 meaning).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Serialize;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::QueueT;
use virtio_queue::desc::split::Descriptor;
use vm_memory::{
    Address, Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend,
    GuestMemoryMmap, GuestMemoryRegion,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    EventConsumer, EventFlag, EventNotifier, new_event_consumer_and_notifier,
};
use vmm_sys_util::timerfd::TimerFd;

use crate::chain::{ChainError, Walker};
use crate::config::{self, ConfigValues, ConfigWrite};
use crate::release::{
    Backing, HUGE_PAGE_SIZE, LayoutError, MAX_CHAIN_PFNS, Op, PAGE_SIZE, Region, RejectReason,
    SysReleaser, TierBalloon, TierStats, Tiers,
};
use crate::spec::TierSpec;

/// Guest memory as vhost-user-backend hands it over.
pub type Mem = GuestMemoryAtomic<GuestMemoryMmap<()>>;
/// Our vring type.
pub type Vring = VringRwLock<Mem>;

/// Standard balloon feature bits (virtio spec 5.5.3) and ours (SPEC.md 1).
pub const VIRTIO_BALLOON_F_STATS_VQ: u32 = 1;
pub const VIRTIO_BALLOON_F_DEFLATE_ON_OOM: u32 = 2;
pub const VIRTIO_BALLOON_F_TIERS: u32 = 23;
/// Most entries per queue the device accepts (SPEC.md section 3): QEMU's
/// `VIRTQUEUE_MAX_SIZE`. The driver picks the size: cloud-hypervisor's
/// vhost-user frontend asks 128, Linux's virtio_uml 256. Rings live in guest
/// memory, so a larger queue costs the device nothing; chains stay bounded
/// by `MAX_CHAIN_PFNS`.
pub const QUEUE_SIZE: usize = 1024;
/// Most bytes read from one stats buffer (10-byte entries; ours use at
/// most 16 standard + 8 * 16 tier tags).
pub const MAX_STATS_BYTES: usize = 64 << 10;
/// Rejections logged before logging only every 1024th (a guest could
/// otherwise fill the log).
const LOG_FIRST: u64 = 32;

/// How the device is offered.
#[derive(Debug, Clone)]
pub struct DeviceOptions {
    /// Offer `VIRTIO_BALLOON_F_DEFLATE_ON_OOM`.
    pub deflate_on_oom: bool,
    /// How long the device holds a stats buffer (SPEC section 4: 1 s).
    pub stats_interval: Duration,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            deflate_on_oom: false,
            stats_interval: Duration::from_secs(1),
        }
    }
}

/// What a queue index serves, given the negotiated features (SPEC.md 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueRole {
    LegacyInflate,
    LegacyDeflate,
    Stats,
    Tier {
        tier: usize,
        op: Op,
    },
    /// No queue at this index with these features.
    Absent,
}

/// SPEC.md section 3: 0 inflate, 1 deflate, then stats if negotiated
/// (reporting is never offered), then `B + 2*i` / `B + 2*i + 1` per tier
/// if `F_TIERS` is negotiated.
pub fn queue_role(index: usize, features: u64, tiers: usize) -> QueueRole {
    let has = |bit: u32| features & (1u64 << bit) != 0;
    match index {
        0 => return QueueRole::LegacyInflate,
        1 => return QueueRole::LegacyDeflate,
        _ => {}
    }
    let stats = has(VIRTIO_BALLOON_F_STATS_VQ);
    if stats && index == 2 {
        return QueueRole::Stats;
    }
    let base = 2 + usize::from(stats);
    if !has(VIRTIO_BALLOON_F_TIERS) || index < base {
        return QueueRole::Absent;
    }
    let k = index - base;
    if k >= 2 * tiers {
        return QueueRole::Absent;
    }
    QueueRole::Tier {
        tier: k / 2,
        op: if k.is_multiple_of(2) {
            Op::Inflate
        } else {
            Op::Deflate
        },
    }
}

/// A refused `set_targets` (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("unknown zone {zone:?} (zones: {known})")]
    UnknownZone { zone: String, known: String },
    #[error("zone {0:?} listed twice")]
    Duplicate(String),
    #[error("target {bytes} for zone {zone:?} exceeds the zone size {zone_bytes}")]
    AboveZone {
        zone: String,
        bytes: u64,
        zone_bytes: u64,
    },
    #[error("legacy target {bytes} exceeds the guest RAM the tiers describe ({ram})")]
    LegacyTooLarge { bytes: u64, ram: u64 },
}

/// What an accepted `set_targets` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TargetsApplied {
    /// A target value changed.
    pub changed: bool,
    /// A `VHOST_USER_BACKEND_CONFIG_CHANGE_MSG` was written to the frontend.
    pub notified: bool,
}

/// Engine state for the mapped guest memory.
struct Engine {
    tiers: Vec<TierBalloon>,
    legacy: TierBalloon,
    /// Bytes of each tier's ranges the frontend mapped.
    mapped: Vec<u64>,
    regions: usize,
    /// Keeps vhost-user-backend's mappings (which the engine's regions
    /// adopted) alive at least as long as the engine.
    _mem: Option<Arc<GuestMemoryMmap<()>>>,
}

impl Engine {
    /// No memory mapped yet: every tier empty. Fails only for a tier count
    /// outside 1..=8, which [`crate::spec::validate`] already refused.
    fn empty(tiers: usize) -> Result<Engine, LayoutError> {
        let t = Tiers::new_allow_empty((0..tiers).map(|_| Vec::new()).collect())?.into_tiers();
        let legacy = Tiers::new_allow_empty(vec![Vec::new()])?
            .into_tiers()
            .pop()
            .ok_or(LayoutError::TierCount(0))?;
        Ok(Engine {
            tiers: t,
            legacy,
            mapped: vec![0; tiers],
            regions: 0,
            _mem: None,
        })
    }

    /// Takes over counters and balloon state; returns pages that left the
    /// balloon because they are no longer mapped.
    fn adopt(&mut self, old: &Engine) -> u64 {
        let mut dropped = self.legacy.adopt(&old.legacy);
        for (new, old) in self.tiers.iter_mut().zip(&old.tiers) {
            dropped += new.adopt(old);
        }
        dropped
    }

    fn clear(&mut self) {
        self.legacy.clear();
        self.tiers.iter_mut().for_each(TierBalloon::clear);
    }
}

/// hugetlbfs backing gives 2 MiB pages; anything else 4 KiB.
fn backing_of(file: &std::fs::File) -> io::Result<Backing> {
    // SAFETY: fstatfs writes only into the zeroed buffer we own.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd borrowed from a live File, valid out pointer.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;
    Ok(if st.f_type as i64 == HUGETLBFS_MAGIC {
        Backing::Huge2M
    } else {
        Backing::Small
    })
}

fn build_engine(specs: &[TierSpec], mem: Arc<GuestMemoryMmap<()>>) -> io::Result<Engine> {
    let mut tiers: Vec<Vec<Region>> = specs.iter().map(|_| Vec::new()).collect();
    let mut legacy = Vec::new();
    let mut mapped = vec![0u64; specs.len()];
    let mut regions = 0;
    for r in mem.iter() {
        let gpa = r.start_addr().raw_value();
        let len = r.len();
        let host = r.as_ptr();
        let Some(fo) = r.file_offset() else {
            tracing::warn!(
                gpa = format_args!("{gpa:#x}"),
                "guest memory region without a file: its pages are never released"
            );
            continue;
        };
        regions += 1;
        // One unusable region (fstatfs or dup failing, a geometry the
        // engine refuses) must not fail the whole memory update and with
        // it the connection: it is skipped like a region without a file,
        // and PFNs in it are rejected as outside guest memory.
        let skip = |what: &str, e: &dyn std::fmt::Display| {
            tracing::warn!(
                gpa = format_args!("{gpa:#x}"),
                len = format_args!("{len:#x}"),
                "guest memory region skipped ({what}: {e}): its pages are never released"
            );
        };
        let backing = match backing_of(fo.file()) {
            Ok(b) => b,
            Err(e) => {
                skip("fstatfs", &e);
                continue;
            }
        };
        let granule = match backing {
            Backing::Small => PAGE_SIZE,
            Backing::Huge2M => HUGE_PAGE_SIZE,
        };
        // [a, b) of this mapping as an engine region.
        let adopt = |a: u64, b: u64| -> io::Result<Region> {
            let fd = fo.file().as_fd().try_clone_to_owned()?;
            let delta = a - gpa;
            // SAFETY: [host + delta, host + delta + (b - a)) lies inside
            // vhost-user-backend's MAP_SHARED mapping of `fo.file()` at
            // `fo.start() + delta` (MmapRegion::from_file); the engine that
            // owns the region also holds `mem`, which keeps that mapping
            // alive. Discarding ballooned pages is the point.
            unsafe {
                Region::from_mapping(
                    fd,
                    fo.start() + delta,
                    b - a,
                    a,
                    host.add(delta as usize),
                    backing,
                )
            }
            .map_err(io::Error::other)
        };
        let (lo, hi) = (
            gpa.next_multiple_of(granule),
            (gpa + len) / granule * granule,
        );
        if lo < hi {
            match adopt(lo, hi) {
                Ok(r) => legacy.push(r),
                Err(e) => {
                    skip("legacy", &e);
                    continue;
                }
            }
        }
        for (t, spec) in specs.iter().enumerate() {
            for range in &spec.ranges {
                let a = range.start.max(gpa).next_multiple_of(granule);
                let b = range.end().min(gpa + len) / granule * granule;
                if a < b {
                    match adopt(a, b) {
                        Ok(r) => {
                            tiers[t].push(r);
                            mapped[t] += b - a;
                        }
                        Err(e) => skip(&spec.name, &e),
                    }
                }
            }
        }
    }
    let tiers = Tiers::new_allow_empty(tiers)
        .map_err(io::Error::other)?
        .into_tiers();
    let legacy = Tiers::new_allow_empty(vec![legacy])
        .map_err(io::Error::other)?
        .into_tiers()
        .pop()
        .ok_or_else(|| io::Error::other("no legacy balloon"))?;
    Ok(Engine {
        tiers,
        legacy,
        mapped,
        regions,
        _mem: Some(mem),
    })
}

/// Counters of the stats queue.
#[derive(Debug, Default, Clone)]
struct GuestStats {
    updates: u64,
    bad_buffers: u64,
    values: BTreeMap<u16, u64>,
}

#[derive(Debug, Default, Clone, Copy)]
struct ConfigCounters {
    writes_accepted: u64,
    writes_ignored: u64,
    reads_refused: u64,
    changes_sent: u64,
    change_errors: u64,
    changes_suppressed: u64,
}

struct State {
    values: ConfigValues,
    acked_features: u64,
    event_idx: bool,
    mem: Option<Mem>,
    engine: Engine,
    stats: GuestStats,
    /// Head of the stats buffer the device holds.
    stats_held: Option<u16>,
    stats_timer: Option<TimerFd>,
    config: ConfigCounters,
    connected: bool,
    connections: u64,
    /// Rejections so far (for rate-limited logging).
    rejections: u64,
    scratch: Vec<u8>,
    /// The chain being served, as walked by `walker`.
    descs: Vec<Descriptor>,
    walker: Walker,
}

struct Inner {
    specs: Vec<TierSpec>,
    opts: DeviceOptions,
    state: Mutex<State>,
    /// Our end of the frontend's backend-request channel (a dup of the fd
    /// of `VHOST_USER_SET_BACKEND_REQ_FD`, see [`crate::relay`]).
    notify: Mutex<Option<UnixStream>>,
}

/// The balloon device; cheap to clone (shared state).
#[derive(Clone)]
pub struct Balloon {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Balloon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Balloon")
            .field("tiers", &self.inner.specs)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves counters, not memory safety,
    // in question: keep serving.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Balloon {
    /// `specs` must have passed [`crate::spec::validate`].
    pub fn new(specs: Vec<TierSpec>, opts: DeviceOptions) -> Result<Balloon, LayoutError> {
        let n = specs.len();
        let engine = Engine::empty(n)?;
        Ok(Balloon {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    values: ConfigValues::new(n),
                    acked_features: 0,
                    event_idx: false,
                    mem: None,
                    engine,
                    stats: GuestStats::default(),
                    stats_held: None,
                    stats_timer: None,
                    config: ConfigCounters::default(),
                    connected: false,
                    connections: 0,
                    rejections: 0,
                    scratch: Vec::new(),
                    descs: Vec::new(),
                    walker: Walker::default(),
                }),
                specs,
                opts,
                notify: Mutex::new(None),
            }),
        })
    }

    pub fn specs(&self) -> &[TierSpec] {
        &self.inner.specs
    }

    /// Event id of the stats timer on the worker's epoll (ids up to
    /// `num_queues` are vhost-user-backend's).
    pub fn timer_event_id(&self) -> u64 {
        self.num_queues() as u64 + 1
    }

    /// The whole config space as the driver would read it now.
    pub fn config_space(&self) -> Vec<u8> {
        config::render(&self.inner.specs, &lock(&self.inner.state).values)
    }

    /// A new stats timer for a connection; its fd goes on the worker's epoll
    /// with [`Balloon::timer_event_id`].
    pub fn new_stats_timer(&self) -> io::Result<RawFd> {
        let mut t = TimerFd::new()?;
        let i = self.inner.opts.stats_interval;
        t.reset(i, Some(i))?;
        let fd = t.as_raw_fd();
        lock(&self.inner.state).stats_timer = Some(t);
        Ok(fd)
    }

    /// A frontend connected.
    pub fn connected(&self) {
        let mut st = lock(&self.inner.state);
        st.connected = true;
        st.connections += 1;
    }

    /// The frontend went away: its memory, features and driver state go
    /// with it; targets and cumulative counters stay.
    pub fn disconnected(&self) {
        *lock(&self.inner.notify) = None;
        let mut st = lock(&self.inner.state);
        // Drop the engine's regions (and with them our hold on the
        // frontend's mappings), keeping the cumulative counters.
        match Engine::empty(self.inner.specs.len()) {
            Ok(mut fresh) => {
                fresh.adopt(&st.engine);
                st.engine = fresh;
            }
            Err(e) => tracing::error!("cannot reset the engine: {e}"),
        }
        st.mem = None;
        st.acked_features = 0;
        st.event_idx = false;
        st.connected = false;
        st.stats_timer = None;
        Self::forget_driver(&mut st);
    }

    fn forget_driver(st: &mut State) {
        st.engine.clear();
        st.values.legacy_actual = 0;
        st.values.actuals.iter_mut().for_each(|a| *a = 0);
        st.stats_held = None;
    }

    /// A GET_CONFIG (`read`) or SET_CONFIG the relay answered itself
    /// because the vhost crate would have dropped the connection over it
    /// (outside the window, zero length, malformed): counted and logged
    /// like an ignored write.
    pub fn config_request_refused(&self, read: bool, offset: u32, len: u32) {
        let mut st = lock(&self.inner.state);
        let n = if read {
            st.config.reads_refused += 1;
            st.config.reads_refused
        } else {
            st.config.writes_ignored += 1;
            st.config.writes_ignored
        };
        if n <= LOG_FIRST || n.is_multiple_of(1024) {
            tracing::warn!(
                offset = format_args!("{offset:#x}"),
                len,
                total = n,
                "config {} outside the 4 KiB window refused",
                if read { "read" } else { "write" }
            );
        }
    }

    /// Our end of the backend-request channel (from the relay).
    pub fn set_notify_channel(&self, stream: Option<UnixStream>) {
        if let Some(s) = &stream {
            // A frontend that stops reading must not block the control
            // socket for long (12-byte messages: only a full buffer blocks).
            if let Err(e) = s.set_write_timeout(Some(Duration::from_secs(1))) {
                tracing::warn!("backend channel write timeout: {e}");
            }
        }
        *lock(&self.inner.notify) = stream;
    }

    /// Writes `VHOST_USER_BACKEND_CONFIG_CHANGE_MSG` (request 2, version 1,
    /// no payload, no reply asked) on the backend channel.
    fn send_config_change(&self) -> io::Result<()> {
        let guard = lock(&self.inner.notify);
        let Some(s) = guard.as_ref() else {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "no backend channel",
            ));
        };
        let mut msg = [0u8; 12];
        msg[0..4].copy_from_slice(&2u32.to_le_bytes());
        msg[4..8].copy_from_slice(&1u32.to_le_bytes());
        (&*s).write_all(&msg)
    }

    /// Sets targets in bytes (rounded down to 4 KiB): listed zones and,
    /// if given, the legacy target. All or nothing. Sends the config-change
    /// message if a value changed and the driver can act on it (a
    /// tier-only change needs `F_TIERS` negotiated, SPEC section 1).
    pub fn set_targets(
        &self,
        zones: &[(String, u64)],
        legacy: Option<u64>,
    ) -> Result<TargetsApplied, TargetError> {
        let specs = &self.inner.specs;
        let mut new: Vec<(usize, u32)> = Vec::new();
        for (zone, bytes) in zones {
            let Some(i) = specs.iter().position(|s| &s.name == zone) else {
                return Err(TargetError::UnknownZone {
                    zone: zone.clone(),
                    known: specs
                        .iter()
                        .map(|s| s.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            };
            if new.iter().any(|&(j, _)| j == i) {
                return Err(TargetError::Duplicate(zone.clone()));
            }
            let zone_bytes = specs[i].zone_bytes();
            if *bytes > zone_bytes {
                return Err(TargetError::AboveZone {
                    zone: zone.clone(),
                    bytes: *bytes,
                    zone_bytes,
                });
            }
            // Fits: zones are at most 2^32-1 pages (spec parsing).
            new.push((i, u32::try_from(bytes / PAGE_SIZE).unwrap_or(u32::MAX)));
        }
        let legacy_pages = match legacy {
            Some(bytes) => {
                let ram: u64 = specs.iter().map(TierSpec::zone_bytes).sum();
                let pages = u32::try_from(bytes / PAGE_SIZE);
                match pages {
                    Ok(p) if bytes <= ram => Some(p),
                    _ => return Err(TargetError::LegacyTooLarge { bytes, ram }),
                }
            }
            None => None,
        };
        let (changed_legacy, changed_tiers, tiers_negotiated) = {
            let mut st = lock(&self.inner.state);
            let mut changed_tiers = false;
            for (i, p) in new {
                changed_tiers |= st.values.targets[i] != p;
                st.values.targets[i] = p;
            }
            let mut changed_legacy = false;
            if let Some(p) = legacy_pages {
                changed_legacy = st.values.legacy_target != p;
                st.values.legacy_target = p;
            }
            let neg = st.acked_features & (1 << VIRTIO_BALLOON_F_TIERS) != 0;
            (changed_legacy, changed_tiers, neg)
        };
        let changed = changed_legacy || changed_tiers;
        let mut notified = false;
        if changed {
            if changed_legacy || tiers_negotiated {
                let r = self.send_config_change();
                let mut st = lock(&self.inner.state);
                match r {
                    Ok(()) => {
                        st.config.changes_sent += 1;
                        notified = true;
                    }
                    Err(e) => {
                        st.config.change_errors += 1;
                        if st.connected {
                            tracing::warn!("config-change message not sent: {e}");
                        }
                    }
                }
            } else {
                lock(&self.inner.state).config.changes_suppressed += 1;
            }
        }
        Ok(TargetsApplied { changed, notified })
    }

    /// Everything the control socket reports.
    pub fn snapshot(&self) -> Snapshot {
        let notify_channel = lock(&self.inner.notify).is_some();
        let st = lock(&self.inner.state);
        let f = st.acked_features;
        let zones = self
            .inner
            .specs
            .iter()
            .enumerate()
            .map(|(i, spec)| ZoneSnapshot {
                id: spec.name.clone(),
                tier: i,
                target: u64::from(st.values.targets[i]) * PAGE_SIZE,
                actual: u64::from(st.values.actuals[i]) * PAGE_SIZE,
                zone_bytes: spec.zone_bytes(),
                mapped_bytes: st.engine.mapped[i],
                counters: Counters::from(st.engine.tiers[i].stats()),
            })
            .collect();
        Snapshot {
            protocol: 1,
            tiers_offered: true,
            tiers_negotiated: f & (1 << VIRTIO_BALLOON_F_TIERS) != 0,
            stats_negotiated: f & (1 << VIRTIO_BALLOON_F_STATS_VQ) != 0,
            frontend: FrontendSnapshot {
                connected: st.connected,
                connections: st.connections,
                acked_features: f,
                memory_regions: st.engine.regions,
                notify_channel,
            },
            legacy_target: u64::from(st.values.legacy_target) * PAGE_SIZE,
            legacy_actual: u64::from(st.values.legacy_actual) * PAGE_SIZE,
            legacy: Counters::from(st.engine.legacy.stats()),
            zones,
            config: ConfigSnapshot {
                writes_accepted: st.config.writes_accepted,
                writes_ignored: st.config.writes_ignored,
                reads_refused: st.config.reads_refused,
                changes_sent: st.config.changes_sent,
                change_errors: st.config.change_errors,
                changes_suppressed: st.config.changes_suppressed,
            },
            stats: StatsSnapshot {
                updates: st.stats.updates,
                bad_buffers: st.stats.bad_buffers,
                values: st
                    .stats
                    .values
                    .iter()
                    .map(|(&tag, &v)| (stat_name(tag), v))
                    .collect(),
            },
        }
    }

    fn serve_queue(&self, index: usize, vring: &Vring) {
        let (role, mem, event_idx) = {
            let st = lock(&self.inner.state);
            let role = queue_role(index, st.acked_features, self.inner.specs.len());
            (role, st.mem.clone(), st.event_idx)
        };
        if role == QueueRole::Absent {
            return;
        }
        let Some(mem) = mem else {
            return;
        };
        loop {
            if event_idx && let Err(e) = vring.disable_notification() {
                tracing::warn!(queue = index, "disable_notification: {e}");
            }
            let mut used = false;
            loop {
                // Only the head comes from virtio-queue: its chain iterator
                // ends a looping or broken chain as if it were complete, so
                // the chain is walked by `crate::chain` instead.
                let popped = {
                    let mut v = vring.get_mut();
                    let q = v.get_queue_mut();
                    let (table, size) = (q.desc_table(), q.size());
                    q.pop_descriptor_chain(mem.memory())
                        .map(|c| (c.head_index(), table, size))
                };
                let Some((head, table, size)) = popped else {
                    break;
                };
                let guest = mem.memory();
                // The state lock is taken per chain, not for the whole drain:
                // a guest that keeps the queue full must not starve the
                // control socket (targets, state) for as long as it likes.
                let mut guard = lock(&self.inner.state);
                let st = &mut *guard;
                let walked =
                    st.walker
                        .walk(&*guest, GuestAddress(table), size, head, &mut st.descs);
                let hold = match role {
                    QueueRole::Stats => self.take_stats(st, head, walked, &guest, vring),
                    QueueRole::Tier { tier, op } => {
                        self.take_pfns(st, Some(tier), op, walked, &guest);
                        false
                    }
                    QueueRole::LegacyInflate => {
                        self.take_pfns(st, None, Op::Inflate, walked, &guest);
                        false
                    }
                    QueueRole::LegacyDeflate => {
                        self.take_pfns(st, None, Op::Deflate, walked, &guest);
                        false
                    }
                    QueueRole::Absent => false,
                };
                drop(guard);
                if !hold {
                    if let Err(e) = vring.add_used(head, 0) {
                        tracing::warn!(queue = index, "add_used: {e}");
                    }
                    used = true;
                }
            }
            if used {
                signal(vring, index);
            }
            if !event_idx {
                break;
            }
            match vring.enable_notification() {
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => {
                    tracing::warn!(queue = index, "enable_notification: {e}");
                    break;
                }
            }
        }
    }

    /// Reads a walked chain's readable bytes into `scratch`, at most `max`.
    fn gather(
        scratch: &mut Vec<u8>,
        walked: Result<(), ChainError>,
        descs: &[Descriptor],
        guest: &GuestMemoryMmap<()>,
        max: usize,
    ) -> Result<(), Gather> {
        scratch.clear();
        walked.map_err(Gather::Malformed)?;
        for desc in descs {
            if desc.is_write_only() {
                return Err(Gather::Bad(scratch.len()));
            }
            let len = desc.len() as usize;
            let start = scratch.len();
            if start + len > max {
                return Err(Gather::TooLong(start + len));
            }
            scratch.resize(start + len, 0);
            if guest
                .read_slice(&mut scratch[start..], desc.addr())
                .is_err()
            {
                return Err(Gather::Bad(start));
            }
        }
        Ok(())
    }

    fn take_pfns(
        &self,
        st: &mut State,
        tier: Option<usize>,
        op: Op,
        walked: Result<(), ChainError>,
        guest: &GuestMemoryMmap<()>,
    ) {
        let mut scratch = std::mem::take(&mut st.scratch);
        let gathered = Self::gather(&mut scratch, walked, &st.descs, guest, MAX_CHAIN_PFNS * 4);
        let malformed = match gathered {
            Err(Gather::Malformed(e)) => Some(e),
            _ => None,
        };
        let engine = &mut st.engine;
        let balloon = match tier {
            Some(t) => &mut engine.tiers[t],
            None => &mut engine.legacy,
        };
        let result = match gathered {
            Ok(()) => balloon.process_chain(op, &[&scratch], &mut SysReleaser::default()),
            Err(Gather::Bad(bytes)) => {
                Err(balloon.count_rejected(RejectReason::BadDescriptor, bytes / 4))
            }
            Err(Gather::TooLong(bytes)) => {
                Err(balloon.count_rejected(RejectReason::TooLong, bytes / 4))
            }
            // Nothing of a malformed chain is read: no PFN counted.
            Err(Gather::Malformed(_)) => {
                Err(balloon.count_rejected(RejectReason::BadDescriptor, 0))
            }
        };
        st.scratch = scratch;
        let queue = match tier {
            Some(t) => self.inner.specs[t].name.as_str(),
            None => "legacy",
        };
        match result {
            Ok(out) => {
                if out.errors > 0 {
                    tracing::warn!(queue, ?op, errors = out.errors, "release calls failed");
                }
            }
            Err(rej) => {
                st.rejections += 1;
                if st.rejections <= LOG_FIRST || st.rejections.is_multiple_of(1024) {
                    match malformed {
                        Some(e) => tracing::warn!(queue, ?op, total = st.rejections, "{rej}: {e}"),
                        None => tracing::warn!(queue, ?op, total = st.rejections, "{rej}"),
                    }
                }
            }
        }
    }

    /// Stores a stats buffer's entries; returns true if the device now
    /// holds the buffer (it is returned by the stats timer).
    fn take_stats(
        &self,
        st: &mut State,
        head: u16,
        walked: Result<(), ChainError>,
        guest: &GuestMemoryMmap<()>,
        vring: &Vring,
    ) -> bool {
        let mut scratch = std::mem::take(&mut st.scratch);
        let ok = Self::gather(&mut scratch, walked, &st.descs, guest, MAX_STATS_BYTES).is_ok();
        if ok {
            st.stats.values.extend(stats_entries(&scratch));
            st.stats.updates += 1;
        } else {
            st.stats.bad_buffers += 1;
        }
        st.scratch = scratch;
        if !ok {
            return false;
        }
        // A driver has one buffer out; if it posts another, give the old
        // one back rather than hold two.
        if let Some(old) = st.stats_held.replace(head)
            && let Err(e) = vring.add_used(old, 0)
        {
            tracing::warn!("stats add_used: {e}");
        }
        true
    }

    fn stats_tick(&self, vrings: &[Vring]) {
        let mut st = lock(&self.inner.state);
        if let Some(t) = st.stats_timer.as_mut() {
            // Readable (epoll said so): consume the expirations.
            if let Err(e) = t.wait() {
                tracing::warn!("stats timer: {e}");
            }
        }
        let Some(head) = st.stats_held.take() else {
            return;
        };
        if let Some(v) = vrings.get(2) {
            if let Err(e) = v.add_used(head, 0) {
                tracing::warn!("stats add_used: {e}");
            }
            signal(v, 2);
        }
    }
}

fn signal(vring: &Vring, index: usize) {
    match vring.needs_notification() {
        Ok(false) => {}
        _ => {
            if let Err(e) = vring.signal_used_queue() {
                tracing::warn!(queue = index, "signal_used_queue: {e}");
            }
        }
    }
}

enum Gather {
    /// A device-writable or unreadable descriptor after this many bytes.
    Bad(usize),
    /// More than the limit (bytes announced so far).
    TooLong(usize),
    /// The chain itself is malformed (loops, leaves its table, ...).
    Malformed(ChainError),
}

/// The entries of a stats buffer the device keeps, in buffer order:
/// 10-byte entries (le16 tag, le64 value); a trailing partial entry is
/// ignored, and so are tags SPEC.md does not define: a guest cycling
/// through all 65536 tags would otherwise grow the `state` answer past
/// what a VMM reads (about 2 MiB). The caller bounds the buffer
/// ([`MAX_STATS_BYTES`]). Fuzzed by the `fuzz` bench.
pub fn stats_entries(buf: &[u8]) -> impl Iterator<Item = (u16, u64)> + '_ {
    buf.chunks_exact(10).filter_map(|e| {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        if !known_tag(tag) {
            return None;
        }
        let mut v = [0u8; 8];
        v.copy_from_slice(&e[2..10]);
        Some((tag, u64::from_le_bytes(v)))
    })
}

/// Whether SPEC.md section 4 defines `tag`: the standard tags 0-15 and the
/// per-tier ones, `0x8000 + 0x10 * i + {0, 1, 2}` for the 8 possible tiers.
pub fn known_tag(tag: u16) -> bool {
    tag < 16 || ((0x8000..0x8080).contains(&tag) && (tag - 0x8000) % 0x10 < 3)
}

/// SPEC.md section 5 counter names of a stats tag.
pub fn stat_name(tag: u16) -> String {
    const STANDARD: [&str; 16] = [
        "stat_swap_in",
        "stat_swap_out",
        "stat_major_faults",
        "stat_minor_faults",
        "stat_free_memory",
        "stat_total_memory",
        "stat_available_memory",
        "stat_disk_caches",
        "stat_htlb_pgalloc",
        "stat_htlb_pgfail",
        "stat_oom_kills",
        "stat_alloc_stalls",
        "stat_async_scans",
        "stat_direct_scans",
        "stat_async_reclaims",
        "stat_direct_reclaims",
    ];
    if let Some(n) = STANDARD.get(usize::from(tag)) {
        return (*n).to_string();
    }
    if (0x8000..0x8080).contains(&tag) {
        let (i, k) = ((tag - 0x8000) / 0x10, (tag - 0x8000) % 0x10);
        match k {
            0 => return format!("tier{i}_guest_accesses"),
            1 => return format!("tier{i}_guest_free_bytes"),
            2 => return format!("tier{i}_guest_total_bytes"),
            _ => {}
        }
    }
    format!("tag_{tag:#06x}")
}

/// Trusted counters of one balloon (a tier's or the legacy one), bytes
/// and PFN counts.
#[derive(Debug, Clone, Serialize)]
pub struct Counters {
    /// Pages the device counted from accepted PFNs, in bytes (trusted).
    pub host_ballooned: u64,
    pub inflated_pfns: u64,
    pub deflated_pfns: u64,
    /// PFNs in rejected chains.
    pub rejected_pfns: u64,
    /// Rejected chains, all reasons.
    pub rejected_chains: u64,
    /// Rejected chains by reason (`RejectReason::name`).
    pub rejected: BTreeMap<&'static str, u64>,
    /// `fallocate` + `madvise` pairs (one per coalesced run).
    pub release_calls: u64,
    pub released_bytes: u64,
    pub release_errors: u64,
}

impl From<&TierStats> for Counters {
    fn from(s: &TierStats) -> Self {
        Counters {
            host_ballooned: s.ballooned_pages * PAGE_SIZE,
            inflated_pfns: s.inflated_pfns,
            deflated_pfns: s.deflated_pfns,
            rejected_pfns: s.rejected_pfns,
            rejected_chains: s.rejected_total(),
            rejected: RejectReason::ALL
                .iter()
                .map(|&r| (r.name(), s.rejected(r)))
                .collect(),
            release_calls: s.release_calls,
            released_bytes: s.released_pages * PAGE_SIZE,
            release_errors: s.release_errors,
        }
    }
}

/// One tier in [`Snapshot`] (SPEC.md 5 `balloon.zones[]` plus counters).
#[derive(Debug, Clone, Serialize)]
pub struct ZoneSnapshot {
    pub id: String,
    pub tier: usize,
    pub target: u64,
    /// Driver-written (untrusted).
    pub actual: u64,
    pub zone_bytes: u64,
    /// Bytes of the zone's ranges the frontend mapped (`SET_MEM_TABLE`).
    pub mapped_bytes: u64,
    #[serde(flatten)]
    pub counters: Counters,
}

#[derive(Debug, Clone, Serialize)]
pub struct FrontendSnapshot {
    pub connected: bool,
    pub connections: u64,
    pub acked_features: u64,
    pub memory_regions: usize,
    pub notify_channel: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct ConfigSnapshot {
    pub writes_accepted: u64,
    pub writes_ignored: u64,
    /// GET_CONFIG requests outside the 4 KiB window (or malformed),
    /// answered with an empty payload by [`crate::relay`].
    pub reads_refused: u64,
    pub changes_sent: u64,
    pub change_errors: u64,
    pub changes_suppressed: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct StatsSnapshot {
    pub updates: u64,
    pub bad_buffers: u64,
    pub values: BTreeMap<String, u64>,
}

/// The control socket's `state` answer.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    pub protocol: u32,
    pub tiers_offered: bool,
    pub tiers_negotiated: bool,
    pub stats_negotiated: bool,
    pub frontend: FrontendSnapshot,
    pub legacy_target: u64,
    pub legacy_actual: u64,
    pub legacy: Counters,
    pub zones: Vec<ZoneSnapshot>,
    pub config: ConfigSnapshot,
    pub stats: StatsSnapshot,
}

impl VhostUserBackend for Balloon {
    type Bitmap = ();
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        3 + 2 * self.inner.specs.len()
    }

    fn max_queue_size(&self) -> usize {
        QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        let mut f = 1u64 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_BALLOON_F_STATS_VQ
            | 1 << VIRTIO_BALLOON_F_TIERS
            | 1 << VIRTIO_RING_F_EVENT_IDX
            | 1 << VIRTIO_RING_F_INDIRECT_DESC
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        if self.inner.opts.deflate_on_oom {
            f |= 1 << VIRTIO_BALLOON_F_DEFLATE_ON_OOM;
        }
        f
    }

    fn acked_features(&self, features: u64) {
        lock(&self.inner.state).acked_features = features;
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::BACKEND_REQ
            | VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
    }

    fn reset_device(&self) {
        // The driver was reset: it no longer holds any ballooned page.
        Self::forget_driver(&mut lock(&self.inner.state));
    }

    fn set_event_idx(&self, enabled: bool) {
        lock(&self.inner.state).event_idx = enabled;
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let space = self.config_space();
        // Inside the window (the vhost crate checked): never empty, which
        // would be a failure reply.
        config::read(&space, offset, size).unwrap_or_default()
    }

    fn set_config(&self, offset: u32, buf: &[u8]) -> io::Result<()> {
        let mut st = lock(&self.inner.state);
        let neg = st.acked_features & (1 << VIRTIO_BALLOON_F_TIERS) != 0;
        match config::classify_write(offset, buf, self.inner.specs.len(), neg) {
            ConfigWrite::LegacyActual(v) => {
                st.values.legacy_actual = v;
                st.config.writes_accepted += 1;
            }
            ConfigWrite::TierActual(i, v) => {
                st.values.actuals[i] = v;
                st.config.writes_accepted += 1;
            }
            ConfigWrite::Ignored => {
                st.config.writes_ignored += 1;
                let n = st.config.writes_ignored;
                if n <= LOG_FIRST || n.is_multiple_of(1024) {
                    tracing::warn!(
                        offset = format_args!("{offset:#x}"),
                        len = buf.len(),
                        total = n,
                        "config write ignored (only actual and tier[i].actual are writable)"
                    );
                }
            }
        }
        // SPEC section 6 rule 2: always acknowledged with success.
        Ok(())
    }

    fn update_memory(&self, mem: Mem) -> io::Result<()> {
        let snapshot = mem.memory().into_inner();
        let mut engine = build_engine(&self.inner.specs, snapshot)?;
        let mut st = lock(&self.inner.state);
        let dropped = engine.adopt(&st.engine);
        if dropped > 0 {
            tracing::warn!(dropped, "ballooned pages no longer mapped left the balloon");
        }
        st.engine = engine;
        st.mem = Some(mem);
        Ok(())
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[Vring],
        _thread_id: usize,
    ) -> io::Result<()> {
        let ev = usize::from(device_event);
        if let Some(v) = vrings.get(ev) {
            self.serve_queue(ev, v);
        } else if u64::from(device_event) == self.timer_event_id() {
            self.stats_tick(vrings);
        }
        // Never an error: that would stop the worker thread, and a guest
        // must not be able to stop the device.
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        // Needed for the worker to exit (and be joined) when a connection
        // ends.
        match new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC) {
            Ok(pair) => Some(pair),
            Err(e) => {
                tracing::error!("exit eventfd: {e}");
                None
            }
        }
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        let mut st = lock(&self.inner.state);
        if queue_role(
            queue_index as usize,
            st.acked_features,
            self.inner.specs.len(),
        ) == QueueRole::Stats
        {
            // The frontend takes the ring back; a held buffer is its again.
            st.stats_held = None;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_layout_follows_spec_section_3() {
        let tiers = 1u64 << VIRTIO_BALLOON_F_TIERS;
        let stats = 1u64 << VIRTIO_BALLOON_F_STATS_VQ;
        let r = |i, f| queue_role(i, f, 2);
        let t = |tier, op| QueueRole::Tier { tier, op };
        // Stats negotiated, two tiers: the SPEC example.
        assert_eq!(r(0, tiers | stats), QueueRole::LegacyInflate);
        assert_eq!(r(1, tiers | stats), QueueRole::LegacyDeflate);
        assert_eq!(r(2, tiers | stats), QueueRole::Stats);
        assert_eq!(r(3, tiers | stats), t(0, Op::Inflate));
        assert_eq!(r(4, tiers | stats), t(0, Op::Deflate));
        assert_eq!(r(5, tiers | stats), t(1, Op::Inflate));
        assert_eq!(r(6, tiers | stats), t(1, Op::Deflate));
        assert_eq!(r(7, tiers | stats), QueueRole::Absent);
        // Without stats the tier queues move down.
        assert_eq!(r(2, tiers), t(0, Op::Inflate));
        assert_eq!(r(5, tiers), t(1, Op::Deflate));
        assert_eq!(r(6, tiers), QueueRole::Absent);
        // Without tiers only the legacy (and stats) queues exist.
        assert_eq!(r(2, stats), QueueRole::Stats);
        assert_eq!(r(3, stats), QueueRole::Absent);
        assert_eq!(r(2, 0), QueueRole::Absent);
    }

    #[test]
    fn stats_entries_keep_spec_tags_and_skip_a_partial_entry() {
        let mut buf = Vec::new();
        for (tag, v) in [(4u16, 7u64), (0x7fff, 1), (0x8002, u64::MAX), (16, 3)] {
            buf.extend_from_slice(&tag.to_le_bytes());
            buf.extend_from_slice(&v.to_le_bytes());
        }
        buf.extend_from_slice(&[5, 0, 1, 2]);
        assert_eq!(
            stats_entries(&buf).collect::<Vec<_>>(),
            vec![(4, 7), (0x8002, u64::MAX)]
        );
        assert_eq!(stats_entries(&buf[..9]).count(), 0);
    }

    #[test]
    fn only_spec_stats_tags_are_known() {
        assert!(known_tag(0) && known_tag(15));
        assert!(known_tag(0x8000) && known_tag(0x8002) && known_tag(0x8072));
        assert!(!known_tag(16) && !known_tag(0x8003) && !known_tag(0x8080));
        assert!(!known_tag(0xffff) && !known_tag(0x7fff));
        assert_eq!((0..=u16::MAX).filter(|&t| known_tag(t)).count(), 16 + 3 * 8);
    }

    #[test]
    fn stat_names_follow_spec_section_5() {
        assert_eq!(stat_name(4), "stat_free_memory");
        assert_eq!(stat_name(15), "stat_direct_reclaims");
        assert_eq!(stat_name(0x8000), "tier0_guest_accesses");
        assert_eq!(stat_name(0x8011), "tier1_guest_free_bytes");
        assert_eq!(stat_name(0x8072), "tier7_guest_total_bytes");
        assert_eq!(stat_name(0x8003), "tag_0x8003");
        assert_eq!(stat_name(16), "tag_0x0010");
    }
}
