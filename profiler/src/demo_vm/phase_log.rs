//! When each phase began, as the vCPU thread switched at a round boundary:
//! the exact pages the guest touched within any recent window (the
//! working-set truth, docs/working-set.md). A round lasts about 0.7 ms and
//! touches every page of its phase, so a window touched a page iff a phase
//! holding it ran in it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::{Phase, touched_pages};

/// Phases kept: a change a second for over an hour.
const KEEP: usize = 4096;

#[derive(Debug)]
pub(crate) struct PhaseLog {
    entries: VecDeque<(Instant, Phase)>,
}

impl PhaseLog {
    pub(crate) fn new(first: Phase) -> PhaseLog {
        PhaseLog {
            entries: VecDeque::from([(Instant::now(), first)]),
        }
    }

    pub(crate) fn record(&mut self, at: Instant, p: Phase) {
        if self.entries.len() == KEEP {
            self.entries.pop_front();
        }
        self.entries.push_back((at, p));
    }

    /// Distinct pages [dram, slow] touched in `[at - horizon, at]` (dram
    /// with the code and parameter pages); None when the log does not
    /// reach back that far.
    pub(crate) fn touched_within(&self, at: Instant, horizon: Duration) -> Option<[u64; 2]> {
        let from = at.checked_sub(horizon)?;
        if self.entries.front().is_none_or(|e| e.0 > from) {
            return None;
        }
        // Work pages are the first N of each region: the union is the max.
        let mut out = [0u64; 2];
        for (i, &(start, p)) in self.entries.iter().enumerate() {
            let end = self.entries.get(i + 1).map(|e| e.0);
            if start > at || end.is_some_and(|e| e <= from) {
                continue;
            }
            let t = touched_pages(p);
            out = [out[0].max(t[0]), out[1].max(t[1])];
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(d: u32, s: u32) -> Phase {
        Phase {
            dram_pages: d,
            dram_repeat: 1,
            slow_pages: s,
            slow_repeat: u32::from(s > 0),
        }
    }

    #[test]
    fn the_window_takes_every_phase_that_ran_in_it() {
        let mut log = PhaseLog::new(p(100, 10));
        let t0 = log.entries[0].0;
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        log.record(at(1000), p(10, 300));
        log.record(at(2000), p(50, 0));
        let s = Duration::from_secs;
        assert_eq!(log.touched_within(at(900), s(1)), None);
        assert_eq!(
            log.touched_within(at(999), Duration::from_millis(500)),
            Some([102, 10])
        );
        assert_eq!(log.touched_within(at(1500), s(1)), Some([102, 300]));
        assert_eq!(
            log.touched_within(at(2500), Duration::from_millis(400)),
            Some([52, 0])
        );
        assert_eq!(log.touched_within(at(2500), s(1)), Some([52, 300]));
    }
}
