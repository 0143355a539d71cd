//! The release engine over the guest memory the frontend mapped: each
//! tier's ranges intersected with its regions, rebuilt on every memory
//! table change.

use super::*;

/// Engine state for the mapped guest memory.
pub(super) struct Engine {
    pub(super) tiers: Vec<TierBalloon>,
    pub(super) legacy: TierBalloon,
    /// Bytes of each tier's ranges the frontend mapped.
    pub(super) mapped: Vec<u64>,
    pub(super) regions: usize,
    /// Keeps vhost-user-backend's mappings (which the engine's regions
    /// adopted) alive at least as long as the engine.
    pub(super) _mem: Option<Arc<GuestMemoryMmap<()>>>,
}

impl Engine {
    /// No memory mapped yet: every tier empty. Fails only for a tier count
    /// outside 1..=8, which [`crate::spec::validate`] already refused.
    pub(super) fn empty(tiers: usize) -> Result<Engine, LayoutError> {
        let t = Tiers::new_allow_empty((0..tiers).map(|_| Vec::new()).collect())?.into_tiers();
        let legacy = Tiers::new_allow_empty(vec![Vec::new()])?
            .into_tiers()
            .pop()
            .ok_or(LayoutError::TierCount(0))?;
        Ok(Engine {
            tiers: t,
            legacy,
            mapped: vec![0; tiers],
            regions: 0,
            _mem: None,
        })
    }

    /// Takes over counters and balloon state; returns pages that left the
    /// balloon because they are no longer mapped.
    pub(super) fn adopt(&mut self, old: &Engine) -> u64 {
        let mut dropped = self.legacy.adopt(&old.legacy);
        for (new, old) in self.tiers.iter_mut().zip(&old.tiers) {
            dropped += new.adopt(old);
        }
        dropped
    }

    pub(super) fn clear(&mut self) {
        self.legacy.clear();
        self.tiers.iter_mut().for_each(TierBalloon::clear);
    }
}

/// hugetlbfs backing gives 2 MiB pages; anything else 4 KiB.
fn backing_of(file: &std::fs::File) -> io::Result<Backing> {
    // SAFETY: fstatfs writes only into the zeroed buffer we own.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd borrowed from a live File, valid out pointer.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;
    Ok(if st.f_type as i64 == HUGETLBFS_MAGIC {
        Backing::Huge2M
    } else {
        Backing::Small
    })
}

pub(super) fn build_engine(
    specs: &[TierSpec],
    mem: Arc<GuestMemoryMmap<()>>,
) -> io::Result<Engine> {
    let mut tiers: Vec<Vec<Region>> = specs.iter().map(|_| Vec::new()).collect();
    let mut legacy = Vec::new();
    let mut mapped = vec![0u64; specs.len()];
    let mut regions = 0;
    for r in mem.iter() {
        let gpa = r.start_addr().raw_value();
        let len = r.len();
        let host = r.as_ptr();
        let Some(fo) = r.file_offset() else {
            tracing::warn!(
                gpa = format_args!("{gpa:#x}"),
                "guest memory region without a file: its pages are never released"
            );
            continue;
        };
        regions += 1;
        // One unusable region (fstatfs or dup failing, a geometry the
        // engine refuses) must not fail the whole memory update and with
        // it the connection: it is skipped like a region without a file,
        // and PFNs in it are rejected as outside guest memory.
        let skip = |what: &str, e: &dyn std::fmt::Display| {
            tracing::warn!(
                gpa = format_args!("{gpa:#x}"),
                len = format_args!("{len:#x}"),
                "guest memory region skipped ({what}: {e}): its pages are never released"
            );
        };
        let backing = match backing_of(fo.file()) {
            Ok(b) => b,
            Err(e) => {
                skip("fstatfs", &e);
                continue;
            }
        };
        let granule = match backing {
            Backing::Small => PAGE_SIZE,
            Backing::Huge2M => HUGE_PAGE_SIZE,
        };
        // [a, b) of this mapping as an engine region.
        let adopt = |a: u64, b: u64| -> io::Result<Region> {
            let fd = fo.file().as_fd().try_clone_to_owned()?;
            let delta = a - gpa;
            // SAFETY: [host + delta, host + delta + (b - a)) lies inside
            // vhost-user-backend's MAP_SHARED mapping of `fo.file()` at
            // `fo.start() + delta` (MmapRegion::from_file); the engine that
            // owns the region also holds `mem`, which keeps that mapping
            // alive. Discarding ballooned pages is the point.
            unsafe {
                Region::from_mapping(
                    fd,
                    fo.start() + delta,
                    b - a,
                    a,
                    host.add(delta as usize),
                    backing,
                )
            }
            .map_err(io::Error::other)
        };
        let (lo, hi) = (
            gpa.next_multiple_of(granule),
            (gpa + len) / granule * granule,
        );
        if lo < hi {
            match adopt(lo, hi) {
                Ok(r) => legacy.push(r),
                Err(e) => {
                    skip("legacy", &e);
                    continue;
                }
            }
        }
        for (t, spec) in specs.iter().enumerate() {
            for range in &spec.ranges {
                let a = range.start.max(gpa).next_multiple_of(granule);
                let b = range.end().min(gpa + len) / granule * granule;
                if a < b {
                    match adopt(a, b) {
                        Ok(r) => {
                            tiers[t].push(r);
                            mapped[t] += b - a;
                        }
                        Err(e) => skip(&spec.name, &e),
                    }
                }
            }
        }
    }
    let tiers = Tiers::new_allow_empty(tiers)
        .map_err(io::Error::other)?
        .into_tiers();
    let legacy = Tiers::new_allow_empty(vec![legacy])
        .map_err(io::Error::other)?
        .into_tiers()
        .pop()
        .ok_or_else(|| io::Error::other("no legacy balloon"))?;
    Ok(Engine {
        tiers,
        legacy,
        mapped,
        regions,
        _mem: Some(mem),
    })
}
