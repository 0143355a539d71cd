//! Reader of the exact truth the `tier_truth` QEMU plugin exports
//! (plugin/tier_truth.c, whose header comment is the layout this mirrors):
//! per guest-physical 4 KiB page of each RAM range, accesses ("touches")
//! and last-level-cache misses, plus instructions executed. The file only
//! grows counters, so a reader snapshots it and diffs two snapshots.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// "TIERTRU1", little-endian.
pub const MAGIC: u64 = 0x3155_5254_5245_4954;
pub const VERSION: u64 = 1;
pub const PAGE: u64 = 4096;
const HDR_BYTES: usize = 1024;
const MAX_RANGES: usize = 16;
// Word indices of the header (tier_truth.c's enum).
const H_MAGIC: usize = 0;
const H_VERSION: usize = 1;
const H_HDR: usize = 2;
const H_PAGE: usize = 3;
const H_LLC_BYTES: usize = 5;
const H_LLC_WAYS: usize = 6;
const H_RANGES: usize = 8;
const H_PAGES: usize = 9;
const H_SEQ: usize = 10;
const H_STATE: usize = 12;
const H_INSNS: usize = 13;
const H_RANGE0: usize = 32;
const H_PHYS0: usize = 64;
const STATE_EXITED: u64 = 2;

#[derive(Debug, thiserror::Error)]
pub enum TruthError {
    #[error("opening {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("mapping {path}: {source}")]
    Map {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: no complete header yet (the plugin has not started)")]
    NotReady { path: PathBuf },
    #[error("{path}: magic {found:#x} is not tier_truth's")]
    Magic { path: PathBuf, found: u64 },
    #[error("{path}: layout version {found}, this reader knows {VERSION}")]
    Version { path: PathBuf, found: u64 },
    #[error("{path}: {what}")]
    Layout { path: PathBuf, what: String },
    #[error("snapshots of different layouts cannot be diffed")]
    Mismatch,
}

/// One RAM range the plugin counts: `len` bytes from guest-physical `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub start: u64,
    pub len: u64,
    /// Index of its first page in the per-page arrays.
    pub first_page: usize,
    /// What `qemu_plugin_hwaddr_phys_addr` minus the GPA was for this range
    /// (QEMU 7.2 adds the region's offset in its parent); None: no sample.
    pub phys_minus_gpa: Option<i64>,
}

/// Totals of a range or an interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PageSums {
    pub touches: u64,
    pub misses: u64,
    /// Pages with at least one touch.
    pub pages_touched: u64,
}

/// The whole-file counters (see the layout in tier_truth.c).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub seq: u64,
    pub exited: bool,
    pub instructions: u64,
    pub other_touches: u64,
    pub other_misses: u64,
    pub io_accesses: u64,
    pub no_hwaddr: u64,
    pub check_samples: u64,
    pub check_mismatches: u64,
}

/// The plugin's file, mapped read-only.
#[derive(Debug)]
pub struct Truth {
    ptr: *const AtomicU64,
    words: usize,
    pages: usize,
    ranges: Vec<Range>,
    pub llc_bytes: u64,
    pub llc_ways: u64,
}

// SAFETY: the mapping is read-only shared memory read only through atomics.
unsafe impl Send for Truth {}
// SAFETY: as above; nothing in Truth is mutated after open.
unsafe impl Sync for Truth {}

