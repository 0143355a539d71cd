//! Bounds-checked, coalesced release of ballooned guest pages.
//!
//! Model: a VM's guest RAM is split into tiers (cloud-hypervisor memory
//! zones); each tier is a set of [`Region`]s, each region a guest-physical
//! range backed by a shared mapping of a memfd. A [`TierBalloon`] serves one
//! tier's inflate and deflate queues: the backend hands it the bytes of one
//! descriptor chain (an array of little-endian `u32` PFNs, SPEC.md section 3)
//! and a [`Releaser`].
//!
//! Per chain, in this order:
//! 1. the byte length must be a multiple of 4 and hold at most
//!    [`MAX_CHAIN_PFNS`] PFNs;
//! 2. the PFNs are sorted; duplicates within the chain are rejected;
//! 3. every PFN must lie in a region of *this* tier (else `WrongTier` if it
//!    is in another tier's region, `OutsideGuestMemory` otherwise), and must
//!    not be ballooned yet (inflate) / must be ballooned (deflate), checked
//!    against the per-region bitmap;
//! 4. only if every PFN passed: the bitmap is updated, the sorted pages are
//!    coalesced into runs that never cross a region, and each run is released
//!    with one call of [`Releaser::release`] (inflate) or
//!    [`Releaser::reclaim`] (deflate).
//!
//! Any failure in 1-3 rejects the whole chain: nothing is released, nothing
//! is accounted except the rejection (per reason, in [`TierStats`]).
//!
//! Regions backed by 2 MiB huge pages ([`Backing::Huge2M`]) cannot release a
//! part of a huge page, so inflate releases a 2 MiB block only once all its
//! 512 4 KiB pages are ballooned (possibly over several chains); adjacent full
//! blocks are released as one run.
//!
//! Safety boundary: the only addresses and file offsets that reach `libc`
//! are those of a [`HostRange`], which only this module constructs, from a
//! region's own mapping and a page index that was checked against the
//! region's length (and is checked again when the range is built).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

/// Bytes per balloon page (`VIRTIO_BALLOON_PFN_SHIFT = 12`), whatever the host page size.
pub const PAGE_SIZE: u64 = 4096;
const PAGE_SHIFT: u32 = 12;
/// Bytes per huge page of a [`Backing::Huge2M`] region.
pub const HUGE_PAGE_SIZE: u64 = 2 << 20;
const PAGES_PER_HUGE: u64 = HUGE_PAGE_SIZE / PAGE_SIZE;
/// `VIRTIO_BALLOON_TIERS_MAX`.
pub const MAX_TIERS: usize = 8;
/// Most PFNs accepted in one chain: 32 descriptors of the SPEC's maximum of
/// 256 PFNs. Bounds the work (and scratch memory) one chain can cause.
pub const MAX_CHAIN_PFNS: usize = 8192;

/// What backs a region's host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// 4 KiB pages (shmem memfd): any page can be released on its own.
    Small,
    /// 2 MiB huge pages (hugetlbfs memfd, or shmem with forced THP): only
    /// whole, 2 MiB-aligned blocks are released.
    Huge2M,
}

impl Backing {
    fn granule(self) -> u64 {
        match self {
            Backing::Small => PAGE_SIZE,
            Backing::Huge2M => HUGE_PAGE_SIZE,
        }
    }
}

/// An invalid region or tier layout.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("region gpa {gpa:#x} len {len:#x}: {what}")]
    BadRegion {
        gpa: u64,
        len: u64,
        what: &'static str,
    },
    #[error("region gpa {a:#x} overlaps region gpa {b:#x}")]
    Overlap { a: u64, b: u64 },
    #[error("{0} tiers; 1..={MAX_TIERS} allowed")]
    TierCount(usize),
    #[error("tier {0} has no region")]
    EmptyTier(usize),
    #[error("region gpa {gpa:#x}: {op}: {source}")]
    Sys {
        gpa: u64,
        op: &'static str,
        #[source]
        source: io::Error,
    },
}

