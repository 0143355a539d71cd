//! The control socket's `state` answer.

use super::*;

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

impl Balloon {
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
}
