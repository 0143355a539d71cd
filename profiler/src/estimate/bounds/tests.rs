use super::*;

/// Passes of tierd's default schedule (1 s, 5 passes).
const TS: [f64; 5] = [0.025, 0.1, 0.375, 0.125, 0.375];

struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Per-page rates: `pages` pages sharing `total` touches per second by a
/// Zipf law of exponent `s` (0: uniform).
pub(crate) fn zipf(pages: usize, s: f64, total: f64) -> Vec<f64> {
    let w: Vec<f64> = (1..=pages).map(|k| (k as f64).powf(-s)).collect();
    let sum: f64 = w.iter().sum();
    w.into_iter().map(|x| x / sum * total).collect()
}

/// One interval: young pages per pass (touches at random times) and the
/// expected accesses over the passes.
fn interval(rates: &[f64], rng: &mut Rng) -> (Vec<(f64, f64)>, f64) {
    let passes = TS
        .iter()
        .map(|&t| {
            let young = rates
                .iter()
                .filter(|&&r| rng.unit() < -(-r * t).exp_m1())
                .count();
            (t, young as f64)
        })
        .collect();
    let total: f64 = TS.iter().sum();
    (passes, rates.iter().map(|r| r * total).sum())
}

fn covers(b: &Bounds, truth: f64) -> bool {
    b.low <= truth && b.high.is_none_or(|h| truth <= h)
}

#[test]
fn normal_quantiles() {
    assert!((z_for(0.05) - 1.96).abs() < 1e-3);
    assert!((z_for(0.01) - 2.576).abs() < 1e-3);
    assert!((z_for(0.001) - 3.291).abs() < 1e-3);
}

#[test]
fn covers_the_truth_under_skew_at_least_95_percent_of_intervals() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    // (pages, Zipf exponent, touches per second of the whole set).
    let shapes = [
        (4096, 0.0, 8000.0),
        (512, 0.0, 1000.0),
        (64, 0.0, 9000.0),
        (512, 0.6, 5000.0),
        (2048, 0.99, 5000.0),
        (8192, 1.2, 5000.0),
        (512, 1.2, 500.0),
        (512, 1.2, 10000.0),
        (128, 1.2, 10000.0),
        (8192, 0.6, 10000.0),
    ];
    for (pages, s, total) in shapes {
        let rates = zipf(pages, s, total);
        let trials = 60;
        let mut hit = 0;
        let mut open = 0;
        for _ in 0..trials {
            let (passes, truth) = interval(&rates, &mut rng);
            let b = bounds(&passes, pages as f64, 1.0, 0.05).expect("bounds");
            hit += usize::from(covers(&b, truth));
            open += usize::from(b.high.is_none());
            assert!(b.misfit.is_finite(), "{b:?}");
        }
        let cov = hit as f64 / trials as f64;
        assert!(cov >= 0.95, "{pages} pages, zipf {s}: coverage {cov}");
        // A set whose every page outruns the shortest pass opens the upper
        // end; a set touched well below it keeps one.
        if total / pages as f64 * TS[0] > 3.0 {
            assert_eq!(open, trials, "{pages} {s}");
        }
        if s == 0.0 && total / (pages as f64) * TS[0] < 0.1 {
            assert_eq!(open, 0, "{pages} {s}");
        }
    }
}

#[test]
fn a_uniform_set_reads_a_narrow_interval() {
    // 4096 pages at 2 touches per second: the test guest's kind of row.
    let rates = zipf(4096, 0.0, 8192.0);
    let (passes, truth) = interval(&rates, &mut Rng(7));
    let b = bounds(&passes, 4096.0, 1.0, 0.05).expect("bounds");
    let high = b.high.expect("closed");
    assert!(covers(&b, truth), "{b:?} {truth}");
    // Pages hidden in the noise of the shortest pass may be touched up to
    // the cap: that, not the fit, sets the upper end.
    assert!(high / b.low < 3.0, "{b:?}");
    assert!(b.saturated < SATURATED_MIN, "{b:?}");
}

