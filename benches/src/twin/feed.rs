//! tierd's own code on the modelled readings: each modelled backend is a
//! VM in a real `Registry` whose readings are handed to the real
//! `Aggregator` pass by pass (`pass_at`/`tick_at` at the simulated times
//! of tierd's `pass_ends` schedule), so the fit, the rate windows and the
//! ~95 % interval are tierd's; PMU readings go through the pmu source's
//! own `Tally` scaling and `annotate`, and the controller reads the
//! result through `tier_controller::policy::input::from_proto`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tier_profiler::aggregate::Aggregator;
use tier_profiler::registry::{Registry, TrackedVm};
use tier_profiler::sampler::TierReading;
use tier_profiler::sampler::pmu::counting::{Tally, TierReading as PmuTier};
use tier_profiler::sampler::pmu::loader::Reading;
use tier_profiler::sampler::pmu::source::{PmuReadings, annotate};
use tier_proto::v1::{GpaRange, StatsUpdate, Tier, TierKind, Vm, VmSource};

/// A VM whose readings the twin sets before each pass.
#[derive(Debug)]
pub struct ModelVm {
    vm: Vm,
    readings: Mutex<Vec<TierReading>>,
    balloon: Mutex<Option<Vec<(u64, u64)>>>,
}

/// Tier 0 DRAM, tier 1 CXL (slow), of the given sizes.
pub fn two_tier_vm(id: &str, sizes: [u64; 2]) -> Vm {
    let tiers = [("dram", TierKind::Dram), ("slow", TierKind::Cxl)]
        .iter()
        .zip(sizes)
        .enumerate()
        .map(|(i, ((name, kind), size))| Tier {
            name: (*name).into(),
            kind: *kind as i32,
            host_numa_nodes: vec![i as u32],
            ranges: vec![GpaRange {
                gpa_start: if i == 0 { 0 } else { sizes[0] },
                length: size,
                hva_start: 0,
            }],
            size_bytes: size,
            derivation: "twin model (benchmark)".into(),
            hotplug: None,
        })
        .collect();
    Vm {
        id: id.into(),
        name: id.into(),
        vmm_pid: 0,
        api_socket: String::new(),
        vcpus: 1,
        tiers,
        source: VmSource::Unspecified as i32,
        discovered_unix_ns: 0,
    }
}

impl ModelVm {
    pub fn new(vm: Vm) -> Arc<ModelVm> {
        Arc::new(ModelVm {
            vm,
            readings: Mutex::new(Vec::new()),
            balloon: Mutex::new(None),
        })
    }

    /// The next pass's (examined, young) per tier.
    pub fn set(&self, r: &[(u64, u64)]) {
        let v = r
            .iter()
            .map(|&(sampled_pages, young_pages)| TierReading {
                sampled_pages,
                young_pages,
                exposure: None,
            })
            .collect();
        *self.readings.lock().unwrap_or_else(|e| e.into_inner()) = v;
    }

    pub fn set_balloon(&self, b: Vec<(u64, u64)>) {
        *self.balloon.lock().unwrap_or_else(|e| e.into_inner()) = Some(b);
    }
}

impl TrackedVm for ModelVm {
    fn vm(&self) -> &Vm {
        &self.vm
    }
    fn alive(&self) -> bool {
        true
    }
    fn resident_bytes(&self) -> Result<Vec<u64>, String> {
        Ok(self.vm.tiers.iter().map(|t| t.size_bytes).collect())
    }
    fn guest_reported_accesses(&self) -> Option<Vec<u64>> {
        None
    }
    fn synthetic_readings(&self) -> Option<Vec<TierReading>> {
        Some(
            self.readings
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }
    fn balloon_bytes(&self) -> Option<Vec<(u64, u64)>> {
        self.balloon
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// A registry of model VMs and tierd's aggregator on a simulated clock.
#[derive(Debug)]
pub struct Feed {
    pub registry: Registry,
    pub agg: Aggregator,
    base: Instant,
}

impl Default for Feed {
    fn default() -> Self {
        Feed {
            registry: Registry::default(),
            agg: Aggregator::default(),
            base: Instant::now(),
        }
    }
}

impl Feed {
    pub fn add(&mut self, vm: Arc<ModelVm>) {
        self.registry.insert(Box::new(vm));
    }

    fn at(&self, t: f64) -> Instant {
        self.base + Duration::from_secs_f64(t.max(0.0))
    }

    /// A pass that ends at simulated second `t` (readings set before).
    pub fn pass(&mut self, t: f64) {
        let now = self.at(t);
        self.agg.pass_at(&mut self.registry, None, now);
    }

    /// The interval's last pass at `t`: tierd's update.
    pub fn tick(&mut self, t: f64, interval_s: f64) -> StatsUpdate {
        let now = self.at(t);
        self.agg
            .tick_at(&mut self.registry, None, (interval_s * 1e9) as u64, now)
    }
}

/// Adds PMU readings (one counter reading per tier) of VM `id` to the
/// update, as the daemon's pmu source does.
pub fn annotate_pmu(update: &mut StatsUpdate, id: &str, per_tier: &[Reading], seconds: f64) {
    let tiers = per_tier
        .iter()
        .map(|&r| {
            let mut t = Tally::default();
            t.add(r);
            t.seconds = seconds;
            PmuTier::from_tally(t)
        })
        .collect();
    let mut readings = PmuReadings::default();
    readings.per_vm.insert(id.into(), tiers);
    readings.fast.insert(id.into(), vec![true, false]);
    annotate(update, &readings);
}
