//! Turns the registry's per-VM readings into one `StatsUpdate` per interval.
//!
//! Accessed bits say whether a page was touched, not how often. So an
//! interval is made of several ageing passes (like DAMON's sampling vs
//! aggregation intervals): `young_pages` is the most pages found young in
//! one pass (a lower bound of the distinct pages touched), and
//! `estimated_accesses` fits pages and touch rate to the passes, which
//! alternate short and long (`estimate`), so a small set touched in every
//! pass outweighs a large set touched in one and a set touched four times
//! as often as another, below one touch per pass, reads four times as much.

use std::collections::HashMap;

use std::time::Instant;

use tier_proto::v1::{SamplerHealth, StatsUpdate, TierSample, VmStats};

use crate::IdMap;
use crate::estimate::bounds::{Bounds, Programs};
pub use crate::estimate::pass_ends;
use crate::estimate::{FitPath, TierIn, VmFit};
use crate::registry::Registry;
use crate::sampler::budget::thread_cpu;
use crate::sampler::{Sampler, TierReading};

const PAGE: u64 = 4096;

/// Carries what one interval needs from the previous one (cumulative
/// counters) and numbers the updates.
#[derive(Debug, Default)]
pub struct Aggregator {
    sequence: u64,
    /// VMs that went away in this interval's earlier passes.
    departed: Vec<String>,
    /// Registry generation of the last update that carried the VM list.
    sent_generation: Option<u64>,
    last_guest: IdMap<String, Vec<u64>>,
    /// Per VM and tier, what this interval's passes found so far; kept
    /// across intervals and reset in place, so a steady VM set allocates
    /// no keys or vectors per interval.
    passes: IdMap<String, VmPasses>,
    /// Per VM, the passes of earlier intervals its tiers' rates are
    /// fitted to, and its last full fit (docs/estimate.md).
    windows: IdMap<String, VmFit>,
    /// The estimator's CPU budget for full fits.
    fit_budget: FitBudget,
    /// Columns and quantiles the tiers' interval programs share.
    programs: Programs,
    /// Sampler health summed over this interval's passes.
    health: Option<SamplerHealth>,
    /// Per VM, why the sampler's last pass of this interval could not read
    /// it ("backend: reason").
    not_measured: HashMap<String, String>,
    /// Why no sampler runs at all (said for every VM without readings).
    no_sampler: Option<String>,
    /// When the last pass re-armed the sampler: the next pass covers the
    /// time since.
    last_pass: Option<Instant>,
}

/// One VM's passes within the current interval.
#[derive(Debug, Default)]
struct VmPasses {
    /// Some pass of this interval read the VM.
    read: bool,
    sums: Vec<PassSum>,
}

impl VmPasses {
    /// One pass's readings of the VM's tiers.
    fn add(&mut self, r: Vec<TierReading>, secs: Option<f64>) {
        self.read = true;
        self.sums.resize(r.len(), PassSum::default());
        for (sum, reading) in self.sums.iter_mut().zip(r) {
            sum.add(reading, secs);
        }
    }
}

/// One tier's passes within the current interval.
#[derive(Debug, Clone, Default, PartialEq)]
struct PassSum {
    sampled_pages: u64,
    young_max: u64,
    young_sum: u64,
    passes: u32,
    /// (seconds watched, young pages) of each pass: the sampler's exposure
    /// where it knows it, else the time since the previous pass; not used
    /// when a pass has neither (the aggregator's first).
    timed: Vec<(f64, f64)>,
    untimed: bool,
    /// Seconds between pass starts over the timed passes: the time the
    /// estimate stands for, walks included.
    span: f64,
}

impl PassSum {
    fn add(&mut self, r: TierReading, secs: Option<f64>) {
        // A VM's arming pass examines nothing: it is not a pass.
        if r.sampled_pages == 0 {
            return;
        }
        self.sampled_pages = self.sampled_pages.max(r.sampled_pages);
        self.young_max = self.young_max.max(r.young_pages);
        self.young_sum += r.young_pages;
        self.passes += 1;
        let watched = r.exposure.map(|d| d.as_secs_f64()).or(secs);
        match watched {
            Some(t) => {
                // One allocation for tierd's schedules (5 passes), not two.
                if self.timed.capacity() == 0 {
                    self.timed.reserve_exact(8);
                }
                self.timed.push((t, r.young_pages as f64));
                self.span += secs.unwrap_or(t);
            }
            None => self.untimed = true,
        }
    }

    /// Span over seconds watched: scales an estimate of the watched time
    /// up to the interval (the rate holds through the walks).
    fn unwatched_scale(&self) -> f64 {
        let watched: f64 = self.timed.iter().map(|p| p.0).sum();
        if watched > 0.0 && self.span > watched {
            self.span / watched
        } else {
            1.0
        }
    }

    fn fitted(&self) -> bool {
        self.passes > 0 && !self.untimed
    }

    /// As new, keeping the buffer of timed passes.
    fn reset(&mut self) {
        let mut timed = std::mem::take(&mut self.timed);
        timed.clear();
        *self = PassSum {
            timed,
            ..PassSum::default()
        };
    }
}

/// One tier's estimate over the interval: page touches, saturation and
/// the ~95 % interval (estimate::bounds), all on the sample's scale.
#[derive(Debug, Clone, Copy, Default)]
struct TierEstimate {
    accesses: f64,
    saturation: Option<f64>,
    bounds: Option<Bounds>,
    /// Intervals since the full fit the estimate rests on.
    fit_age: u32,
    /// The full fit was due and the estimator's CPU budget deferred it.
    deferred: bool,
}

/// Share of one core the estimator's full fits may take, on average over
/// intervals (docs/estimate.md), by default (`[sampler] fit_budget_pct`):
/// fits past it are deferred to a later interval, the VMs taken in turn
/// from where the last interval stopped.
pub const FIT_BUDGET_PCT: f64 = 0.5;

