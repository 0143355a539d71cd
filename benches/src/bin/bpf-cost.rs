//! Cost per event of the EPT sampler's BPF programs (`bpf/ept.bpf.c`) in
//! this kernel, against an empty program on the same hook, all run through
//! BPF_PROG_TEST_RUN with synthetic `kvm_tdp_mmu_spte_changed` arguments.
//!
//! Raw tracepoint programs refuse the kernel's timing loop (`repeat`: EINVAL,
//! checked below), so time comes from the kernel's per-program run
//! statistics (BPF_ENABLE_STATS: `run_time_ns / run_cnt`, one sched_clock
//! pair around each run, the method of CONTEXT.md), over many single runs
//! per sample. The wall time per BPF_PROG_TEST_RUN syscall is reported too.

use std::time::Instant;

use anyhow::Context;
use tier_benches::progress::Progress;
use tier_benches::{Row, Summary, print_table, result_line};
use tier_profiler::sampler::ept::{
    EptOptions, EptProgram, EptPrograms, GfnRange, MAX_RANGES, ProgramStatus, current_tid,
    enable_run_stats,
};

const RUNS: usize = 7;
const EVENTS_PER_RUN: u64 = 100_000;

const PRESENT: u64 = 0x0000_0001_2345_6000 | (1 << 11) | 0x7;
const YOUNG: u64 = PRESENT | (1 << 8);
const OLD: u64 = PRESENT;

/// 16 ranges of 0x1000 pages; tiers 0..7 twice.
fn sixteen_ranges() -> Vec<GfnRange> {
    (0..MAX_RANGES as u64)
        .map(|i| GfnRange {
            start_gfn: i * 0x1000,
            end_gfn: (i + 1) * 0x1000,
            tier: (i % 8) as u32,
        })
        .collect()
}

struct Case {
    name: &'static str,
    heat: bool,
    program: EptProgram,
    owned: bool,
    args: [u64; 5],
}

/// A loaded object with the VM in slot 0 and this thread as its scanner
/// (ownership toggled per case).
fn load(heat: bool) -> anyhow::Result<EptPrograms> {
    let mut p = EptPrograms::load(&EptOptions {
        tracepoint: true,
        fexit: false,
        empty_baseline: true,
        attach: false,
        heat,
        ..EptOptions::default()
    })
    .context("loading ept.bpf.o (needs root)")?;
    for prog in [EptProgram::SpteChanged, EptProgram::Empty] {
        anyhow::ensure!(
            p.status(prog) == &ProgramStatus::Loaded,
            "{prog}: {:?}",
            p.status(prog)
        );
    }
    p.set_vm(0, &sixteen_ranges())?;
    Ok(p)
}

/// ns per event (kernel run stats) and ns per syscall (wall) of one sample.
fn sample(p: &EptPrograms, c: &Case) -> anyhow::Result<(f64, f64)> {
    let tid = current_tid();
    if c.owned {
        p.set_scan_owner(tid, 0)?;
    } else {
        p.clear_scan_owner(tid)?;
    }
    let before = p.run_stats(c.program)?;
    let t = Instant::now();
    for _ in 0..EVENTS_PER_RUN {
        p.test_run(c.program, &c.args)?;
    }
    let wall = t.elapsed().as_nanos() as f64 / EVENTS_PER_RUN as f64;
    let after = p.run_stats(c.program)?;
    let runs = after.run_cnt - before.run_cnt;
    anyhow::ensure!(
        runs == EVENTS_PER_RUN,
        "{}: {runs} runs counted, expected {EVENTS_PER_RUN}",
        c.name
    );
    let ns = (after.run_time_ns - before.run_time_ns) as f64 / runs as f64;
    Ok((ns, wall))
}

