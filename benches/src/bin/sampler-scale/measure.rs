//! One sampler over one stand-in guest: CPU per interval (thread CPU time
//! of the passes, budget bookkeeping included) and the sampler's peak RSS.
//! Passes run back to back; intervals are counted in pass slots as tierd's
//! schedule has them (`passes_per_interval` slots each), which is all the
//! budget knows of time.

use std::collections::HashSet;
use std::fs::File;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use tier_benches::sys::thread_cpu_ns;
use tier_profiler::sampler::Sampler;
use tier_profiler::sampler::budget::{self, Budget, Report, UnitSpec};
use tier_profiler::sampler::folio::PageFlags;
use tier_profiler::sampler::hostpte::HostPte;
use tier_profiler::sampler::page_idle::{self, Bitmap};
use tier_proto::v1::{GpaRange, Tier, Vm};

use crate::guest::{Guest, status_kib};

pub const INTERVAL: Duration = Duration::from_secs(1);
pub const PASSES: u32 = 5;
const PAGE: u64 = 4096;

/// What one case measured.
#[derive(Debug, Clone)]
pub struct Cost {
    /// CPU ms per interval, one value per run.
    pub ms: Vec<f64>,
    /// Peak RSS of this process over the case, KiB.
    pub peak_rss_kib: u64,
    /// The budget's report of the last sampled interval (budget on).
    pub last: Option<Report>,
}

/// The guest as tierd would list it: two tiers, halves of its memory.
pub fn vm_of(g: &Guest) -> Vm {
    let half = (g.len / 2) / PAGE * PAGE;
    let tier = |name: &str, gpa: u64, hva: u64, len: u64| Tier {
        name: name.into(),
        size_bytes: len,
        ranges: vec![GpaRange {
            gpa_start: gpa,
            length: len,
            hva_start: hva,
        }],
        ..Default::default()
    };
    Vm {
        id: "bench".into(),
        vmm_pid: g.pid(),
        tiers: vec![
            tier("dram", 0, g.base, half),
            tier("slow", half, g.base + half, g.len - half),
        ],
        ..Default::default()
    }
}

/// Resets this process's peak RSS (VmHWM) so the next read is this case's.
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn peak_kib() -> u64 {
    status_kib(std::process::id(), "VmHWM:")
}

/// How a case runs: `runs` runs of `intervals` intervals each.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub runs: usize,
    pub intervals: usize,
    /// % of one core; None: no budget.
    pub budget_pct: Option<f64>,
}

fn budget_of(plan: Plan) -> Budget {
    match plan.budget_pct {
        Some(p) => Budget::new(p, INTERVAL, PASSES, 1),
        None => Budget::unlimited(1),
    }
}

/// Sampled intervals a budget-on run spans at least: its CPU is averaged
/// over whole cycles (a sampled interval and the skipped ones paying it
/// back), or a run would end in debt or in credit.
const CYCLES: usize = 2;
/// A budget-on case stops after this many intervals even short of its runs.
const MAX_INTERVALS: usize = 100_000;