/// The estimator's CPU budget: credit per interval, spent by the
/// estimate (thread CPU time); full fits run while it is not negative.
#[derive(Debug)]
struct FitBudget {
    /// Share of one core; `None`: no budget.
    share: Option<f64>,
    credit: f64,
    /// Registry position to start the next interval's fits from: the
    /// first VM deferred last time.
    cursor: usize,
}

impl Default for FitBudget {
    fn default() -> Self {
        FitBudget {
            share: Some(FIT_BUDGET_PCT / 100.0),
            credit: 0.0,
            cursor: 0,
        }
    }
}

impl FitBudget {
    /// Credit for a new interval: at most one interval's allowance banked,
    /// and at most one interval's debt carried, so each interval fits at
    /// least one VM (the one whose turn it is) and no VM waits forever.
    fn start(&mut self, interval_s: f64) {
        if let Some(s) = self.share {
            let allowance = s * interval_s;
            self.credit = (self.credit.max(-allowance) + allowance).min(allowance);
        }
    }

    fn may_fit(&self) -> bool {
        self.share.is_none() || self.credit >= 0.0
    }
}

/// Tail of the VM's ratio interval: 5 %, split over its tiers.
const ALPHA: f64 = 0.05;

/// Page touches over the interval, saturation and interval of each tier of
/// one VM (`estimate::VmFit::fit` over its timed tiers; the plain sum
/// otherwise, without an interval), and how they were had.
fn estimates(
    sums: &[PassSum],
    vm: &mut VmFit,
    programs: &mut Programs,
    pages: &[u64],
    may_fit: bool,
) -> (Vec<TierEstimate>, FitPath) {
    // Untimed tiers go in empty: they keep no window.
    let input: Vec<TierIn<'_>> = sums
        .iter()
        .zip(pages)
        .map(|(s, &pages)| TierIn {
            passes: if s.fitted() { s.timed.as_slice() } else { &[] },
            pages: s.sampled_pages as f64,
            fraction: s.sampled_pages as f64 / pages.max(1) as f64,
        })
        .collect();
    // Bonferroni over the tiers: both ends of the ratio at once.
    let alpha = ALPHA / sums.len().max(1) as f64;
    let (fitted, path) = vm.fit(&input, alpha, programs, may_fit);
    let out = sums
        .iter()
        .zip(fitted)
        .zip(pages)
        .map(|((s, f), &pages)| {
            let e = f.estimate;
            if !s.fitted() {
                return TierEstimate {
                    accesses: s.young_sum as f64,
                    ..Default::default()
                };
            }
            // A fitted rate holds through the walks; a plain sum counts
            // what was seen.
            let k = if e.saturation.is_some() {
                s.unwatched_scale()
            } else {
                1.0
            };
            let accesses = e.accesses * k;
            let bounds = f.bounds.map(|b| Bounds {
                // Scaled as the point, and never without it.
                low: (b.low * k).min(accesses),
                high: b.high.map(|h| (h * k).max(accesses)),
                ..b
            });
            // Passes of one length (hostpte's long pass: one pass of the
            // whole interval) fit no interval, yet the point stands: each
            // young page was touched at least once, and nothing bounds how
            // often. Firm only where every page was read (a sample's young
            // share scaled to the tier is not a bound); else no interval.
            let bounds = bounds.or_else(|| {
                (s.passes > 0 && s.sampled_pages >= pages).then(|| Bounds {
                    low: (s.young_max as f64).min(accesses),
                    high: None,
                    saturated: 0.0,
                    misfit: f64::NAN,
                })
            });
            TierEstimate {
                accesses,
                saturation: e.saturation,
                bounds,
                fit_age: f.age,
                deferred: path == FitPath::Deferred,
            }
        })
        .collect();
    (out, path)
}

impl Aggregator {
    /// One ageing pass within the interval: samples every live VM and keeps
    /// what it found for the interval's update.
    pub fn pass(&mut self, registry: &mut Registry, sampler: Option<&mut dyn Sampler>) {
        self.pass_at(registry, sampler, Instant::now());
    }

    /// [`Aggregator::pass`] as if it ran at `now` (the pass's length is the
    /// time since the previous one).
    pub fn pass_at(
        &mut self,
        registry: &mut Registry,
        sampler: Option<&mut dyn Sampler>,
        now: Instant,
    ) {
        let departed = registry.reap();
        self.pass_over(registry, sampler, &departed, now);
        self.departed.extend(departed);
    }

    fn pass_over(
        &mut self,
        registry: &Registry,
        sampler: Option<&mut dyn Sampler>,
        departed: &[String],
        now: Instant,
    ) {
        for id in departed {
            self.passes.remove(id);
        }
        let secs = self
            .last_pass
            .replace(now)
            .map(|before| now.saturating_duration_since(before).as_secs_f64());
        let (readings, health) = match sampler {
            Some(s) => {
                let (r, h) = sample(s, registry, departed, &mut self.not_measured);
                (Some(r), h)
            }
            None => (None, None),
        };
        // Without a sampler no per-pass vector of empty readings.
        let mut readings = readings.map(Vec::into_iter);
        for t in registry.iter() {
            let r = readings.as_mut().and_then(Iterator::next).flatten();
            let Some(r) = t.synthetic_readings().or(r) else {
                continue;
            };
            // Looked up by reference, once: no key copied for every pass.
            let id = &t.vm().id;
            match self.passes.get_mut(id) {
                Some(vp) => vp.add(r, secs),
                None => {
                    let mut vp = VmPasses::default();
                    vp.add(r, secs);
                    self.passes.insert(id.clone(), vp);
                }
            }
        }
        if let Some(h) = health {
            let total = self.health.get_or_insert_with(|| SamplerHealth {
                backend: h.backend,
                active: true,
                ..Default::default()
            });
            total.events += h.events;
            total.lost += h.lost;
            total.scan_cost_ns += h.scan_cost_ns;
            total.unattributed_pages += h.unattributed_pages;
            total.foreign_young_pages += h.foreign_young_pages;
            total.unmapped_pages += h.unmapped_pages;
            if !h.error.is_empty() {
                total.error = h.error;
            }
        }
    }

