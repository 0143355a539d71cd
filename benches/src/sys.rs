//! Small host readings for benches: thread CPU time, load, output folder.

use std::path::PathBuf;

/// CPU time of the calling thread, in ns (CLOCK_THREAD_CPUTIME_ID), as
/// tierd's sampler budget reads it; 0 if the clock fails.
pub fn thread_cpu_ns() -> u64 {
    u64::try_from(tier_profiler::sampler::budget::thread_cpu().as_nanos()).unwrap_or(u64::MAX)
}

/// A thread's scheduler times, from `/proc/PID/task/TID/schedstat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedStat {
    /// Time spent running on a CPU, ns.
    pub run_ns: u64,
    /// Time spent runnable but waiting for a CPU (run queue), ns.
    pub wait_ns: u64,
}

/// Scheduler times of thread `tid` of `pid`; `None` if the thread is gone.
pub fn sched_stat(pid: u32, tid: i32) -> Option<SchedStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?;
    let mut f = text.split_whitespace().map(|v| v.parse::<u64>());
    Some(SchedStat {
        run_ns: f.next()?.ok()?,
        wait_ns: f.next()?.ok()?,
    })
}

/// The 1-minute load average, for judging how noisy a run was.
pub fn load_1min() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Online CPUs.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Where a bench writes its files: `$TIER_BENCH_OUT/<bench>` if set, else
/// `$CARGO_TARGET_DIR/bench/<bench>`, else `target/bench/<bench>` in the
/// workspace. Created if missing.
pub fn out_dir(bench: &str) -> std::io::Result<PathBuf> {
    let base = match (
        std::env::var_os("TIER_BENCH_OUT"),
        std::env::var_os("CARGO_TARGET_DIR"),
    ) {
        (Some(d), _) => PathBuf::from(d),
        (None, Some(t)) => PathBuf::from(t).join("bench"),
        (None, None) => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("target")
            .join("bench"),
    };
    let dir = base.join(bench);
    std::fs::create_dir_all(&dir)?;
    dir.canonicalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_cpu_grows_with_work_and_runtime_is_readable() {
        let a = thread_cpu_ns();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        assert!(thread_cpu_ns() > a, "{x}");
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        assert!(sched_stat(std::process::id(), tid).is_some_and(|s| s.run_ns > 0));
        assert_eq!(sched_stat(std::process::id(), -5), None);
        assert!(load_1min().is_some());
        assert!(cpus() >= 1);
    }
}