/// Runs `pass` `PASSES` times per interval and returns CPU ms per interval
/// per run, plus the last sampled interval's report. Budget off: a run is
/// one interval. Budget on: a run starts at a sampled interval and spans
/// at least CYCLES sampled intervals with their skipped ones and
/// `plan.intervals` intervals, ending where the next sampled one starts.
fn drive(
    plan: Plan,
    mut pass: impl FnMut() -> anyhow::Result<()>,
    mut report: impl FnMut() -> Report,
) -> anyhow::Result<Cost> {
    reset_peak();
    let mut interval = || -> anyhow::Result<(f64, Report)> {
        let t0 = thread_cpu_ns();
        for _ in 0..PASSES {
            pass()?;
        }
        let r = report();
        Ok((thread_cpu_ns().saturating_sub(t0) as f64 / 1e6, r))
    };
    // One interval first: arming passes and the budget's probe.
    interval()?;
    let mut ms = Vec::new();
    let mut last = None;
    if plan.budget_pct.is_none() {
        for _ in 0..plan.runs {
            ms.push(interval()?.0);
        }
    } else {
        let (mut cpu, mut n, mut cycles) = (0.0, 0usize, 0usize);
        for _ in 0..MAX_INTERVALS {
            let (dt, r) = interval()?;
            let sampled = r.vms.first().is_some_and(|v| v.passes > 0);
            if sampled && cycles >= CYCLES && n >= plan.intervals {
                ms.push(cpu / n as f64);
                (cpu, n, cycles) = (0.0, 0, 0);
                if ms.len() == plan.runs {
                    break;
                }
            }
            if sampled {
                cycles += 1;
                last = Some(r);
            }
            // A run starts at a sampled interval.
            if cycles > 0 {
                cpu += dt;
                n += 1;
            }
        }
        anyhow::ensure!(
            !ms.is_empty(),
            "no whole budget cycle in {MAX_INTERVALS} intervals"
        );
    }
    Ok(Cost {
        ms,
        peak_rss_kib: peak_kib(),
        last,
    })
}

/// hostpte as tierd runs it (smaps walk and clear_refs of the guest).
pub fn hostpte(g: &Guest, plan: Plan) -> anyhow::Result<Cost> {
    let vm = vm_of(g);
    let mut s = HostPte::with_budget(budget_of(plan));
    let s = std::cell::RefCell::new(&mut s);
    drive(
        plan,
        || {
            let mut s = s.borrow_mut();
            match s.sample(&[&vm]).pop() {
                Some(Err(e)) => Err(anyhow::anyhow!("hostpte: {e}")),
                _ => Ok(()),
            }
        },
        || {
            s.borrow_mut()
                .budget()
                .map(|b| b.take_report())
                .unwrap_or_default()
        },
    )
}

/// The EPT driver's user-space part as `EptAgeing` runs it with page_idle:
/// pagemap and kpageflags reads of the sample, then bitmap writes, here to
/// a stand-in file (`bitmap`) where the kernel has no page_idle.
pub fn ept_user(g: &Guest, plan: Plan, bitmap: &Path) -> anyhow::Result<Cost> {
    let vm = vm_of(g);
    let pagemap = File::open(format!("/proc/{}/pagemap", g.pid())).context("pagemap")?;
    let flags = PageFlags::open().context("kpageflags (needs root)")?;
    let bitmap = Bitmap::stand_in(bitmap).context("bitmap stand-in")?;
    let budget = std::cell::RefCell::new(budget_of(plan));
    let spec = UnitSpec {
        key: vm.id.clone(),
        vms: vec![vm.id.clone()],
        pages: vm.tiers.iter().map(|t| t.size_bytes / PAGE).sum(),
        scalable: true,
    };
    drive(
        plan,
        || {
            let d = budget.borrow_mut().begin_pass(std::slice::from_ref(&spec));
            let Some(d) = d.first().copied().filter(|d| d.run) else {
                return Ok(());
            };
            let cpu = budget::thread_cpu();
            let mut seen = HashSet::new();
            let mut heads = Vec::new();
            let mut grid = 0;
            for t in &vm.tiers {
                for r in &t.ranges {
                    let s = page_idle::sample_range(
                        &pagemap,
                        &flags,
                        r.hva_start,
                        r.length,
                        d.stride,
                        &mut seen,
                    )?;
                    heads.extend(s.heads);
                    grid += budget::grid(r.length / PAGE, d.stride);
                }
            }
            bitmap.mark_idle(&page_idle::words(heads))?;
            let spent = budget::thread_cpu().saturating_sub(cpu);
            budget.borrow_mut().spent(&spec.key, spent, grid);
            Ok(())
        },
        || budget.borrow_mut().take_report(),
    )
}
