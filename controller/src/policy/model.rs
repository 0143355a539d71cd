//! The one model of how a VM's DRAM-hit ratio responds to a change of its
//! DRAM, from the host-sampled per-tier accesses and accessed bytes.
//!
//! The hit ratio is a power of the fraction of the VM's hot set (bytes
//! accessed in the interval, both tiers) that sits in DRAM: r = x^b. The one
//! parameter b is fitted to this interval's sample, b = ln r / ln x: b = 1
//! means accesses spread evenly, b < 1 that the guest keeps its hotter pages
//! in DRAM. Then:
//!
//! - DRAM added to a VM turns slow-tier hot bytes into DRAM hot bytes (the
//!   guest promotes them), up to the whole slow hot set;
//! - DRAM taken away takes idle DRAM bytes first, then hot ones.
//!
//! Where no exponent fits (x or r at 0 or 1, e.g. the whole hot set already
//! in DRAM), accesses are taken as spread evenly over each tier's hot bytes:
//! each byte moved carries its tier's average access density.

use super::config::PAGE;
use super::hit_interval::HitEvidence;
use super::input::VmObs;

/// The per-tier load of one VM, as the model needs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    pub dram_accesses: f64,
    pub slow_accesses: f64,
    pub dram_hot: u64,
    pub slow_hot: u64,
    pub dram_idle: u64,
}

/// Rounds up to whole pages.
fn pages_up(bytes: f64) -> u64 {
    (bytes / PAGE as f64).ceil().max(0.0) as u64 * PAGE
}

/// Rounds down to whole pages.
fn pages_down(bytes: f64) -> u64 {
    (bytes / PAGE as f64).floor().max(0.0) as u64 * PAGE
}

impl Load {
    /// Where the PMU counted every tier, its ratio splits the accesses
    /// (the accessed-bit totals keep the scale; 1 when they saw none).
    pub fn of(vm: &VmObs) -> Load {
        let (mut d, mut s) = (vm.dram.accesses(), vm.slow.accesses());
        if let HitEvidence::Counted(c) = vm.hit {
            let total = if d + s > 0.0 { d + s } else { 1.0 };
            (d, s) = (c * total, (1.0 - c) * total);
        }
        Load {
            dram_accesses: d,
            slow_accesses: s,
            dram_hot: vm.dram.accessed_bytes,
            slow_hot: vm.slow.accessed_bytes,
            dram_idle: vm.dram.idle_bytes,
        }
    }

    /// Hot bytes, both tiers.
    pub fn hot_set(&self) -> u64 {
        self.dram_hot.saturating_add(self.slow_hot)
    }

    pub fn total(&self) -> f64 {
        self.dram_accesses + self.slow_accesses
    }

    /// Observed ratio; `None` without accesses.
    pub fn ratio(&self) -> Option<f64> {
        let t = self.total();
        (t > 0.0).then(|| self.dram_accesses / t)
    }

    /// The fitted exponent b of r = x^b, if the sample allows one.
    pub fn exponent(&self) -> Option<f64> {
        let r = self.ratio()?;
        let hot = self.dram_hot as f64 + self.slow_hot as f64;
        let x = self.dram_hot as f64 / hot;
        let ok = |v: f64| v > 0.0 && v < 1.0;
        (ok(r) && ok(x)).then(|| (r.ln() / x.ln()).clamp(0.01, 100.0))
    }

    /// Hot bytes of a tier that has accesses: at least one page, so the
    /// density stays finite when the sample saw accesses but no bytes.
    fn hot(accesses: f64, bytes: u64) -> f64 {
        if accesses > 0.0 {
            bytes.max(PAGE) as f64
        } else {
            bytes as f64
        }
    }

    /// Average accesses per hot byte in the slow tier.
    pub fn slow_density(&self) -> f64 {
        let hot = Self::hot(self.slow_accesses, self.slow_hot);
        if hot > 0.0 {
            self.slow_accesses / hot
        } else {
            0.0
        }
    }

    /// Average accesses per hot byte in the DRAM tier.
    pub fn dram_density(&self) -> f64 {
        let hot = Self::hot(self.dram_accesses, self.dram_hot);
        if hot > 0.0 {
            self.dram_accesses / hot
        } else {
            0.0
        }
    }

