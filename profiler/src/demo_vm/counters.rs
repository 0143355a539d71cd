//! Lock-free published state: a single-writer seqlock over atomics, so a
//! reader always gets counters and phase from the same exit.

use super::{GuestCounters, Phase};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Snapshot {
    pub counters: GuestCounters,
    /// The phase the guest is running right now.
    pub phase: Phase,
}

#[derive(Debug, Default)]
pub(crate) struct Published {
    seq: AtomicU64,
    words: [AtomicU64; 4],
    phase: [AtomicU32; 4],
}

impl Published {
    pub(crate) fn new(s: Snapshot) -> Self {
        let p = Published::default();
        p.publish(&s);
        p
    }

    /// Only the vCPU thread calls this (single writer).
    pub(crate) fn publish(&self, s: &Snapshot) {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        let c = &s.counters;
        let words = [c.rounds, c.accesses[0], c.accesses[1], c.exits];
        for (a, v) in self.words.iter().zip(words) {
            a.store(v, Ordering::Relaxed);
        }
        let p = &s.phase;
        let phase = [p.dram_pages, p.dram_repeat, p.slow_pages, p.slow_repeat];
        for (a, v) in self.phase.iter().zip(phase) {
            a.store(v, Ordering::Relaxed);
        }
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    pub(crate) fn read(&self) -> Snapshot {
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            let w: [u64; 4] = std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed));
            let p: [u32; 4] = std::array::from_fn(|i| self.phase[i].load(Ordering::Relaxed));
            fence(Ordering::Acquire);
            if s1.is_multiple_of(2) && self.seq.load(Ordering::Relaxed) == s1 {
                return Snapshot {
                    counters: GuestCounters {
                        rounds: w[0],
                        accesses: [w[1], w[2]],
                        exits: w[3],
                    },
                    phase: Phase {
                        dram_pages: p[0],
                        dram_repeat: p[1],
                        slow_pages: p[2],
                        slow_repeat: p[3],
                    },
                };
            }
            std::hint::spin_loop();
        }
    }
}
