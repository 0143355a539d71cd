//! The test guest's serial lines, timestamped on the host as they arrive:
//! a thread reads the file cloud-hypervisor writes every [`POLL`]. Used for
//! the `tg ready` line and for errors; the counts come from guest memory
//! (`guest_truth`), as a line costs the guest about a millisecond of exits
//! per character.

use std::fs::File;
use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use tier_testguest::serial::Line;

/// How often the log is read: bounds how late a line is timestamped.
pub const POLL: Duration = Duration::from_millis(2);

/// One guest line with the host's time of arrival.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Instant,
    pub wall: SystemTime,
    pub line: Line,
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
        assert_eq!(lines[0].line.list("acc"), Some(vec![9, 1, 2]));
        assert!(lines[0].at >= before - POLL * 10);
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut file, b",4\n").unwrap();
        while f.lines().len() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(f.lines()[1].line.list("acc"), Some(vec![9, 3, 4]));
        assert!(f.find(|s| s.line.u64("s") == Some(1)).is_some());
    }
}
