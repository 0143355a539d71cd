//! Which pass schedule buys what: tierd's own estimate (`VmFit`: windowed
//! fit, `estimate::bounds` intervals and their reuse while the passes agree,
//! as the aggregator forms them) on
//! simulated accessed bits of two-tier VMs whose pages are touched at
//! random times at known per-page rates: uniform sets, Zipf sets, a few
//! always-hot guest-kernel pages, a head/tail split of one Zipf ranking,
//! and real-host rates. Per schedule: coverage of the truth by the
//! interval, one-sided share, median width, point error, and the walks
//! it costs against tierd's default schedule. No VM: the model of accessed
//! bits is the kernel's (a page is young in a pass when touched in it).
//! Options: `--intervals N` per shape (default 40), `--fraction F` of the
//! pages sampled (default 1; the sampler CPU budget lowers it on large VMs:
//! the sample's fit and bounds are scaled by pages / sampled, as the
//! aggregator does), `--refit-every N` (default `estimate::REFIT_EVERY`; 1:
//! every interval fitted in full, as before reuse).

use std::time::Duration;

use anyhow::Context;
use tier_benches::progress::Progress;
use tier_benches::result_line;
use tier_profiler::aggregate::hit_interval;
use tier_profiler::estimate::bounds::{Bounds, Programs};
use tier_profiler::estimate::{REFIT_EVERY, TierIn, VmFit, VmWindows, pass_lengths};
use tier_proto::v1::TierSample;

struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `n` pages sharing `total` touches/s by a Zipf law of exponent `s`.
fn zipf(n: usize, s: f64, total: f64) -> Vec<f64> {
    let w: Vec<f64> = (1..=n).map(|k| (k as f64).powf(-s)).collect();
    let sum: f64 = w.iter().sum();
    w.into_iter().map(|x| x / sum * total).collect()
}

/// A VM's two tiers: per-page touch rates of dram and of slow.
struct Shape {
    name: &'static str,
    dram: Vec<f64>,
    slow: Vec<f64>,
}

fn shapes() -> Vec<Shape> {
    let split = |name, n: usize, s: f64, total: f64, head: usize| {
        let all = zipf(n, s, total);
        Shape {
            name,
            dram: all[..head].to_vec(),
            slow: all[head..].to_vec(),
        }
    };
    let mut kernel = zipf(4096, 0.0, 8000.0);
    kernel.extend([10_000.0; 8]);
    vec![
        Shape {
            name: "uniform 4096+4096, 80/20, 10 k/s",
            dram: zipf(4096, 0.0, 8000.0),
            slow: zipf(4096, 0.0, 2000.0),
        },
        Shape {
            name: "same + 8 guest-kernel pages at 10 k/s",
            dram: kernel,
            slow: zipf(4096, 0.0, 2000.0),
        },
        Shape {
            name: "zipf 0.6 2048+2048, 50/50, 10 k/s",
            dram: zipf(2048, 0.6, 5000.0),
            slow: zipf(2048, 0.6, 5000.0),
        },
        Shape {
            name: "zipf 1.2 512+512, 70/30, 10 k/s",
            dram: zipf(512, 1.2, 7000.0),
            slow: zipf(512, 1.2, 3000.0),
        },
        split(
            "zipf 0.99 over 4096: head 512 dram",
            4096,
            0.99,
            10_000.0,
            512,
        ),
        split(
            "zipf 1.2 over 8192: head 1024 dram",
            8192,
            1.2,
            10_000.0,
            1024,
        ),
        split(
            "real host: zipf 0.99 over 65536 at 1e8/s",
            65_536,
            0.99,
            1e8,
            8192,
        ),
    ]
}

/// Young pages of one tier in each pass.
fn young(rates: &[f64], ts: &[f64], rng: &mut Rng) -> Vec<(f64, f64)> {
    ts.iter()
        .map(|&t| {
            let n = rates
                .iter()
                .filter(|&&r| rng.unit() < -(-r * t).exp_m1())
                .count();
            (t, n as f64)
        })
        .collect()
}

