//! The test guest's working-set truth: which of its pages it touched
//! since an instant, from its page stamps (`tg_truth.stamp_*`: per page,
//! the access count when last touched) and a log of the access count read
//! every millisecond by the truth watcher. A read of the count lies between
//! the instants taken before and after it, so the count at an instant is
//! known within a bracket, and the pages touched within a window within a
//! band: its low end counts the pages whose last touch is surely inside
//! the window, its high end adds those that may have been (a touch near an
//! edge, or a page touched again after the window ended, before the stamps
//! were read).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How far back the log reaches: the longest horizon scored plus slack.
pub const KEEP: Duration = Duration::from_secs(15 * 60);

/// One read of the access count: taken after `before` and before `after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountRead {
    pub before: Instant,
    pub after: Instant,
    pub count: u64,
}

/// The access count over time.
#[derive(Debug, Default)]
pub struct CountLog {
    reads: VecDeque<CountRead>,
}

impl CountLog {
    pub fn push(&mut self, r: CountRead) {
        self.reads.push_back(r);
        while self
            .reads
            .front()
            .is_some_and(|f| r.after.duration_since(f.after) > KEEP)
        {
            self.reads.pop_front();
        }
    }

    /// (low, high) bounds of the count at `t`: the last read finished by
    /// `t`, the first begun after it. None when the log does not reach `t`
    /// on both sides.
    pub fn bracket(&self, t: Instant) -> Option<(u64, u64)> {
        let lo = self
            .reads
            .iter()
            .rev()
            .find(|r| r.after <= t)
            .map(|r| r.count)?;
        let hi = self.reads.iter().find(|r| r.before >= t).map(|r| r.count)?;
        Some((lo, hi.max(lo)))
    }
}

/// (low, high) pages among `stamps` touched between the instants whose
/// counts lie in `since` and `until` (stamp = count after the touch; 0:
/// never touched).
pub fn touched_band(stamps: &[u64], since: (u64, u64), until: (u64, u64)) -> (u64, u64) {
    let mut band = (0, 0);
    for &s in stamps {
        if s > since.1 && s <= until.0 {
            band.0 += 1;
        }
        if s > since.0 {
            band.1 += 1;
        }
    }
    band
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_counts_sure_pages_low_and_edge_pages_high() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut log = CountLog::default();
        for (ms, count) in [(0, 0), (10, 100), (20, 200), (30, 300)] {
            log.push(CountRead {
                before: at(ms),
                after: at(ms + 1),
                count,
            });
        }
        assert_eq!(log.bracket(at(5)), Some((0, 100)));
        assert_eq!(log.bracket(at(10)), Some((0, 100)));
        assert_eq!(log.bracket(at(11)), Some((100, 200)));
        assert_eq!(log.bracket(at(31)), None, "no read after it yet");
        // Pages last touched at counts 50 (edge), 150, 250 (inside), 350
        // (after the window's end: may have been touched inside too), never.
        let stamps = [50, 150, 250, 350, 0];
        let band = touched_band(&stamps, (0, 100), (200, 300));
        assert_eq!(band, (1, 4));
        let exact = touched_band(&stamps, (100, 100), (300, 300));
        assert_eq!(exact, (2, 3));
    }

    #[test]
    fn the_log_forgets_reads_older_than_it_keeps() {
        let t0 = Instant::now();
        let mut log = CountLog::default();
        let read = |s: u64, count| CountRead {
            before: t0 + Duration::from_secs(s),
            after: t0 + Duration::from_secs(s),
            count,
        };
        log.push(read(0, 1));
        log.push(read(KEEP.as_secs() + 2, 2));
        log.push(read(KEEP.as_secs() + 4, 3));
        assert_eq!(log.reads.len(), 2);
        assert_eq!(log.bracket(t0 + Duration::from_secs(1)), None);
    }
}
