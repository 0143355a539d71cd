//! Synthetic VM sources, for benchmarks only (`tierd run --synthetic-vms N`):
//! a fleet of 1000 VMs cannot exist on a test machine, so these stand in for
//! them from the registry onwards. Their ids start with `synthetic:` and
//! their derivation says so; no host sampler ever looks at them.

use std::sync::atomic::{AtomicU64, Ordering};

use tier_proto::v1::{GpaRange, Tier, TierKind, Vm, VmSource};

use crate::registry::TrackedVm;
use crate::sampler::TierReading;

const KINDS: [TierKind; 4] = [
    TierKind::Dram,
    TierKind::Cxl,
    TierKind::Pmem,
    TierKind::Remote,
];
const TIER_BYTES: u64 = 1 << 30;

/// One synthetic VM with `tiers` tiers of 1 GiB and pseudo-random readings.
#[derive(Debug)]
pub struct SyntheticVm {
    vm: Vm,
    state: AtomicU64,
}

impl SyntheticVm {
    pub fn new(index: u32, tiers: u32) -> SyntheticVm {
        let tiers = (0..tiers)
            .map(|t| Tier {
                name: format!("tier{t}"),
                kind: KINDS[t as usize % KINDS.len()] as i32,
                host_numa_nodes: vec![t],
                ranges: vec![GpaRange {
                    gpa_start: u64::from(t) * TIER_BYTES,
                    length: TIER_BYTES,
                    hva_start: 0,
                }],
                size_bytes: TIER_BYTES,
                derivation: "synthetic VM source (benchmark)".into(),
                hotplug: None,
            })
            .collect();
        SyntheticVm {
            vm: Vm {
                id: format!("synthetic:{index}"),
                name: format!("synthetic-{index}"),
                vmm_pid: 0,
                api_socket: String::new(),
                vcpus: 2,
                tiers,
                source: VmSource::Unspecified as i32,
                discovered_unix_ns: crate::unix_now_ns(),
            },
            state: AtomicU64::new(u64::from(index).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1),
        }
    }

    /// xorshift64: cheap, deterministic per VM.
    fn next(&self) -> u64 {
        let mut x = self.state.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state.store(x, Ordering::Relaxed);
        x
    }
}

impl TrackedVm for SyntheticVm {
    fn vm(&self) -> &Vm {
        &self.vm
    }

    fn alive(&self) -> bool {
        true
    }

    fn resident_bytes(&self) -> Result<Vec<u64>, String> {
        Ok(self
            .vm
            .tiers
            .iter()
            .map(|_| (self.next() % TIER_BYTES) & !4095)
            .collect())
    }

    fn guest_reported_accesses(&self) -> Option<Vec<u64>> {
        None
    }

    fn is_synthetic(&self) -> bool {
        true
    }

    fn synthetic_readings(&self) -> Option<Vec<TierReading>> {
        let pages = TIER_BYTES / 4096;
        Some(
            self.vm
                .tiers
                .iter()
                .map(|_| TierReading {
                    sampled_pages: pages,
                    young_pages: self.next() % pages,
                    exposure: None,
                })
                .collect(),
        )
    }
}
