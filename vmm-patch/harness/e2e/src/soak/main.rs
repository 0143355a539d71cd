//! `tier-soak` (docs/soak.md): the closed loop of `tier-e2e` under faults from
//! a seeded schedule (`schedule`), with invariants checked every interval
//! from outside tierd (`checks`), what tierd's streams showed (`watch`),
//! and a table of faults injected, survived and recovered from (p50/p95
//! intervals). `cargo xtask soak` builds everything and runs it.

mod checks;
mod faults;
mod schedule;
mod watch;
mod world;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;

use crate::faults::{Fault, Phase};
use crate::schedule::{ALL, Kind};
use crate::world::{Paths, Plan, World};

#[derive(Debug, Parser)]
#[command(
    about = "Chaos soak: test guests, patched cloud-hypervisor, tier-balloon, tierd and its controller under faults"
)]
struct Args {
    #[arg(long)]
    ch_bin: PathBuf,
    #[arg(long)]
    tierd: PathBuf,
    /// The tier-balloon binary (VM b's vhost-user balloon backend).
    #[arg(long)]
    balloon: PathBuf,
    /// The test guest ELF (default: the one this build compiled).
    #[arg(long)]
    guest: Option<PathBuf>,
    /// Keep sockets, logs and the policy file here (default: a temporary
    /// directory, removed at the end).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Length of the run.
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// Seed of the fault schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Only these faults (comma-separated: kill-tierd, kill-backend,
    /// stop-vmm, kill-vm, control-flood, tierd-flood, stalled-watcher).
    #[arg(long, value_delimiter = ',', value_parser = Kind::parse)]
    faults: Vec<Kind>,
}

/// A fault not recovered within this many intervals has not survived.
const RECOVERY_LIMIT: u32 = 20;

fn main() -> ExitCode {
    tier_e2e::run::exit("tier-soak", "soak", run())
}

fn run() -> anyhow::Result<bool> {
    let args = Args::parse();
    tier_e2e::run::require_files(&[
        ("--ch-bin", args.ch_bin.as_path()),
        ("--tierd", args.tierd.as_path()),
        ("--balloon", args.balloon.as_path()),
    ])?;
    let (work, _tmp) = tier_e2e::run::work_dir(args.work_dir.as_deref())?;
    let paths = Paths {
        ch_bin: args.ch_bin.clone(),
        tierd: args.tierd.clone(),
        balloon: args.balloon.clone(),
        guest: args
            .guest
            .clone()
            .unwrap_or_else(|| tier_testguest::elf_path().to_path_buf()),
        work,
    };
    let run_s = args.minutes * 60.0;
    let (warmup, gap) = if run_s < 300.0 {
        (15.0, (9.0, 12.0))
    } else {
        (20.0, (12.0, 25.0))
    };
    let kinds = if args.faults.is_empty() {
        ALL.to_vec()
    } else {
        args.faults.clone()
    };
    let plan = Plan {
        dram_mib: 32,
        slow_mib: 64,
        initial_dram_balloon_mib: 8,
        interval_ms: 1000,
        guest_extra: schedule::guest_windows(args.seed, &kinds, run_s, warmup),
    };
    let planned = schedule::plan(args.seed, &kinds, run_s, warmup, 10.0, gap);
    println!(
        "soak: {:.0} s, seed {}, {} faults planned, work dir {}",
        run_s,
        args.seed,
        planned.len(),
        paths.work.display()
    );
    let rt = tokio::runtime::Runtime::new().context("tokio runtime")?;
    rt.block_on(soak(paths, plan, planned, run_s))
}

