//! A set-associative cache with LRU replacement: the last-level cache
//! (lines) and, for recorded traces, the second-level TLB (pages).
//!
//! Sets are indexed by a hash of the tag, as the LLC's slice hash and
//! physical placement spread lines. A twin that follows a fraction `f` of
//! the pages keeps a fraction `f` of the sets with the same associativity
//! (`Cache::scaled`): each sampled line meets the competition it would
//! meet among all the lines (set sampling), and hit ratios carry over.

const EMPTY: u64 = u64::MAX;

/// One cache: `sets` x `ways` tags, each set most recently used first.
#[derive(Debug, Clone)]
pub struct Cache {
    tags: Vec<u64>,
    sets: usize,
    ways: usize,
    pub hits: u64,
    pub misses: u64,
}

fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z ^= z >> 29;
    z = z.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z ^ (z >> 32)
}

impl Cache {
    pub fn new(sets: usize, ways: usize) -> Cache {
        let (sets, ways) = (sets.max(1), ways.max(1));
        Cache {
            tags: vec![EMPTY; sets * ways],
            sets,
            ways,
            hits: 0,
            misses: 0,
        }
    }

    /// A cache of `bytes` in `line`-byte entries and `ways` ways, scaled to
    /// a fraction of its sets (at least one).
    pub fn scaled(bytes: u64, line: u64, ways: usize, fraction: f64) -> Cache {
        let sets = (bytes / line / ways as u64).max(1) as f64;
        Cache::new((sets * fraction).round().max(1.0) as usize, ways)
    }

    pub fn entries(&self) -> usize {
        self.sets * self.ways
    }

    /// Looks `tag` up; on a miss it is filled (evicting the set's LRU).
    /// True on a hit.
    pub fn access(&mut self, tag: u64) -> bool {
        let s = (mix(tag) % self.sets as u64) as usize;
        let set = &mut self.tags[s * self.ways..(s + 1) * self.ways];
        match set.iter().position(|&t| t == tag) {
            Some(i) => {
                set[..=i].rotate_right(1);
                self.hits += 1;
                true
            }
            None => {
                set.rotate_right(1);
                set[0] = tag;
                self.misses += 1;
                false
            }
        }
    }

    /// Drops every entry (a TLB flush).
    pub fn flush(&mut self) {
        self.tags.fill(EMPTY);
    }

    pub fn hit_ratio(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 {
            0.0
        } else {
            self.hits as f64 / n as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::twin::stream::Rng;

    #[test]
    fn a_loop_that_fits_hits_and_one_that_does_not_thrashes() {
        // 64 sets x 8 ways = 512 lines.
        let mut c = Cache::new(64, 8);
        for _ in 0..10 {
            for l in 0..128u64 {
                c.access(l);
            }
        }
        // A quarter of the capacity: only the first round misses (the
        // hash leaves no set over its ways at this load).
        assert!(c.hit_ratio() > 0.89, "{}", c.hit_ratio());
        let mut c = Cache::new(1, 8);
        for _ in 0..10 {
            for l in 0..9u64 {
                c.access(l);
            }
        }
        // A cyclic loop one larger than LRU's ways never hits.
        assert_eq!(c.hits, 0);
    }

    #[test]
    fn uniform_random_hit_ratio_is_capacity_over_footprint() {
        let mut c = Cache::new(256, 16); // 4096 lines
        let mut rng = Rng::new(7);
        for _ in 0..400_000 {
            c.access(rng.below(16_384));
        }
        // Random references: hit ratio ~ 4096 / 16384.
        assert!((c.hit_ratio() - 0.25).abs() < 0.02, "{}", c.hit_ratio());
        c.flush();
        assert!(!c.access(1));
    }

    #[test]
    fn set_sampling_keeps_the_hit_ratio() {
        // Full: 1024 sets over 65536 lines; sampled: 1/16 of both.
        let run = |sets: usize, lines: u64, seed| {
            let mut c = Cache::new(sets, 16);
            let mut rng = Rng::new(seed);
            for _ in 0..600_000 {
                // Skewed: half the references to an eighth of the lines.
                let l = if rng.unit() < 0.5 {
                    rng.below(lines / 8)
                } else {
                    rng.below(lines)
                };
                c.access(l);
            }
            c.hit_ratio()
        };
        let (full, part) = (run(1024, 65_536, 1), run(64, 4096, 2));
        assert!((full - part).abs() < 0.03, "{full} vs {part}");
    }
}