    /// Says, for every VM, why there is no sampler (the daemon runs
    /// without one): never a VM silently without numbers.
    pub fn set_no_sampler_reason(&mut self, reason: String) {
        self.no_sampler = Some(reason);
    }

    /// The interval's last pass; reaps dead VMs, reads the live ones and
    /// returns the next update.
    pub fn tick(
        &mut self,
        registry: &mut Registry,
        sampler: Option<&mut dyn Sampler>,
        interval_ns: u64,
    ) -> StatsUpdate {
        self.tick_at(registry, sampler, interval_ns, Instant::now())
    }

    /// [`Aggregator::tick`] as if its pass ran at `now`.
    pub fn tick_at(
        &mut self,
        registry: &mut Registry,
        sampler: Option<&mut dyn Sampler>,
        interval_ns: u64,
        now: Instant,
    ) -> StatsUpdate {
        let mut departed = std::mem::take(&mut self.departed);
        departed.extend(registry.reap());
        for id in &departed {
            self.last_guest.remove(id);
            self.windows.remove(id);
        }
        self.fit_budget.start(interval_ns as f64 / 1e9);
        let mut sampler = sampler;
        if let Some(s) = sampler.as_deref_mut() {
            s.interval_ends();
        }
        let reborrow = sampler.as_mut().map(|s| &mut **s as &mut dyn Sampler);
        self.pass_over(registry, reborrow, &departed, now);
        let health: Vec<SamplerHealth> = self.health.take().into_iter().collect();
        let mut passes = std::mem::take(&mut self.passes);
        // Departed VMs' reasons leave with them.
        let mut not_measured = std::mem::take(&mut self.not_measured);
        let backend = health.first().map_or(0, |h| h.backend);
        // The VM list travels only when the set of VMs changed.
        let vms_unchanged = self.sent_generation == Some(registry.generation());
        self.sent_generation = Some(registry.generation());
        let mut vms = Vec::with_capacity(if vms_unchanged { 0 } else { registry.len() });
        let mut stats = Vec::with_capacity(registry.len());
        let tracked_vms: Vec<_> = registry.iter().collect();
        let readings: Vec<Option<&[PassSum]>> = tracked_vms
            .iter()
            .map(|t| {
                passes
                    .get(&t.vm().id)
                    .filter(|p| p.read)
                    .map(|p| p.sums.as_slice())
            })
            .collect();
        let mut fits = self.fit_all(&tracked_vms, &readings);
        let mut fast: Vec<bool> = Vec::new();
        for (i, tracked) in tracked_vms.iter().enumerate() {
            let vm = tracked.vm();
            let reading = readings.get(i).copied().flatten();
            let why = not_measured.remove(&vm.id);
            let (resident, resident_why) = match tracked.resident_bytes() {
                Ok(r) => (r, String::new()),
                Err(e) => (Vec::new(), e),
            };
            let balloon = tracked.balloon_bytes().unwrap_or_default();
            let hotplug = tracked.hotplug_bytes().unwrap_or_default();
            let guest = tracked.guest_reported_accesses();
            let guest_delta = guest.map(|now| {
                let before = self.last_guest.insert(vm.id.clone(), now.clone());
                delta(&now, before.as_deref())
            });
            // Working-set ages: from the backend's own per-VM record.
            let mut ages = match sampler.as_mut() {
                Some(s) if reading.is_some() && !tracked.is_synthetic() => s.ages(vm),
                _ => None,
            }
            .unwrap_or_default()
            .into_iter();
            // Read but no pass for the estimate (hostpte's sweep): why.
            let quiet = match (sampler.as_ref(), reading) {
                (Some(s), Some(r)) if r.iter().all(|p| p.passes == 0) => s.quiet(vm),
                _ => None,
            };
            let fitted = fits.get_mut(i).map(std::mem::take).unwrap_or_default();
            let mut tiers = vm
                .tiers
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let r = reading.and_then(|r| r.get(i));
                    let mut sample = TierSample {
                        tier: t.name.clone(),
                        resident_bytes: resident.get(i).copied().unwrap_or(0),
                        balloon_target_bytes: balloon.get(i).map_or(0, |b| b.0),
                        balloon_actual_bytes: balloon.get(i).map_or(0, |b| b.1),
                        ages: ages.next(),
                        hotplug_requested_bytes: hotplug.get(i).copied().flatten().map(|h| h.0),
                        hotplug_plugged_bytes: hotplug.get(i).copied().flatten().and_then(|h| h.1),
                        resident_not_measured: resident_why.clone(),
                        ..Default::default()
                    };
                    // A tier read without an estimate is left unread (its
                    // VM's ratio unknown), never an estimate of 0.
                    if let Some(r) = r.filter(|r| r.passes > 0)
                        && let Some(e) = fitted.get(i).copied()
                    {
                        fill_estimate(&mut sample, t.size_bytes, r, e, backend);
                    }
                    sample
                })
                .collect::<Vec<_>>();
            fast.clear();
            fast.extend(vm.tiers.iter().map(|t| t.kind().is_fast()));
            // A tier no pass read while others were read: its accesses
            // are unknown, not 0, so the VM's ratio is too.
            let unread: Vec<String> = unread_tiers(&tiers, &resident)
                .into_iter()
                .map(str::to_string)
                .collect();
            let Hit {
                ratio,
                has,
                error,
                interval,
                not_measured: dram_hit_not_measured,
            } = vm_hit(&tiers, &fast, unread.is_empty(), backend);
            crate::hotset::mark_vacuous(&mut tiers, &vm.tiers);
            let hot_set_dram = crate::hotset::dram_share(&tiers, &fast);
            let quiet = quiet.or_else(|| {
                (!unread.is_empty()).then(|| {
                    format!(
                        "no pass read tier {} this interval: its accesses and the \
                         DRAM-hit ratio are unknown",
                        unread.join(", ")
                    )
                })
            });
            stats.push(VmStats {
                vm_id: vm.id.clone(),
                tiers,
                dram_hit_ratio: ratio,
                dram_hit_error: error,
                has_accesses: has,
                dram_hit_target: None,
                guest_reported_accesses: guest_delta.unwrap_or_default(),
                // A VM read by any pass of the interval is measured.
                not_measured: if reading.is_some() {
                    quiet.unwrap_or_default()
                } else {
                    why.or_else(|| self.no_sampler.clone()).unwrap_or_default()
                },
                dram_hit_low: interval.map(|i| i.low),
                dram_hit_high: interval.map(|i| i.high),
                dram_hit_low_open: interval.is_some_and(|i| i.low_open),
                dram_hit_high_open: interval.is_some_and(|i| i.high_open),
                counted_dram_hit_ratio: None,
                // Set by the daemon from the sampler's budget report.
                sampler_budget: None,
                // Set by the daemon from the controller's choice.
                actuator: 0,
                actuator_detail: String::new(),
                dram_hit_not_measured,
                hot_set_dram,
            });
            if !vms_unchanged {
                vms.push(vm.clone());
            }
        }
        // Kept for the next interval, emptied.
        drop(readings);
        for p in passes.values_mut() {
            p.read = false;
            p.sums.iter_mut().for_each(PassSum::reset);
        }
        self.passes = passes;
        self.sequence += 1;
        StatsUpdate {
            sequence: self.sequence,
            timestamp_unix_ns: crate::unix_now_ns(),
            interval_ns,
            vms,
            stats,
            departed_vm_ids: departed,
            vms_unchanged,
            health,
        }
    }
}

