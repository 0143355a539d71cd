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

pub fn matrix() -> Vec<Workload> {
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
    let rate = |d: u32, s: u32| Shape {
        dram_pages: 128,
        dram_repeat: d,
        slow_pages: 128,
        slow_repeat: s,
    };
    m.push(Workload {
        name: "128+128 pages, dram pages 4x as often".into(),
        kind: Kind::Rate,
        steps: vec![rate(4, 1)],
    });
    m.push(Workload {
        name: "128+128 pages, slow pages 4x as often".into(),
        kind: Kind::Rate,
        steps: vec![rate(1, 4)],
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
    m.push(Workload {
        name: "skew steps 75% -> 25% -> 75%".into(),
        kind: Kind::Phases,
        steps: vec![
            Shape::pages(192, 64),
            Shape::pages(64, 192),
            Shape::pages(192, 64),
        ],
    });
    m.push(Workload {
        name: "slow tier idles and returns".into(),
        kind: Kind::Phases,
        steps: vec![
            Shape::pages(256, 256),
            Shape::pages(256, 0),
            Shape::pages(256, 256),
        ],
    });
    m.push(Workload {
        name: "rate steps 1x -> 4x -> 1x in dram".into(),
        kind: Kind::Phases,
        steps: vec![rate(1, 1), rate(4, 1), rate(1, 1)],
    });
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrix_fits_the_demo_vm_and_covers_each_kind() {
        let m = matrix();
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