fn main() -> anyhow::Result<()> {
    tier_profiler::bpf::route_libbpf_logs();
    let plain = load(false)?;
    let heat = load(true)?;
    let _stats = enable_run_stats().context("BPF_ENABLE_STATS")?;

    let repeat_note = match plain.test_run_repeat(EptProgram::Empty, &[0; 5], 1000) {
        Ok((_, d)) => format!("kernel repeat loop works here: {d:?} per run"),
        Err(e) => format!("kernel repeat loop refused for raw_tp ({e}); timing from run stats"),
    };

    // Worst-case match: the gfn is in the 16th (last) range.
    let last = 15 * 0x1000 + 0x10;
    let cases = [
        Case {
            name: "empty raw_tp (baseline)",
            heat: false,
            program: EptProgram::Empty,
            owned: true,
            args: [0, last, 1, YOUNG, OLD],
        },
        Case {
            name: "ageing, owned, range 16/16",
            heat: false,
            program: EptProgram::SpteChanged,
            owned: true,
            args: [0, last, 1, YOUNG, OLD],
        },
        Case {
            name: "ageing, owned, range 1/16",
            heat: false,
            program: EptProgram::SpteChanged,
            owned: true,
            args: [0, 0x10, 1, YOUNG, OLD],
        },
        Case {
            name: "non-ageing (old not young)",
            heat: false,
            program: EptProgram::SpteChanged,
            owned: true,
            args: [0, last, 1, OLD, OLD],
        },
        Case {
            name: "ageing, unattributed",
            heat: false,
            program: EptProgram::SpteChanged,
            owned: false,
            args: [0, last, 1, YOUNG, OLD],
        },
        Case {
            name: "ageing, owned, 16/16, heat on",
            heat: true,
            program: EptProgram::SpteChanged,
            owned: true,
            args: [0, last, 1, YOUNG, OLD],
        },
    ];

    let mut ns: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut wall: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    // Warm-up, then samples interleaved across cases so drift hits all alike.
    let progress = Progress::bar("bpf-cost", ((RUNS + 1) * cases.len()) as u64);
    for round in 0..=RUNS {
        for (i, c) in cases.iter().enumerate() {
            let p = if c.heat { &heat } else { &plain };
            let what = match round {
                0 => format!("warm-up: {}", c.name),
                r => format!("run {r}/{RUNS}: {}", c.name),
            };
            let (n, w) = progress.step(what, || sample(p, c))?;
            if round > 0 {
                ns[i].push(n);
                wall[i].push(w);
            }
        }
    }
    progress.finish();
    plain.clear_scan_owner(current_tid())?;
    heat.clear_scan_owner(current_tid())?;

    let summarize = |v: &[f64]| Summary::of(v).context("empty sample");
    let base = summarize(&ns[0])?;
    let base_wall = summarize(&wall[0])?;
    let mut rows = Vec::new();
    let mut wall_rows = Vec::new();
    let mut worst = (0.0f64, "");
    let mut worst_heat_off = 0.0f64;
    for (i, c) in cases.iter().enumerate() {
        let s = summarize(&ns[i])?;
        let w = summarize(&wall[i])?;
        rows.push(Row {
            name: c.name.into(),
            unit: "ns/event",
            summary: s,
            ratio: Some(s.median / base.median),
        });
        wall_rows.push(Row {
            name: c.name.into(),
            unit: "ns/syscall",
            summary: w,
            ratio: Some(w.median / base_wall.median),
        });
        if i > 0 && s.median > worst.0 {
            worst = (s.median, c.name);
        }
        if i > 0 && !c.heat {
            worst_heat_off = worst_heat_off.max(s.median);
        }
    }
    print_table(
        &format!(
            "BPF program run time in the kernel (run_time_ns/run_cnt), {RUNS} runs x {EVENTS_PER_RUN} events"
        ),
        &rows,
    );
    println!();
    print_table(
        "wall time per BPF_PROG_TEST_RUN syscall (includes the syscall and ctx copy)",
        &wall_rows,
    );
    println!();
    println!("note: {repeat_note}");
    println!(
        "note: fexit/kvm_age_gfn is not runnable here (fexit load gives EPERM); \
         it shares account() with the raw_tp program"
    );
    println!(
        "worst program median: {} at {:.1} ns/event, {:.1} ns above the empty program",
        worst.1,
        worst.0,
        worst.0 - base.median
    );
    println!(
        "{}",
        result_line(&[
            ("bpf_cost_ratio", format!("{:.2}", worst.0 / base.median)),
            (
                "heat_off_ratio",
                format!("{:.2}", worst_heat_off / base.median)
            ),
            ("empty_ns", format!("{:.1}", base.median)),
            ("worst_ns", format!("{:.1}", worst.0)),
        ])
    );
    Ok(())
}
