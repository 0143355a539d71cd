//! hostpte's working-set ages (docs/working-set.md). hostpte re-arms a whole
//! process per pass and reads counts per VMA, so it knows how many pages of
//! a tier were touched within each pass's exposure, never which. Its passes
//! are far shorter than the horizons, so one interval in
//! `long_pass_every` is a long pass: the process is re-armed at the
//! interval's start and not again until its end; its passes inside read
//! smaps only, so each counts from that start (the estimate takes them as
//! passes of growing exposure), and the last is the working set within
//! about one interval. Horizons beyond that are not measured: a longer pass
//! would take the ratio estimate's short passes away for as long.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Instant;

use tier_proto::v1::{TierAges, Vm};

use super::TierReading;
use crate::ages::exposure::Whole;
use crate::ages::profile::from_whole;
use crate::ages::{AgesConfig, not_measured};

const PAGE: u64 = 4096;
/// Readings kept per tier to bound a horizon's edge.
const RECENT: usize = 16;

/// One tier's readings.
#[derive(Debug, Default)]
struct TierWhole {
    current: Vec<Whole>,
    recent: VecDeque<Whole>,
    /// Exposure of the last long pass that closed.
    long: Option<f64>,
    /// Resident pages at the last reading: what cold is counted over.
    resident: Option<f64>,
}

#[derive(Debug)]
struct VmAges {
    first: Instant,
    pid: u32,
    tiers: Vec<TierWhole>,
}

/// The long-pass schedule and each VM's readings.
#[derive(Debug, Default)]
pub struct HostPteAges {
    config: AgesConfig,
    ticks: u64,
    tick_now: bool,
    /// Processes inside a long pass.
    long: HashSet<u32>,
    /// Processes whose long pass closed at this interval's end.
    closed: HashSet<u32>,
    vms: HashMap<String, VmAges>,
}

impl HostPteAges {
    pub fn set_config(&mut self, config: &AgesConfig) {
        self.config = config.clone();
    }

    pub fn interval_ends(&mut self) {
        self.tick_now = true;
        self.closed.clear();
    }

    /// True: `pid` is inside a long pass and this pass reads it without
    /// re-arming.
    pub fn inside_long(&self, pid: u32) -> bool {
        !self.tick_now && self.long.contains(&pid)
    }

    /// After `pid` was read and re-armed: a tick closes its long pass, or
    /// opens one when it is due (staggered by pid).
    pub fn walked(&mut self, pid: u32) {
        if !self.tick_now {
            return;
        }
        if self.long.remove(&pid) {
            self.closed.insert(pid);
            return;
        }
        let every = u64::from(self.config.long_pass_every);
        if every > 0 && (self.ticks + u64::from(pid)).is_multiple_of(every) {
            self.long.insert(pid);
        }
    }

    /// This pass's readings of `vm` (pages, not yet scaled) and its tiers'
    /// resident pages.
    pub fn record(&mut self, vm: &Vm, readings: &[TierReading], resident: &[u64]) {
        let closed = self.closed.contains(&vm.vmm_pid) && self.tick_now;
        let v = self.vms.entry(vm.id.clone()).or_insert_with(|| VmAges {
            first: Instant::now(),
            pid: vm.vmm_pid,
            tiers: Vec::new(),
        });
        v.tiers.resize_with(readings.len(), TierWhole::default);
        for (i, (t, r)) in v.tiers.iter_mut().zip(readings).enumerate() {
            let Some(e) = r.exposure.filter(|_| r.sampled_pages > 0) else {
                continue;
            };
            t.resident = resident.get(i).map(|&p| p as f64);
            let w = Whole {
                young: r.young_pages as f64,
                exposure: e.as_secs_f64(),
            };
            t.current.push(w);
            if closed {
                t.long = Some(w.exposure);
            }
        }
    }

    /// The sample call is over.
    pub fn pass_done(&mut self) {
        if self.tick_now {
            self.tick_now = false;
            self.ticks += 1;
        }
    }

    pub fn forget(&mut self, vm_id: &str) {
        self.vms.remove(vm_id);
    }

    /// Ages of `vm` over the interval that just ended; its readings move to
    /// the recent ones.
    pub fn ages(&mut self, vm: &Vm) -> Vec<TierAges> {
        let horizons = &self.config.horizons;
        let every = self.config.long_pass_every;
        let Some(v) = self.vms.get_mut(&vm.id) else {
            return vm
                .tiers
                .iter()
                .map(|_| not_measured(horizons, "hostpte: no pass read this VM yet"))
                .collect();
        };
        let closed = self.closed.contains(&v.pid);
        let history = v.first.elapsed().as_secs_f64();
        v.tiers.resize_with(vm.tiers.len(), TierWhole::default);
        vm.tiers
            .iter()
            .zip(v.tiers.iter_mut())
            .map(|(t, w)| {
                let pages = (t.size_bytes / PAGE) as f64;
                // Cold is counted over the pages the walk could see (as
                // the ept backends' sample is drawn from resident pages),
                // not memory never mapped.
                let resident = w.resident.unwrap_or(0.0).min(pages);
                let recent: Vec<Whole> = w.recent.iter().copied().collect();
                let long = w.long;
                let missing = |h: f64| match long {
                    Some(e) if !closed && every > 0 && h <= e * 1.5 => Some(format!(
                        "hostpte measures {h}s in its long pass (one interval in {every}); \
                         not this one"
                    )),
                    _ if every == 0 => Some(format!(
                        "hostpte re-arms the whole process every pass and its long pass is \
                         off ([sampler] ws_long_pass_every = 0): {h}s is beyond its passes"
                    )),
                    _ => None,
                };
                let a = from_whole(
                    horizons, &w.current, &recent, pages, resident, history, missing,
                );
                for r in w.current.drain(..) {
                    if w.recent.len() == RECENT {
                        w.recent.pop_front();
                    }
                    w.recent.push_back(r);
                }
                a
            })
            .collect()
    }
}
