//! Working-set ages at real rates through tierd's own code: each ept
//! model's ageing pass hands the young bit of every examined page to a
//! `tier_profiler::ages::recency::Recency` per tier (what
//! `sampler/ept_recency.rs` does with page_idle's bitmap), and each
//! interval `from_recency` gives the working set per horizon with its
//! interval (the TLB's unseen pages in the high end, as tierd adds them),
//! scored against the pages the stream touched within it.

use std::time::{Duration, Instant};

use tier_profiler::ages::profile::{from_recency, tlb_unseen_pages};
use tier_profiler::ages::recency::Recency;

use super::ept::EptBits;

/// Horizons scored, seconds (tierd's defaults that fit a twin run).
pub const HORIZONS: [f64; 3] = [1.0, 10.0, 60.0];

const PAGE: f64 = 4096.0;

/// One tier's working set within one horizon at an interval end, real
/// pages: the truth and each ept model's (point, low, high), `None` where
/// not measured.
#[derive(Debug, Clone, Copy)]
pub struct AgeRec {
    pub horizon: f64,
    pub tier: usize,
    pub truth: f64,
    pub est: [Option<(f64, f64, f64)>; 2],
    /// The tier's population: an interval from 0 to it says nothing.
    pub full: f64,
}

/// The recency records of one ept model.
#[derive(Debug)]
pub struct Ages {
    epoch: Instant,
    /// Per tier: the record and its examined pages.
    tiers: Vec<(Recency, Vec<usize>)>,
    young: Vec<bool>,
    last_end: f64,
}

impl Ages {
    /// The examined pages of `ept` (every `stride`-th), split by tier.
    pub fn new(ept: &EptBits, tier_of: &[u8], tiers: usize) -> Ages {
        let epoch = Instant::now();
        let longest = HORIZONS[HORIZONS.len() - 1];
        let tiers = (0..tiers)
            .map(|t| {
                let pages: Vec<usize> = (0..tier_of.len())
                    .step_by(ept.stride)
                    .filter(|&p| usize::from(tier_of[p]) == t)
                    .collect();
                let mut r = Recency::new(epoch, longest);
                let keys: Vec<u64> = pages.iter().map(|&p| p as u64).collect();
                r.set_units(&keys, &vec![1; keys.len()]);
                (r, pages)
            })
            .collect();
        Ages {
            epoch,
            tiers,
            young: Vec::new(),
            last_end: 0.0,
        }
    }

    fn at(&self, t: f64) -> Instant {
        self.epoch + Duration::from_secs_f64(t.max(0.0))
    }

    /// After `ept`'s pass that ended at `end` (it found young exactly the
    /// pages whose `last_young` is `end`): the pass watched from the last
    /// (the first from 0, where the bits were armed, not observed).
    pub fn observe(&mut self, ept: &EptBits, end: f64) {
        let (start, stop) = (self.at(self.last_end), self.at(end));
        for (rec, pages) in &mut self.tiers {
            self.young.clear();
            self.young
                .extend(pages.iter().map(|&p| ept.last_young[p] == end));
            rec.observe(start, stop, &self.young);
        }
        self.last_end = end;
    }

    /// Per tier and horizon, (point, low, high) real pages for a tier of
    /// `population[t]` real pages; `None`: not measured.
    pub fn read(&mut self, population: &[f64]) -> Vec<[Option<(f64, f64, f64)>; 3]> {
        self.tiers
            .iter_mut()
            .zip(population)
            .map(|((rec, _), &pop)| {
                // One vCPU, 4 KiB mappings: the model's TLB (tlb.rs) holds
                // fewer entries than tierd's bound assumes.
                let a = from_recency(rec, &HORIZONS, pop, tlb_unseen_pages(1, 1.0, pop));
                let mut out = [None; 3];
                for (o, w) in out.iter_mut().zip(&a.working_set) {
                    if w.not_measured.is_empty() {
                        *o = Some((w.bytes / PAGE, w.bytes_low / PAGE, w.bytes_high / PAGE));
                    }
                }
                out
            })
            .collect()
    }
}

/// Pages of each tier touched after `since` (sim pages x `scale`).
pub fn truth(last_touch: &[f64], tier_of: &[u8], tiers: usize, since: f64, scale: f64) -> Vec<f64> {
    let mut out = vec![0.0; tiers];
    for (t, &tier) in last_touch.iter().zip(tier_of) {
        if *t > since {
            out[usize::from(tier)] += scale;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::twin::tlb::Tlb;

    /// Every page touched once between passes, a TLB flushed each pass:
    /// the 1 s working set read through tierd's record is the truth, and
    /// pages touched only before the horizon fall out of it.
    #[test]
    fn flushed_bits_read_the_exact_working_set() {
        let tier_of = vec![0u8, 0, 1, 1];
        let mut e = EptBits::new(4, Tlb::sets(64, 4), 1, true);
        let mut ages = Ages::new(&e, &tier_of, 2);
        let mut last = vec![f64::NEG_INFINITY; 4];
        e.age(&tier_of, 2, 0.0);
        for k in 1..=4 {
            let t = f64::from(k);
            // Pages 0 and 2 touched every second, 1 and 3 only in the first.
            for p in [0u32, 2]
                .into_iter()
                .chain((k == 1).then_some([1u32, 3]).into_iter().flatten())
            {
                e.touch(p, t - 0.5);
                last[p as usize] = t - 0.5;
            }
            e.age(&tier_of, 2, t);
            ages.observe(&e, t);
        }
        let r = ages.read(&[2.0, 2.0]);
        let tr = truth(&last, &tier_of, 2, 4.0 - 1.0, 1.0);
        assert_eq!(tr, vec![1.0, 1.0]);
        for (t, per) in r.iter().enumerate() {
            let (p, lo, hi) = per[0].unwrap();
            assert!((p - tr[t]).abs() < 1e-9, "tier {t}: {p}");
            assert!(lo <= tr[t] && tr[t] <= hi, "tier {t}: [{lo}, {hi}]");
            // 10 s: not watched that long yet.
            assert!(per[1].is_none());
        }
    }
}