/// One guest RAM region: `[gpa, gpa + len)` is backed by
/// `[file_offset, file_offset + len)` of `fd`, mapped shared at `host`.
#[derive(Debug)]
pub struct Region {
    gpa: u64,
    len: u64,
    fd: OwnedFd,
    file_offset: u64,
    /// Host virtual address of the mapping (kept as an integer: it is only
    /// ever handed to `madvise`, never dereferenced by this crate).
    host: usize,
    backing: Backing,
    /// Whether this crate created the mapping and unmaps it on drop.
    owns_mapping: bool,
}

impl Region {
    /// Maps `[file_offset, file_offset + len)` of `fd` shared read-write and
    /// makes it the guest range `[gpa, gpa + len)`. The mapping lives as long
    /// as the region.
    pub fn map(
        fd: OwnedFd,
        file_offset: u64,
        len: u64,
        gpa: u64,
        backing: Backing,
    ) -> Result<Region, LayoutError> {
        check_geometry(&fd, file_offset, len, gpa, 0, backing)?;
        let (Ok(map_len), Ok(off)) = (usize::try_from(len), libc::off_t::try_from(file_offset))
        else {
            return Err(bad(gpa, len, "does not fit the address space"));
        };
        // SAFETY: a fresh shared mapping chosen by the kernel (addr NULL), so it
        // aliases no existing Rust object; fd and the range were checked above.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(sys(gpa, "mmap"));
        }
        Ok(Region {
            gpa,
            len,
            fd,
            file_offset,
            host: p as usize,
            backing,
            owns_mapping: true,
        })
    }

    /// Uses an existing mapping, e.g. one made by a vhost-user backend for a
    /// `SET_MEM_TABLE` region. Not unmapped on drop.
    ///
    /// # Safety
    /// `[host, host + len)` must be a `MAP_SHARED` mapping of
    /// `[file_offset, file_offset + len)` of `fd` that stays mapped for the
    /// whole life of the returned region, and the caller must accept that the
    /// contents of pages the guest balloons are discarded (that is the point).
    pub unsafe fn from_mapping(
        fd: OwnedFd,
        file_offset: u64,
        len: u64,
        gpa: u64,
        host: *mut u8,
        backing: Backing,
    ) -> Result<Region, LayoutError> {
        let host = host as usize;
        check_geometry(&fd, file_offset, len, gpa, host, backing)?;
        if host == 0 {
            return Err(bad(gpa, len, "null host address"));
        }
        Ok(Region {
            gpa,
            len,
            fd,
            file_offset,
            host,
            backing,
            owns_mapping: false,
        })
    }

    pub fn gpa(&self) -> u64 {
        self.gpa
    }
    pub fn len(&self) -> u64 {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn backing(&self) -> Backing {
        self.backing
    }
    pub fn file_offset(&self) -> u64 {
        self.file_offset
    }
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
    /// Host address of the mapping (for the caller's own guest-memory
    /// accesses, tests and benches; this crate never dereferences it).
    pub fn as_ptr(&self) -> *mut u8 {
        self.host as *mut u8
    }
    fn first_pfn(&self) -> u64 {
        self.gpa >> PAGE_SHIFT
    }
    fn pages(&self) -> u64 {
        self.len >> PAGE_SHIFT
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.owns_mapping {
            // SAFETY: the mapping was created by `Region::map` with this address
            // and length and is unmapped exactly once, here.
            unsafe { libc::munmap(self.host as *mut libc::c_void, self.len as usize) };
        }
    }
}

fn bad(gpa: u64, len: u64, what: &'static str) -> LayoutError {
    LayoutError::BadRegion { gpa, len, what }
}

fn sys(gpa: u64, op: &'static str) -> LayoutError {
    LayoutError::Sys {
        gpa,
        op,
        source: io::Error::last_os_error(),
    }
}