async fn soak(
    paths: Paths,
    plan: Plan,
    planned: Vec<schedule::Planned>,
    run_s: f64,
) -> anyhow::Result<bool> {
    let tick = Duration::from_millis(plan.interval_ms);
    let mut w = World::start(paths, plan).await?;
    let log = watch::spawn(w.tierd.socket().to_path_buf());
    let mut checker = checks::Checker::default();
    let mut faults: Vec<Fault> = Vec::new();
    let mut steady = Vec::new();
    let mut next = 0;
    let start = Instant::now();
    // Past the run's length only to let open faults recover (or not).
    let open = |faults: &[Fault]| faults.iter().any(|f| !matches!(f.phase, Phase::Done));
    let overtime = run_s + f64::from(RECOVERY_LIMIT + 10) * tick.as_secs_f64();
    while start.elapsed().as_secs_f64() < run_s
        || (open(&faults) && start.elapsed().as_secs_f64() < overtime)
    {
        let t0 = Instant::now();
        let now_s = start.elapsed().as_secs_f64();
        // A VMM that exits on its own is a VM lost to a fault.
        // It is booted again, so the faults after it still have two VMs.
        for i in 0..2 {
            if let Some(st) = w.vms[i].as_mut().and_then(|v| v.exited()) {
                let x = format!(
                    "VM {}'s VMM exited by itself ({st}); see its log",
                    ["a", "b"][i]
                );
                println!("{now_s:>6.1} s VIOLATION {x}");
                steady.push(x);
                w.vms[i] = None;
                if let Err(e) = w.reboot_vm(i).await {
                    steady.push(format!("VM {} did not boot again: {e:#}", ["a", "b"][i]));
                }
            }
        }
        track_guest_windows(&w, &mut faults, now_s);
        // Inject what is due, one fault at a time.
        let busy = faults
            .iter()
            .any(|f| f.plan.kind.injected() && matches!(f.phase, Phase::Holding { .. }));
        if !busy && next < planned.len() && planned[next].at_s <= now_s && now_s < run_s {
            let p = planned[next];
            next += 1;
            let on = if p.kind.per_vm() {
                format!(" (vm {})", ["a", "b"][p.vm])
            } else {
                String::new()
            };
            println!("{now_s:>6.1} s inject {}{on}", p.kind.name());
            faults.push(faults::inject(p, &mut w).await);
        }
        // Advance every fault.
        let pids = [
            w.vms[0].as_ref().map(|v| v.pid()),
            w.vms[1].as_ref().map(|v| v.pid()),
        ];
        let mut excluded = [false, false];
        for f in &mut faults {
            match f.phase {
                Phase::Holding { until } => {
                    if matches!(f.plan.kind, Kind::StopVmm | Kind::KillVmMidMove) {
                        excluded[f.plan.vm] = true;
                    }
                    faults::during(f, &w, &log, tick).await;
                    if Instant::now() >= until {
                        faults::undo(f, &mut w).await;
                        f.phase = Phase::Recovering {
                            since: Instant::now(),
                        };
                    }
                }
                Phase::Recovering { since } => {
                    if let Some(at) = faults::recovered(f, &w, &log, &pids).await {
                        let n =
                            at.saturating_duration_since(since).as_secs_f64() / tick.as_secs_f64();
                        f.recovery = Some(n.ceil().max(1.0) as u32);
                        f.phase = Phase::Done;
                        // A restarted tierd has its VMs back, ready to
                        // decide, within 2 intervals (docs/soak.md).
                        if f.plan.kind == Kind::KillTierd && n > 2.0 {
                            f.violations
                                .push(format!("tierd took {n:.1} intervals to have both VMs back"));
                        }
                        println!(
                            "{:>6.1} s recovered from {} in {} intervals {}",
                            start.elapsed().as_secs_f64(),
                            f.plan.kind.name(),
                            n.ceil().max(1.0),
                            f.note
                        );
                    } else if since.elapsed() > tick * RECOVERY_LIMIT {
                        f.phase = Phase::Done;
                        f.violations
                            .push(format!("not recovered within {RECOVERY_LIMIT} intervals"));
                    }
                }
                Phase::Done => {}
            }
        }
        let v = checker.tick(&w, &excluded).await;
        for x in v {
            println!("{:>6.1} s VIOLATION {x}", start.elapsed().as_secs_f64());
            steady.push(x);
        }
        if let Some(rest) = tick.checked_sub(t0.elapsed()) {
            tokio::time::sleep(rest).await;
        }
    }
    // Faults still open at the end get their chance to finish.
    for f in &mut faults {
        if let Phase::Holding { .. } = f.phase {
            faults::undo(f, &mut w).await;
        }
    }
    w.stop();
    Ok(report(&faults, &steady, &checker, &log))
}

