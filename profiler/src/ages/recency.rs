//! Per sampled page (or folio), the pass it was last seen young in: the
//! working set per horizon, and promotion, for backends that know each
//! sampled page's young bit (the ept backends through page_idle).
//!
//! A page young in pass P was touched somewhere in P's `(start, end]`. For
//! a horizon H at `now`: a last-young pass that began at or after
//! `now - H` counts in both ends; one that began before and ended after
//! counts in the high end only (the point takes the part of it inside).
//!
//! A pass armed later than the previous one ended (its `start` after that
//! end) leaves a *gap*: the time between was not watched, so a touch in it
//! was lost with the re-arm. A page's age is unknown across a gap: a page
//! not seen young since before a gap inside a horizon counts in that
//! horizon's high end only, and a page young after a gap is a definite
//! promotion only if it was watched untouched for the longest horizon
//! after the gap (else a possible one). A skipped slot that keeps the
//! pages armed is no gap: the next pass starts where the last one was armed
//! and spans the skip (`sampler/ept_ageing.rs`).
//! Memory: 8 bytes per sampled unit plus 16 per pass (and per gap) inside
//! the longest horizon; nothing is allocated per pass once the sample is
//! steady.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use super::interval::share_bounds;
use super::{Bounded, horizon_label};

/// One unit's state: pass indices (1-based; 0 = never young).
#[derive(Debug, Clone, Copy, Default)]
struct Unit {
    last_young: u32,
    /// The pass that armed this unit: watched from its end.
    since: u32,
}

/// One tier's recency record.
#[derive(Debug, Clone)]
pub struct Recency {
    epoch: Instant,
    longest: f64,
    /// (start, end) seconds since `epoch` of passes `first..next`.
    passes: VecDeque<(f64, f64)>,
    /// Unwatched spans (end of a pass, start of the next) that may still
    /// matter: ending within the longest horizon of the last pass's start.
    gaps: VecDeque<(f64, f64)>,
    first: u32,
    next: u32,
    keys: Vec<u64>,
    weights: Vec<u32>,
    units: Vec<Unit>,
    /// End of the first (arming) pass.
    started: Option<f64>,
    /// Promoted pages (definite, possible) since the last take, and when
    /// that span began.
    promoted: (f64, f64),
    promoted_since: Option<f64>,
}

/// What [`Recency::profile`] gives for one horizon: in sample pages.
#[derive(Debug, Clone, PartialEq)]
pub enum Horizon {
    Measured(Bounded),
    NotMeasured(String),
}

impl Recency {
    /// `longest`: the longest horizon, seconds (cold and promotion).
    pub fn new(epoch: Instant, longest: f64) -> Recency {
        Recency {
            epoch,
            longest,
            passes: VecDeque::new(),
            gaps: VecDeque::new(),
            first: 1,
            next: 1,
            keys: Vec::new(),
            weights: Vec::new(),
            units: Vec::new(),
            started: None,
            promoted: (0.0, 0.0),
            promoted_since: None,
        }
    }

