//! The workload matrix: hot-set size x skew by footprint, skew by access
//! rate, phase changes, and (test guest) Zipf page popularity inside the
//! tiers. Every row is run and reported, whatever the result; none is
//! chosen for how a backend does on it.

use tier_benches::workload::{Shape, Skew};

/// Where a row's dram share comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Distinct pages per tier differ, each page touched once per round.
    Footprint,
    /// Same pages per tier, touched a different number of times per round.
    Rate,
    /// The shape changes during the run (mid-interval).
    Phases,
    /// Pages of a tier differ in popularity (Zipf, the test guest's
    /// `zipf=`): a few hot pages among many cool ones, as in real guests.
    Skew,
    /// Long rows for the working-set ages (test guest; run only when
    /// `--kinds` names them): [`AGES_PER_STEP`] intervals per step, room
    /// for hostpte's sweep.
    Ages,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Footprint => "footprint",
            Kind::Rate => "rate",
            Kind::Phases => "phases",
            Kind::Skew => "skew",
            Kind::Ages => "ages",
        }
    }
}

impl Workload {
    /// Measured intervals per step.
    pub fn per_step(&self) -> usize {
        match self.kind {
            Kind::Ages => AGES_PER_STEP,
            _ => INTERVALS,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Workload {
    pub name: String,
    pub kind: Kind,
    /// One shape per phase; each runs `INTERVALS` measured intervals.
    pub steps: Vec<Shape>,
}

/// Measured intervals per phase (the first phase also gets one warm-up
/// interval, which is not scored).
pub const INTERVALS: usize = 6;

/// Measured intervals per step of an ages row: three steps hold one sweep
/// of 60 s every 120 s (`--ws-sweep-s 60 --ws-sweep-every-s 120`), which
/// opens between intervals 60 and 180 of a VM and lasts 60.
pub const AGES_PER_STEP: usize = 84;

/// Where in its interval a phase change lands (fraction of the interval):
/// inside a pass, as changes in real guests do.
pub const CHANGE_AT: f64 = 0.4;

/// Hot-set size x skew by footprint: 64, 512 and 4096 pages, 10 / 50 /
/// 90 % of them in dram, every page as often as any other.
fn footprint() -> Vec<Workload> {
    let mut m = Vec::new();
    for total in [64u32, 512, 4096] {
        for share in [10u32, 50, 90] {
            let dram = (total * share).div_ceil(100);
            m.push(Workload {
                name: format!("{total} pages, {share}% in dram"),
                kind: Kind::Footprint,
                steps: vec![Shape::pages(dram, total - dram)],
            });
        }
    }
    m
}

/// `pages` + `pages`, dram pages touched `d` times for every `s` of slow.
fn rate(pages: u32, d: u32, s: u32) -> Shape {
    Shape {
        dram_pages: pages,
        dram_repeat: d,
        slow_pages: pages,
        slow_repeat: s,
        skew: Skew::Uniform,
    }
}

/// The phase rows both matrices share, at a source's sizes: skew by pages
/// (`unit` x 3 | `unit` and back), the slow tier of `idle` + `idle` pages
/// going idle and back, dram rate 1x -> 4x -> 1x on `pages` + `pages`.
fn phases(unit: u32, idle: u32, pages: u32) -> [Workload; 3] {
    let three = |a: Shape, b: Shape| vec![a, b, a];
    [
        Workload {
            name: "skew steps 75% -> 25% -> 75%".into(),
            kind: Kind::Phases,
            steps: three(Shape::pages(3 * unit, unit), Shape::pages(unit, 3 * unit)),
        },
        Workload {
            name: "slow tier idles and returns".into(),
            kind: Kind::Phases,
            steps: three(Shape::pages(idle, idle), Shape::pages(idle, 0)),
        },
        Workload {
            name: "rate steps 1x -> 4x -> 1x in dram".into(),
            kind: Kind::Phases,
            steps: three(rate(pages, 1, 1), rate(pages, 4, 1)),
        },
    ]
}

/// The matrix for the demo VM, which touches every page of a round in
/// order: repeat counts are exact per round.
pub fn demo() -> Vec<Workload> {
    let mut m = footprint();
    let r128 = |d: u32, s: u32| rate(128, d, s);
    m.push(Workload {
        name: "128+128 pages, dram pages 4x as often".into(),
        kind: Kind::Rate,
        steps: vec![r128(4, 1)],
    });
    m.push(Workload {
        name: "128+128 pages, slow pages 4x as often".into(),
        kind: Kind::Rate,
        steps: vec![r128(1, 4)],
    });
    m.push(Workload {
        name: "demo default 48x4 | 96x1".into(),
        kind: Kind::Rate,
        steps: vec![Shape {
            dram_pages: 48,
            dram_repeat: 4,
            slow_pages: 96,
            slow_repeat: 1,
            skew: Skew::Uniform,
        }],
    });
    m.extend(phases(64, 256, 128));
    m
}

/// Zipf rows (test guest only): exponents 0.6, 0.99 and 1.2 over 512 to
/// 8192 pages; the split by weight towards dram and towards slow; one
/// ranking whose popular head dram holds while slow holds its tail; bursty
/// phases moving the weight between two skewed tiers; a chain's tail
/// growing and shrinking (the head's share drifts as the working set does).
fn skew() -> Vec<Workload> {
    let z = |d: u32, s: u32| Skew::Zipf([d, s]);
    let chain = |m: u32, head: u32, tail: u32| Shape::pages(head, tail).skewed(Skew::Chain(m));
    let one = |name: &str, shape: Shape| Workload {
        name: name.into(),
        kind: Kind::Skew,
        steps: vec![shape],
    };
    let bursty = rate(1024, 4, 1).skewed(z(990, 990));
    vec![
        one(
            "z0.6 512+512, dram 4x by weight",
            rate(512, 4, 1).skewed(z(600, 600)),
        ),
        one(
            "z0.99 2048+2048, slow 4x by weight",
            rate(2048, 1, 4).skewed(z(990, 990)),
        ),
        one(
            "z1.2 4096+4096, dram 4x by weight",
            rate(4096, 4, 1).skewed(z(1200, 1200)),
        ),
        one(
            "1024 uniform + z0.99 7168 in slow",
            Shape::pages(1024, 7168).skewed(z(0, 990)),
        ),
        one(
            "z1 chain 4096: dram head 512, slow tail",
            chain(1000, 512, 3584),
        ),
        one("z0.99 chain 8192: dram head 1024", chain(990, 1024, 7168)),
        one("z1.2 chain 4096: dram head 128", chain(1200, 128, 3968)),
        Workload {
            name: "z0.99 1024+1024 bursts: 4x dram/slow".into(),
            kind: Kind::Skew,
            steps: vec![bursty, rate(1024, 1, 4).skewed(z(990, 990)), bursty],
        },
        Workload {
            name: "z1 chain: tail grows 512 -> 3584 -> 512".into(),
            kind: Kind::Skew,
            steps: vec![
                chain(1000, 512, 512),
                chain(1000, 512, 3584),
                chain(1000, 512, 512),
            ],
        },
    ]
}

/// Ages rows (test guest only): a steady Zipf pair, whose horizons differ
/// by how far into its tail each reaches, and a chain whose tail grows and
/// shrinks back, so that the 10 s and 60 s working sets part ways.
fn ages() -> Vec<Workload> {
    let steady = rate(2048, 4, 1).skewed(Skew::Zipf([990, 990]));
    let chain = |tail: u32| Shape::pages(512, tail).skewed(Skew::Chain(1000));
    vec![
        Workload {
            name: "ages: z0.99 2048+2048, dram 4x, steady".into(),
            kind: Kind::Ages,
            steps: vec![steady; 3],
        },
        Workload {
            name: "ages: z1 chain, tail 512 -> 3584 -> 512".into(),
            kind: Kind::Ages,
            steps: vec![chain(512), chain(3584), chain(512)],
        },
    ]
}

/// The matrix for the PVH test guest, which picks pages at random with
/// per-set weights (pages x repeat): a page's rate is accesses/s x weight
/// / pages, and accessed bits can tell rates apart only below about one
/// touch per pass, so the rate rows use bigger sets than the demo's. The
/// 128 + 128 row is kept on purpose: beyond what accessed bits resolve at
/// this guest's speed.
pub fn testguest() -> Vec<Workload> {
    let mut m = footprint();
    for (name, shape) in [
        ("1024+1024 pages, dram pages 4x as often", rate(1024, 4, 1)),
        ("1024+1024 pages, slow pages 4x as often", rate(1024, 1, 4)),
        ("4096+4096 pages, dram pages 4x as often", rate(4096, 4, 1)),
        ("128+128 pages, dram pages 4x as often", rate(128, 4, 1)),
    ] {
        m.push(Workload {
            name: name.into(),
            kind: Kind::Rate,
            steps: vec![shape],
        });
    }
    m.extend(phases(512, 2048, 1024));
    m.extend(skew());
    m.extend(ages());
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrix_fits_the_demo_vm_and_covers_each_kind() {
        let m = demo();
        for w in &m {
            for s in &w.steps {
                // Demo VM work pages: 3840 in dram, 4096 in slow.
                assert!(s.dram_pages <= 3840 && s.slow_pages <= 4096, "{}", w.name);
                assert!(s.accesses_per_round().iter().sum::<u64>() > 0, "{}", w.name);
            }
        }
        for k in [Kind::Footprint, Kind::Rate, Kind::Phases] {
            assert!(m.iter().any(|w| w.kind == k));
        }
        assert_eq!(m[0].steps[0], Shape::pages(7, 57));
        // The demo VM touches every page of a round alike: no skew rows.
        assert!(
            m.iter()
                .all(|w| w.kind != Kind::Skew && w.steps.iter().all(|s| s.skew == Skew::Uniform))
        );
    }
}

#[cfg(test)]
mod testguest_tests {
    use std::time::Duration;

    use tier_benches::workload::{Schedule, guest_plan};
    use tier_testguest::params::Params;

    use super::*;

    #[test]
    fn every_test_guest_row_is_a_command_line_the_guest_accepts() {
        let schedule = Schedule {
            interval: Duration::from_secs(1),
            warmup: 1,
            per_step: INTERVALS as u32,
            change_at: CHANGE_AT,
        };
        let m = testguest();
        assert_eq!(m.len(), 27);
        assert_eq!(m.iter().filter(|w| w.kind == Kind::Skew).count(), 9);
        assert_eq!(m.iter().filter(|w| w.kind == Kind::Ages).count(), 2);
        for k in [Kind::Footprint, Kind::Rate, Kind::Phases] {
            assert!(m.iter().any(|w| w.kind == k));
        }
        // The existing rows come first, unchanged in number and kind.
        assert!(m[..16].iter().all(|w| w.kind != Kind::Skew));
        for w in &m {
            let p = guest_plan::plan(&w.steps, &schedule, 500, 1).unwrap();
            let parsed = Params::parse(&p.params.to_cmdline()).unwrap();
            assert_eq!(parsed, p.params, "{}", w.name);
            assert_eq!(parsed.phases.len(), w.steps.len(), "{}", w.name);
            let cap = tier_benches::workload::testguest::ZONE_MIB.map(|m| m * 256);
            for s in &w.steps {
                assert!(
                    u64::from(s.dram_pages) <= cap[0] && u64::from(s.slow_pages) <= cap[1],
                    "{}",
                    w.name
                );
            }
            if w.kind == Kind::Skew {
                assert!(!p.params.zipf.is_empty(), "{}", w.name);
            }
        }
    }
}
