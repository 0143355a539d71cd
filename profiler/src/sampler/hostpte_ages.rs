//! hostpte's working-set ages (docs/working-set.md). hostpte re-arms a whole
//! process per pass and reads counts per VMA, so it knows how many pages of
//! a tier were touched within each pass's exposure, never which. Its passes
//! are far shorter than the horizons, so one interval in
//! `long_pass_every` is a long pass: the process is re-armed at the
//! interval's start and not again until its end; its passes inside read
//! smaps only, so each counts from that start, and the last is the working
//! set within about one interval. Longer horizons come from a *sweep*: one
//! pass of `sweep_s`, read at every interval's end without re-arming, every
//! `sweep_every_s`; its reading after k intervals is the working set within
//! k intervals. The ratio estimate gets no pass while it lasts (a reading
//! spanning intervals is no pass of one), so sweeps are rare.
use std::collections::{HashMap, VecDeque};
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
    /// Inside a sweep, its readings of the intervals before: the growth
    /// the sweep's stretched horizons follow (at most a sweep's passes).
    sweep_hist: Vec<Whole>,
}

#[derive(Debug)]
struct VmAges {
    first: Instant,
    pid: u32,
    tiers: Vec<TierWhole>,
}

/// A process's long pass or sweep.
#[derive(Debug, Clone, Copy)]
struct Long {
    /// Interval ends still to come before it closes.
    left: u32,
    /// Intervals it lasts (1: a long pass; more: a sweep).
    of: u32,
}

/// The long-pass and sweep schedule and each VM's readings.
#[derive(Debug, Default)]
pub struct HostPteAges {
    config: AgesConfig,
    ticks: u64,
    tick_now: bool,
    /// Processes inside a long pass or sweep.
    long: HashMap<u32, Long>,
    /// Processes whose long pass or sweep closed at this interval's end,
    /// with the intervals it lasted.
    closed: HashMap<u32, u32>,
    /// The tick each process was first walked: its first sweep waits
    /// half a period, so a fresh tierd does not sweep at once.
    first_tick: HashMap<u32, u64>,
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

    /// True: `pid` is inside a long pass or sweep and this pass reads it
    /// without re-arming (a sweep's interval ends too, but its last).
    pub fn inside_long(&self, pid: u32) -> bool {
        self.long
            .get(&pid)
            .is_some_and(|l| !self.tick_now || l.left > 1)
    }

    /// True: `pid`'s reading this pass belongs to a sweep (inside it, or
    /// the one that closed it): it spans more than an interval, so it is no
    /// pass for the ratio estimate.
    /// Call before `walked`.
    pub fn in_sweep(&self, pid: u32) -> bool {
        self.long.get(&pid).is_some_and(|l| l.of > 1)
    }

    /// After `pid` was read (and re-armed unless `inside_long`): a tick
    /// counts down its long pass or sweep and closes it at the last, or
    /// opens one when due (staggered by pid): a sweep first.
    pub fn walked(&mut self, pid: u32) {
        if !self.tick_now {
            return;
        }
        if let Some(l) = self.long.get_mut(&pid) {
            l.left = l.left.saturating_sub(1);
            if l.left == 0 {
                let of = l.of;
                self.long.remove(&pid);
                self.closed.insert(pid, of);
            }
            return;
        }
        let first = *self.first_tick.entry(pid).or_insert(self.ticks);
        let at = self.ticks + u64::from(pid);
        if let Some((len, every)) = self.config.sweep() {
            let every = u64::from(every);
            if self.ticks - first >= every / 2 && at.is_multiple_of(every) {
                self.long.insert(pid, Long { left: len, of: len });
                return;
            }
        }
        let every = u64::from(self.config.long_pass_every);
        if every > 0 && at.is_multiple_of(every) {
            self.long.insert(pid, Long { left: 1, of: 1 });
        }
    }

