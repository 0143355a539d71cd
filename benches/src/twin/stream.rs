//! Access streams: which sampled page (and cache line) is touched when.
//!
//! Synthetic streams follow the independent reference model: each page of
//! the working set has a touch rate (Zipf ranks, uniform sets and
//! mixtures of them, re-ranked at a phase change), and touches arrive as a
//! Poisson process over the pages. A working set of 1-256 GiB is far too
//! many pages to simulate at 10^8-10^9 touches per second, so the twin
//! follows a stratified sample of `S` of its `W` pages (fraction `f = S /
//! W`): page `j` of the sample stands for real page `(j + u) / f`, and its
//! touches keep their real rate. Caches seen by the sample are scaled by
//! the same `f` (set sampling: `llc`), so each sampled page competes for
//! its cache sets as it would among all `W` pages.
//!
//! Recorded streams replay a page trace of a real program (`trace`), in
//! the program's own order, at a chosen rate.

use std::path::Path;

use anyhow::Context;

/// The controller simulator's splitmix64, seeded apart from it, with the
/// draws the twin needs on top.
#[derive(Debug, Clone)]
pub struct Rng(tier_sim::rng::Rng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(tier_sim::rng::Rng::new(seed ^ 0x6a09_e667_f3bc_c909))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.0.unit()
    }
    /// Exponential with the given rate.
    pub fn exp(&mut self, rate: f64) -> f64 {
        -(1.0 - self.unit()).ln() / rate
    }
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (1.0 - self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
    /// Binomial(n, p): exact below 64 trials, normal beyond (clamped).
    pub fn binomial(&mut self, n: f64, p: f64) -> f64 {
        if n <= 0.0 || p <= 0.0 {
            return 0.0;
        }
        if p >= 1.0 {
            return n;
        }
        if n < 64.0 {
            return (0..n as u32).filter(|_| self.unit() < p).count() as f64;
        }
        let x = n * p + (n * p * (1.0 - p)).sqrt() * self.normal();
        x.round().clamp(0.0, n)
    }
}

/// Walker/Vose alias table: O(1) draws from fixed weights.
#[derive(Debug, Clone)]
pub struct Alias {
    prob: Vec<f64>,
    alias: Vec<u32>,
}