/// The guests' own windows (`tg deaf on/off`, `tg lie on/off` on their
/// serial logs): a fault when one opens, recovering when it has closed.
fn track_guest_windows(w: &World, faults: &mut Vec<Fault>, now_s: f64) {
    for (i, vm) in w.vms.iter().enumerate() {
        let Some(vm) = vm else { continue };
        let lines = vm.lines();
        for (kind, word) in [(Kind::GuestDeaf, "deaf"), (Kind::GuestLies, "lie")] {
            let edges = |edge: &str| {
                lines
                    .iter()
                    .filter(|l| l.kind == word && l.words.first().is_some_and(|x| x == edge))
                    .count()
            };
            let (on, off) = (edges("on"), edges("off"));
            let seen = faults
                .iter()
                .filter(|f| f.plan.kind == kind && f.plan.vm == i)
                .count();
            if on > seen {
                println!(
                    "{now_s:>6.1} s guest {} window opens ({})",
                    ["a", "b"][i],
                    kind.name()
                );
                faults.push(faults::observed(schedule::Planned {
                    at_s: now_s,
                    kind,
                    vm: i,
                }));
            }
            for f in faults
                .iter_mut()
                .filter(|f| f.plan.kind == kind && f.plan.vm == i)
            {
                if !matches!(f.phase, Phase::Holding { .. }) {
                    continue;
                }
                // The window is 10 s; a guest rebooted or held up may
                // never print its end: 20 s after the start it is over.
                let late = f.injected.elapsed() > Duration::from_secs(20);
                if off >= seen.max(1) || late {
                    if late && off < seen.max(1) {
                        f.note = "the guest's end-of-window line was not seen".into();
                    }
                    f.phase = Phase::Recovering {
                        since: Instant::now(),
                    };
                }
            }
        }
    }
}

fn report(
    faults: &[Fault],
    steady: &[String],
    checker: &checks::Checker,
    log: &watch::Shared,
) -> bool {
    println!();
    println!(
        "{:<24} {:>8} {:>8} {:>6} {:>6} {:>6}  notes",
        "fault", "injected", "survived", "p50", "p95", "max"
    );
    let mut all_rec = Vec::new();
    let mut violations = steady.len();
    let mut survived_total = 0;
    for kind in ALL {
        let of: Vec<&Fault> = faults.iter().filter(|f| f.plan.kind == kind).collect();
        if of.is_empty() {
            println!("{:<24} {:>8}", kind.name(), 0);
            continue;
        }
        let survived: Vec<&&Fault> = of
            .iter()
            .filter(|f| f.violations.is_empty() && f.recovery.is_some())
            .collect();
        survived_total += survived.len();
        let mut rec: Vec<u32> = of.iter().filter_map(|f| f.recovery).collect();
        rec.sort_unstable();
        all_rec.extend(rec.iter().copied());
        let q = |p: f64| {
            rec.get(((rec.len() as f64 - 1.0) * p).round() as usize)
                .map_or_else(|| "-".into(), u32::to_string)
        };
        let notes: Vec<String> = of
            .iter()
            .flat_map(|f| {
                let mut n: Vec<String> = f
                    .violations
                    .iter()
                    .map(|v| format!("VIOLATION {v}"))
                    .collect();
                if !f.note.is_empty() {
                    n.push(f.note.clone());
                }
                n
            })
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        violations += of.iter().map(|f| f.violations.len()).sum::<usize>();
        println!(
            "{:<24} {:>8} {:>8} {:>6} {:>6} {:>6}  {}",
            kind.name(),
            of.len(),
            survived.len(),
            q(0.5),
            q(0.95),
            rec.last().map_or_else(|| "-".into(), u32::to_string),
            notes.join("; ")
        );
    }
    println!(
        "(recovery in tierd intervals from the fault's undo: kill -9 tierd = both VMs back in its stream with balloon state and the policy in force; others = the VM back in the stream / the device reconnected or reported)"
    );
    println!();
    let mut grew = 0;
    for (what, detail, bad) in checker.growth() {
        println!("{} {what}: {detail}", if bad { "GREW" } else { "flat" });
        grew += usize::from(bad);
    }
    violations += grew;
    let l = watch::lock(log);
    for x in &l.wrong {
        println!("VIOLATION watcher saw {x}");
    }
    violations += l.wrong.len();
    println!(
        "checks: {} intervals, budget not checkable in {} (a VM stopped or rebooting), canary {}; watcher: {} connections, {} updates",
        checker.ticks_checked,
        checker.budget_skipped,
        if checker.canary_seen {
            "checked"
        } else {
            "not reported by this guest"
        },
        l.connections,
        l.seen.len()
    );
    all_rec.sort_unstable();
    let p95 = all_rec
        .get(((all_rec.len() as f64 - 1.0) * 0.95).round() as usize)
        .copied();
    println!(
        "RESULT faults={} survived={} violations={} recovery_p95_intervals={}",
        faults.len(),
        survived_total,
        violations,
        p95.map_or_else(|| "none".into(), |p| p.to_string())
    );
    violations == 0 && survived_total == faults.len()
}