impl Aggregator {
    /// Every VM's estimates for this interval (empty without passes, and
    /// the VM's windows start over), in registry order. VMs are taken in
    /// turn from where the estimator's budget ran out last interval, so a
    /// deferred fit is among the first next time.
    fn fit_all(
        &mut self,
        tracked: &[&dyn crate::registry::TrackedVm],
        readings: &[Option<&[PassSum]>],
    ) -> Vec<Vec<TierEstimate>> {
        let n = tracked.len();
        let mut out = vec![Vec::new(); n];
        let start = self.fit_budget.cursor % n.max(1);
        let mut first_deferred = None;
        let mut pages: Vec<u64> = Vec::new();
        let mut clock = self.fit_budget.share.is_some().then(thread_cpu);
        for k in 0..n {
            let i = (start + k) % n;
            let vm = tracked[i].vm();
            let Some(r) = readings[i] else {
                // A VM without passes this interval starts its windows over.
                self.windows.remove(&vm.id);
                continue;
            };
            pages.clear();
            pages.extend(vm.tiers.iter().map(|t| (t.size_bytes / PAGE).max(1)));
            if !self.windows.contains_key(&vm.id) {
                self.windows.insert(vm.id.clone(), VmFit::default());
            }
            let Some(fit) = self.windows.get_mut(&vm.id) else {
                continue;
            };
            let (e, path) = estimates(
                r,
                fit,
                &mut self.programs,
                &pages,
                self.fit_budget.may_fit(),
            );
            // The clock is read after full fits only (a system call each):
            // the cheap VMs before one are charged with it.
            if path == FitPath::Full
                && let Some(b) = clock
            {
                let now = thread_cpu();
                self.fit_budget.credit -= now.saturating_sub(b).as_secs_f64();
                clock = Some(now);
            }
            if path == FitPath::Deferred && first_deferred.is_none() {
                first_deferred = Some(i);
            }
            out[i] = e;
        }
        if let Some(b) = clock {
            self.fit_budget.credit -= thread_cpu().saturating_sub(b).as_secs_f64();
        }
        self.fit_budget.cursor = first_deferred.unwrap_or(start);
        out
    }

    /// Sets the estimator's CPU budget, % of one core (0: none).
    pub fn set_fit_budget_pct(&mut self, pct: f64) {
        self.fit_budget.share = (pct > 0.0).then_some(pct / 100.0);
    }
}

/// Runs the sampler over every live VM; per-VM failures become the
/// health's error text and `not_measured` (VM id -> reason), and leave that
/// VM without readings.
fn sample(
    s: &mut dyn Sampler,
    registry: &Registry,
    departed: &[String],
    not_measured: &mut HashMap<String, String>,
) -> (Vec<Option<Vec<TierReading>>>, Option<SamplerHealth>) {
    for id in departed {
        s.forget(id);
    }
    // Synthetic VMs have no process to look at.
    let host: Vec<bool> = registry.iter().map(|t| !t.is_synthetic()).collect();
    let vms: Vec<_> = registry
        .iter()
        .zip(&host)
        .filter(|(_, h)| **h)
        .map(|(t, _)| t.vm())
        .collect();
    let started = Instant::now();
    let results = s.sample(&vms);
    let cost = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let backend = s.backend().short_name();
    let mut errors = Vec::new();
    for (r, vm) in results.iter().zip(&vms) {
        if let Err(e) = r {
            errors.push(format!("{}: {e}", vm.id));
            not_measured.insert(vm.id.clone(), format!("{backend}: {e}"));
        }
    }
    let events = results
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .flatten()
        .map(|t| t.sampled_pages)
        .sum();
    let signals = s.take_signals();
    let health = SamplerHealth {
        backend: s.backend() as i32,
        active: true,
        error: errors.join("; "),
        events,
        lost: 0,
        scan_cost_ns: cost,
        unattributed_pages: signals.unattributed,
        foreign_young_pages: signals.foreign_young,
        unmapped_pages: signals.unmapped,
        // Set by the daemon from the sampler's budget report.
        cpu_budget_pct: 0.0,
        cpu_spent_pct: 0.0,
    };
    let mut results = results.into_iter().map(Result::ok);
    let readings = host
        .iter()
        .map(|h| if *h { results.next().flatten() } else { None })
        .collect();
    (readings, Some(health))
}

