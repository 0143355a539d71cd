//! The test guest's exact counts read from its memory (`struct tg_truth`,
//! whose guest-physical address the `tg ready` line gives): through
//! `/proc/PID/mem` of the VMM at the block's host address, so the truth at
//! an instant is read at that instant and the guest prints nothing while it
//! runs. A watcher thread notes when the guest's RTC second count and phase
//! change, for the row's clock and the measured phase-change instants,
//! and logs the access count for the working-set truth (`guest_ws`).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use tier_proto::v1::Vm;
use tier_testguest::truth::{Stamps, Truth};

use super::guest_ws::{CountLog, CountRead};

/// How often the watcher reads the block: bounds how late a change is seen.
pub const WATCH: Duration = Duration::from_millis(1);

/// Reads one guest's truth block.
#[derive(Debug)]
pub struct TruthReader {
    mem: File,
    hva: u64,
    /// The VM's ranges with a host address: (gpa, length, hva).
    ranges: Vec<(u64, u64, u64)>,
}

impl TruthReader {
    /// The block at guest-physical `gpa` of `vm`, through its VMM's memory.
    pub fn open(vm: &Vm, gpa: u64) -> Result<TruthReader, String> {
        let hva = hva_of(vm, gpa, Truth::SIZE as u64)?;
        let path = format!("/proc/{}/mem", vm.vmm_pid);
        let mem = File::open(&path).map_err(|e| format!("{path}: {e}"))?;
        let ranges = vm
            .tiers
            .iter()
            .flat_map(|t| &t.ranges)
            .filter(|r| r.hva_start != 0)
            .map(|r| (r.gpa_start, r.length, r.hva_start))
            .collect();
        Ok(TruthReader { mem, hva, ranges })
    }

    /// One zone's page stamps, as the guest wrote them up to now.
    pub fn stamps(&self, s: &Stamps) -> Result<Vec<u64>, String> {
        let len = s.pages * 8;
        let hva = self
            .ranges
            .iter()
            .find(|(gpa, l, _)| s.gpa >= *gpa && s.gpa + len <= gpa + l)
            .map(|(gpa, _, hva)| hva + (s.gpa - gpa))
            .ok_or_else(|| format!("page stamps at {:#x} are in no range", s.gpa))?;
        let mut b = vec![0u8; usize::try_from(len).map_err(|e| e.to_string())?];
        self.mem
            .read_exact_at(&mut b, hva)
            .map_err(|e| format!("reading page stamps at {hva:#x}: {e}"))?;
        Ok(b.chunks_exact(8)
            .filter_map(|c| c.try_into().ok().map(u64::from_le_bytes))
            .collect())
    }

    pub fn read(&self) -> Result<Truth, String> {
        let mut b = [0u8; Truth::SIZE];
        self.mem
            .read_exact_at(&mut b, self.hva)
            .map_err(|e| format!("reading the truth block at {:#x}: {e}", self.hva))?;
        Truth::from_bytes(&b).ok_or_else(|| "short truth block".into())
    }
}

/// Host address of `[gpa, gpa+len)`, which must lie in one range of `vm`.
pub fn hva_of(vm: &Vm, gpa: u64, len: u64) -> Result<u64, String> {
    let r = vm
        .tiers
        .iter()
        .flat_map(|t| &t.ranges)
        .find(|r| gpa >= r.gpa_start && gpa + len <= r.gpa_start + r.length)
        .ok_or_else(|| format!("guest address {gpa:#x} is in no range of {}", vm.id))?;
    if r.hva_start == 0 {
        return Err(format!(
            "{}: no host address known for guest address {gpa:#x}",
            vm.id
        ));
    }
    Ok(r.hva_start + (gpa - r.gpa_start))
}

/// A change of the guest's second count or phase, as first seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    pub wall: SystemTime,
    pub seconds: u64,
    pub phase: u64,
}