#[test]
fn a_set_that_changed_within_the_passes_widens_instead_of_failing() {
    // The first two passes at one rate, the rest at four times it.
    let slow: Vec<f64> = zipf(1024, 0.0, 1024.0);
    let fast: Vec<f64> = zipf(1024, 0.0, 4096.0);
    let mut rng = Rng(11);
    let (a, ta) = interval(&slow, &mut rng);
    let (b, tb) = interval(&fast, &mut rng);
    let passes: Vec<(f64, f64)> = a[..2].iter().chain(&b[2..]).copied().collect();
    let truth = (ta * 0.125 + tb * 0.875) / 1.0;
    let bd = bounds(&passes, 1024.0, 1.0, 0.05).expect("bounds");
    assert!(bd.misfit > 1.0, "{bd:?}");
    assert!(covers(&bd, truth), "{bd:?} {truth}");
}

#[test]
fn page_sampling_widens_and_nothing_young_reads_zero() {
    let rates = zipf(2048, 0.0, 4096.0);
    let (passes, _) = interval(&rates, &mut Rng(3));
    let all = bounds(&passes, 2048.0, 1.0, 0.05).expect("bounds");
    let some = bounds(&passes, 2048.0, 0.25, 0.05).expect("bounds");
    let width = |b: &Bounds| b.high.unwrap_or(f64::INFINITY) - b.low;
    assert!(width(&some) > width(&all), "{some:?} {all:?}");
    let none = bounds(&TS.map(|t| (t, 0.0)), 2048.0, 1.0, 0.05).expect("bounds");
    assert_eq!(none.low, 0.0);
    // No pass seen young: still never a zero-width interval.
    assert!(none.high.is_some_and(|h| h > 0.0), "{none:?}");
    assert_eq!(bounds(&[], 10.0, 1.0, 0.05), None);
    assert_eq!(bounds(&[(0.0, 3.0)], 10.0, 1.0, 0.05), None);
    assert_eq!(bounds(&[(0.2, 3.0), (0.21, 4.0)], 10.0, 1.0, 0.05), None);
}

#[test]
fn kept_columns_and_quantiles_give_the_intervals_computed_anew() {
    // One `Programs` through tiers of varied shape, schedules that repeat
    // and change (jittered lengths, another pass count), two tails, page
    // sampling on and off: every interval as a fresh computation has it.
    let mut rng = Rng(0x5eed_cafe);
    let mut kept = Programs::default();
    let jitter =
        |rng: &mut Rng| -> Vec<f64> { TS.iter().map(|t| t * (1.0 + 0.02 * rng.unit())).collect() };
    let mut schedule = TS.to_vec();
    let (mut closed, mut open) = (0, 0);
    for k in 0..600 {
        match k % 7 {
            0 => schedule = jitter(&mut rng),
            3 => schedule = TS[..4].to_vec(),
            5 => schedule = TS.to_vec(),
            _ => {}
        }
        let (rates, pages) = match k % 4 {
            0 => (zipf(512, 1.2, 10000.0), 512.0),
            1 => (zipf(4096, 0.0, 8000.0), 4096.0),
            2 => (zipf(2048, 0.99, 500.0), 2048.0),
            _ => (zipf(64, 0.0, 9000.0), 64.0),
        };
        let young = interval(&rates, &mut rng).0;
        let passes: Vec<(f64, f64)> = schedule
            .iter()
            .zip(&young)
            .map(|(&t, p)| (t, p.1))
            .collect();
        let fraction = if k % 3 == 0 { 0.25 } else { 1.0 };
        let alpha = if k % 5 < 2 { 0.05 } else { 0.05 / 4.0 };
        let fresh = bounds(&passes, pages, fraction, alpha);
        assert_eq!(
            kept.bounds(&passes, pages, fraction, alpha),
            fresh,
            "{passes:?}"
        );
        match fresh {
            Some(b) if b.high.is_some() => closed += 1,
            Some(_) => open += 1,
            None => {}
        }
    }
    // Both kinds of interval were compared.
    assert!(closed > 50 && open > 50, "{closed} closed, {open} open");
}
