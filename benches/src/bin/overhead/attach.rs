//! The samplers a run can have attached: hostpte passes in their own
//! thread (as `tierd run` does them), or the EPT BPF programs attached to
//! their hooks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use tier_benches::sys::thread_cpu_ns;
use tier_profiler::aggregate::Aggregator;
use tier_profiler::estimate::pass_lengths;
use tier_profiler::registry::{Registry, TrackedVm};
use tier_profiler::sampler::Sampler;
use tier_profiler::sampler::ept::{EptOptions, EptProgram, EptPrograms, ProgramStatus};
use tier_profiler::sampler::hostpte::HostPte;

/// What the hostpte thread did while it ran.
#[derive(Debug, Clone, Copy, Default)]
pub struct PassStats {
    pub passes: u64,
    /// CPU time of the sampling thread (smaps walks, re-arms, aggregation).
    pub cpu_ns: u64,
    /// Wall time inside the passes.
    pub wall_ns: u64,
    /// Guest memory covered by the passes, in bytes.
    pub scanned_bytes: u64,
}

impl PassStats {
    pub fn add(&mut self, o: PassStats) {
        self.passes += o.passes;
        self.cpu_ns += o.cpu_ns;
        self.wall_ns += o.wall_ns;
        self.scanned_bytes += o.scanned_bytes;
    }

    /// CPU ms per GiB covered.
    pub fn cpu_ms_per_gib(&self) -> f64 {
        self.cpu_ns as f64 / 1e6 / (self.scanned_bytes as f64 / (1u64 << 30) as f64).max(1e-12)
    }
}

/// hostpte passes on tierd's schedule (`pass_lengths`: short and long
/// alternate) until stopped.
pub struct HostpteThread {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<anyhow::Result<PassStats>>,
}

impl HostpteThread {
    pub fn start(
        tracked: Box<dyn TrackedVm>,
        interval: Duration,
        passes: u32,
    ) -> anyhow::Result<HostpteThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("hostpte-passes".into())
            .spawn(move || passes_until(&flag, tracked, interval, passes))
            .context("spawning the sampling thread")?;
        Ok(HostpteThread { stop, handle })
    }

    pub fn stop(self) -> anyhow::Result<PassStats> {
        self.stop.store(true, Ordering::Release);
        self.handle
            .join()
            .map_err(|_| anyhow::anyhow!("sampling thread panicked"))?
    }
}

fn passes_until(
    stop: &AtomicBool,
    tracked: Box<dyn TrackedVm>,
    interval: Duration,
    passes: u32,
) -> anyhow::Result<PassStats> {
    let bytes_per_pass: u64 = tracked.vm().tiers.iter().map(|t| t.size_bytes).sum();
    let mut reg = Registry::default();
    reg.insert(tracked);
    let mut agg = Aggregator::default();
    let mut sampler = HostPte::new();
    let lens = pass_lengths(interval, passes);
    let interval_ns = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX);
    let cpu0 = thread_cpu_ns();
    let mut stats = PassStats::default();
    let mut next = Instant::now();
    let mut k = 0u32;
    while !stop.load(Ordering::Acquire) {
        // A late pass delays the next ones instead of bunching them (tokio's
        // MissedTickBehavior::Delay, as in tierd's loop).
        let pass_len = lens.get(k as usize % lens.len().max(1)).copied();
        next = (next + pass_len.unwrap_or(interval)).max(Instant::now());
        // Sleep in short steps so a stop is seen quickly.
        while Instant::now() < next && !stop.load(Ordering::Acquire) {
            std::thread::sleep((next - Instant::now()).min(Duration::from_millis(20)));
        }
        if stop.load(Ordering::Acquire) {
            break;
        }
        let t = Instant::now();
        k += 1;
        let s = Some(&mut sampler as &mut dyn Sampler);
        if k.is_multiple_of(passes) {
            let u = agg.tick(&mut reg, s, interval_ns);
            if let Some(h) = u.health.first().filter(|h| !h.error.is_empty()) {
                anyhow::bail!("hostpte: {}", h.error);
            }
        } else {
            agg.pass(&mut reg, s);
        }
        stats.wall_ns += u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        stats.passes += 1;
        stats.scanned_bytes += bytes_per_pass;
    }
    stats.cpu_ns = thread_cpu_ns() - cpu0;
    Ok(stats)
}

/// Loads `bpf/ept.bpf.c` (all programs, the empty baseline too) and
/// attaches what this kernel allows; returns the object and one line per
/// program.
pub fn load_ept() -> anyhow::Result<(EptPrograms, Vec<String>)> {
    let p = EptPrograms::load(&EptOptions {
        tracepoint: true,
        fexit: true,
        empty_baseline: true,
        attach: true,
        ..EptOptions::default()
    })
    .context("loading ept.bpf.o (needs root)")?;
    let lines = p
        .statuses()
        .into_iter()
        .map(|(prog, st)| match st {
            ProgramStatus::Failed(e) => format!("{prog}: refused: {e}"),
            other => format!("{prog}: {other:?}"),
        })
        .collect();
    Ok((p, lines))
}

/// True when the tracepoint program is attached (the only EPT program
/// that can run here).
pub fn ept_attached(p: &EptPrograms) -> bool {
    p.status(EptProgram::SpteChanged) == &ProgramStatus::Attached
}
