//! Per-vCPU guest-only memory-source events, as tierd's pmu source reads
//! them: counting mode with multiplexing, and sampling mode with a period.
//!
//! Modelled kernel behaviour (kernel/events/core.c):
//! - With more events than free hardware counters, the per-CPU hrtimer
//!   (`perf_mux_hrtimer_handler`, every `perf_event_mux_interval_ms`,
//!   default `PERF_CPU_HRTIMER` = 1000 / HZ ms: 4 ms at HZ=250) rotates
//!   the flexible events (`rotate_ctx`): round robin, `counters` of
//!   `events` at a time.
//! - Each event keeps `time_enabled` and `time_running`
//!   (`update_context_time`, `perf_event_update_time`); a `read()` returns
//!   count, enabled and running (`perf_read_one`,
//!   PERF_FORMAT_TOTAL_TIME_ENABLED|RUNNING), and tierd scales count x
//!   enabled / running (`sampler::pmu::counting::Tally::add`, run here).
//! - Sampling: an event with `sample_period` P raises an overflow
//!   interrupt (an NMI, and a guest exit when the guest is running) every
//!   P counted events (`__perf_event_overflow`); non-precise samples name
//!   only the event, so the tier is the event's, and the estimate is
//!   samples x P (scaled the same way).
//!
//! The events count what the memory tiers serve: LLC misses of the
//! guest, not every access.

use tier_profiler::sampler::pmu::loader::Reading;

#[derive(Debug, Clone, Copy)]
pub struct PmuConfig {
    /// Memory-source events opened per vCPU (two name our tiers).
    pub events: usize,
    /// Hardware counters free for them.
    pub counters: usize,
    pub slice_s: f64,
    /// Sampling period in (real) events.
    pub period: f64,
}

impl Default for PmuConfig {
    fn default() -> Self {
        PmuConfig {
            events: 4,
            counters: 2,
            slice_s: 0.004,
            period: 100_003.0,
        }
    }
}

/// The counters of one vCPU over one interval.
#[derive(Debug, Clone)]
pub struct Pmu {
    pub cfg: PmuConfig,
    /// Real events counted while running, per tier.
    counted: Vec<f64>,
    /// Events since the last overflow, and samples, per tier.
    pending: Vec<f64>,
    samples: Vec<u64>,
    pub samples_total: u64,
    start: f64,
}

impl Pmu {
    pub fn new(cfg: PmuConfig, tiers: usize, start: f64) -> Pmu {
        Pmu {
            cfg,
            counted: vec![0.0; tiers],
            pending: vec![0.0; tiers],
            samples: vec![0; tiers],
            samples_total: 0,
            start,
        }
    }

    /// Whether event `e` is on a counter in rotation slice `k`.
    fn running_in(&self, e: usize, k: usize) -> bool {
        let c = &self.cfg;
        c.counters >= c.events
            || (e + c.events - (k * c.counters) % c.events) % c.events < c.counters
    }

    /// Whether event `e` is on a counter at `now`.
    pub fn running(&self, e: usize, now: f64) -> bool {
        self.running_in(e, (now / self.cfg.slice_s).floor().max(0.0) as usize)
    }

    /// `weight` real LLC misses served by tier `tier` (event `tier`) at `now`.
    pub fn miss(&mut self, tier: usize, now: f64, weight: f64) {
        if !self.running(tier, now) {
            return;
        }
        self.counted[tier] += weight;
        let p = &mut self.pending[tier];
        *p += weight;
        while *p >= self.cfg.period {
            *p -= self.cfg.period;
            self.samples[tier] += 1;
            self.samples_total += 1;
        }
    }

    /// Enabled and running ns of event `e` over `[from, to)`.
    fn times(&self, e: usize, from: f64, to: f64) -> (u64, u64) {
        let s = self.cfg.slice_s;
        let (k0, k1) = ((from / s).floor() as usize, (to / s).ceil() as usize);
        let running: f64 = (k0..k1)
            .filter(|&k| self.running_in(e, k))
            .map(|k| (to.min((k + 1) as f64 * s) - from.max(k as f64 * s)).max(0.0))
            .sum();
        (
            ((to - from) * 1e9).round() as u64,
            (running * 1e9).round() as u64,
        )
    }

    /// Reads and restarts: per tier the counting reading and the sampling
    /// one (samples x period), as `read()` would give them.
    pub fn read(&mut self, now: f64) -> (Vec<Reading>, Vec<Reading>) {
        let mut count = Vec::new();
        let mut sample = Vec::new();
        for t in 0..self.counted.len() {
            let (enabled_ns, running_ns) = self.times(t, self.start, now);
            count.push(Reading {
                count: self.counted[t].round() as u64,
                enabled_ns,
                running_ns,
            });
            sample.push(Reading {
                count: (self.samples[t] as f64 * self.cfg.period) as u64,
                enabled_ns,
                running_ns,
            });
            self.counted[t] = 0.0;
            self.samples[t] = 0;
        }
        self.start = now;
        (count, sample)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tier_profiler::sampler::pmu::counting::Tally;

    #[test]
    fn multiplexing_runs_each_event_its_share_and_scaling_restores_counts() {
        let cfg = PmuConfig {
            events: 4,
            counters: 2,
            slice_s: 0.004,
            period: 1000.0,
        };
        let mut pmu = Pmu::new(cfg, 2, 0.0);
        // 1 M misses/s to tier 0, 250 k/s to tier 1, evenly over 1 s.
        for i in 0..1_250_000u32 {
            let now = f64::from(i) / 1_250_000.0;
            pmu.miss(usize::from(i % 5 == 4), now, 1.0);
        }
        let (count, sample) = pmu.read(1.0);
        for (t, truth) in [(0, 1_000_000.0), (1, 250_000.0)] {
            let r = count[t];
            assert_eq!(r.enabled_ns, 1_000_000_000);
            let share = r.running_ns as f64 / r.enabled_ns as f64;
            assert!((share - 0.5).abs() < 0.01, "{share}");
            // Raw counts are about half; tierd's scaling restores them.
            let mut tally = Tally::default();
            tally.add(r);
            assert!(
                (tally.scaled / truth - 1.0).abs() < 0.01,
                "{}",
                tally.scaled
            );
            let mut ts = Tally::default();
            ts.add(sample[t]);
            assert!((ts.scaled / truth - 1.0).abs() < 0.02, "{}", ts.scaled);
        }
        assert_eq!(pmu.samples_total, 625);
    }

    #[test]
    fn enough_counters_never_multiplex() {
        let mut pmu = Pmu::new(
            PmuConfig {
                counters: 4,
                ..Default::default()
            },
            2,
            0.0,
        );
        pmu.miss(1, 0.5, 3.0);
        let (c, _) = pmu.read(1.0);
        assert_eq!((c[1].count, c[1].running_ns), (3, 1_000_000_000));
    }
}
