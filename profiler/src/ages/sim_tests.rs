//! Seeded simulations of the recency record against exact truth.

use std::time::{Duration, Instant};

use super::recency::{Recency, scale};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Pages touched at their own Poisson rates (0.001 to 10 per second), passes
/// alternating 50 and 150 ms, one page in `stride` sampled: the working set
/// interval holds the exact count of pages touched within each horizon in
/// at least 95 % of the evaluations, and is never a point.
fn coverage(stride: usize, seed: u64) -> (usize, usize) {
    let mut rng = Rng(seed);
    let n = 4096;
    let horizons = [1.0, 10.0, 30.0];
    let rates: Vec<f64> = (0..n)
        .map(|_| 10f64.powf(-3.0 + 4.0 * rng.next()))
        .collect();
    let mut next_touch: Vec<f64> = rates.iter().map(|r| -rng.next().ln() / r).collect();
    let mut last_touch = vec![f64::NEG_INFINITY; n];
    let epoch = Instant::now();
    let at = |t: f64| epoch + Duration::from_secs_f64(t);
    let mut rec = Recency::new(epoch, 30.0);
    let keys: Vec<u64> = (0..n as u64).step_by(stride).collect();
    rec.set_units(&keys, &vec![1; keys.len()]);
    let (mut t, mut k) = (0.0, 0);
    let (mut covered, mut total) = (0, 0);
    while t < 90.0 {
        let len = if k % 2 == 0 { 0.05 } else { 0.15 };
        let end = t + len;
        let mut young = vec![false; n];
        for i in 0..n {
            while next_touch[i] <= end {
                last_touch[i] = next_touch[i];
                young[i] = true;
                next_touch[i] += -rng.next().ln() / rates[i];
            }
        }
        let sampled: Vec<bool> = keys.iter().map(|&i| young[i as usize]).collect();
        rec.observe(at(t), at(end), &sampled);
        t = end;
        k += 1;
        if k % 25 == 0 && t >= 31.0 {
            let counts = rec.counts(&horizons);
            for (h, c) in horizons.iter().zip(counts) {
                let c = c.expect("watched long enough");
                let b = scale(c, keys.len() as f64, keys.len(), n as f64);
                let truth = last_touch.iter().filter(|&&x| x >= t - h).count() as f64;
                assert!(b.low < b.high || stride == 1, "{b:?}");
                assert!(b.low <= b.point && b.point <= b.high, "{b:?}");
                total += 1;
                covered += usize::from(b.low <= truth && truth <= b.high);
            }
        }
    }
    (covered, total)
}

#[test]
fn sampled_working_set_interval_covers_the_truth() {
    for seed in [7, 11, 13] {
        let (c, t) = coverage(8, seed);
        assert!(t > 50 && c * 100 >= t * 95, "seed {seed}: {c} of {t}");
    }
}

#[test]
fn every_page_read_covers_by_the_edges_alone() {
    let (c, t) = coverage(1, 3);
    assert_eq!(c, t, "{c} of {t}");
}

#[test]
fn edges_count_in_high_only_and_history_limits_horizons() {
    let epoch = Instant::now();
    let at = |t: f64| epoch + Duration::from_secs_f64(t);
    let mut rec = Recency::new(epoch, 10.0);
    rec.set_units(&[1, 2, 3], &[1, 1, 1]);
    // Pass 1 [0, 1) arms; pass 2 [1, 4): unit 0 young; pass 3 [4, 6):
    // unit 1; pass 4 [6, 6.5): none.
    rec.observe(at(0.0), at(1.0), &[true, true, true]);
    rec.observe(at(1.0), at(4.0), &[true, false, false]);
    rec.observe(at(4.0), at(6.0), &[false, true, false]);
    rec.observe(at(6.0), at(6.5), &[false, false, false]);
    let c = rec.counts(&[3.0, 5.5, 10.0]);
    // H = 3 s at 6.5: cut 3.5 falls inside pass 2 (high only), pass 3 whole.
    let (p, lo, hi) = c[0].clone().unwrap();
    assert_eq!((lo, hi), (1.0, 2.0));
    assert!((p - (1.0 + 0.5 / 3.0)).abs() < 1e-9, "{p}");
    // On the pass edge (cut 1): exact.
    assert_eq!(c[1].clone().unwrap(), (2.0, 2.0, 2.0));
    let e = c[2].clone().unwrap_err();
    assert!(e.starts_with("watched for") && e.ends_with("of 10s"), "{e}");
    // Every unit read and the horizon on an edge: a point after scaling.
    let b = scale((2.0, 2.0, 2.0), 3.0, 3, 3.0);
    assert_eq!((b.low, b.high), (2.0, 2.0));
    // Sampled: never a point.
    let b = scale((2.0, 2.0, 2.0), 3.0, 3, 300.0);
    assert!(b.low < 200.0 && b.high > 200.0, "{b:?}");
}

