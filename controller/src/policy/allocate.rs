//! Splitting a pool of DRAM among claims: in proportion to weight, no claim
//! above its cap, what a capped claim leaves going to the others
//! (water-filling). O(n log n).

use super::config::PAGE;

/// One claim on the pool.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Claim {
    pub weight: f64,
    /// Most this claim takes, bytes.
    pub cap: u64,
}

fn down(bytes: f64) -> u64 {
    (bytes / PAGE as f64).floor().max(0.0) as u64 * PAGE
}

/// Amounts per claim, in claim order: whole pages (unless a cap is not),
/// each <= its cap, summing to <= `pool`.
pub fn water_fill(pool: u64, claims: &[Claim]) -> Vec<u64> {
    let total_cap: u64 = claims.iter().map(|c| c.cap).fold(0, u64::saturating_add);
    if total_cap <= pool {
        return claims.iter().map(|c| c.cap).collect();
    }
    // A claim without a usable weight still gets a share, a tiny one.
    let w = |c: &Claim| {
        if c.weight.is_finite() && c.weight > 0.0 {
            c.weight
        } else {
            f64::MIN_POSITIVE
        }
    };
    let mut order: Vec<usize> = (0..claims.len()).filter(|&i| claims[i].cap > 0).collect();
    // Claims that saturate first: smallest cap per unit of weight.
    order.sort_by(|&a, &b| {
        let (ca, cb) = (&claims[a], &claims[b]);
        (ca.cap as f64 / w(ca)).total_cmp(&(cb.cap as f64 / w(cb)))
    });
    let mut out = vec![0; claims.len()];
    let mut left = pool;
    let mut weight: f64 = order.iter().map(|&i| w(&claims[i])).sum();
    for (k, &i) in order.iter().enumerate() {
        let c = &claims[i];
        let share = left as f64 * w(c) / weight;
        if (c.cap as f64) <= share {
            let amount = c.cap.min(left);
            out[i] = amount;
            left -= amount;
            weight -= w(c);
            continue;
        }
        // No later claim saturates either: all get their share of `left`.
        let rest = &order[k..];
        let shares: Vec<f64> = rest.iter().map(|&j| w(&claims[j])).collect();
        let sum: f64 = shares.iter().sum();
        let mut given = 0u64;
        for (&j, s) in rest.iter().zip(shares) {
            let amount = down(left as f64 * s / sum).min(claims[j].cap);
            // Float rounding must never hand out more than is left.
            let amount = amount.min(left - given);
            out[j] = amount;
            given += amount;
        }
        break;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    fn c(weight: f64, cap: u64) -> Claim {
        Claim { weight, cap }
    }

    #[test]
    fn everything_fits() {
        assert_eq!(
            water_fill(10 * M, &[c(1.0, 2 * M), c(5.0, 3 * M)]),
            [2 * M, 3 * M]
        );
    }

    #[test]
    fn proportional_with_redistribution() {
        // 12M by weights 1:1:2 would be 3/3/6; the first is capped at 1M,
        // so the other 11M go 1:2 -> 11/3 and 22/3 MiB, rounded down to pages.
        let got = water_fill(12 * M, &[c(1.0, M), c(1.0, 100 * M), c(2.0, 100 * M)]);
        assert_eq!(got[0], M);
        assert_eq!(got[1], down(11.0 * M as f64 / 3.0));
        assert_eq!(got[2], down(22.0 * M as f64 / 3.0));
        assert!(got.iter().sum::<u64>() <= 12 * M);
    }

    #[test]
    fn zero_weight_and_empty() {
        assert_eq!(water_fill(0, &[c(1.0, M)]), [0]);
        assert!(water_fill(M, &[]).is_empty());
        let got = water_fill(4 * M, &[c(0.0, 8 * M), c(1.0, 8 * M)]);
        assert_eq!(got, [0, 4 * M]);
        let got = water_fill(4 * M, &[c(f64::NAN, 8 * M), c(0.0, 8 * M)]);
        assert_eq!(got, [2 * M, 2 * M]);
    }
}
