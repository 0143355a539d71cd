//! Kernel run time per program (BPF_ENABLE_STATS: `run_time_ns /
//! run_cnt`, only while the returned fd is held; the global
//! kernel.bpf_stats_enabled sysctl is never written).

use anyhow::Context;
use tier_benches::Summary;
use tier_profiler::sampler::ept::{EptProgram, EptPrograms, GfnRange, ProgramStatus, current_tid};

const RUNS: usize = 5;
const EVENTS: u64 = 20_000;
const PRESENT: u64 = 0x0000_0001_2345_6000 | (1 << 11) | 0x7;
const YOUNG: u64 = PRESENT | (1 << 8);

/// ns per run of each loaded program, exercised with BPF_PROG_TEST_RUN
/// (raw_tp programs cannot be timed by the kernel's repeat loop): an
/// ageing event of a page in a VM's range, owned by this thread.
pub fn exercise(p: &mut EptPrograms) -> anyhow::Result<Vec<(EptProgram, Summary)>> {
    p.set_vm(
        0,
        &[GfnRange {
            start_gfn: 0,
            end_gfn: 0x1000,
            tier: 0,
        }],
    )?;
    p.set_scan_owner(current_tid(), 0)?;
    let args = [0u64, 0x10, 1, YOUNG, PRESENT];
    let progs: Vec<EptProgram> = [EptProgram::Empty, EptProgram::SpteChanged]
        .into_iter()
        .filter(|&g| matches!(p.status(g), ProgramStatus::Loaded | ProgramStatus::Attached))
        .collect();
    let mut samples = vec![Vec::new(); progs.len()];
    for _ in 0..RUNS {
        for (i, &g) in progs.iter().enumerate() {
            let before = p.run_stats(g)?;
            for _ in 0..EVENTS {
                p.test_run(g, &args)?;
            }
            let after = p.run_stats(g)?;
            let n = after.run_cnt - before.run_cnt;
            anyhow::ensure!(n >= EVENTS, "{g}: {n} runs counted, expected {EVENTS}");
            samples[i].push((after.run_time_ns - before.run_time_ns) as f64 / n as f64);
        }
    }
    p.clear_scan_owner(current_tid())?;
    progs
        .into_iter()
        .zip(samples)
        .map(|(g, s)| Ok((g, Summary::of(&s).context("no samples")?)))
        .collect()
}

pub const EXERCISE_RUNS: usize = RUNS;
pub const EXERCISE_EVENTS: u64 = EVENTS;
