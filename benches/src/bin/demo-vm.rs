//! How fast the demo VM's guest runs on this host's KVM: rounds/s and
//! accesses/s with the default phase, against an idle phase (no work pages:
//! the KVM exit + re-entry cost per round) in the same run. Sizes test
//! guests for emulating KVMs such as kvm_pvm.

use std::time::{Duration, Instant};

use anyhow::Context;
use tier_benches::progress::Progress;
use tier_benches::{Row, Summary, print_table, result_line};
use tier_profiler::demo_vm::{DemoVm, DemoVmConfig, Phase};

const RUNS: usize = 5;
const RUN_TIME: Duration = Duration::from_millis(600);

/// Seconds per round and accesses per second over one run of `phase`.
fn run(vm: &DemoVm, phase: Phase) -> anyhow::Result<(f64, f64)> {
    vm.set_phase(phase).context("set_phase")?;
    // Let the phase take effect at a round boundary.
    std::thread::sleep(Duration::from_millis(50));
    let a = vm.counters();
    let t = Instant::now();
    std::thread::sleep(RUN_TIME);
    let b = vm.counters();
    let secs = t.elapsed().as_secs_f64();
    let rounds = (b.rounds - a.rounds).max(1) as f64;
    let accesses = (b.accesses[0] + b.accesses[1] - a.accesses[0] - a.accesses[1]) as f64;
    Ok((secs / rounds, accesses / secs))
}

fn main() -> anyhow::Result<()> {
    let vm =
        DemoVm::start(DemoVmConfig::default()).context("starting the demo VM (needs /dev/kvm)")?;
    let work = DemoVmConfig::default().phase;
    let idle = Phase {
        dram_pages: 0,
        dram_repeat: 0,
        slow_pages: 0,
        slow_repeat: 0,
    };
    let (mut work_round, mut idle_round, mut rate) = (Vec::new(), Vec::new(), Vec::new());
    let progress = Progress::bar("demo-vm", 2 * RUNS as u64);
    for n in 1..=RUNS {
        // Interleaved so drift on a noisy machine hits both alike.
        let (r, a) = progress.step(format!("run {n}/{RUNS}: work"), || run(&vm, work))?;
        work_round.push(r * 1e6);
        rate.push(a);
        idle_round.push(
            progress
                .step(format!("run {n}/{RUNS}: idle"), || run(&vm, idle))?
                .0
                * 1e6,
        );
    }
    progress.finish();
    vm.stop().context("stopping the demo VM")?;
    let s = |v: &[f64]| Summary::of(v).context("empty sample");
    let (w, i, r) = (s(&work_round)?, s(&idle_round)?, s(&rate)?);
    let per_round = work.dram_pages * work.dram_repeat + work.slow_pages * work.slow_repeat;
    print_table(
        &format!(
            "demo VM on this KVM, {RUNS} runs of {RUN_TIME:?} (phase {work:?}: {per_round} accesses/round)"
        ),
        &[
            Row {
                name: "idle round (exit+entry), baseline".into(),
                unit: "us",
                summary: i,
                ratio: Some(1.0),
            },
            Row {
                name: "work round".into(),
                unit: "us",
                summary: w,
                ratio: Some(w.median / i.median),
            },
            Row {
                name: "guest accesses".into(),
                unit: "1/s",
                summary: r,
                ratio: None,
            },
        ],
    );
    println!(
        "{}",
        result_line(&[
            ("accesses_per_s", format!("{:.0}", r.median)),
            ("round_us", format!("{:.1}", w.median)),
            ("exit_us", format!("{:.1}", i.median)),
            ("round_vs_exit", format!("{:.1}", w.median / i.median)),
        ])
    );
    Ok(())
}