    /// Hot bytes moved into DRAM (> 0) or out of it (< 0) by a change of
    /// `delta` bytes of DRAM.
    fn hot_moved(&self, delta: i64) -> f64 {
        let d = delta.unsigned_abs() as f64;
        if delta >= 0 {
            d.min(Self::hot(self.slow_accesses, self.slow_hot))
        } else {
            -(d - self.dram_idle as f64)
                .max(0.0)
                .min(Self::hot(self.dram_accesses, self.dram_hot))
        }
    }

    /// Expected ratio once the VM's DRAM changed by `delta` bytes.
    pub fn expected_ratio(&self, delta: i64) -> Option<f64> {
        let total = self.total();
        if total <= 0.0 {
            return None;
        }
        let moved = self.hot_moved(delta);
        let r = match self.exponent() {
            Some(b) => {
                let hot = self.dram_hot as f64 + self.slow_hot as f64;
                ((self.dram_hot as f64 + moved) / hot).max(0.0).powf(b)
            }
            None if moved >= 0.0 => (self.dram_accesses + moved * self.slow_density()) / total,
            None => (self.dram_accesses + moved * self.dram_density()) / total,
        };
        Some(r.clamp(0.0, 1.0))
    }

    /// DRAM hot bytes at which the model gives `target`, if it fits.
    fn hot_for(&self, target: f64) -> Option<f64> {
        let b = self.exponent()?;
        let hot = self.dram_hot as f64 + self.slow_hot as f64;
        Some(target.clamp(0.0, 1.0).powf(1.0 / b) * hot)
    }

    /// DRAM bytes to add so the expected ratio reaches `target` (whole
    /// pages, rounded up; at most the slow hot set).
    pub fn grow_for(&self, target: f64) -> u64 {
        let cap = Self::hot(self.slow_accesses, self.slow_hot);
        let bytes = match self.hot_for(target) {
            Some(h) => h - self.dram_hot as f64,
            None => {
                let density = self.slow_density();
                if density <= 0.0 {
                    return 0;
                }
                (target * self.total() - self.dram_accesses) / density
            }
        };
        pages_up(bytes.min(cap))
    }

    /// DRAM bytes that can go with the expected ratio still >= `target`
    /// (whole pages, rounded down): idle bytes, then hot ones.
    pub fn shrink_for(&self, target: f64) -> u64 {
        let hot = match self.hot_for(target) {
            Some(h) => self.dram_hot as f64 - h,
            None => {
                let surplus = self.dram_accesses - target * self.total();
                let density = self.dram_density();
                if surplus <= 0.0 || self.total() <= 0.0 {
                    0.0
                } else if density <= 0.0 {
                    self.dram_hot as f64
                } else {
                    surplus / density
                }
            }
        };
        pages_down(self.dram_idle as f64 + hot.clamp(0.0, self.dram_hot as f64))
    }

