//! The guest's TLB, as far as it decides whether an access walks the EPT.
//!
//! The CPU sets an EPT accessed bit only when a page walk loads the
//! translation; a TLB hit sets nothing. Realistic reach: a second-level
//! TLB of 1536 entries, 12-way (Skylake-SP and later Intel server cores;
//! AMD Zen 2-4 have 2048), i.e. 6 MiB of 4 KiB pages per vCPU.
//!
//! Two models of one LRU TLB:
//! - `Sets`: a set-associative LRU (`llc::Cache`) on the page numbers,
//!   used for recorded traces whose pages are all simulated;
//! - `Che`: for sampled synthetic streams, whose sample is too thin to
//!   keep a scaled TLB of even one set: Che's approximation of an LRU
//!   cache under independent references (Che, Tung, Wang 2002; Fricker et
//!   al. 2012): a page is in the TLB iff it was touched within the
//!   characteristic time `tc`, solved from `sum_i (1 - e^(-r_i tc)) =
//!   entries` over all the working set's pages.

use super::llc::Cache;

pub const STLB_ENTRIES: usize = 1536;
pub const STLB_WAYS: usize = 12;

#[derive(Debug, Clone)]
pub enum Tlb {
    Sets(Cache),
    Che {
        tc: f64,
        /// Last touch per sampled page (negative: never, or flushed).
        last: Vec<f64>,
    },
}

/// Che's characteristic time for `entries` over pages touched at `rates`,
/// each standing for `1 / fraction` real pages; infinite if they all fit.
pub fn characteristic_time(rates: &[f64], fraction: f64, entries: usize) -> f64 {
    let occupied = |t: f64| rates.iter().map(|r| -(-r * t).exp_m1()).sum::<f64>() / fraction;
    let e = entries as f64;
    if occupied(1e9) <= e {
        return f64::INFINITY;
    }
    let (mut lo, mut hi) = (0.0f64, 1e-9f64);
    while occupied(hi) < e {
        lo = hi;
        hi *= 2.0;
    }
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if occupied(mid) < e {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

impl Tlb {
    pub fn sets(entries: usize, ways: usize) -> Tlb {
        Tlb::Sets(Cache::new(entries / ways, ways))
    }

    pub fn che(tc: f64, pages: usize) -> Tlb {
        Tlb::Che {
            tc,
            last: vec![f64::NEG_INFINITY; pages],
        }
    }

    /// A new characteristic time (the rates changed with a phase).
    pub fn set_tc(&mut self, t: f64) {
        if let Tlb::Che { tc, .. } = self {
            *tc = t;
        }
    }

    /// Touch of sampled page `page` at `now`: true when the translation
    /// was cached (no walk, no accessed bit set).
    pub fn access(&mut self, page: u32, now: f64) -> bool {
        match self {
            Tlb::Sets(c) => c.access(u64::from(page)),
            Tlb::Che { tc, last } => {
                let p = &mut last[page as usize];
                let hit = now - *p < *tc;
                *p = now;
                hit
            }
        }
    }

    /// Every translation dropped (what `clear_flush_young` or a
    /// `clear_refs` write does; the MMU notifier's `clear_young` does not).
    pub fn flush(&mut self) {
        match self {
            Tlb::Sets(c) => c.flush(),
            Tlb::Che { last, .. } => last.fill(f64::NEG_INFINITY),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::twin::stream::Rng;

    #[test]
    fn che_time_and_set_model_agree_on_hit_ratio() {
        // 8192 pages, Zipf-ish rates; a 512-entry TLB.
        let rates: Vec<f64> = (1..=8192).map(|k| 1e6 / f64::from(k)).collect();
        let tc = characteristic_time(&rates, 1.0, 512);
        let alias = crate::twin::stream::Alias::new(&rates);
        let total: f64 = rates.iter().sum();
        let (mut sets, mut che) = (Tlb::sets(512, 8), Tlb::che(tc, 8192));
        let (mut rng, mut now) = (Rng::new(5), 0.0);
        let (mut hs, mut hc, n) = (0u32, 0u32, 300_000);
        for _ in 0..n {
            now += rng.exp(total);
            let p = alias.draw(&mut rng) as u32;
            hs += u32::from(sets.access(p, now));
            hc += u32::from(che.access(p, now));
        }
        let (hs, hc) = (f64::from(hs) / f64::from(n), f64::from(hc) / f64::from(n));
        assert!((hs - hc).abs() < 0.03, "set-assoc {hs} vs Che {hc}");
        assert!(characteristic_time(&rates[..100], 1.0, 512).is_infinite());
    }

    #[test]
    fn reach_hides_hot_pages_from_a_walk() {
        // A page touched every 1 us stays cached: after the first walk it
        // never walks again until a flush.
        let mut t = Tlb::sets(STLB_ENTRIES, STLB_WAYS);
        let mut walks = 0;
        for i in 0..1000 {
            walks += u32::from(!t.access(7, f64::from(i) * 1e-6));
        }
        assert_eq!(walks, 1);
        t.flush();
        assert!(!t.access(7, 1.0));
        // A loop over more pages than the reach walks on every touch.
        let mut t = Tlb::sets(64, 4);
        let misses = (0..10_000u32).filter(|i| !t.access(i % 1000, 0.0)).count();
        assert!(misses > 9_000, "{misses}");
    }
}