#[test]
fn promotion_counts_pages_young_after_the_longest_horizon_cold() {
    let epoch = Instant::now();
    let at = |t: f64| epoch + Duration::from_secs_f64(t);
    let mut rec = Recency::new(epoch, 5.0);
    rec.set_units(&[1, 2, 3], &[1, 1, 1]);
    rec.observe(at(0.0), at(1.0), &[true, true, false]);
    let mut t = 1.0;
    while t < 8.0 {
        rec.observe(at(t), at(t + 1.0), &[false, true, false]);
        t += 1.0;
    }
    let _ = rec.take_promoted();
    // Unit 0 young last in [0, 1), now 8 s on: cold. Unit 1 hot all along.
    // Unit 2 never young in 8 s watched: cold.
    rec.observe(at(8.0), at(9.0), &[true, true, true]);
    let (definite, possible, secs) = rec.take_promoted().unwrap();
    assert_eq!((definite, possible), (2.0, 2.0));
    assert!((secs - 1.0).abs() < 1e-9);
    // Straddling: young last in [3, 5) at a pass from 8.5 (longest 5):
    // possibly cold only.
    let mut rec = Recency::new(epoch, 5.0);
    rec.set_units(&[1], &[1]);
    rec.observe(at(0.0), at(3.0), &[false]);
    rec.observe(at(3.0), at(5.0), &[true]);
    rec.observe(at(5.0), at(8.5), &[false]);
    let _ = rec.take_promoted();
    rec.observe(at(8.5), at(9.0), &[true]);
    assert_eq!(rec.take_promoted().map(|p| (p.0, p.1)), Some((0.0, 1.0)));
}

#[test]
fn a_changed_sample_keeps_the_history_of_units_it_keeps() {
    let epoch = Instant::now();
    let at = |t: f64| epoch + Duration::from_secs_f64(t);
    let mut rec = Recency::new(epoch, 60.0);
    rec.set_units(&[10, 20], &[1, 1]);
    rec.observe(at(0.0), at(1.0), &[false, false]);
    rec.observe(at(1.0), at(2.0), &[true, false]);
    rec.set_units(&[20, 10, 30], &[1, 1, 4]);
    rec.observe(at(2.0), at(3.0), &[false, false, true]);
    assert_eq!(rec.units(), 3);
    // Unit 10 young in [1, 2): within 2 s. Unit 30 armed by [2, 3) (its
    // young bit there means nothing): high only.
    let (_, lo, hi) = rec.counts(&[2.0]).remove(0).unwrap();
    assert_eq!((lo, hi), (1.0, 5.0));
}

/// A pass armed later than the last one ended leaves a gap: a touch in it
/// was lost, so a page young after it is a possible promotion, not a
/// definite one, and a page not seen young since before it may be in the
/// working set (high end). Watched untouched for the longest horizon after
/// the gap, a page young again is a definite promotion.
#[test]
fn a_gap_leaves_ages_unknown_not_cold() {
    let epoch = Instant::now();
    let at = |t: f64| epoch + Duration::from_secs_f64(t);
    let mut rec = Recency::new(epoch, 5.0);
    rec.set_units(&[1, 2], &[1, 1]);
    rec.observe(at(0.0), at(1.0), &[false, false]);
    rec.observe(at(1.0), at(2.0), &[true, false]);
    rec.observe(at(2.0), at(3.0), &[false, false]);
    let _ = rec.take_promoted();
    // Not watched from 3 to 10 (re-armed at 10).
    rec.observe(at(10.0), at(11.0), &[true, false]);
    let (definite, possible, _) = rec.take_promoted().unwrap();
    assert_eq!((definite, possible), (0.0, 1.0));
    // Unit 1, never seen young, may have been touched in the gap.
    let (_, lo, hi) = rec.counts(&[10.0]).remove(0).unwrap();
    assert_eq!((lo, hi), (1.0, 2.0));
    // The gap is before a 0.5 s horizon: unit 1 is out of it.
    let (_, lo, hi) = rec.counts(&[0.5]).remove(0).unwrap();
    assert_eq!((lo, hi), (0.0, 1.0));
    // Watched without a gap from 10 to 16, untouched: both definite.
    for t in 11..16 {
        rec.observe(at(t as f64), at(t as f64 + 1.0), &[false, false]);
    }
    let _ = rec.take_promoted();
    rec.observe(at(16.0), at(17.0), &[true, true]);
    let (definite, possible, _) = rec.take_promoted().unwrap();
    assert_eq!((definite, possible), (2.0, 2.0));
    // A pass that starts before the last one ended (the ept caller starts
    // a pass at the last ageing, spanning skipped slots) is no gap.
    let mut rec = Recency::new(epoch, 5.0);
    rec.set_units(&[1], &[1]);
    rec.observe(at(0.0), at(1.0), &[false]);
    rec.observe(at(0.9), at(2.0), &[true]);
    rec.observe(at(1.9), at(3.0), &[false]);
    let _ = rec.take_promoted();
    rec.observe(at(2.9), at(11.0), &[false]);
    rec.observe(at(10.9), at(12.0), &[true]);
    let (definite, possible, _) = rec.take_promoted().unwrap();
    assert_eq!((definite, possible), (1.0, 1.0));
}