/// Watches one truth block until dropped.
#[derive(Debug)]
pub struct Watcher {
    changes: Arc<Mutex<Vec<Change>>>,
    counts: Arc<Mutex<CountLog>>,
    error: Arc<Mutex<Option<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    pub fn start(reader: Arc<TruthReader>) -> Watcher {
        let changes = Arc::new(Mutex::new(Vec::new()));
        let counts = Arc::new(Mutex::new(CountLog::default()));
        let error = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, n, e, s) = (
            Arc::clone(&changes),
            Arc::clone(&counts),
            Arc::clone(&error),
            Arc::clone(&stop),
        );
        let thread = std::thread::Builder::new()
            .name("truth-watch".into())
            .spawn(move || watch(&reader, &c, &n, &e, &s))
            .ok();
        Watcher {
            changes,
            counts,
            error,
            stop,
            thread,
        }
    }

    /// The first change for which `pred` holds, if it came.
    pub fn find(&self, pred: impl Fn(&Change) -> bool) -> Option<Change> {
        let c = self.changes.lock().ok()?;
        c.iter().find(|c| pred(c)).copied()
    }

    /// Bounds of the guest's access count at `t` (`CountLog::bracket`).
    pub fn count_at(&self, t: Instant) -> Option<(u64, u64)> {
        self.counts.lock().ok()?.bracket(t)
    }

    /// Why the block could not be read, once it could not.
    pub fn error(&self) -> Option<String> {
        self.error.lock().ok()?.clone()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn watch(
    reader: &TruthReader,
    changes: &Mutex<Vec<Change>>,
    counts: &Mutex<CountLog>,
    error: &Mutex<Option<String>>,
    stop: &AtomicBool,
) {
    let mut last: Option<(u64, u64)> = None;
    while !stop.load(Ordering::Acquire) {
        let before = Instant::now();
        let read = reader.read();
        if let (Ok(t), Ok(mut log)) = (&read, counts.lock()) {
            log.push(CountRead {
                before,
                after: Instant::now(),
                count: t.count(),
            });
        }
        match read {
            Ok(t) if last != Some((t.seconds, t.phase)) => {
                last = Some((t.seconds, t.phase));
                if let Ok(mut c) = changes.lock() {
                    c.push(Change {
                        wall: SystemTime::now(),
                        seconds: t.seconds,
                        phase: t.phase,
                    });
                }
            }
            Ok(_) => {}
            Err(e) => {
                if let Ok(mut slot) = error.lock() {
                    *slot = Some(e);
                }
                return;
            }
        }
        std::thread::sleep(WATCH);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tier_proto::v1::{GpaRange, Tier};

    #[test]
    fn guest_addresses_map_through_the_range_that_holds_them() {
        let vm = Vm {
            id: "vm".into(),
            tiers: vec![Tier {
                ranges: vec![
                    GpaRange {
                        gpa_start: 0,
                        length: 0x80_0000,
                        hva_start: 0x7f00_0000_0000,
                    },
                    GpaRange {
                        gpa_start: 0x100_0000,
                        length: 0x1000,
                        hva_start: 0,
                    },
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(hva_of(&vm, 0x12_3450, 88), Ok(0x7f00_0012_3450));
        // Straddling the end of a range, outside every range, no host address.
        assert!(hva_of(&vm, 0x7f_fff0, 88).is_err());
        assert!(hva_of(&vm, 0x90_0000, 8).is_err());
        let e = hva_of(&vm, 0x100_0000, 8).unwrap_err();
        assert!(e.contains("no host address"), "{e}");
    }

    #[test]
    fn reads_and_watches_a_block_in_this_process() {
        // The block in this process's own memory, read through /proc/self/mem
        // as the bench reads the VMM's.
        let mut block: Box<[u64; Truth::SIZE / 8]> = Box::new([0; Truth::SIZE / 8]);
        let ptr = block.as_mut_ptr();
        let addr = ptr as u64;
        let vm = Vm {
            id: "self".into(),
            vmm_pid: std::process::id(),
            tiers: vec![Tier {
                ranges: vec![GpaRange {
                    gpa_start: 0x1000,
                    length: Truth::SIZE as u64,
                    hva_start: addr,
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let reader = Arc::new(TruthReader::open(&vm, 0x1000).expect("own memory"));
        assert_eq!(reader.read(), Ok(Truth::default()));
        // Stamps outside every range the VM has are an error, not zeros.
        let lost = tier_testguest::truth::Stamps {
            gpa: 0x9000,
            pfn: 0,
            pages: 2,
        };
        assert!(reader.stamps(&lost).is_err());
        let inside = tier_testguest::truth::Stamps {
            gpa: 0x1000,
            ..lost
        };
        assert_eq!(reader.stamps(&inside), Ok(vec![0, 0]));
        let w = Watcher::start(Arc::clone(&reader));
        let seconds = tier_testguest::params::MAX_SETS + 1;
        // SAFETY: `ptr` points into the live boxed block; one aligned u64
        // store, read concurrently only through /proc/self/mem.
        unsafe { std::ptr::write_volatile(ptr.add(seconds), 1) };
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while w.find(|c| c.seconds == 1).is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(WATCH);
        }
        assert!(w.find(|c| c.seconds == 1 && c.phase == 0).is_some());
        assert_eq!(reader.read().map(|t| t.seconds), Ok(1));
        // The access count is logged on every read: bracketed once a read
        // has finished before and another begun after an instant.
        // SAFETY: as above; acc[0] is word 0.
        unsafe { std::ptr::write_volatile(ptr, 7) };
        let t = std::time::Instant::now();
        let deadline = t + Duration::from_secs(2);
        while w.count_at(t).is_none_or(|c| c.1 < 7) && std::time::Instant::now() < deadline {
            std::thread::sleep(WATCH);
        }
        assert!(
            w.count_at(t).is_some_and(|(lo, hi)| lo <= hi && hi == 7),
            "{:?}",
            w.count_at(t)
        );
        assert_eq!(w.error(), None);
        drop(w);
        drop(block);
    }
}
