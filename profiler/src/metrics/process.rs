//! The standard process series (`process_cpu_seconds_total`, memory, fds,
//! start time) read from /proc at each scrape, as every Prometheus client
//! library exports them, so a fleet's rules for agents apply to tierd too;
//! and `tierd_build_info`, which rules join on to find tierd's process.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Values of /proc/self at one instant.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Sample {
    pub cpu_seconds: f64,
    pub resident_bytes: f64,
    pub virtual_bytes: f64,
    pub start_time_seconds: f64,
    pub open_fds: f64,
    pub max_fds: f64,
}

/// Fields of /proc/PID/stat after the command (which may hold spaces and
/// parentheses, so it is cut at the last ')'), 0-based from field 3.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().collect())
}

/// From /proc/self/stat, /proc/stat's btime and the clock tick and page size.
pub(super) fn parse(stat: &str, btime: f64, tick: f64, page: f64) -> Option<Sample> {
    let f = stat_fields(stat)?;
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    // Fields 14 utime, 15 stime, 22 starttime, 23 vsize, 24 rss (man 5 proc),
    // here at index field - 3.
    Some(Sample {
        cpu_seconds: (num(11)? + num(12)?) / tick,
        start_time_seconds: btime + num(19)? / tick,
        virtual_bytes: num(20)?,
        resident_bytes: num(21)? * page,
        ..Sample::default()
    })
}

fn read() -> Option<Sample> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let btime = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf only reads configuration values.
    let (tick, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if tick <= 0 || page <= 0 {
        return None;
    }
    let mut s = parse(&stat, btime, tick as f64, page as f64)?;
    s.open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as f64;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        s.max_fds = lim.rlim_cur as f64;
    }
    Some(s)
}

#[derive(Debug)]
pub(super) struct Process;

impl Collector for Process {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        // Unreadable /proc (another OS, a sandbox): no series rather than zeros.
        let Some(s) = read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(s.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        for (name, help, v) in [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                s.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                s.virtual_bytes,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                s.start_time_seconds,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                s.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                s.max_fds,
            ),
        ] {
            let g = ConstGauge::new(v);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_command_with_spaces_and_parentheses_does_not_shift_the_fields() {
        // Fields from field 3 on; utime 250, stime 50 ticks, starttime 1000,
        // vsize 8192000, rss 300 pages.
        let rest = "S 1 1 1 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1000 8192000 300";
        let stat = format!("42 (tier d) (x)) {rest}");
        let s = parse(&stat, 1_700_000_000.0, 100.0, 4096.0).unwrap();
        assert_eq!(s.cpu_seconds, 3.0);
        assert_eq!(s.start_time_seconds, 1_700_000_010.0);
        assert_eq!(s.virtual_bytes, 8_192_000.0);
        assert_eq!(s.resident_bytes, 300.0 * 4096.0);
    }

    #[test]
    fn this_process_reads_as_running_now() {
        let s = read().unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(s.start_time_seconds <= now + 1.0 && s.start_time_seconds > now - 86400.0 * 365.0);
        assert!(s.resident_bytes > 0.0 && s.open_fds >= 3.0 && s.max_fds >= s.open_fds);
    }
}