    /// This pass's readings of `vm` (pages, not yet scaled) and its tiers'
    /// resident pages.
    pub fn record(&mut self, vm: &Vm, readings: &[TierReading], resident: &[u64]) {
        let closed = self.closed.contains_key(&vm.vmm_pid) && self.tick_now;
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
            if closed && self.closed.get(&vm.vmm_pid) == Some(&1) {
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
        if let Some(v) = self.vms.remove(vm_id) {
            // The process may hold other VMs: its schedule stays with them.
            if !self.vms.values().any(|o| o.pid == v.pid) {
                self.long.remove(&v.pid);
                self.first_tick.remove(&v.pid);
            }
        }
    }

    /// Why `vm` gave the ratio estimate no pass this interval although it
    /// was read: it is inside a sweep.
    pub fn quiet(&self, vm: &Vm) -> Option<String> {
        let (k, of) = self.sweeping(vm.vmm_pid)?;
        Some(format!(
            "hostpte sweep for the working-set horizons: interval {k} of {of} without re-arming; no ratio pass until it ends"
        ))
    }

    /// (k, n): `pid`'s interval that just ended was the k-th of a sweep of
    /// n intervals.
    fn sweeping(&self, pid: u32) -> Option<(u32, u32)> {
        let of = self
            .long
            .get(&pid)
            .map(|l| l.of)
            .or_else(|| self.closed.get(&pid).copied())
            .filter(|&of| of > 1)?;
        let left = self.long.get(&pid).map_or(0, |l| l.left);
        // Opened at this interval's end: this interval had its passes.
        if left == of {
            return None;
        }
        Some((of - left, of))
    }

    /// Intervals from the one that just ended to the next long-pass reading
    /// of `pid` as scheduled (a sampler budget's skip or a sweep may move
    /// it); None when there is none, or a sweep holds the process.
    fn next_long_in(&self, pid: u32) -> Option<u64> {
        let every = u64::from(self.config.long_pass_every);
        if every == 0 {
            return None;
        }
        match self.long.get(&pid) {
            Some(l) if l.of == 1 => return Some(1),
            Some(_) => return None,
            None => {}
        }
        // `ticks` is the next tick: a long pass opened there closes (and
        // is read) one tick later.
        let k = (every - (self.ticks + u64::from(pid)) % every) % every;
        Some(k + 2)
    }

    /// Ages of `vm` over the interval that just ended; its readings move to
    /// the recent ones.
    pub fn ages(&mut self, vm: &Vm) -> Vec<TierAges> {
        let horizons = &self.config.horizons;
        let every = self.config.long_pass_every;
        // A sweep's readings span intervals: they stay out of the recent
        // ones, which bound a horizon's edges with short passes.
        let sweeping = self.sweeping(vm.vmm_pid).is_some();
        let next_long = self.next_long_in(vm.vmm_pid);
        let Some(v) = self.vms.get_mut(&vm.id) else {
            return vm
                .tiers
                .iter()
                .map(|_| not_measured(horizons, "hostpte: no pass read this VM yet"))
                .collect();
        };
        let closed = self.closed.contains_key(&v.pid);
        let sweep = self
            .config
            .sweep()
            .map(|_| (self.config.sweep_s, self.config.sweep_every_s));
        let history = v.first.elapsed().as_secs_f64();
        let interval_s = self.config.interval_s;
        let next = next_long.map_or(String::new(), |n| {
            format!("; next in about {} s", n as f64 * self.config.interval_s)
        });
        v.tiers.resize_with(vm.tiers.len(), TierWhole::default);
        vm.tiers
            .iter()
            .zip(v.tiers.iter_mut())
            .map(|(t, w)| {
                let pages = (t.size_bytes / PAGE) as f64;
                // Cold is counted over the pages the walk could see (as
                // the ept backends' sample is drawn from resident pages),
                // not memory never mapped.
                // Unknown until a reading saw the tier: no cold then.
                let resident = w.resident.map(|r| r.min(pages));
                let mut recent: Vec<Whole> = w.recent.iter().copied().collect();
                if sweeping {
                    recent.extend_from_slice(&w.sweep_hist);
                }
                // Before the first long pass: one as long as an interval.
                let long = w.long.or((every > 0).then_some(interval_s));
                let missing = |h: f64| match (long, sweep) {
                    (Some(e), _) if !closed && every > 0 && h <= e * 1.5 => Some(format!(
                        "hostpte measures {h}s in its long pass (one interval in {every}); \
                         not this one{next}"
                    )),
                    (_, Some((len, each))) if h <= len * 1.25 => Some(format!(
                        "hostpte measures {h}s in its sweep ({len} s every {each} s); \
                         not this one"
                    )),
                    (_, Some((len, _))) => Some(format!(
                        "hostpte re-arms the whole process every pass and its sweep \
                         ([sampler] ws_sweep_s) is {len} s: {h}s is beyond it"
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
                if sweeping {
                    w.sweep_hist.append(&mut w.current);
                } else {
                    w.sweep_hist.clear();
                }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tier_proto::v1::Tier;

    /// Between long passes the 1 s horizon says when the next comes; the
    /// long pass then closes in the interval it said.
    #[test]
    fn the_next_long_pass_is_announced_when_it_comes() {
        let mut a = HostPteAges::default();
        a.set_config(&AgesConfig {
            horizons: vec![1.0],
            long_pass_every: 5,
            sweep_s: 0.0,
            ..AgesConfig::default()
        });
        let vm = Vm {
            id: "vm".into(),
            vmm_pid: 7,
            tiers: vec![Tier {
                name: "dram".into(),
                size_bytes: 64 * PAGE,
                ..Default::default()
            }],
            ..Default::default()
        };
        let reading = |e: f64| TierReading {
            sampled_pages: 64,
            young_pages: 10,
            exposure: Some(Duration::from_secs_f64(e)),
        };
        // One pass per interval, as its last: exposure 1 s when it closes
        // a long pass, else as the schedule's last 0.375 s pass.
        let (mut expected, mut measured, mut announced) = (None, 0, 0);
        for tick in 0..30u64 {
            a.interval_ends();
            a.walked(7);
            let long = a.closed.get(&7) == Some(&1);
            a.record(&vm, &[reading(if long { 1.0 } else { 0.375 })], &[64]);
            // Watched long enough for the horizon from the start.
            if let Some(v) = a.vms.get_mut("vm")
                && let Some(t) = v.first.checked_sub(Duration::from_secs(60))
            {
                v.first = t;
            }
            a.pass_done();
            let ages = a.ages(&vm);
            let w = &ages[0].working_set[0];
            if w.not_measured.is_empty() {
                assert!(long, "tick {tick}: {w:?}");
                if let Some(e) = expected.take() {
                    assert_eq!(e, tick, "announced for tick {e}, came at {tick}");
                }
                measured += 1;
                continue;
            }
            assert!(!long);
            let n: f64 = w
                .not_measured
                .split("next in about ")
                .nth(1)
                .and_then(|t| t.strip_suffix(" s"))
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("tick {tick}: {}", w.not_measured));
            let at = tick + n as u64;
            if let Some(e) = expected {
                assert_eq!(e, at, "tick {tick}: {}", w.not_measured);
            }
            expected = Some(at);
            announced += 1;
        }
        assert!(measured >= 5 && announced >= 20, "{measured} {announced}");
    }
}
