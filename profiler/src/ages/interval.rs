//! The ~95 % interval of a share measured on a sample of pages.

/// Two-sided 95 % normal quantile.
pub const Z: f64 = 1.959_964;

/// Wilson score bounds of the share `k / n` when `n` units were drawn
/// without replacement from `population` (finite-population correction:
/// a sample of every unit is exact). `k` may be fractional (folio-weighted).
pub fn share_bounds(k: f64, n: f64, population: f64) -> (f64, f64) {
    if n <= 0.0 {
        return (0.0, 1.0);
    }
    let p = (k / n).clamp(0.0, 1.0);
    let fpc = if population > 1.0 && n < population {
        ((population - n) / (population - 1.0)).max(0.0)
    } else {
        0.0
    };
    if fpc == 0.0 {
        return (p, p);
    }
    let z2 = Z * Z * fpc;
    let denom = 1.0 + z2 / n;
    let center = (p + z2 / (2.0 * n)) / denom;
    let half = (z2.sqrt() / denom) * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    ((center - half).max(0.0), (center + half).min(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_population_is_exact_and_a_sample_is_not() {
        assert_eq!(share_bounds(30.0, 100.0, 100.0), (0.3, 0.3));
        let (lo, hi) = share_bounds(30.0, 100.0, 10_000.0);
        assert!(lo < 0.3 && hi > 0.3 && lo > 0.2 && hi < 0.4, "{lo} {hi}");
        // Zero young: the upper end still opens.
        let (lo, hi) = share_bounds(0.0, 100.0, 10_000.0);
        assert!(lo == 0.0 && hi > 0.02, "{hi}");
        assert_eq!(share_bounds(1.0, 0.0, 10.0), (0.0, 1.0));
    }

    /// Seeded simulation: the interval of a 1-in-16 sample holds the true
    /// share at least 95 % of the time.
    #[test]
    fn interval_covers_the_truth_in_a_seeded_simulation() {
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let population = 16_384usize;
        let mut covered = 0;
        let trials = 400;
        for t in 0..trials {
            let share = 0.02 + 0.9 * (t as f64 / trials as f64);
            let young: Vec<bool> = (0..population)
                .map(|_| (next() % 10_000) as f64 / 10_000.0 < share)
                .collect();
            let truth = young.iter().filter(|y| **y).count() as f64 / population as f64;
            let offset = (next() % 16) as usize;
            let sample: Vec<bool> = young.iter().skip(offset).step_by(16).copied().collect();
            let k = sample.iter().filter(|y| **y).count() as f64;
            let (lo, hi) = share_bounds(k, sample.len() as f64, population as f64);
            covered += usize::from(lo <= truth && truth <= hi);
        }
        assert!(covered * 100 >= trials * 95, "{covered} of {trials}");
    }
}