fn check_geometry(
    fd: &OwnedFd,
    file_offset: u64,
    len: u64,
    gpa: u64,
    host: usize,
    backing: Backing,
) -> Result<(), LayoutError> {
    let g = backing.granule();
    if len == 0 {
        return Err(bad(gpa, len, "empty"));
    }
    if !gpa.is_multiple_of(g)
        || !len.is_multiple_of(g)
        || !file_offset.is_multiple_of(g)
        || !(host as u64).is_multiple_of(g)
    {
        return Err(bad(
            gpa,
            len,
            "gpa, length, file offset and host address must be aligned to the backing page size",
        ));
    }
    if gpa.checked_add(len).is_none()
        || file_offset.checked_add(len).is_none()
        || (host as u64).checked_add(len).is_none()
        || len > isize::MAX as u64
        || file_offset > i64::MAX as u64 - len
    {
        return Err(bad(gpa, len, "range overflows"));
    }
    // SAFETY: fstat writes only into the zeroed stat buffer we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd (owned), valid out pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(sys(gpa, "fstat"));
    }
    if (st.st_size as u64) < file_offset + len {
        return Err(bad(gpa, len, "extends past the end of the file"));
    }
    Ok(())
}

/// A memfd of `size` bytes (close-on-exec), `huge` for `MFD_HUGETLB`.
pub fn memfd(name: &str, size: u64, huge: bool) -> io::Result<OwnedFd> {
    let cname = std::ffi::CString::new(name).map_err(io::Error::other)?;
    let mut flags = libc::MFD_CLOEXEC;
    if huge {
        flags |= libc::MFD_HUGETLB | libc::MFD_HUGE_2MB;
    }
    // SAFETY: cname is a valid NUL-terminated string for the call's duration.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by memfd_create and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let size = libc::off_t::try_from(size).map_err(io::Error::other)?;
    // SAFETY: plain syscall on an fd we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// A range of host memory to release or reclaim: inside one registered
/// region, both as file range and as mapped range. Only this module builds
/// them, after the bounds check.
#[derive(Debug, Clone, Copy)]
pub struct HostRange<'a> {
    fd: BorrowedFd<'a>,
    file_offset: u64,
    host: usize,
    len: u64,
    gpa: u64,
}

