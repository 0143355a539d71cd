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

mod engine;
mod queues;
mod snapshot;
mod stats;

use engine::{Engine, build_engine};
pub use snapshot::{
    ConfigSnapshot, Counters, FrontendSnapshot, Snapshot, StatsSnapshot, ZoneSnapshot,
};
use stats::GuestStats;
pub use stats::{known_tag, stat_name, stats_entries};

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
