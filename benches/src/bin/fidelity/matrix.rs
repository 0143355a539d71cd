//! The workload matrix: hot-set size x skew by footprint, skew by access
//! rate, and phase changes. Every row is run and reported, whatever the
//! result; none is chosen for how a backend does on it.

use tier_benches::workload::Shape;

/// Where a row's dram share comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Distinct pages per tier differ, each page touched once per round.
    Footprint,
    /// Same pages per tier, touched a different number of times per round.
    Rate,
    /// The shape changes during the run (mid-interval).
    Phases,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Footprint => "footprint",
            Kind::Rate => "rate",
            Kind::Phases => "phases",
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
        }],
    });
    m.extend(phases(64, 256, 128));
    m
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
        assert_eq!(m.len(), 16);
        for k in [Kind::Footprint, Kind::Rate, Kind::Phases] {
            assert!(m.iter().any(|w| w.kind == k));
        }
        for w in &m {
            let p = guest_plan::plan(&w.steps, &schedule, 500, 1).unwrap();
            let parsed = Params::parse(&p.params.to_cmdline()).unwrap();
            assert_eq!(parsed, p.params, "{}", w.name);
            assert_eq!(parsed.phases.len(), w.steps.len(), "{}", w.name);
            for s in &w.steps {
                // The zones of TestGuestSource hold 4096-page hot sets.
                assert!(s.dram_pages <= 4096 && s.slow_pages <= 4096, "{}", w.name);
            }
        }
    }
}