struct Score {
    coverage: f64,
    one_sided: f64,
    width_pp: f64,
    p95_err_pp: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The pages of a tier in a sample of `fraction` of them, the same set
/// every pass (as tierd's stride grid); at least one page.
fn sample(rates: &[f64], fraction: f64, rng: &mut Rng) -> Vec<f64> {
    if fraction >= 1.0 {
        return rates.to_vec();
    }
    let mut out: Vec<f64> = rates
        .iter()
        .filter(|_| rng.unit() < fraction)
        .copied()
        .collect();
    if out.is_empty() {
        out.extend(rates.first());
    }
    out
}

fn score(
    shape: &Shape,
    ts: &[f64],
    intervals: usize,
    seed: u64,
    fraction: f64,
    refit_every: u32,
) -> Score {
    let mut rng = Rng(seed);
    let mut w = VmFit::new(VmWindows::default(), refit_every);
    let mut programs = Programs::default();
    let total: f64 = ts.iter().sum();
    let acc = |r: &[f64]| r.iter().sum::<f64>() * total;
    let truth = acc(&shape.dram) / (acc(&shape.dram) + acc(&shape.slow));
    // As the aggregator: the sample's fit and bounds, scaled by
    // pages / sampled.
    let dram = sample(&shape.dram, fraction, &mut rng);
    let slow = sample(&shape.slow, fraction, &mut rng);
    let scale = |all: &[f64], sampled: &[f64]| all.len() as f64 / sampled.len() as f64;
    let (kd, ks) = (scale(&shape.dram, &dram), scale(&shape.slow, &slow));
    let (mut covered, mut open) = (0, 0);
    let (mut widths, mut errs) = (Vec::new(), Vec::new());
    for _ in 0..intervals {
        let d = young(&dram, ts, &mut rng);
        let s = young(&slow, ts, &mut rng);
        // As the aggregator: the kept fit while the passes agree with it.
        fn input(p: &[(f64, f64)], sampled: usize, k: f64) -> TierIn<'_> {
            TierIn {
                passes: p,
                pages: sampled as f64,
                fraction: 1.0 / k,
            }
        }
        let (e, _) = w.fit(
            &[input(&d, dram.len(), kd), input(&s, slow.len(), ks)],
            0.025,
            &mut programs,
            true,
        );
        let (ad, as_) = (e[0].estimate.accesses * kd, e[1].estimate.accesses * ks);
        let sum = ad + as_;
        let point = if sum > 0.0 { ad / sum } else { 0.0 };
        errs.push((point - truth).abs() * 100.0);
        let tier = |p: &[(f64, f64)], b: Option<Bounds>, k: f64, accesses: f64| TierSample {
            passes: p.len() as u32,
            accesses_low: b.map(|b| (b.low * k).min(accesses)),
            accesses_high: b.and_then(|b| b.high.map(|h| (h * k).max(accesses))),
            accesses_high_open: b.is_some_and(|b| b.high.is_none()),
            ..Default::default()
        };
        let tiers = [
            tier(&d, e[0].bounds, kd, ad),
            tier(&s, e[1].bounds, ks, as_),
        ];
        if let Some(i) = hit_interval(&tiers, &[true, false], point) {
            covered += usize::from(i.low <= truth && truth <= i.high);
            open += usize::from(i.low_open || i.high_open);
            widths.push((i.high - i.low) * 100.0);
        }
    }
    errs.sort_by(f64::total_cmp);
    let p95 = errs[((errs.len() as f64 * 0.95).ceil() as usize).saturating_sub(1)];
    Score {
        coverage: covered as f64 / intervals as f64,
        one_sided: open as f64 / intervals as f64,
        width_pp: median(widths),
        p95_err_pp: p95,
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let intervals = match args.iter().position(|a| a == "--intervals") {
        Some(i) => args
            .get(i + 1)
            .context("--intervals needs a value")?
            .parse::<usize>()
            .context("--intervals")?
            .max(1),
        None => 40,
    };
    // The share of pages sampled (1/stride), as the sampler CPU budget
    // lowers it on large VMs; 1 = every page.
    let fraction = match args.iter().position(|a| a == "--fraction") {
        Some(i) => args
            .get(i + 1)
            .context("--fraction needs a value")?
            .parse::<f64>()
            .context("--fraction")?,
        None => 1.0,
    };
    let refit_every = match args.iter().position(|a| a == "--refit-every") {
        Some(i) => args
            .get(i + 1)
            .context("--refit-every needs a value")?
            .parse::<u32>()
            .context("--refit-every")?
            .max(1),
        None => REFIT_EVERY,
    };
    anyhow::ensure!(
        fraction > 0.0 && fraction <= 1.0,
        "--fraction must be in (0, 1]"
    );
    let secs = |d: Vec<Duration>| d.iter().map(Duration::as_secs_f64).collect::<Vec<_>>();
    let one = Duration::from_secs(1);
    // tierd's default first: the baseline of the ratios.
    let schedules: Vec<(&str, Vec<f64>)> = vec![
        ("5 passes, 25 ms lead (default)", secs(pass_lengths(one, 5))),
        ("4 passes, no lead", secs(pass_lengths(one, 4))),
        (
            "5 passes, 5 ms lead",
            vec![0.005, 0.12, 0.375, 0.125, 0.375],
        ),
        ("7 passes, 18 ms lead", secs(pass_lengths(one, 7))),
    ];
    let shapes = shapes();
    println!(
        "schedule: {intervals} simulated 1 s intervals per shape; interval = ~95 % DRAM-hit interval; pages sampled: {fraction}; full fit at least every {refit_every} intervals"
    );
    println!(
        "{:<42} {:<32} {:>6} {:>5} {:>9} {:>9} {:>8} {:>9} {:>10}",
        "shape",
        "schedule",
        "walks",
        "cost",
        "coverage",
        "one-sided",
        "width",
        "p95 err",
        "width/def"
    );
    let mut cov_min = f64::INFINITY;
    let mut rows = Vec::new();
    let progress = Progress::bar("schedule", (shapes.len() * schedules.len()) as u64);
    for (k, shape) in shapes.iter().enumerate() {
        let mut base_width = f64::NAN;
        for (j, (name, ts)) in schedules.iter().enumerate() {
            progress.item(format!("{}, {name}", shape.name));
            let s = score(
                shape,
                ts,
                intervals,
                0x9e37_79b9 + k as u64,
                fraction,
                refit_every,
            );
            progress.inc();
            if j == 0 {
                base_width = s.width_pp;
            }
            cov_min = cov_min.min(s.coverage);
            let cost = ts.len() as f64 / schedules[0].1.len() as f64;
            progress.suspend(|| {
                println!(
                    "{:<42} {:<32} {:>6} {:>5.2} {:>9.2} {:>9.2} {:>7.1}pp {:>7.2}pp {:>10.2}",
                    shape.name,
                    name,
                    ts.len(),
                    cost,
                    s.coverage,
                    s.one_sided,
                    s.width_pp,
                    s.p95_err_pp,
                    s.width_pp / base_width
                )
            });
            rows.push((j, s));
        }
    }
    progress.finish();
    // Per schedule over the shapes: median width and worst coverage.
    println!("{:<32} {:>9} {:>13}", "schedule", "min cov", "median width");
    let mut pairs = vec![
        ("shapes", shapes.len().to_string()),
        ("coverage_min", format!("{cov_min:.2}")),
    ];
    let keys = [
        "width_pp_default",
        "width_pp_four",
        "width_pp_lead5ms",
        "width_pp_seven",
    ];
    for (j, (name, _)) in schedules.iter().enumerate() {
        let of: Vec<&Score> = rows.iter().filter(|r| r.0 == j).map(|r| &r.1).collect();
        let cov = of.iter().map(|s| s.coverage).fold(f64::INFINITY, f64::min);
        let width = median(of.iter().map(|s| s.width_pp).collect());
        println!("{name:<32} {cov:>9.2} {width:>12.1}pp");
        pairs.push((keys[j], format!("{width:.1}")));
    }
    pairs.push(("fraction", format!("{fraction}")));
    pairs.push(("refit_every", format!("{refit_every}")));
    println!("{}", result_line(&pairs));
    Ok(())
}
