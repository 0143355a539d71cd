//! The guest's Zipf tables (`guest/zipf.c`, fixed point), compiled for the
//! host: what a hot set's page popularity under `zipf=` is, exactly as the
//! guest draws it, for tests and for a bench that wants the per-page shares.

/// Mirrors `struct tg_zipf`.
#[repr(C)]
struct CZipf {
    n: u32,
    gshift: u32,
    cdf: *mut u32,
    guide: *mut u32,
}

unsafe extern "C" {
    fn tg_zipf_mem(n: u32) -> u64;
    fn tg_zipf_build(z: *mut CZipf, n: u32, milli: u32, mem: *mut u8);
    fn tg_zipf_pick_ext(z: *const CZipf, a: u32, r: u32) -> u32;
}

/// Most ranks of one table (`TG_ZIPF_MAX_RANKS`).
pub const MAX_RANKS: u32 = 1 << 22;

/// One Zipf ranking of `n` pages, as the guest builds it at boot.
pub struct Table {
    z: CZipf,
    /// The memory `z` points into (u64 for the C code's 8-byte alignment).
    _mem: Vec<u64>,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table").field("ranks", &self.z.n).finish()
    }
}

impl Table {
    /// `n` (1..=MAX_RANKS) ranks, exponent `milli` / 1000 (at most 4000).
    pub fn new(n: u32, milli: u32) -> Option<Table> {
        if n == 0 || n > MAX_RANKS || milli > crate::params::Zipf::MAX_MILLI {
            return None;
        }
        // SAFETY: a pure function of its argument.
        let bytes = unsafe { tg_zipf_mem(n) };
        let mut mem = vec![0u64; usize::try_from(bytes.div_ceil(8)).ok()?];
        let mut z = CZipf {
            n: 0,
            gshift: 0,
            cdf: std::ptr::null_mut(),
            guide: std::ptr::null_mut(),
        };
        // SAFETY: `mem` holds tg_zipf_mem(n) bytes, 8-byte aligned, and
        // stays alive (and unmoved: a Vec's buffer) as long as `z`, whose
        // pointers point into it; n and milli are in the documented range.
        unsafe { tg_zipf_build(&mut z, n, milli, mem.as_mut_ptr().cast()) };
        Some(Table { z, _mem: mem })
    }

    pub fn ranks(&self) -> u32 {
        self.z.n
    }

    /// Share of draws of each of the first `a` ranks (0-based), as the
    /// guest draws them among those ranks.
    pub fn shares(&self, a: u32) -> Vec<f64> {
        let a = a.min(self.z.n) as usize;
        // SAFETY: cdf holds n entries, written by tg_zipf_build.
        let cdf = unsafe { std::slice::from_raw_parts(self.z.cdf, self.z.n as usize) };
        let total = if a == self.z.n as usize {
            (1u64 << 32) as f64
        } else {
            f64::from(cdf[a])
        };
        (0..a)
            .map(|k| {
                let next = if k + 1 == self.z.n as usize {
                    1u64 << 32
                } else {
                    u64::from(cdf[k + 1])
                };
                (next - u64::from(cdf[k])) as f64 / total
            })
            .collect()
    }

    /// The 0-based rank the guest draws among the first `a` (>= 1) ranks
    /// for the random 32 bits `r`.
    pub fn pick(&self, a: u32, r: u32) -> u32 {
        // SAFETY: `z` was built by tg_zipf_build and its memory is alive.
        unsafe { tg_zipf_pick_ext(&self.z, a.clamp(1, self.z.n), r) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrored_struct_matches_the_c_layout() {
        assert_eq!(crate::c_layout(12), size_of::<CZipf>());
    }

    /// r^-s / sum, in f64.
    fn exact(n: u32, s: f64) -> Vec<f64> {
        let w: Vec<f64> = (1..=n).map(|r| f64::from(r).powf(-s)).collect();
        let t: f64 = w.iter().sum();
        w.into_iter().map(|x| x / t).collect()
    }

    #[test]
    fn fixed_point_shares_match_the_exponent() {
        for (n, milli) in [
            (512u32, 600u32),
            (8192, 990),
            (4096, 1200),
            (3, 2500),
            (1, 1000),
        ] {
            let t = Table::new(n, milli).unwrap();
            let got = t.shares(n);
            let want = exact(n, f64::from(milli) / 1000.0);
            assert_eq!(got.len(), n as usize);
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                // 1e-5 relative, plus the CDF quantum (2^-32 of the
                // whole, one more from the sum scaled to 32 bits).
                assert!(
                    (g - w).abs() <= 1e-5 * w + 3.0 / 4_294_967_296.0,
                    "n={n} s={milli} rank {k}: {g} vs {w}"
                );
            }
            let sum: f64 = got.iter().sum();
            assert!((sum - 1.0).abs() < 1e-9, "{sum}");
        }
        // Exponent 0: every rank alike.
        let u = Table::new(100, 0).unwrap().shares(100);
        assert!(u.iter().all(|x| (x - 0.01).abs() < 1e-9));
        assert!(Table::new(0, 1000).is_none());
        assert!(Table::new(8, 4001).is_none());
    }

    #[test]
    fn a_prefix_is_the_zipf_of_the_touched_ranks() {
        let t = Table::new(8192, 1200).unwrap();
        let got = t.shares(100);
        let want = exact(100, 1.2);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-5 * w + 1e-8, "{g} vs {w}");
        }
    }

    /// Every 32-bit draw value, in steps: each rank is drawn for exactly
    /// its CDF width, never one outside the prefix.
    #[test]
    fn draws_follow_the_table() {
        for (n, milli, a) in [
            (8192u32, 990u32, 8192u32),
            (512, 600, 300),
            (1000, 2000, 1000),
        ] {
            let t = Table::new(n, milli).unwrap();
            let want = t.shares(a);
            let mut count = vec![0u64; a as usize];
            let step = 997u32; // odd, so every residue class is visited evenly
            let draws = u32::MAX / step;
            for i in 0..draws {
                let k = t.pick(a, i * step);
                assert!(k < a, "rank {k} outside the first {a}");
                count[k as usize] += 1;
            }
            for (k, (c, w)) in count.iter().zip(&want).enumerate() {
                let expect = w * f64::from(draws);
                assert!(
                    (*c as f64 - expect).abs() <= 2.0 + 1e-6 * expect,
                    "n={n} s={milli} rank {k}: {c} draws vs {expect}"
                );
            }
        }
    }
}