impl Alias {
    pub fn new(weights: &[f64]) -> Alias {
        let n = weights.len();
        let sum: f64 = weights.iter().sum();
        let mut p: Vec<f64> = weights.iter().map(|w| w * n as f64 / sum).collect();
        let mut alias = vec![0u32; n];
        let (mut small, mut large): (Vec<usize>, Vec<usize>) = (0..n).partition(|&i| p[i] < 1.0);
        while let (Some(s), Some(&l)) = (small.pop(), large.last()) {
            alias[s] = l as u32;
            p[l] -= 1.0 - p[s];
            if p[l] < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        for i in large.into_iter().chain(small) {
            p[i] = 1.0;
        }
        Alias { prob: p, alias }
    }
    pub fn draw(&self, rng: &mut Rng) -> usize {
        let i = rng.below(self.prob.len() as u64) as usize;
        if rng.unit() < self.prob[i] {
            i
        } else {
            self.alias[i] as usize
        }
    }
}

/// Popularity of one component of a mixture over real pages
/// `[offset, offset + pages)`.
#[derive(Debug, Clone, Copy)]
pub enum Popularity {
    Uniform {
        offset: u64,
        pages: u64,
    },
    /// Zipf of exponent `s` over ranks given by an odd multiplier `key`
    /// (`pages` a power of two, so the ranking is a permutation): a phase
    /// change re-ranks with another key.
    Zipf {
        offset: u64,
        pages: u64,
        s: f64,
        key: u64,
    },
}

/// Generalised harmonic number H(n, s): exact to 10^4, Euler-Maclaurin
/// beyond (enough for 2^26 pages).
pub fn harmonic(n: u64, s: f64) -> f64 {
    let m = n.min(10_000);
    let mut h: f64 = (1..=m).map(|k| (k as f64).powf(-s)).sum();
    if n > m {
        let (a, b) = (m as f64 + 0.5, n as f64 + 0.5);
        h += if (s - 1.0).abs() < 1e-9 {
            (b / a).ln()
        } else {
            (b.powf(1.0 - s) - a.powf(1.0 - s)) / (1.0 - s)
        };
    }
    h
}

impl Popularity {
    /// Probability that one touch of this component goes to real page `p`.
    pub fn prob(&self, p: u64, h: f64) -> f64 {
        match *self {
            Popularity::Uniform { offset, pages } => {
                if (offset..offset + pages).contains(&p) {
                    1.0 / pages as f64
                } else {
                    0.0
                }
            }
            Popularity::Zipf {
                offset,
                pages,
                s,
                key,
            } => {
                if !(offset..offset + pages).contains(&p) {
                    return 0.0;
                }
                let rank = ((p - offset)
                    .wrapping_mul(key | 1)
                    .wrapping_add(key.wrapping_mul(7919)))
                    & (pages - 1);
                (rank as f64 + 1.0).powf(-s) / h
            }
        }
    }
    fn norm(&self) -> f64 {
        match *self {
            Popularity::Uniform { .. } => 1.0,
            Popularity::Zipf { pages, s, .. } => harmonic(pages, s),
        }
    }
}

/// One phase: from `at_s` on, touches split over the components by weight.
#[derive(Debug, Clone)]
pub struct Phase {
    pub at_s: f64,
    pub mix: Vec<(f64, Popularity)>,
}

/// The sampled pages of a synthetic working set and their rates per phase.
#[derive(Debug, Clone)]
pub struct Sampled {
    /// Real page number each sampled page stands for.
    pub real: Vec<u64>,
    /// Per phase: touches per second of each sampled page.
    pub rates: Vec<Vec<f64>>,
    pub fraction: f64,
}

/// Samples `sample` of `ws_pages` pages (stratified, offset `u`) and gives
/// each its rate in each phase at `rate` touches per second in all.
pub fn sample_pages(
    ws_pages: u64,
    sample: u64,
    phases: &[Phase],
    rate: f64,
    rng: &mut Rng,
) -> Sampled {
    let s = sample.min(ws_pages).max(1);
    let fraction = s as f64 / ws_pages as f64;
    let u = rng.unit();
    let real: Vec<u64> = (0..s)
        .map(|j| (((j as f64 + u) / fraction) as u64).min(ws_pages - 1))
        .collect();
    let rates = phases
        .iter()
        .map(|ph| {
            let wsum: f64 = ph.mix.iter().map(|m| m.0).sum();
            let norms: Vec<f64> = ph.mix.iter().map(|m| m.1.norm()).collect();
            real.iter()
                .map(|&p| {
                    ph.mix
                        .iter()
                        .zip(&norms)
                        .map(|((w, pop), h)| w / wsum * pop.prob(p, *h))
                        .sum::<f64>()
                        * rate
                })
                .collect()
        })
        .collect();
    Sampled {
        real,
        rates,
        fraction,
    }
}

/// A run of touches of one page: `count` touches starting at `line`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub page: u32,
    pub line: u8,
    pub count: u32,
}

/// A recorded page trace: runs over pages renumbered 0..pages.
#[derive(Debug, Clone)]
pub struct Trace {
    pub runs: Vec<Run>,
    pub pages: u32,
    pub accesses: u64,
}

const MAGIC: &[u8; 8] = b"TWINPGS1";

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn read_varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let x = *b.get(*at)?;
        *at += 1;
        v |= u64::from(x & 0x7f) << shift;
        if x & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

impl Trace {
    /// Runs of a lackey `--trace-mem=yes` log (`L`/`S`/`M` lines; `I`
    /// fetches skipped), after skipping `skip` data accesses (start-up),
    /// up to `max_runs` runs; pages renumbered in order of first touch.
    pub fn from_lackey(text: &str, skip: usize, max_runs: usize) -> Trace {
        let mut ids = std::collections::HashMap::new();
        let mut runs: Vec<Run> = Vec::new();
        let mut accesses = 0u64;
        let data = text.lines().filter_map(|l| {
            let l = l.trim_start();
            let kind = l.chars().next()?;
            if !matches!(kind, 'L' | 'S' | 'M') {
                return None;
            }
            let addr = l.get(1..)?.trim().split(',').next()?;
            u64::from_str_radix(addr, 16).ok()
        });
        for addr in data.skip(skip) {
            let next = ids.len() as u32;
            let page = *ids.entry(addr >> 12).or_insert(next);
            accesses += 1;
            match runs.last_mut() {
                Some(r) if r.page == page => r.count += 1,
                _ => {
                    if runs.len() == max_runs {
                        accesses -= 1;
                        break;
                    }
                    runs.push(Run {
                        page,
                        line: ((addr >> 6) & 63) as u8,
                        count: 1,
                    });
                }
            }
        }
        Trace {
            runs,
            pages: ids.len() as u32,
            accesses,
        }
    }

