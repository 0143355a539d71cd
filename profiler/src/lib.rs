//! tierd: host-side measurement of how each VM's memory accesses split
//! across memory tiers.
//!
//! Data flow: `registry` (which VMs exist, their tier maps) -> `aggregate`
//! (one `StatsUpdate` per interval) -> `server` (gRPC fan-out to watchers).
//! `probe` decides which sampler backends this host supports.

pub mod actuator;
pub mod ages;
pub mod aggregate;
pub mod bpf;
pub mod ch;
pub mod config;
pub mod control;
pub mod demo_vm;
pub mod discovery;
pub mod estimate;
pub mod health;
pub mod hotset;
pub mod memtier;
pub mod policy_store;
pub mod probe;
pub mod publish;
pub mod qemu;
pub mod registry;
pub mod sampler;
pub mod server;
pub mod synthetic;
pub mod watch;

/// Nanoseconds since the Unix epoch, saturating (clock before 1970 -> 0).
pub fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A map keyed by VM id (or anything looked up per VM and interval), with
/// a fast seeded hasher: SipHash was about 8 % of tierd's CPU at 1000 VMs
/// (`bench tierd-scale`). The ids come from this host's own discovery.
pub type IdMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