    /// The arithmetic of `grow_for` / `shrink_for`, for decision records.
    pub fn explain(&self, target: f64) -> String {
        let mib = |b: f64| b / (1u64 << 20) as f64;
        let (hd, hs) = (self.dram_hot as f64, self.slow_hot as f64);
        match (self.exponent(), self.hot_for(target)) {
            (Some(b), Some(h)) => format!(
                "r = x^{b:.3} fitted at x = {:.1}M / {:.1}M hot = {:.3}; {target:.3} needs x = {:.3}: {:.1}M hot in dram",
                mib(hd),
                mib(hd + hs),
                hd / (hd + hs),
                h / (hd + hs),
                mib(h)
            ),
            _ => format!(
                "no fit (x = 1, r = 0 or 1); average densities {:.4e} acc/MiB dram, {:.4e} slow; {target:.3} x {:.4e} acc",
                self.dram_density() * (1u64 << 20) as f64,
                self.slow_density() * (1u64 << 20) as f64,
                self.total()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-9)
    }

    /// Within a page of `b` (the fit goes through ln and powf).
    fn about(a: u64, b: u64) -> bool {
        a.abs_diff(b) <= PAGE
    }

    fn uniform() -> Load {
        // 600 accesses over 60M hot in DRAM, 400 over 40M hot in slow:
        // x = r = 0.6, b = 1; 20M of DRAM idle.
        Load {
            dram_accesses: 600.0,
            slow_accesses: 400.0,
            dram_hot: 60 * M,
            slow_hot: 40 * M,
            dram_idle: 20 * M,
        }
    }

    fn skewed() -> Load {
        // A quarter of the 64M hot set in DRAM takes half the accesses:
        // b = ln 0.5 / ln 0.25 = 0.5, r = sqrt(x).
        Load {
            dram_accesses: 500.0,
            slow_accesses: 500.0,
            dram_hot: 16 * M,
            slow_hot: 48 * M,
            dram_idle: 4 * M,
        }
    }

    #[test]
    fn uniform_expected_ratio() {
        let l = uniform();
        assert!(close(l.exponent(), 1.0));
        assert!(close(l.expected_ratio(10 * M as i64), 0.7));
        // More than the slow hot set: all accesses hit DRAM.
        assert!(close(l.expected_ratio(100 * M as i64), 1.0));
        // -20M is all idle: no change; -30M loses 10M of 100M hot.
        assert!(close(l.expected_ratio(-20 * M as i64), 0.6));
        assert!(close(l.expected_ratio(-30 * M as i64), 0.5));
        let idle = Load {
            dram_accesses: 0.0,
            slow_accesses: 0.0,
            ..l
        };
        assert_eq!(idle.expected_ratio(M as i64), None);
        // 0.9 needs x = 0.9: 90M, 30M more; 0.5 lets 10M hot + 20M idle go.
        assert!(about(l.grow_for(0.9), 30 * M));
        assert!(about(l.shrink_for(0.5), 30 * M));
        // At or above the ratio only the idle bytes can go.
        assert_eq!(l.shrink_for(0.7), 20 * M);
        assert_eq!(l.grow_for(0.5), 0);
    }

    #[test]
    fn skewed_fit() {
        let l = skewed();
        assert!(close(l.exponent(), 0.5));
        // +20M: x = 36/64, r = 0.75. -4M is idle; -8M: x = 12/64.
        assert!(close(l.expected_ratio(20 * M as i64), 0.75));
        assert!(close(l.expected_ratio(-4 * M as i64), 0.5));
        assert!(close(
            l.expected_ratio(-8 * M as i64),
            (12.0f64 / 64.0).sqrt()
        ));
        // 0.75 needs x = 0.5625: 36M in DRAM, 20M more.
        assert!(about(l.grow_for(0.75), 20 * M));
        assert_eq!(l.grow_for(1.0), 48 * M);
        // 0.25 needs x = 1/16: 4M hot stay, 12M hot + 4M idle go.
        assert!(about(l.shrink_for(0.25), 16 * M));
    }

    #[test]
    fn no_fit_falls_back_to_tier_densities() {
        // The whole hot set in DRAM: x = 1, nothing to fit.
        let l = Load {
            dram_accesses: 1000.0,
            slow_accesses: 0.0,
            dram_hot: 100 * M,
            slow_hot: 0,
            dram_idle: 50 * M,
        };
        assert_eq!(l.exponent(), None);
        // Down to 0.9: the 50M idle and 10% of the hot bytes.
        assert_eq!(l.shrink_for(0.9), 60 * M);
        assert!(close(l.expected_ratio(-(60 * M as i64)), 0.9));
        assert_eq!(l.grow_for(1.0), 0);
    }

    #[test]
    fn rounds_to_pages() {
        let l = Load {
            dram_accesses: 1.0,
            slow_accesses: 0.0,
            dram_hot: 3 * PAGE,
            slow_hot: 0,
            dram_idle: 0,
        };
        // 0.5 lets 1.5 pages go: rounded down to 1.
        assert_eq!(l.shrink_for(0.5), PAGE);
        let l = Load {
            dram_accesses: 0.0,
            slow_accesses: 1.0,
            dram_hot: 0,
            slow_hot: 3 * PAGE,
            dram_idle: 0,
        };
        // 0.5 needs half the slow density's worth: 1.5 pages, up to 2.
        assert_eq!(l.grow_for(0.5), 2 * PAGE);
    }
}