impl<'a> HostRange<'a> {
    /// Pages `[page, page + pages)` of `region`; `None` if not inside it
    /// (never happens for ranges built from validated PFNs: a second check).
    fn new(region: &'a Region, page: u64, pages: u64) -> Option<HostRange<'a>> {
        let end = page.checked_add(pages)?;
        if pages == 0 || end > region.pages() {
            return None;
        }
        let off = page << PAGE_SHIFT;
        Some(HostRange {
            fd: region.fd.as_fd(),
            file_offset: region.file_offset + off,
            host: region.host + off as usize,
            len: pages << PAGE_SHIFT,
            gpa: region.gpa + off,
        })
    }
    pub fn fd(&self) -> BorrowedFd<'a> {
        self.fd
    }
    pub fn file_offset(&self) -> u64 {
        self.file_offset
    }
    /// Host virtual address of the first byte.
    pub fn host_addr(&self) -> usize {
        self.host
    }
    pub fn len(&self) -> u64 {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn gpa(&self) -> u64 {
        self.gpa
    }
}

/// What to do with validated runs.
pub trait Releaser {
    /// Inflate: give the run's host memory back.
    fn release(&mut self, range: &HostRange<'_>) -> io::Result<()>;
    /// Deflate: the guest takes the run back.
    fn reclaim(&mut self, range: &HostRange<'_>) -> io::Result<()>;
}

/// The real release: `fallocate(PUNCH_HOLE|KEEP_SIZE)` then
/// `madvise(MADV_DONTNEED)`, one each per run.
///
/// Deflate does nothing by default: on a shmem memfd `MADV_WILLNEED` of a
/// punched hole allocates nothing (shmem has no readahead, the call only
/// swaps in swapped-out pages), so it would be a syscall per run for no
/// effect; the guest's next touch faults a zeroed page in, exactly as after
/// v53.0's `MADV_WILLNEED`. `willneed_on_deflate` restores v53.0's call.
#[derive(Debug, Clone, Copy, Default)]
pub struct SysReleaser {
    pub willneed_on_deflate: bool,
}

impl Releaser for SysReleaser {
    fn release(&mut self, r: &HostRange<'_>) -> io::Result<()> {
        // Both fit: HostRange lies inside a region whose offsets and length
        // were checked against i64/isize at construction.
        let (off, len) = (r.file_offset as libc::off_t, r.len as libc::off_t);
        // SAFETY: fallocate only changes the file behind a borrowed, open fd;
        // the range is inside the region's file range (HostRange invariant).
        let rc = unsafe {
            libc::fallocate(
                r.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                len,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: [host, host + len) lies inside the region's live shared
        // mapping (HostRange invariant; the mapping outlives the borrow of the
        // region). Dropping its pages is the intended effect: the guest gave
        // them up, and this crate holds no Rust reference into guest memory.
        let rc = unsafe {
            libc::madvise(
                r.host as *mut libc::c_void,
                r.len as usize,
                libc::MADV_DONTNEED,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn reclaim(&mut self, r: &HostRange<'_>) -> io::Result<()> {
        if !self.willneed_on_deflate {
            return Ok(());
        }
        // SAFETY: as in `release`; MADV_WILLNEED never discards data.
        let rc = unsafe {
            libc::madvise(
                r.host as *mut libc::c_void,
                r.len as usize,
                libc::MADV_WILLNEED,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Inflate or deflate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Inflate,
    Deflate,
}

/// Why a chain was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// Byte length not a multiple of 4.
    MalformedLength,
    /// More than [`MAX_CHAIN_PFNS`] PFNs.
    TooLong,
    /// A PFN in no tier's region.
    OutsideGuestMemory,
    /// A PFN in another tier's region.
    WrongTier,
    /// The same PFN twice in the chain.
    DuplicateInChain,
    /// Inflate of a page already in this tier's balloon.
    AlreadyBallooned,
    /// Deflate of a page not in this tier's balloon.
    NotBallooned,
    /// The virtqueue chain itself is unusable (a device-writable or
    /// unreadable descriptor); found by the vhost-user device before the
    /// engine sees any PFN, counted here with the others.
    BadDescriptor,
}

impl RejectReason {
    pub const ALL: [RejectReason; 8] = [
        RejectReason::MalformedLength,
        RejectReason::TooLong,
        RejectReason::OutsideGuestMemory,
        RejectReason::WrongTier,
        RejectReason::DuplicateInChain,
        RejectReason::AlreadyBallooned,
        RejectReason::NotBallooned,
        RejectReason::BadDescriptor,
    ];
    /// Counter name suffix (`tier<i>_rejected_<name>`).
    pub fn name(self) -> &'static str {
        match self {
            RejectReason::MalformedLength => "malformed_length",
            RejectReason::TooLong => "too_long",
            RejectReason::OutsideGuestMemory => "outside_guest_memory",
            RejectReason::WrongTier => "wrong_tier",
            RejectReason::DuplicateInChain => "duplicate_in_chain",
            RejectReason::AlreadyBallooned => "already_ballooned",
            RejectReason::NotBallooned => "not_ballooned",
            RejectReason::BadDescriptor => "bad_descriptor",
        }
    }
    fn index(self) -> usize {
        self as usize
    }
}

/// A rejected chain: nothing was released or accounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("tier {tier}: chain of {pfns} PFNs rejected: {} (pfn {pfn:?})", reason.name())]
pub struct Rejected {
    pub tier: usize,
    pub reason: RejectReason,
    /// The first offending PFN in sorted order, when one PFN is to blame.
    pub pfn: Option<u32>,
    /// PFNs in the chain (whole 4-byte entries).
    pub pfns: usize,
}

/// Result of an accepted chain.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    /// PFNs accepted (and accounted).
    pub pages: usize,
    /// Runs handed to the releaser.
    pub runs: usize,
    /// 4 KiB pages of host memory handed to `release` (inflate) or
    /// `reclaim` (deflate). For huge-page regions only whole blocks.
    pub host_pages: u64,
    /// Runs whose release/reclaim call failed (the pages stay accounted as
    /// ballooned: the guest gave them up whatever the host did).
    pub errors: usize,
}

/// Trusted per-tier counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Pages of this tier in the balloon now (`tierN_host_pages`).
    pub ballooned_pages: u64,
    pub inflated_pfns: u64,
    pub deflated_pfns: u64,
    /// Rejected chains, indexed like [`RejectReason::ALL`].
    pub rejected_chains: [u64; 8],
    /// PFNs in rejected chains (`tierN_rejected_pfns`).
    pub rejected_pfns: u64,
    pub release_calls: u64,
    pub released_pages: u64,
    pub release_errors: u64,
}

impl TierStats {
    pub fn rejected(&self, reason: RejectReason) -> u64 {
        self.rejected_chains[reason.index()]
    }
    pub fn rejected_total(&self) -> u64 {
        self.rejected_chains.iter().sum()
    }
}

/// One tier's GPA span, for telling "wrong tier" from "outside".
#[derive(Debug, Clone, Copy)]
struct Span {
    first_pfn: u64,
    end_pfn: u64,
    tier: usize,
}

#[derive(Debug)]
struct RegionState {
    region: Region,
    first_pfn: u64,
    end_pfn: u64,
    /// Bit `p` set: page `p` of the region is ballooned.
    bitmap: Vec<u64>,
}

impl RegionState {
    fn test(&self, page: u64) -> bool {
        self.bitmap[(page / 64) as usize] & (1u64 << (page % 64)) != 0
    }
    fn set(&mut self, page: u64, on: bool) {
        let w = &mut self.bitmap[(page / 64) as usize];
        let bit = 1u64 << (page % 64);
        if on {
            *w |= bit;
        } else {
            *w &= !bit;
        }
    }
    /// All 512 pages of 2 MiB block `block` ballooned.
    fn block_full(&self, block: u64) -> bool {
        let w = (block * PAGES_PER_HUGE / 64) as usize;
        self.bitmap[w..w + (PAGES_PER_HUGE / 64) as usize]
            .iter()
            .all(|&x| x == u64::MAX)
    }
}

/// The balloon state of one tier: serves that tier's inflate and deflate
/// queues. Independent of the other tiers (each can live on its own thread).
#[derive(Debug)]
pub struct TierBalloon {
    index: usize,
    regions: Vec<RegionState>,
    layout: Arc<[Span]>,
    stats: TierStats,
    bytes: Vec<u8>,
    pfns: Vec<u32>,
    /// (region index, page index in region), sorted.
    plan: Vec<(usize, u64)>,
}

/// All tiers of one VM, built together so that every region is checked
/// against every other (no overlap in guest-physical space).
#[derive(Debug)]
pub struct Tiers {
    tiers: Vec<TierBalloon>,
}

impl Tiers {
    /// `tiers[i]` holds the regions of tier i (any order).
    pub fn new(tiers: Vec<Vec<Region>>) -> Result<Tiers, LayoutError> {
        Self::build(tiers, false)
    }

    /// Like [`Tiers::new`], but a tier may have no region: the vhost-user
    /// device builds its tiers from what the frontend has mapped, which may
    /// be nothing yet (before `SET_MEM_TABLE`) or miss a tier's ranges.
    /// Every chain of an empty tier is rejected (`OutsideGuestMemory` or
    /// `WrongTier`).
    pub fn new_allow_empty(tiers: Vec<Vec<Region>>) -> Result<Tiers, LayoutError> {
        Self::build(tiers, true)
    }

    fn build(tiers: Vec<Vec<Region>>, allow_empty: bool) -> Result<Tiers, LayoutError> {
        if tiers.is_empty() || tiers.len() > MAX_TIERS {
            return Err(LayoutError::TierCount(tiers.len()));
        }
        let mut spans = Vec::new();
        for (t, regions) in tiers.iter().enumerate() {
            if regions.is_empty() && !allow_empty {
                return Err(LayoutError::EmptyTier(t));
            }
            for r in regions {
                spans.push(Span {
                    first_pfn: r.first_pfn(),
                    end_pfn: r.first_pfn() + r.pages(),
                    tier: t,
                });
            }
        }
        spans.sort_by_key(|s| s.first_pfn);
        for w in spans.windows(2) {
            if w[1].first_pfn < w[0].end_pfn {
                return Err(LayoutError::Overlap {
                    a: w[0].first_pfn << PAGE_SHIFT,
                    b: w[1].first_pfn << PAGE_SHIFT,
                });
            }
        }
        let layout: Arc<[Span]> = spans.into();
        let tiers = tiers
            .into_iter()
            .enumerate()
            .map(|(index, regions)| {
                let mut regions: Vec<RegionState> = regions
                    .into_iter()
                    .map(|region| RegionState {
                        first_pfn: region.first_pfn(),
                        end_pfn: region.first_pfn() + region.pages(),
                        bitmap: vec![0; region.pages().div_ceil(64) as usize],
                        region,
                    })
                    .collect();
                regions.sort_by_key(|r| r.first_pfn);
                TierBalloon {
                    index,
                    regions,
                    layout: Arc::clone(&layout),
                    stats: TierStats::default(),
                    bytes: Vec::new(),
                    pfns: Vec::new(),
                    plan: Vec::new(),
                }
            })
            .collect();
        Ok(Tiers { tiers })
    }

    pub fn len(&self) -> usize {
        self.tiers.len()
    }
    pub fn is_empty(&self) -> bool {
        self.tiers.is_empty()
    }
    pub fn tier(&self, i: usize) -> Option<&TierBalloon> {
        self.tiers.get(i)
    }
    pub fn tier_mut(&mut self, i: usize) -> Option<&mut TierBalloon> {
        self.tiers.get_mut(i)
    }
    /// One owner per tier, e.g. one thread per tier queue pair.
    pub fn into_tiers(self) -> Vec<TierBalloon> {
        self.tiers
    }
}

impl TierBalloon {
    pub fn index(&self) -> usize {
        self.index
    }
    pub fn stats(&self) -> &TierStats {
        &self.stats
    }
    /// This tier's regions, by ascending guest-physical address.
    pub fn regions(&self) -> impl Iterator<Item = &Region> {
        self.regions.iter().map(|r| &r.region)
    }
    /// Counts a chain the caller rejected before parsing it (e.g.
    /// [`RejectReason::BadDescriptor`], or [`RejectReason::TooLong`] decided
    /// from descriptor lengths without reading them) exactly like the
    /// engine's own rejections.
    pub fn count_rejected(&mut self, reason: RejectReason, pfns: usize) -> Rejected {
        self.reject(reason, None, pfns)
    }

    /// The PFNs in this tier's balloon, ascending.
    pub fn ballooned_pfns(&self) -> impl Iterator<Item = u64> + '_ {
        self.regions.iter().flat_map(|r| {
            r.bitmap.iter().enumerate().flat_map(move |(w, &bits)| {
                (0..64u64)
                    .filter(move |b| bits & (1u64 << b) != 0)
                    .map(move |b| r.first_pfn + w as u64 * 64 + b)
            })
        })
    }

    /// Takes over `old`'s counters and the balloon state of every page that
    /// is in both `old`'s and this tier's regions, without releasing
    /// anything (the pages were released when they were inflated). Used when
    /// the guest memory is mapped anew (`SET_MEM_TABLE`, `ADD_MEM_REG`).
    /// Returns the number of `old`'s ballooned pages that have no place
    /// here (no longer mapped): they leave the balloon.
    pub fn adopt(&mut self, old: &TierBalloon) -> u64 {
        self.stats = old.stats.clone();
        let (mut kept, mut dropped) = (0u64, 0u64);
        let mut ri = 0;
        for pfn in old.ballooned_pfns() {
            while ri < self.regions.len() && self.regions[ri].end_pfn <= pfn {
                ri += 1;
            }
            match self.regions.get_mut(ri) {
                Some(r) if r.first_pfn <= pfn => {
                    let page = pfn - r.first_pfn;
                    r.set(page, true);
                    kept += 1;
                }
                _ => dropped += 1,
            }
        }
        self.stats.ballooned_pages = kept;
        dropped
    }

    /// Empties the balloon without touching memory (the guest driver was
    /// reset or went away: it no longer holds those pages). Cumulative
    /// counters are kept.
    pub fn clear(&mut self) {
        for r in &mut self.regions {
            r.bitmap.iter_mut().for_each(|w| *w = 0);
        }
        self.stats.ballooned_pages = 0;
    }

    /// Whether the page at `pfn` is in this tier's balloon.
    pub fn is_ballooned(&self, pfn: u32) -> bool {
        let p = u64::from(pfn);
        self.regions
            .iter()
            .find(|r| r.first_pfn <= p && p < r.end_pfn)
            .is_some_and(|r| r.test(p - r.first_pfn))
    }

    /// Processes one descriptor chain given as its readable buffers in order
    /// (a PFN may straddle two buffers).
    pub fn process_chain(
        &mut self,
        op: Op,
        parts: &[&[u8]],
        rel: &mut dyn Releaser,
    ) -> Result<Outcome, Rejected> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if !total.is_multiple_of(4) {
            return Err(self.reject(RejectReason::MalformedLength, None, total / 4));
        }
        if total / 4 > MAX_CHAIN_PFNS {
            return Err(self.reject(RejectReason::TooLong, None, total / 4));
        }
        let mut pfns = std::mem::take(&mut self.pfns);
        pfns.clear();
        if let [one] = parts {
            pfns.extend(
                one.chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            );
        } else {
            let mut bytes = std::mem::take(&mut self.bytes);
            bytes.clear();
            for p in parts {
                bytes.extend_from_slice(p);
            }
            pfns.extend(
                bytes
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            );
            self.bytes = bytes;
        }
        let r = self.run(op, &mut pfns, rel);
        self.pfns = pfns;
        r
    }

    /// Processes one chain already parsed into PFNs.
    pub fn process_pfns(
        &mut self,
        op: Op,
        pfns: &[u32],
        rel: &mut dyn Releaser,
    ) -> Result<Outcome, Rejected> {
        if pfns.len() > MAX_CHAIN_PFNS {
            return Err(self.reject(RejectReason::TooLong, None, pfns.len()));
        }
        let mut buf = std::mem::take(&mut self.pfns);
        buf.clear();
        buf.extend_from_slice(pfns);
        let r = self.run(op, &mut buf, rel);
        self.pfns = buf;
        r
    }

    fn reject(&mut self, reason: RejectReason, pfn: Option<u32>, pfns: usize) -> Rejected {
        self.stats.rejected_chains[reason.index()] += 1;
        self.stats.rejected_pfns += pfns as u64;
        Rejected {
            tier: self.index,
            reason,
            pfn,
            pfns,
        }
    }

    fn classify_outside(&self, pfn: u64) -> RejectReason {
        let i = self.layout.partition_point(|s| s.end_pfn <= pfn);
        match self.layout.get(i) {
            Some(s) if s.first_pfn <= pfn && s.tier != self.index => RejectReason::WrongTier,
            _ => RejectReason::OutsideGuestMemory,
        }
    }

    fn run(
        &mut self,
        op: Op,
        pfns: &mut [u32],
        rel: &mut dyn Releaser,
    ) -> Result<Outcome, Rejected> {
        let n = pfns.len();
        pfns.sort_unstable();
        if let Some(w) = pfns.windows(2).find(|w| w[0] == w[1]) {
            let d = w[0];
            return Err(self.reject(RejectReason::DuplicateInChain, Some(d), n));
        }
        // Validate every PFN; build the plan. Sorted PFNs walk the sorted
        // regions once.
        let mut plan = std::mem::take(&mut self.plan);
        plan.clear();
        let mut ri = 0;
        for &pfn in pfns.iter() {
            let p = u64::from(pfn);
            while ri < self.regions.len() && self.regions[ri].end_pfn <= p {
                ri += 1;
            }
            let inside = self.regions.get(ri).filter(|r| r.first_pfn <= p);
            let Some(r) = inside else {
                let reason = self.classify_outside(p);
                self.plan = plan;
                return Err(self.reject(reason, Some(pfn), n));
            };
            let page = p - r.first_pfn;
            let bad = match op {
                Op::Inflate if r.test(page) => Some(RejectReason::AlreadyBallooned),
                Op::Deflate if !r.test(page) => Some(RejectReason::NotBallooned),
                _ => None,
            };
            if let Some(reason) = bad {
                self.plan = plan;
                return Err(self.reject(reason, Some(pfn), n));
            }
            plan.push((ri, page));
        }
        // Commit: accounting first, then release.
        for &(ri, page) in &plan {
            self.regions[ri].set(page, op == Op::Inflate);
        }
        match op {
            Op::Inflate => {
                self.stats.inflated_pfns += n as u64;
                self.stats.ballooned_pages += n as u64;
            }
            Op::Deflate => {
                self.stats.deflated_pfns += n as u64;
                self.stats.ballooned_pages -= n as u64;
            }
        }
        let mut out = Outcome {
            pages: n,
            ..Outcome::default()
        };
        let mut i = 0;
        while i < plan.len() {
            let ri = plan[i].0;
            let region = &self.regions[ri];
            if region.region.backing == Backing::Huge2M {
                // All of this chain's pages in this region, in order.
                let mut j = i;
                while j < plan.len() && plan[j].0 == ri {
                    j += 1;
                }
                if op == Op::Inflate {
                    // Each distinct block touched once; release the full
                    // ones, adjacent full blocks as one run.
                    let mut pending: Option<(u64, u64)> = None;
                    let mut last = None;
                    for &(_, page) in &plan[i..j] {
                        let b = page / PAGES_PER_HUGE;
                        if last == Some(b) || !region.block_full(b) {
                            last = Some(b);
                            continue;
                        }
                        last = Some(b);
                        pending = match pending {
                            Some((s, e)) if e == b => Some((s, e + 1)),
                            Some((s, e)) => {
                                Self::apply_blocks(&mut self.stats, &mut out, region, s, e, rel);
                                Some((b, b + 1))
                            }
                            None => Some((b, b + 1)),
                        };
                    }
                    if let Some((s, e)) = pending {
                        Self::apply_blocks(&mut self.stats, &mut out, region, s, e, rel);
                    }
                }
                // Huge2M deflate: nothing to do; the guest's touch faults a
                // huge page in (the rest of the block stays ballooned).
                i = j;
                continue;
            }
            let start = plan[i].1;
            let mut end = start + 1;
            i += 1;
            while i < plan.len() && plan[i] == (ri, end) {
                end += 1;
                i += 1;
            }
            Self::apply(
                &mut self.stats,
                &mut out,
                op,
                region,
                start,
                end - start,
                rel,
            );
        }
        self.plan = plan;
        Ok(out)
    }

    fn apply_blocks(
        stats: &mut TierStats,
        out: &mut Outcome,
        region: &RegionState,
        first_block: u64,
        end_block: u64,
        rel: &mut dyn Releaser,
    ) {
        let (page, pages) = (
            first_block * PAGES_PER_HUGE,
            (end_block - first_block) * PAGES_PER_HUGE,
        );
        Self::apply(stats, out, Op::Inflate, region, page, pages, rel);
    }

    fn apply(
        stats: &mut TierStats,
        out: &mut Outcome,
        op: Op,
        region: &RegionState,
        page: u64,
        pages: u64,
        rel: &mut dyn Releaser,
    ) {
        let Some(range) = HostRange::new(&region.region, page, pages) else {
            // Unreachable by construction (validated pages); never release.
            out.errors += 1;
            stats.release_errors += 1;
            return;
        };
        let r = match op {
            Op::Inflate => rel.release(&range),
            Op::Deflate => rel.reclaim(&range),
        };
        out.runs += 1;
        match r {
            Ok(()) => {
                out.host_pages += pages;
                if op == Op::Inflate {
                    stats.release_calls += 1;
                    stats.released_pages += pages;
                }
            }
            Err(_) => {
                out.errors += 1;
                stats.release_errors += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reject_reason_indices_match_all() {
        for (i, r) in RejectReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
    }

    #[test]
    fn layout_rejects_overlap_misalignment_and_past_eof() {
        let fd = memfd("t", 1 << 20, false).unwrap();
        let mk = |gpa, len| Region::map(fd.try_clone().unwrap(), 0, len, gpa, Backing::Small);
        assert!(matches!(
            mk(0x800, 4096),
            Err(LayoutError::BadRegion { .. })
        ));
        assert!(matches!(mk(0, 2 << 20), Err(LayoutError::BadRegion { .. })));
        assert!(matches!(
            Region::map(fd.try_clone().unwrap(), 0, 1 << 20, 0, Backing::Huge2M),
            Err(LayoutError::BadRegion { .. })
        ));
        let a = mk(0, 1 << 20).unwrap();
        let b = mk(0x80000, 1 << 20).unwrap();
        assert!(matches!(
            Tiers::new(vec![vec![a], vec![b]]),
            Err(LayoutError::Overlap { .. })
        ));
        assert!(matches!(Tiers::new(vec![]), Err(LayoutError::TierCount(0))));
    }
}
