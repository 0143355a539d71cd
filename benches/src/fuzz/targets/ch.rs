//! cloud-hypervisor API bodies: `vm.info` and `vm.counters`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tier_controller::actuate::{BALLOON_DEVICE, parse_counters, parse_vm_info, tier_states};
use tier_profiler::ch::Snapshot;
use tier_profiler::ch::handle::guest_accesses;
use tier_profiler::ch::layout;
use tier_profiler::memtier::MemoryTiers;
use tier_proto::v1::TierKind;

use super::Corpus;
use crate::fuzz::{Rng, Target, Verdict};

const ANON_INFO: &str =
    include_str!("../../../../profiler/tests/fixtures/ch-layout/anon.vm.info.json");
const SHARED_INFO: &str =
    include_str!("../../../../profiler/tests/fixtures/ch-layout/shared.vm.info.json");
const ANON_MAPS: &str = include_str!("../../../../profiler/tests/fixtures/ch-layout/anon.maps");
const ANON_NUMA: &str =
    include_str!("../../../../profiler/tests/fixtures/ch-layout/anon.numa_maps");

/// `GET /api/v1/vm.info` bodies: decoded as tierd decodes them, then the
/// tier states the controller reads, the drivability check, and the tier
/// map built from `memory_zones` against a recorded /proc/PID/maps.
#[derive(Debug)]
pub struct VmInfo {
    corpus: Corpus,
    overrides: HashMap<String, TierKind>,
    memtiers: MemoryTiers,
}

impl VmInfo {
    pub fn new() -> VmInfo {
        VmInfo {
            corpus: Corpus::json(&[
                ANON_INFO,
                SHARED_INFO,
                r#"{"state":"Created"}"#,
                r#"{"state":"Running","memory_actual_size":0,"balloon":null,"memory_zones":[]}"#,
                r#"{"state":"Running","balloon":{"tiers_offered":true,"tiers_negotiated":true,"legacy_target":0,"legacy_actual":0,"zones":[{"id":"dram","tier":0,"target":67108864,"actual":4096,"host_ballooned":4096,"inflated_pfns":1,"deflated_pfns":0,"rejected_pfns":0},{"id":"slow","tier":1,"target":0,"actual":0,"host_ballooned":0,"inflated_pfns":0,"deflated_pfns":0,"rejected_pfns":0}]},"memory_zones":[{"id":"dram","host_numa_node":0,"guest_numa_node":0,"ranges":[{"start":0,"size":134217728},{"start":4294967296,"size":134217728}]},{"id":"slow","host_numa_node":1,"guest_numa_node":1,"ranges":[{"start":268435456,"size":268435456}]}]}"#,
            ]),
            overrides: HashMap::from([("slow".to_string(), TierKind::Cxl)]),
            // Two tiers, so the kernel-tier branch of the kind runs too.
            memtiers: MemoryTiers::from_tiers(vec![(4, vec![0]), (5, vec![1])]),
        }
    }
}

impl Default for VmInfo {
    fn default() -> Self {
        VmInfo::new()
    }
}

impl Target for VmInfo {
    fn name(&self) -> &'static str {
        "vm-info"
    }

    fn generate(&mut self, rng: &mut Rng, big: bool, out: &mut Vec<u8>) {
        let c = &self.corpus;
        c.generate(rng, big, out, &mut |rng, big, out| c.tree(rng, big, out));
    }

    fn run(&mut self, input: &[u8]) -> Verdict {
        let Ok(info) = parse_vm_info(input) else {
            return Verdict::Rejected;
        };
        let _ = std::hint::black_box(tier_states(info.clone()));
        if let Some(zones) = &info.memory_zones {
            let tiers = layout::tiers(zones, ANON_MAPS, ANON_NUMA, &self.overrides, &self.memtiers);
            std::hint::black_box(tiers);
        }
        let snap = Snapshot {
            info: Some(info),
            read_at: Some(Instant::now()),
            ..Default::default()
        };
        let _ = std::hint::black_box(snap.drivable(Duration::from_secs(5), &["dram", "slow"]));
        std::hint::black_box(snap.zone("dram"));
        Verdict::Accepted
    }
}

/// `GET /api/v1/vm.counters` bodies: decoded, then the per-tier guest
/// access counters tierd takes from the balloon's entry.
#[derive(Debug)]
pub struct VmCounters {
    corpus: Corpus,
}

impl VmCounters {
    pub fn new() -> VmCounters {
        VmCounters {
            corpus: Corpus::json(&[
                r#"{"__balloon":{"tier0_guest_accesses":10,"tier1_guest_accesses":30,"tier0_target_bytes":4096,"stat_free_memory":1,"stat_total_memory":268435456,"tier1_guest_free_bytes":0,"tier1_guest_total_bytes":268435456}}"#,
                r#"{"_disk0":{"read_bytes":0,"read_ops":0,"write_bytes":0,"write_ops":0},"_net1":{"rx_bytes":1514,"rx_frames":1,"tx_bytes":0,"tx_frames":0},"__balloon":{"tier0_guest_accesses":18446744073709551615}}"#,
                "{}",
            ]),
        }
    }
}

impl Default for VmCounters {
    fn default() -> Self {
        VmCounters::new()
    }
}

impl Target for VmCounters {
    fn name(&self) -> &'static str {
        "vm-counters"
    }

    fn generate(&mut self, rng: &mut Rng, big: bool, out: &mut Vec<u8>) {
        let c = &self.corpus;
        c.generate(rng, big, out, &mut |rng, big, out| c.tree(rng, big, out));
    }

    fn run(&mut self, input: &[u8]) -> Verdict {
        let Ok(counters) = parse_counters(input) else {
            return Verdict::Rejected;
        };
        std::hint::black_box(guest_accesses(counters.get(BALLOON_DEVICE)));
        Verdict::Accepted
    }
}
