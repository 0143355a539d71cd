//! The workloads the bench runs: synthetic streams at real rates and
//! recorded page traces of real programs (benches/traces/README.md).

use std::path::Path;
use std::sync::Arc;

use super::run::{Placement, Source, Workload};
use super::stream::{Phase, Popularity, Trace};

const GIB_PAGES: u64 = 1 << 18;

fn zipf(pages: u64, s: f64, key: u64) -> Popularity {
    Popularity::Zipf {
        offset: 0,
        pages,
        s,
        key,
    }
}

fn one(mix: Vec<(f64, Popularity)>) -> Vec<Phase> {
    vec![Phase { at_s: 0.0, mix }]
}

fn synthetic(
    name: &str,
    gib: u64,
    rate: f64,
    phases: Vec<Phase>,
    placement: Placement,
) -> Workload {
    Workload {
        name: name.into(),
        source: Source::Synthetic {
            ws_pages: gib * GIB_PAGES,
            rate,
            phases,
        },
        placement,
        max_rate: None,
    }
}

/// The synthetic suite.
pub fn synthetic_suite() -> Vec<Workload> {
    let mut few_hot = synthetic(
        "uniform 1 GiB + 64 pages with 40 %, 1e6/s, whole",
        1,
        1e6,
        one(vec![
            (
                0.6,
                Popularity::Uniform {
                    offset: 0,
                    pages: GIB_PAGES,
                },
            ),
            (
                0.4,
                Popularity::Uniform {
                    offset: 0,
                    pages: 64,
                },
            ),
        ]),
        Placement::Head(0.25),
    );
    few_hot.max_rate = Some(1e6);
    vec![
        synthetic(
            "uniform 1 GiB, 1e6/s, dram random 50 %",
            1,
            1e6,
            one(vec![(
                1.0,
                Popularity::Uniform {
                    offset: 0,
                    pages: GIB_PAGES,
                },
            )]),
            Placement::Random(0.5),
        ),
        few_hot,
        synthetic(
            "zipf 0.99 16 GiB, 1e8/s, dram hottest 25 %",
            16,
            1e8,
            one(vec![(1.0, zipf(16 * GIB_PAGES, 0.99, 3))]),
            Placement::Head(0.25),
        ),
        synthetic(
            "zipf 0.99 16 GiB, 1e9/s, dram random 50 %",
            16,
            1e9,
            one(vec![(1.0, zipf(16 * GIB_PAGES, 0.99, 5))]),
            Placement::Random(0.5),
        ),
        synthetic(
            "zipf 1.2 64 GiB, 1e9/s, dram hottest 12.5 %",
            64,
            1e9,
            one(vec![(1.0, zipf(64 * GIB_PAGES, 1.2, 7))]),
            Placement::Head(0.125),
        ),
        synthetic(
            "mix 80 % on 1 GiB + 20 % over 256 GiB, 1e8/s, dram = hot GiB",
            256,
            1e8,
            one(vec![
                (
                    0.8,
                    Popularity::Uniform {
                        offset: 0,
                        pages: GIB_PAGES,
                    },
                ),
                (
                    0.2,
                    Popularity::Uniform {
                        offset: 0,
                        pages: 256 * GIB_PAGES,
                    },
                ),
            ]),
            Placement::Head(1.0 / 256.0),
        ),
        synthetic(
            "zipf 0.8 4 GiB, 1e7/s, re-ranked at 30 s, dram hottest 25 %",
            4,
            1e7,
            vec![
                Phase {
                    at_s: 0.0,
                    mix: vec![(1.0, zipf(4 * GIB_PAGES, 0.8, 11))],
                },
                Phase {
                    at_s: 30.0,
                    mix: vec![(1.0, zipf(4 * GIB_PAGES, 0.8, 12345))],
                },
            ],
            Placement::Head(0.25),
        ),
    ]
}

/// Recorded traces in `dir` (`*.pgs.xz`), replayed at `rate`, the
/// hottest quarter of their pages in DRAM.
pub fn trace_suite(dir: &Path, rate: f64) -> anyhow::Result<Vec<Workload>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".pgs.xz"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let trace = Arc::new(Trace::load(&p)?);
            let stem = p
                .file_name()
                .map(|n| n.to_string_lossy().trim_end_matches(".pgs.xz").to_string())
                .unwrap_or_default();
            Ok(Workload {
                name: format!(
                    "trace {stem} ({} MiB touched), {rate:.0e}/s, dram hottest 25 %",
                    (u64::from(trace.pages) * 4096) >> 20
                ),
                source: Source::Trace {
                    name: stem,
                    trace,
                    rate,
                },
                placement: Placement::Head(0.25),
                max_rate: None,
            })
        })
        .collect()
}