/// Per-tier increase of cumulative counters; a counter that went backwards
/// (guest restarted its count) is taken as restarted from zero.
fn delta(now: &[u64], before: Option<&[u64]>) -> Vec<u64> {
    now.iter()
        .enumerate()
        .map(|(i, &n)| match before.and_then(|b| b.get(i)) {
            Some(&b) if n >= b => n - b,
            _ => n,
        })
        .collect()
}

/// Tiers without a pass this interval while others of the VM had one
/// (none when no tier had a pass): their accesses are unknown. A tier
/// known to hold no resident page has none to touch and reads 0.
/// One tier's estimate, scaled from the pages sampled to the tier, into
/// its sample.
fn fill_estimate(
    sample: &mut TierSample,
    size_bytes: u64,
    r: &PassSum,
    e: TierEstimate,
    backend: i32,
) {
    let pages = (size_bytes / PAGE).max(1);
    let scale = pages as f64 / r.sampled_pages as f64;
    sample.sampled_pages = r.sampled_pages;
    sample.young_pages = r.young_max;
    sample.coverage = (r.sampled_pages as f64 / pages as f64).min(1.0);
    sample.estimated_accessed_bytes = (r.young_max as f64 * scale) as u64 * PAGE;
    sample.estimated_accesses = e.accesses * scale;
    sample.saturation = e.saturation;
    if let Some(b) = e.bounds {
        sample.accesses_low = Some(b.low * scale);
        sample.accesses_high = b.high.map(|h| h * scale);
        sample.accesses_high_open = b.high.is_none();
        sample.saturated_pages = b.saturated * scale;
        // NaN: not computed (a deferred fit).
        sample.fit_misfit = Some(b.misfit).filter(|m| !m.is_nan());
    }
    sample.fit_age = e.fit_age;
    sample.fit_deferred = e.deferred;
    if r.fitted() {
        (sample.pass_seconds, sample.pass_young_pages) =
            r.timed.iter().map(|&(t, y)| (t, y as u64)).unzip();
    }
    sample.passes = r.passes;
    sample.source = backend;
}

/// A VM's DRAM-hit ratio over its tiers' estimates, its interval, and
/// whether the backend measures it at all (`VmStats.dram_hit_not_measured`).
struct Hit {
    ratio: f64,
    has: bool,
    error: f64,
    interval: Option<HitInterval>,
    not_measured: String,
}

/// `read_all`: every tier was read (else the ratio is unknown, not 0).
fn vm_hit(tiers: &[TierSample], fast: &[bool], read_all: bool, backend: i32) -> Hit {
    let (ratio, has) = if read_all {
        hit_ratio(tiers, fast)
    } else {
        (0.0, false)
    };
    let error = if has { hit_error(tiers, fast) } else { 0.0 };
    let interval = has.then(|| hit_interval(tiers, fast, ratio)).flatten();
    let bounds = interval.map(|i| crate::hotset::Bounds {
        low: i.low,
        high: i.high,
        low_open: i.low_open,
        high_open: i.high_open,
    });
    Hit {
        ratio,
        has,
        error,
        interval,
        not_measured: crate::hotset::ratio_not_measured(backend, bounds),
    }
}

fn unread_tiers<'a>(tiers: &'a [TierSample], resident: &[u64]) -> Vec<&'a str> {
    if tiers.iter().all(|t| t.passes == 0) {
        return Vec::new();
    }
    tiers
        .iter()
        .enumerate()
        .filter(|(i, t)| t.passes == 0 && resident.get(*i) != Some(&0))
        .map(|(_, t)| t.tier.as_str())
        .collect()
}

/// Half-width of a ~95 % interval for the hit ratio from sampling: zero when
/// every page was examined, else a binomial bound on the sampled share.
pub fn hit_error(tiers: &[TierSample], fast: &[bool]) -> f64 {
    if tiers.iter().all(|t| t.coverage >= 1.0) {
        return 0.0;
    }
    let young: u64 = tiers.iter().map(|t| t.young_pages).sum();
    if young == 0 {
        return 0.0;
    }
    let (p, _) = hit_ratio(tiers, fast);
    (1.96 * (p * (1.0 - p) / young as f64).sqrt()).min(1.0)
}

/// A ratio interval and which ends only the ratio's range bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HitInterval {
    pub low: f64,
    pub high: f64,
    pub low_open: bool,
    pub high_open: bool,
}

/// The DRAM-hit ratio's interval from each tier's accesses interval: the
/// least DRAM share pairs the fast tiers' low ends with the slow tiers'
/// high ends, and the other way round; it always holds `point`. `None`
/// when a tier that was read has no interval.
pub fn hit_interval(tiers: &[TierSample], fast: &[bool], point: f64) -> Option<HitInterval> {
    // (low, high; None = open) summed over the fast and the slow tiers.
    let mut sum = [(0.0, Some(0.0)), (0.0, Some(0.0))];
    for (t, f) in tiers.iter().zip(fast) {
        // The aggregator asks only when every tier without a pass holds
        // no resident page (`unread_tiers`): it adds nothing.
        if t.passes == 0 {
            continue;
        }
        let low = t.accesses_low?;
        let high = if t.accesses_high_open {
            None
        } else {
            Some(t.accesses_high?)
        };
        let s = &mut sum[usize::from(!*f)];
        s.0 += low;
        s.1 = s.1.zip(high).map(|(a, b)| a + b);
    }
    let [(d_lo, d_hi), (s_lo, s_hi)] = sum;
    let share = |d: f64, s: f64| if d + s > 0.0 { d / (d + s) } else { 0.0 };
    let low = s_hi.map_or(0.0, |s_hi| share(d_lo, s_hi));
    let high = d_hi.map_or(1.0, |d_hi| {
        if d_hi + s_lo > 0.0 {
            share(d_hi, s_lo)
        } else {
            1.0
        }
    });
    Some(HitInterval {
        low: low.min(point),
        high: high.max(point),
        low_open: s_hi.is_none(),
        high_open: d_hi.is_none(),
    })
}