impl Truth {
    pub fn open(path: &Path) -> Result<Truth, TruthError> {
        let p = || path.to_path_buf();
        let file = File::open(path).map_err(|source| TruthError::Open { path: p(), source })?;
        let bytes = file
            .metadata()
            .map_err(|source| TruthError::Open { path: p(), source })?
            .len() as usize;
        if bytes < HDR_BYTES {
            return Err(TruthError::NotReady { path: p() });
        }
        // SAFETY: a fresh read-only shared mapping of an open file; checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let source = std::io::Error::last_os_error();
            return Err(TruthError::Map { path: p(), source });
        }
        let mut t = Truth {
            ptr: ptr.cast(),
            words: bytes / 8,
            pages: 0,
            ranges: Vec::new(),
            llc_bytes: 0,
            llc_ways: 0,
        };
        t.validate(path)?;
        Ok(t)
    }

    fn word(&self, i: usize) -> u64 {
        assert!(i < self.words, "word {i} outside the mapping");
        // SAFETY: i is inside the page-aligned mapping, which lives as long
        // as self; AtomicU64 has u64's layout.
        unsafe { &*self.ptr.add(i) }.load(Ordering::Relaxed)
    }

    fn validate(&mut self, path: &Path) -> Result<(), TruthError> {
        let p = || path.to_path_buf();
        let layout = |what: String| TruthError::Layout { path: p(), what };
        // Acquire: the plugin stores the magic last.
        // SAFETY: word 0 is inside the mapping (bytes >= HDR_BYTES).
        let magic = unsafe { &*self.ptr.add(H_MAGIC) }.load(Ordering::Acquire);
        match magic {
            0 => return Err(TruthError::NotReady { path: p() }),
            MAGIC => {}
            found => return Err(TruthError::Magic { path: p(), found }),
        }
        let version = self.word(H_VERSION);
        if version != VERSION {
            return Err(TruthError::Version {
                path: p(),
                found: version,
            });
        }
        if self.word(H_HDR) != HDR_BYTES as u64 || self.word(H_PAGE) != PAGE {
            return Err(layout("header size or page size differ".into()));
        }
        let (n, pages) = (self.word(H_RANGES) as usize, self.word(H_PAGES) as usize);
        if n > MAX_RANGES || HDR_BYTES / 8 + 2 * pages != self.words {
            return Err(layout(format!(
                "{n} ranges, {pages} pages, {} words",
                self.words
            )));
        }
        let mut first_page = 0;
        for r in 0..n {
            let (start, len) = (self.word(H_RANGE0 + 2 * r), self.word(H_RANGE0 + 2 * r + 1));
            let phys = self.word(H_PHYS0 + r) as i64;
            self.ranges.push(Range {
                start,
                len,
                first_page,
                phys_minus_gpa: (phys != i64::MIN).then_some(phys),
            });
            first_page += (len / PAGE) as usize;
        }
        if first_page != pages {
            return Err(layout(format!(
                "ranges hold {first_page} pages, header says {pages}"
            )));
        }
        self.pages = pages;
        self.llc_bytes = self.word(H_LLC_BYTES);
        self.llc_ways = self.word(H_LLC_WAYS);
        Ok(())
    }

    pub fn ranges(&self) -> &[Range] {
        &self.ranges
    }

    /// The header's counters now (phys_minus_gpa is sampled while running).
    pub fn counters(&self) -> Counters {
        Counters {
            seq: self.word(H_SEQ),
            exited: self.word(H_STATE) == STATE_EXITED,
            instructions: self.word(H_INSNS),
            other_touches: self.word(14),
            other_misses: self.word(15),
            io_accesses: self.word(16),
            no_hwaddr: self.word(17),
            check_samples: self.word(18),
            check_mismatches: self.word(19),
        }
    }

    /// Every counter now. Not atomic as a whole: pages read later may
    /// include accesses made after earlier ones were read.
    pub fn snapshot(&self) -> Snapshot {
        let base = HDR_BYTES / 8;
        Snapshot {
            counters: self.counters(),
            touches: (0..self.pages).map(|i| self.word(base + i)).collect(),
            misses: (0..self.pages)
                .map(|i| self.word(base + self.pages + i))
                .collect(),
            ranges: self.ranges.clone(),
        }
    }
}

impl Drop for Truth {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in open.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.words * 8) };
    }
}

/// Counters at one moment, or (from [`Snapshot::since`]) over an interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub counters: Counters,
    pub touches: Vec<u64>,
    pub misses: Vec<u64>,
    pub ranges: Vec<Range>,
}

impl Snapshot {
    /// What happened between `earlier` and this snapshot.
    pub fn since(&self, earlier: &Snapshot) -> Result<Snapshot, TruthError> {
        if !same_spans(&self.ranges, &earlier.ranges) {
            return Err(TruthError::Mismatch);
        }
        let d = |a: &[u64], b: &[u64]| a.iter().zip(b).map(|(x, y)| x.saturating_sub(*y)).collect();
        let (a, b) = (&self.counters, &earlier.counters);
        Ok(Snapshot {
            counters: Counters {
                seq: a.seq.saturating_sub(b.seq),
                exited: a.exited,
                instructions: a.instructions.saturating_sub(b.instructions),
                other_touches: a.other_touches.saturating_sub(b.other_touches),
                other_misses: a.other_misses.saturating_sub(b.other_misses),
                io_accesses: a.io_accesses.saturating_sub(b.io_accesses),
                no_hwaddr: a.no_hwaddr.saturating_sub(b.no_hwaddr),
                check_samples: a.check_samples.saturating_sub(b.check_samples),
                check_mismatches: a.check_mismatches.saturating_sub(b.check_mismatches),
            },
            touches: d(&self.touches, &earlier.touches),
            misses: d(&self.misses, &earlier.misses),
            ranges: self.ranges.clone(),
        })
    }

    /// Sums over the pages in guest-physical `[start, start + len)` (e.g.
    /// a NUMA node's span); pages outside every range count nothing.
    pub fn sum_in(&self, start: u64, len: u64) -> PageSums {
        let end = start.saturating_add(len);
        let mut s = PageSums::default();
        for r in &self.ranges {
            let lo = start.max(r.start);
            let hi = end.min(r.start + r.len);
            if lo >= hi {
                continue;
            }
            let first = r.first_page + ((lo - r.start) / PAGE) as usize;
            let last = r.first_page + (hi - r.start).div_ceil(PAGE) as usize;
            for i in first..last.min(self.touches.len()) {
                s.touches += self.touches[i];
                s.misses += self.misses[i];
                s.pages_touched += u64::from(self.touches[i] > 0);
            }
        }
        s
    }

    /// Sums over every range.
    pub fn total(&self) -> PageSums {
        self.sum_in(0, u64::MAX)
    }

    /// Guest-physical address of page index `i`.
    pub fn page_gpa(&self, i: usize) -> Option<u64> {
        self.ranges
            .iter()
            .find(|r| i >= r.first_page && i < r.first_page + (r.len / PAGE) as usize)
            .map(|r| r.start + (i - r.first_page) as u64 * PAGE)
    }
}

/// Same ranges up to the sampled phys offsets (they fill in while running).
fn same_spans(a: &[Range], b: &[Range]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x.start, x.len, x.first_page) == (y.start, y.len, y.first_page))
}

#[cfg(test)]
#[path = "truth_tests.rs"]
mod tests;
