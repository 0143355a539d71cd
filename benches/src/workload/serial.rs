//! The test guest's exact per-tier counts from its serial log, timestamped
//! on the host as the lines arrive: a thread reads the file cloud-hypervisor
//! writes every [`POLL`], and the truth at an instant is interpolated
//! between the last line before it and the first line after it.

use std::fs::File;
use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use tier_testguest::serial::Line;

use super::guest_plan::WORK;

/// How often the log is read: bounds how late a line is timestamped.
pub const POLL: Duration = Duration::from_millis(2);

/// One guest line with the host's time of arrival.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Instant,
    pub wall: SystemTime,
    pub line: Line,
}

impl Seen {
    /// Cumulative accesses [dram, slow] if the line carries them (`acc=`,
    /// one count per zone; the work zones are [`WORK`]).
    pub fn acc(&self) -> Option<[u64; 2]> {
        let acc = self.line.list("acc")?;
        Some([*acc.get(WORK[0])?, *acc.get(WORK[1])?])
    }
}

/// Counts [dram, slow] at `at`, linear between the last line with counts
/// at or before `at` and the first one after it; `None` until a line after
/// `at` has arrived (or none came before it).
pub fn interpolate(lines: &[Seen], at: Instant) -> Option<[u64; 2]> {
    let points: Vec<(Instant, [u64; 2])> = lines
        .iter()
        .filter_map(|s| Some((s.at, s.acc()?)))
        .collect();
    let after = points.iter().position(|(t, _)| *t > at)?;
    let (t1, a1) = points[after];
    let (t0, a0) = *points[..after].last()?;
    let span = (t1 - t0).as_secs_f64();
    let f = if span > 0.0 {
        (at - t0).as_secs_f64() / span
    } else {
        1.0
    };
    let mut out = [0u64; 2];
    for i in 0..2 {
        let step = a1[i].saturating_sub(a0[i]) as f64;
        out[i] = a0[i] + (step * f).round() as u64;
    }
    Some(out)
}

/// Follows one serial log until dropped.
#[derive(Debug)]
pub struct Follower {
    lines: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Follower {
    /// Starts reading `path` (it may not exist yet).
    pub fn start(path: PathBuf) -> Follower {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s) = (Arc::clone(&lines), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("serial-follow".into())
            .spawn(move || follow(&path, &l, &s))
            .ok();
        Follower {
            lines,
            stop,
            thread,
        }
    }

    /// Every guest line so far.
    pub fn lines(&self) -> Vec<Seen> {
        self.lines.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// The first line for which `pred` holds, if it came.
    pub fn find(&self, pred: impl Fn(&Seen) -> bool) -> Option<Seen> {
        let l = self.lines.lock().ok()?;
        l.iter().find(|s| pred(s)).cloned()
    }

    /// Counts at `at` once known (see [`interpolate`]).
    pub fn truth_at(&self, at: Instant) -> Option<[u64; 2]> {
        let l = self.lines.lock().ok()?;
        interpolate(&l, at)
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn follow(path: &std::path::Path, lines: &Mutex<Vec<Seen>>, stop: &AtomicBool) {
    let mut file: Option<File> = None;
    let mut pending = Vec::new();
    let mut buf = [0u8; 16384];
    while !stop.load(Ordering::Acquire) {
        if file.is_none() {
            file = File::open(path).ok();
        }
        let mut got = false;
        if let Some(f) = file.as_mut() {
            while let Ok(n) = f.read(&mut buf) {
                if n == 0 {
                    break;
                }
                pending.extend_from_slice(&buf[..n]);
                got = true;
            }
        }
        if got {
            let (at, wall) = (Instant::now(), SystemTime::now());
            let mut fresh = Vec::new();
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let raw: Vec<u8> = pending.drain(..=end).collect();
                if let Some(line) = Line::parse(&String::from_utf8_lossy(&raw)) {
                    fresh.push(Seen { at, wall, line });
                }
            }
            if let Ok(mut l) = lines.lock() {
                l.extend(fresh);
            }
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(at: Instant, text: &str) -> Seen {
        Seen {
            at,
            wall: SystemTime::now(),
            line: Line::parse(text).unwrap(),
        }
    }

    #[test]
    fn truth_is_interpolated_between_the_lines_around_an_instant() {
        let t = Instant::now();
        let ms = |n: u64| t + Duration::from_millis(n);
        let lines = vec![
            seen(ms(0), "tg ready tiers=3 sets=3 phases=1"),
            seen(ms(10), "tg tick s=0 phase=0 total=500 acc=0,400,100"),
            seen(
                ms(40),
                "tg phase n=1 w=25/75 active=1/1 len=6s at=2000 acc=0,1600,400",
            ),
            seen(ms(60), "tg tick s=1 phase=1 total=2500 acc=0,1700,800"),
        ];
        // Before the first count, and after the last: unknown yet.
        assert_eq!(interpolate(&lines, ms(5)), None);
        assert_eq!(interpolate(&lines, ms(60)), None);
        assert_eq!(interpolate(&lines, ms(10)), Some([400, 100]));
        assert_eq!(interpolate(&lines, ms(25)), Some([1000, 250]));
        assert_eq!(interpolate(&lines, ms(50)), Some([1650, 600]));
    }

    #[test]
    fn the_follower_timestamps_complete_lines_as_they_arrive() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("serial.log");
        let f = Follower::start(path.clone());
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(&path, "noise\ntg tick s=0 acc=9,1,2\ntg tick s=1 acc=9,3").unwrap();
        let before = Instant::now();
        let deadline = before + Duration::from_secs(2);
        while f.lines().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let lines = f.lines();
        assert_eq!(lines.len(), 1, "the unfinished line waits");
        assert_eq!(lines[0].acc(), Some([1, 2]));
        assert!(lines[0].at >= before - POLL * 10);
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut file, b",4\n").unwrap();
        while f.lines().len() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(f.lines()[1].acc(), Some([3, 4]));
        assert!(f.find(|s| s.line.u64("s") == Some(1)).is_some());
    }
}