/// Share of estimated accesses that hit fast tiers; `(0, false)` with none.
pub fn hit_ratio(tiers: &[TierSample], fast: &[bool]) -> (f64, bool) {
    let total: f64 = tiers.iter().map(|t| t.estimated_accesses).sum();
    if total <= 0.0 {
        return (0.0, false);
    }
    let hits: f64 = tiers
        .iter()
        .zip(fast)
        .filter(|(_, f)| **f)
        .map(|(t, _)| t.estimated_accesses)
        .sum();
    (hits / total, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delta_handles_first_reading_and_restarts() {
        assert_eq!(delta(&[5, 7], None), vec![5, 7]);
        assert_eq!(delta(&[9, 7], Some(&[5, 7])), vec![4, 0]);
        assert_eq!(delta(&[2, 10], Some(&[5, 7])), vec![2, 3]);
    }

    #[test]
    fn hit_ratio_weights_by_estimated_accesses() {
        let s = |a: f64| TierSample {
            estimated_accesses: a,
            ..Default::default()
        };
        let (r, has) = hit_ratio(&[s(300.0), s(100.0)], &[true, false]);
        assert!(has && (r - 0.75).abs() < 1e-12);
        assert_eq!(hit_ratio(&[s(0.0), s(0.0)], &[true, false]), (0.0, false));
    }

    /// A VM whose passes read a script of readings (no sampler): tests the
    /// aggregator's arithmetic only.
    struct ScriptedVm(tier_proto::v1::Vm, std::sync::Mutex<Vec<Vec<TierReading>>>);

    impl crate::registry::TrackedVm for ScriptedVm {
        fn vm(&self) -> &tier_proto::v1::Vm {
            &self.0
        }
        fn alive(&self) -> bool {
            true
        }
        fn resident_bytes(&self) -> Result<Vec<u64>, String> {
            Ok(Vec::new())
        }
        fn guest_reported_accesses(&self) -> Option<Vec<u64>> {
            None
        }
        fn synthetic_readings(&self) -> Option<Vec<TierReading>> {
            self.1.lock().ok()?.pop()
        }
    }

    #[test]
    fn past_the_fit_budget_fits_are_deferred_with_open_intervals_and_taken_in_turn() {
        use std::time::Duration;
        // Synthetic VMs: young counts drawn at random per pass, which no
        // kept fit agrees with, so every interval is due a full fit.
        let run = |pct: f64| {
            let mut reg = Registry::default();
            for i in 0..3 {
                reg.insert(Box::new(crate::synthetic::SyntheticVm::new(i, 2)));
            }
            let mut agg = Aggregator::default();
            agg.set_fit_budget_pct(pct);
            let t0 = Instant::now();
            let ms = Duration::from_millis;
            let mut updates = Vec::new();
            for k in 0..3u64 {
                let start = t0 + ms(1000 * k);
                for e in [25, 125, 500, 625] {
                    agg.pass_at(&mut reg, None, start + ms(e));
                }
                updates.push(agg.tick_at(&mut reg, None, 1_000_000_000, start + ms(1000)));
            }
            // Per interval after the first (untimed: no pass before it),
            // which VMs were deferred.
            updates[1..]
                .iter()
                .map(|u| {
                    u.stats
                        .iter()
                        .map(|v| {
                            let deferred = v.tiers.iter().all(|t| t.fit_deferred);
                            if deferred {
                                // Firm low end, high end open, no misfit.
                                assert!(v.tiers.iter().all(|t| t.accesses_high_open
                                    && t.accesses_low.is_some()
                                    && t.fit_misfit.is_none()));
                            }
                            deferred
                        })
                        .collect::<Vec<bool>>()
                })
                .collect::<Vec<_>>()
        };
        assert!(run(0.0).iter().flatten().all(|d| !d), "no budget");
        // A budget far below one fit: the first VM in turn is fitted, the
        // rest deferred, and the next interval starts from the first of
        // those.
        let tiny = run(1e-9);
        assert_eq!(tiny[0].iter().filter(|d| !**d).count(), 1, "{tiny:?}");
        let first = tiny[0].iter().position(|d| !*d);
        let next = tiny[1].iter().position(|d| !*d);
        assert_ne!(first, next, "{tiny:?}");
    }

    /// VM "vm" with a dram and a slow tier of 4096 pages each.
    fn two_tier_vm() -> tier_proto::v1::Vm {
        use tier_proto::v1::{Tier, TierKind, Vm};
        let tier = |name: &str, kind: TierKind| Tier {
            name: name.into(),
            kind: kind.into(),
            size_bytes: 4096 * PAGE,
            ..Default::default()
        };
        Vm {
            id: "vm".into(),
            tiers: vec![tier("dram", TierKind::Dram), tier("slow", TierKind::Cxl)],
            ..Default::default()
        }
    }

    #[test]
    fn passes_are_timed_by_the_sampler_exposure_and_scaled_to_the_interval() {
        use std::time::Duration;
        let ms = Duration::from_millis;
        let ends = [25, 125, 500, 625, 1000].map(ms);
        // Each pass watched 7 ms less than its length (the walk); pages
        // young as a rate of 40 (dram) and 10 (slow) touches/s over 1024
        // pages would make them.
        let mut lengths = vec![ends[0]];
        lengths.extend(ends.windows(2).map(|w| w[1] - w[0]));
        let watched: Vec<Duration> = lengths.iter().map(|l| *l - ms(7)).collect();
        let young =
            |r: f64, t: Duration| (1024.0 * -(-r * t.as_secs_f64()).exp_m1()).round() as u64;
        let mut script: Vec<Vec<TierReading>> = watched
            .iter()
            .map(|&w| {
                [40.0, 10.0]
                    .map(|r| TierReading {
                        sampled_pages: 4096,
                        young_pages: young(r, w),
                        exposure: Some(w),
                    })
                    .to_vec()
            })
            .collect();
        // Popped from the end: the arming reading first.
        script.reverse();
        script.push(vec![TierReading::default(); 2]);
        let vm = two_tier_vm();
        let mut reg = Registry::default();
        reg.insert(Box::new(ScriptedVm(vm, std::sync::Mutex::new(script))));
        let mut agg = Aggregator::default();
        let t0 = Instant::now();
        agg.tick_at(&mut reg, None, 1_000_000_000, t0);
        for e in &ends[..4] {
            agg.pass_at(&mut reg, None, t0 + *e);
        }
        let u = agg.tick_at(&mut reg, None, 1_000_000_000, t0 + ends[4]);
        let tiers = &u.stats[0].tiers;
        let secs: Vec<f64> = watched.iter().map(|w| w.as_secs_f64()).collect();
        assert_eq!(tiers[0].pass_seconds, secs);
        // The fit sees the watched seconds; its accesses stand for the
        // whole second, walks included.
        let passes: Vec<Vec<(f64, f64)>> = tiers
            .iter()
            .map(|t| {
                secs.iter()
                    .zip(&t.pass_young_pages)
                    .map(|(&s, &y)| (s, y as f64))
                    .collect()
            })
            .collect();
        let fits = crate::estimate::fit_vm(&[&passes[0], &passes[1]]);
        let scale = 1.0 / secs.iter().sum::<f64>();
        for (t, f) in tiers.iter().zip(&fits) {
            let want = f.accesses * scale;
            assert!(
                (t.estimated_accesses / want - 1.0).abs() < 1e-9,
                "{t:?} {want}"
            );
        }
        // 1024 pages at 40/s and 10/s: 40960 and 10240 touches per second.
        let (d, s) = (tiers[0].estimated_accesses, tiers[1].estimated_accesses);
        assert!(
            (d / 40960.0 - 1.0).abs() < 0.05 && (s / 10240.0 - 1.0).abs() < 0.05,
            "{d} {s}"
        );
        // The VM's rate windows carry over to its next interval; an
        // interval without passes (the script is used up) drops them.
        assert!(agg.windows.contains_key("vm"));
        let u = agg.tick_at(&mut reg, None, 1_000_000_000, t0 + ends[4] * 2);
        assert_eq!(u.stats[0].tiers[0].passes, 0);
        assert!(!agg.windows.contains_key("vm"), "{:?}", agg.windows);
    }

    /// One pass of the whole interval (hostpte's long pass) fits no
    /// interval: every page read, the young pages are a firm low end and
    /// the high end is open; a sampled tier gets none (its scaled share is
    /// no bound), and its VM's ratio no interval.
    #[test]
    fn a_single_whole_pass_gives_a_firm_low_end_and_an_open_high_one() {
        use std::time::Duration;
        let vm = two_tier_vm();
        let reading = |sampled: u64, young: u64| TierReading {
            sampled_pages: sampled,
            young_pages: young,
            exposure: Some(Duration::from_millis(990)),
        };
        for (sampled, firm) in [(4096, true), (512, false)] {
            let script = vec![
                vec![reading(sampled, 300), reading(sampled, 100)],
                vec![TierReading::default(); 2],
            ];
            let mut reg = Registry::default();
            reg.insert(Box::new(ScriptedVm(
                vm.clone(),
                std::sync::Mutex::new(script),
            )));
            let mut agg = Aggregator::default();
            let t0 = Instant::now();
            agg.tick_at(&mut reg, None, 1_000_000_000, t0);
            let u = agg.tick_at(&mut reg, None, 1_000_000_000, t0 + Duration::from_secs(1));
            let (s, t) = (&u.stats[0], &u.stats[0].tiers);
            assert_eq!(t[0].passes, 1);
            if firm {
                assert_eq!(t[0].accesses_low, Some(300.0), "{:?}", t[0]);
                assert_eq!(t[1].accesses_low, Some(100.0));
                assert!(t[0].accesses_high_open && t[1].accesses_high_open);
                assert!(t[0].estimated_accesses >= 300.0);
                // Both tiers open above: the ratio may be anything.
                assert_eq!((s.dram_hit_low, s.dram_hit_high), (Some(0.0), Some(1.0)));
                assert!(s.dram_hit_low_open && s.dram_hit_high_open);
            } else {
                assert_eq!(t[0].accesses_low, None, "{:?}", t[0]);
                assert_eq!(s.dram_hit_low, None);
            }
        }
    }

    /// A tier that no pass read while the other was read: its accesses are
    /// unknown, so the VM has no ratio, no interval, and says why; a tier
    /// known to hold no resident page reads an exact 0.
    #[test]
    fn a_tier_without_a_pass_leaves_the_ratio_unknown_not_zero() {
        use std::time::Duration;
        struct Vm2(ScriptedVm, Vec<u64>);
        impl crate::registry::TrackedVm for Vm2 {
            fn vm(&self) -> &tier_proto::v1::Vm {
                self.0.vm()
            }
            fn alive(&self) -> bool {
                true
            }
            fn resident_bytes(&self) -> Result<Vec<u64>, String> {
                match self.1.is_empty() {
                    true => Err("smaps unreadable".into()),
                    false => Ok(self.1.clone()),
                }
            }
            fn guest_reported_accesses(&self) -> Option<Vec<u64>> {
                None
            }
            fn synthetic_readings(&self) -> Option<Vec<TierReading>> {
                self.0.synthetic_readings()
            }
        }
        let reading = |sampled: u64, young: u64| TierReading {
            sampled_pages: sampled,
            young_pages: young,
            exposure: Some(Duration::from_millis(990)),
        };
        // Resident unknown, or known and non-zero: unknown; known 0: zero.
        for (resident, known) in [
            (vec![], false),
            (vec![4096 * PAGE, 4096 * PAGE], false),
            (vec![4096 * PAGE, 0], true),
        ] {
            let script = vec![
                vec![reading(4096, 300), reading(0, 0)],
                vec![TierReading::default(); 2],
            ];
            let mut reg = Registry::default();
            reg.insert(Box::new(Vm2(
                ScriptedVm(two_tier_vm(), std::sync::Mutex::new(script)),
                resident.clone(),
            )));
            let mut agg = Aggregator::default();
            let t0 = Instant::now();
            agg.tick_at(&mut reg, None, 1_000_000_000, t0);
            let u = agg.tick_at(&mut reg, None, 1_000_000_000, t0 + Duration::from_secs(1));
            let s = &u.stats[0];
            assert_eq!((s.tiers[0].passes, s.tiers[1].passes), (1, 0));
            if known {
                assert!(s.has_accesses, "{resident:?} {s:?}");
                assert_eq!(s.dram_hit_ratio, 1.0);
                assert!(s.not_measured.is_empty(), "{}", s.not_measured);
            } else {
                assert!(!s.has_accesses, "{resident:?} {s:?}");
                assert_eq!((s.dram_hit_low, s.dram_hit_high), (None, None));
                assert!(s.not_measured.contains("tier slow"), "{}", s.not_measured);
            }
        }
    }

    /// A sampler that refuses every VM (stands in for a backend on a host
    /// where the VM's memory cannot be aged): tests the aggregator's
    /// plumbing of the reason only.
    struct RefusingSampler;

    impl Sampler for RefusingSampler {
        fn backend(&self) -> tier_proto::v1::Backend {
            tier_proto::v1::Backend::EptTracepoint
        }
        fn sample(
            &mut self,
            vms: &[&tier_proto::v1::Vm],
        ) -> Vec<Result<Vec<TierReading>, crate::sampler::SampleError>> {
            vms.iter()
                .map(|_| {
                    Err(crate::sampler::SampleError::Unmeasurable {
                        reason: "guest memory is hugetlbfs-backed".into(),
                    })
                })
                .collect()
        }
        fn take_signals(&mut self) -> crate::sampler::Signals {
            crate::sampler::Signals {
                unattributed: 7,
                foreign_young: 5,
                unmapped: 3,
            }
        }
    }

    #[test]
    fn a_vm_the_sampler_refuses_says_why_stand_in_sampler() {
        use tier_proto::v1::{Tier, Vm};
        let vm = Vm {
            id: "vm".into(),
            tiers: vec![Tier {
                name: "dram".into(),
                size_bytes: 64 * PAGE,
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut reg = Registry::default();
        // An empty script: no synthetic readings, so the sampler reads it.
        reg.insert(Box::new(ScriptedVm(vm, std::sync::Mutex::new(Vec::new()))));
        let mut agg = Aggregator::default();
        let mut s = RefusingSampler;
        let u = agg.tick(&mut reg, Some(&mut s), 1_000_000_000);
        let st = &u.stats[0];
        assert_eq!(
            st.not_measured,
            "ept-tracepoint: guest memory is hugetlbfs-backed"
        );
        assert!(!st.has_accesses);
        assert_eq!(st.tiers[0].passes, 0);
        assert!(u.health[0].error.contains("hugetlbfs"), "{:?}", u.health);
        // The backend's health signals travel in the interval's health.
        let h = &u.health[0];
        assert_eq!(
            (
                h.unattributed_pages,
                h.foreign_young_pages,
                h.unmapped_pages
            ),
            (7, 5, 3)
        );
    }

    fn tier(low: f64, high: Option<f64>) -> TierSample {
        TierSample {
            passes: 5,
            accesses_low: Some(low),
            accesses_high: high,
            accesses_high_open: high.is_none(),
            ..Default::default()
        }
    }

    #[test]
    fn the_ratio_interval_pairs_opposite_ends_and_says_which_are_open() {
        let fast = [true, false];
        let both = hit_interval(
            &[tier(60.0, Some(90.0)), tier(10.0, Some(40.0))],
            &fast,
            0.8,
        );
        let i = both.unwrap();
        assert!(
            (i.low - 0.6).abs() < 1e-12 && (i.high - 0.9).abs() < 1e-12,
            "{i:?}"
        );
        assert!(!i.low_open && !i.high_open);
        // DRAM's hottest pages outrun the passes: at least 60 %, open above.
        let i = hit_interval(&[tier(60.0, None), tier(10.0, Some(40.0))], &fast, 0.8).unwrap();
        assert_eq!(
            (i.high, i.high_open, i.low_open),
            (1.0, true, false),
            "{i:?}"
        );
        // Both: accessed bits cannot bound it at all.
        let i = hit_interval(&[tier(60.0, None), tier(10.0, None)], &fast, 0.3).unwrap();
        assert_eq!(
            (i.low, i.high, i.low_open, i.high_open),
            (0.0, 1.0, true, true)
        );
        // The point is always inside; a tier without an interval gives none.
        let i = hit_interval(
            &[tier(60.0, Some(90.0)), tier(10.0, Some(40.0))],
            &fast,
            0.95,
        )
        .unwrap();
        assert_eq!(i.high, 0.95);
        let none = TierSample {
            passes: 5,
            ..Default::default()
        };
        assert_eq!(
            hit_interval(&[tier(1.0, Some(2.0)), none], &fast, 0.5),
            None
        );
        // A tier without passes adds nothing.
        let idle = TierSample::default();
        let i = hit_interval(&[tier(1.0, Some(2.0)), idle], &fast, 1.0).unwrap();
        assert_eq!((i.low, i.high), (1.0, 1.0));
    }
}
