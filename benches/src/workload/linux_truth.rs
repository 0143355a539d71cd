//! Per-interval truth of the Linux bed from tier_truth's per-page counters:
//! touches and LLC misses per tier, and the working set per horizon from
//! the interval each page was last touched in (a band: a page touched in
//! an interval that straddles the horizon's start may or may not count).

use std::time::{Duration, Instant};

use tier_linux_bed::truth::{PAGE, Snapshot};

/// One interval's sums per tier [dram, slow].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IntervalSums {
    pub touches: [u64; 2],
    pub misses: [u64; 2],
    pub pages: [u64; 2],
    /// Guest instructions executed (all vCPUs).
    pub instructions: u64,
}

impl IntervalSums {
    /// Adds a part of the interval (one pass's sums).
    pub fn add(&mut self, o: &IntervalSums) {
        for t in 0..2 {
            self.touches[t] += o.touches[t];
            self.misses[t] += o.misses[t];
        }
        self.instructions += o.instructions;
    }
}

/// Snapshot history reduced to what the metrics need.
#[derive(Debug)]
pub struct PageHistory {
    /// Tier of each page (0 dram, 1 slow), None outside both.
    tier: Vec<Option<u8>>,
    /// 1 + the interval each page was last touched in; 0: not yet.
    last: Vec<u32>,
    /// End instant of each interval; index 0 is the first snapshot.
    ends: Vec<Instant>,
    prev: Snapshot,
}

impl PageHistory {
    /// Starts at `first`, taken at `at`; `tiers` are the guest-physical
    /// ranges [(start, len)] of each tier.
    pub fn new(first: Snapshot, at: Instant, tiers: &[Vec<(u64, u64)>; 2]) -> PageHistory {
        let tier = (0..first.touches.len())
            .map(|i| {
                let gpa = first.page_gpa(i)?;
                tiers.iter().position(|rs| {
                    rs.iter()
                        .any(|&(s, l)| gpa >= s && gpa + PAGE <= s.saturating_add(l))
                })
            })
            .map(|t| t.and_then(|t| u8::try_from(t).ok()))
            .collect();
        PageHistory {
            last: vec![0; first.touches.len()],
            tier,
            ends: vec![at],
            prev: first,
        }
    }

    /// Closes an interval (or a pass) at `at` with `now`: its sums per
    /// tier (pages: distinct pages touched in it; not additive).
    pub fn push(&mut self, now: Snapshot, at: Instant) -> IntervalSums {
        let k = u32::try_from(self.ends.len()).unwrap_or(u32::MAX);
        let mut s = IntervalSums {
            instructions: now
                .counters
                .instructions
                .saturating_sub(self.prev.counters.instructions),
            ..IntervalSums::default()
        };
        let n = self.last.len().min(now.touches.len());
        for i in 0..n {
            let dt = now.touches[i].saturating_sub(self.prev.touches[i]);
            if dt == 0 {
                continue;
            }
            self.last[i] = k;
            if let Some(t) = self.tier[i].map(usize::from) {
                s.touches[t] += dt;
                s.misses[t] += now.misses[i].saturating_sub(self.prev.misses[i]);
                s.pages[t] += 1;
            }
        }
        self.ends.push(at);
        self.prev = now;
        s
    }

    /// Parts closed so far: [`PageHistory::pages_since`] of it counts the
    /// pages touched in the parts closed after this call.
    pub fn mark(&self) -> u32 {
        u32::try_from(self.ends.len().saturating_sub(1)).unwrap_or(u32::MAX)
    }

    /// Distinct pages per tier touched since `mark`.
    pub fn pages_since(&self, mark: u32) -> [u64; 2] {
        let mut out = [0; 2];
        for (i, &j) in self.last.iter().enumerate() {
            if let Some(t) = self.tier[i].map(usize::from).filter(|_| j > mark) {
                out[t] += 1;
            }
        }
        out
    }

    /// Pages per tier touched within `horizon` before `at` (the latest
    /// interval end or just after it), as (low, high): low counts pages
    /// last touched in an interval wholly inside the horizon, high those
    /// in an interval that overlaps it. None: the history is shorter.
    pub fn touched_within(&self, at: Instant, horizon: Duration) -> Option<[(u64, u64); 2]> {
        let from = at.checked_sub(horizon)?;
        if self.ends.first().is_none_or(|&t0| t0 > from) {
            return None;
        }
        // Interval j (1-based) spans (ends[j-1], ends[j]].
        let inside = |j: u32, whole: bool| -> bool {
            let j = j as usize;
            if j == 0 || j >= self.ends.len() {
                return false;
            }
            if whole {
                self.ends[j - 1] >= from
            } else {
                self.ends[j] > from
            }
        };
        let mut out = [(0u64, 0u64); 2];
        for (i, &j) in self.last.iter().enumerate() {
            let Some(t) = self.tier[i].map(usize::from) else {
                continue;
            };
            if inside(j, false) {
                out[t].1 += 1;
                if inside(j, true) {
                    out[t].0 += 1;
                }
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tier_linux_bed::truth::{Counters, Range};

    fn snap(touches: &[u64]) -> Snapshot {
        Snapshot {
            counters: Counters::default(),
            touches: touches.to_vec(),
            misses: touches.iter().map(|t| t / 2).collect(),
            ranges: vec![Range {
                start: 0,
                len: touches.len() as u64 * PAGE,
                first_page: 0,
                phys_minus_gpa: None,
            }],
        }
    }

    #[test]
    fn sums_per_tier_and_a_working_set_band() {
        // Pages 0-1 dram, 2-3 slow.
        let tiers = [vec![(0, 2 * PAGE)], vec![(2 * PAGE, 2 * PAGE)]];
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut h = PageHistory::new(snap(&[0, 0, 0, 0]), t0, &tiers);
        let a = h.push(snap(&[4, 0, 2, 0]), t0 + s);
        assert_eq!(a.touches, [4, 2]);
        assert_eq!(a.misses, [2, 1]);
        assert_eq!(a.pages, [1, 1]);
        let b = h.push(snap(&[4, 6, 2, 2]), t0 + 2 * s);
        assert_eq!(b.touches, [6, 2]);
        assert_eq!(b.pages, [1, 1]);
        // Within 1 s of the end: interval 2 only (pages 1 and 3).
        assert_eq!(h.touched_within(t0 + 2 * s, s), Some([(1, 1), (1, 1)]));
        // 1.5 s: interval 1 straddles the start, so high adds pages 0 and 2.
        let w = h.touched_within(t0 + 2 * s, s.mul_f64(1.5)).unwrap();
        assert_eq!(w, [(1, 2), (1, 2)]);
        assert_eq!(h.touched_within(t0 + 2 * s, 2 * s), Some([(2, 2), (2, 2)]));
        assert_eq!(h.pages_since(1), [1, 1]);
        assert_eq!(h.pages_since(0), [2, 2]);
        // Longer than the history: unknown.
        assert_eq!(h.touched_within(t0 + 2 * s, 3 * s), None);
    }
}