    fn secs(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.epoch).as_secs_f64()
    }

    /// The sample this pass examines: unit keys (e.g. folio head PFNs) and
    /// their pages. Units kept from the last sample keep their history;
    /// new ones are armed by the next pass and watched from its end. No
    /// allocation when unchanged.
    pub fn set_units(&mut self, keys: &[u64], weights: &[u32]) {
        if keys == self.keys.as_slice() {
            self.weights.clear();
            self.weights.extend_from_slice(weights);
            return;
        }
        let old: HashMap<u64, Unit> = self
            .keys
            .iter()
            .copied()
            .zip(self.units.iter().copied())
            .collect();
        let since = self.next;
        self.units = keys
            .iter()
            .map(|k| {
                old.get(k).copied().unwrap_or(Unit {
                    last_young: 0,
                    since,
                })
            })
            .collect();
        self.keys = keys.to_vec();
        self.weights = weights.to_vec();
    }

    fn pass(&self, index: u32) -> Option<(f64, f64)> {
        let i = index.checked_sub(self.first)?;
        self.passes.get(i as usize).copied()
    }

    /// The end of the latest gap that ended at or before `t`, if any.
    fn gap_before(&self, t: f64) -> f64 {
        self.gaps
            .iter()
            .rev()
            .map(|g| g.1)
            .find(|&ge| ge <= t)
            .unwrap_or(f64::NEG_INFINITY)
    }

    /// Whether a gap ended after `t` (and before `now`'s horizon `cut`):
    /// a touch after `t` may have been lost in it.
    fn gap_after(&self, t: f64, cut: f64) -> bool {
        self.gaps.iter().any(|&(_, ge)| ge > t && ge > cut)
    }

    /// Records one pass over the current units: it watched from `start`
    /// (the re-arm) to `end` (the read); `young[i]` for unit i. A `start`
    /// after the previous pass's end leaves a gap (not watched).
    pub fn observe(&mut self, start: Instant, end: Instant, young: &[bool]) {
        let (s, e) = (self.secs(start), self.secs(end));
        if let Some(&(_, pe)) = self.passes.back()
            && s > pe
        {
            self.gaps.push_back((pe, s));
        }
        // The first pass arms every unit: watched from its end.
        self.started.get_or_insert(e);
        self.promoted_since.get_or_insert(e);
        let index = self.next;
        self.passes.push_back((s, e));
        self.next += 1;
        let longest = self.longest;
        let watched = self.started.map_or(0.0, |st| s - st);
        // Watched without a gap since: a cold stretch starts here at the
        // earliest.
        let seen_from = self.gap_before(s);
        let (mut definite, mut possible) = (0.0, 0.0);
        for (i, y) in young.iter().enumerate() {
            if !*y {
                continue;
            }
            let Some(u) = self.units.get(i).copied() else {
                break;
            };
            // A unit's first pass only arms it: young since whenever.
            if u.since == index {
                continue;
            }
            let w = f64::from(self.weights.get(i).copied().unwrap_or(1));
            // Cold before this pass: watched untouched for at least
            // `longest` (definite) or maybe (the last touch's time, or a
            // gap since, leaves it open).
            let cold = if u.last_young != 0 {
                match self.pass(u.last_young) {
                    Some((_, le)) if s - le.max(seen_from) >= longest => Some(true),
                    Some((ls, _)) if s - ls >= longest => None,
                    Some(_) => Some(false),
                    // Dropped: it ended before the longest horizon.
                    None if s - seen_from >= longest => Some(true),
                    None => None,
                }
            } else {
                let from = self.pass(u.since).map_or(f64::NEG_INFINITY, |p| p.1);
                if s - from.max(seen_from) >= longest {
                    Some(true)
                } else if watched >= longest || s - from >= longest {
                    // Joined the sample lately, or a gap since: what came
                    // before is unknown.
                    None
                } else {
                    Some(false)
                }
            };
            match cold {
                Some(true) => {
                    definite += w;
                    possible += w;
                }
                None => possible += w,
                Some(false) => {}
            }
            if let Some(unit) = self.units.get_mut(i) {
                unit.last_young = index;
            }
        }
        self.promoted.0 += definite;
        self.promoted.1 += possible;
        // Passes that ended before the longest horizon are no longer needed.
        while self
            .passes
            .front()
            .is_some_and(|&(_, pe)| pe < e - longest && self.passes.len() > 1)
        {
            self.passes.pop_front();
            self.first += 1;
        }
        // Nor gaps that ended a longest horizon before this pass began
        // (later passes begin no earlier).
        while self.gaps.front().is_some_and(|&(_, ge)| ge <= s - longest) {
            self.gaps.pop_front();
        }
    }

    /// Seconds watched: from the first pass's end to the last's.
    pub fn history(&self) -> f64 {
        match (self.started, self.passes.back()) {
            (Some(s), Some(&(_, e))) => (e - s).max(0.0),
            _ => 0.0,
        }
    }

    /// Pages in the current sample.
    pub fn sample_pages(&self) -> f64 {
        self.weights.iter().map(|&w| f64::from(w)).sum()
    }

    /// Working set per horizon at the end of the last pass, in sample
    /// pages: the share bounds are applied by [`scale`].
    pub fn counts(&self, horizons: &[f64]) -> Vec<Result<(f64, f64, f64), String>> {
        let now = self.passes.back().map_or(0.0, |p| p.1);
        let history = self.history();
        let mut low = vec![0.0; horizons.len()];
        let mut high = vec![0.0; horizons.len()];
        let mut point = vec![0.0; horizons.len()];
        for (u, &w) in self.units.iter().zip(&self.weights) {
            let w = f64::from(w);
            let young = if u.last_young == 0 {
                None
            } else {
                self.pass(u.last_young)
            };
            let since = self.pass(u.since).map(|p| p.1);
            // Last seen touched no later than this (a dropped pass: long
            // before).
            let seen = if u.last_young == 0 {
                since
            } else {
                young.map(|p| p.1)
            }
            .unwrap_or(f64::NEG_INFINITY);
            for (j, &h) in horizons.iter().enumerate() {
                let cut = now - h;
                match young {
                    Some((s, _)) if s >= cut => {
                        low[j] += w;
                        high[j] += w;
                        point[j] += w;
                    }
                    Some((s, e)) if e > cut => {
                        high[j] += w;
                        point[j] += w * (e - cut) / (e - s).max(1e-9);
                    }
                    // Joined the sample inside the horizon, not young since:
                    // touched before joining or not, unknown.
                    _ if u.last_young == 0 && since.is_some_and(|s| s > cut) => high[j] += w,
                    // Not young since a pass before a gap inside the
                    // horizon: a touch in the gap was lost, unknown.
                    _ if self.gap_after(seen, cut) => high[j] += w,
                    _ => {}
                }
            }
        }
        horizons
            .iter()
            .enumerate()
            .map(|(j, &h)| {
                if history + 1e-9 < h {
                    return Err(format!(
                        "watched for {history:.1} s of {}",
                        horizon_label(h)
                    ));
                }
                Ok((point[j], low[j], high[j]))
            })
            .collect()
    }

    /// Promoted sample pages (definite, possible) since the last take and
    /// the seconds they span; `None` until the longest horizon was watched.
    pub fn take_promoted(&mut self) -> Option<(f64, f64, f64)> {
        let now = self.passes.back().map_or(0.0, |p| p.1);
        let since = self.promoted_since.replace(now)?;
        let p = std::mem::take(&mut self.promoted);
        (self.history() >= self.longest && now > since).then_some((p.0, p.1, now - since))
    }

    /// Pages of the largest unit (a huge folio: 512).
    pub fn max_unit_pages(&self) -> f64 {
        self.weights.iter().max().map_or(1.0, |&w| f64::from(w))
    }

    /// Units in the sample.
    pub fn units(&self) -> usize {
        self.units.len()
    }
}

/// Sample counts (point, low, high) of `n` pages in `units` units, scaled to
/// a population of `population` pages with the share's ~95 % interval.
pub fn scale(c: (f64, f64, f64), n: f64, units: usize, population: f64) -> Bounded {
    let (point, low, high) = c;
    if n <= 0.0 {
        return Bounded::default();
    }
    // Variance by units (a folio is one draw), shares by pages.
    let un = units.max(1) as f64;
    let upop = (population * un / n).max(un);
    let lo = share_bounds(low / n * un, un, upop).0;
    let hi = share_bounds(high / n * un, un, upop).1;
    let p = (point / n).clamp(lo, hi);
    Bounded {
        point: p * population,
        low: lo * population,
        high: hi * population,
    }
}