    /// Compact form: magic, then per run zigzag page delta, line, count.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        let mut prev = 0i64;
        for r in &self.runs {
            let d = i64::from(r.page) - prev;
            prev = i64::from(r.page);
            varint(&mut out, ((d << 1) ^ (d >> 63)) as u64);
            out.push(r.line);
            varint(&mut out, u64::from(r.count));
        }
        out
    }

    pub fn decode(b: &[u8]) -> Option<Trace> {
        if b.get(..8)? != MAGIC {
            return None;
        }
        let (mut at, mut prev, mut runs) = (8usize, 0i64, Vec::new());
        let (mut pages, mut accesses) = (0u32, 0u64);
        while at < b.len() {
            let z = read_varint(b, &mut at)?;
            prev += ((z >> 1) as i64) ^ -((z & 1) as i64);
            let line = *b.get(at)?;
            at += 1;
            let count = u32::try_from(read_varint(b, &mut at)?).ok()?;
            let page = u32::try_from(prev).ok()?;
            pages = pages.max(page + 1);
            accesses += u64::from(count);
            runs.push(Run { page, line, count });
        }
        Some(Trace {
            runs,
            pages,
            accesses,
        })
    }

    /// Reads a `.pgs.xz` file (decompressed by `xz -dc`, xz-utils).
    pub fn load(path: &Path) -> anyhow::Result<Trace> {
        let out = std::process::Command::new("xz")
            .arg("-dc")
            .arg(path)
            .output()
            .with_context(|| format!("xz -dc {}", path.display()))?;
        anyhow::ensure!(
            out.status.success(),
            "xz -dc {}: {}",
            path.display(),
            out.status
        );
        Trace::decode(&out.stdout).with_context(|| format!("{}: not a page trace", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_round_trip_and_lackey_parse() {
        let log =
            "I  0400d7d4,8\n L 1ffefffc30,8\n S 1ffefffc38,8\n M 0061a000,4\n L 1ffefff000,8\n";
        let t = Trace::from_lackey(log, 0, 100);
        // 1ffefffc30, 1ffefffc38 and 1ffefff000 share a page.
        assert_eq!(t.pages, 2);
        assert_eq!(t.accesses, 4);
        assert_eq!(t.runs.len(), 3);
        assert_eq!(t.runs[0].count, 2);
        let back = Trace::decode(&t.encode()).unwrap();
        assert_eq!(back.runs, t.runs);
        assert_eq!(back.accesses, 4);
    }

    #[test]
    fn alias_draws_follow_weights() {
        let a = Alias::new(&[1.0, 3.0, 0.0, 4.0]);
        let mut rng = Rng::new(1);
        let mut n = [0u32; 4];
        for _ in 0..80_000 {
            n[a.draw(&mut rng)] += 1;
        }
        assert_eq!(n[2], 0);
        assert!((f64::from(n[1]) / 80_000.0 - 0.375).abs() < 0.01, "{n:?}");
    }

    #[test]
    fn sampled_rates_sum_to_the_sampled_share() {
        let ph = [Phase {
            at_s: 0.0,
            mix: vec![(
                1.0,
                Popularity::Zipf {
                    offset: 0,
                    pages: 1 << 20,
                    s: 0.99,
                    key: 5,
                },
            )],
        }];
        let s = sample_pages(1 << 20, 1 << 14, &ph, 1e9, &mut Rng::new(3));
        assert_eq!(s.real.len(), 1 << 14);
        assert!(s.rates[0].iter().all(|&r| r > 0.0));
        // Uniform: the sample holds exactly its share of the touches.
        let u = [Phase {
            at_s: 0.0,
            mix: vec![(
                1.0,
                Popularity::Uniform {
                    offset: 0,
                    pages: 1 << 20,
                },
            )],
        }];
        let s = sample_pages(1 << 20, 1 << 14, &u, 1e9, &mut Rng::new(3));
        let sum: f64 = s.rates[0].iter().sum();
        assert!((sum / (1e9 * s.fraction) - 1.0).abs() < 1e-9, "{sum}");
        assert!(
            (harmonic(1 << 20, 0.99)
                - (1..=1u64 << 20)
                    .map(|k| (k as f64).powf(-0.99))
                    .sum::<f64>())
            .abs()
                < 1e-3
        );
    }
}
