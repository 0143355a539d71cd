#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose
//! The release engine on real memfds and real mappings: real punch-hole and
//! madvise, checked with mincore and st_blocks.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use tier_balloon::release::HUGE_PAGE_SIZE;
use tier_balloon::{
    Backing, HostRange, Op, PAGE_SIZE, Region, RejectReason, Releaser, SysReleaser, Tiers, memfd,
};

const MIB: u64 = 1 << 20;

/// Records every range (gpa, len) handed over, then does the real thing.
#[derive(Default)]
struct Recording {
    sys: SysReleaser,
    released: Vec<(u64, u64)>,
    reclaimed: Vec<(u64, u64)>,
}

impl Releaser for Recording {
    fn release(&mut self, r: &HostRange<'_>) -> io::Result<()> {
        self.released.push((r.gpa(), r.len()));
        self.sys.release(r)
    }
    fn reclaim(&mut self, r: &HostRange<'_>) -> io::Result<()> {
        self.reclaimed.push((r.gpa(), r.len()));
        self.sys.reclaim(r)
    }
}

/// Tier 0 ("dram"): memfd A, GPA [0, 1 MiB) at file offset 0 and
/// [2 MiB, 3 MiB) at file offset 1 MiB (a split zone, hole at 1-2 MiB).
/// Tier 1 ("slow"): memfd B, GPA [4 MiB, 6 MiB). Tier 2: memfd C,
/// GPA [8 MiB, 12 MiB) declared as 2 MiB huge-page backed.
fn layout() -> Tiers {
    let a = memfd("dram", 2 * MIB, false).unwrap();
    let b = memfd("slow", 2 * MIB, false).unwrap();
    let c = memfd("huge", 4 * MIB, false).unwrap();
    let r = |fd: &std::os::fd::OwnedFd, off, len, gpa, backing| {
        Region::map(fd.try_clone().unwrap(), off, len, gpa, backing).unwrap()
    };
    Tiers::new(vec![
        vec![
            r(&a, MIB, MIB, 2 * MIB, Backing::Small),
            r(&a, 0, MIB, 0, Backing::Small),
        ],
        vec![r(&b, 0, 2 * MIB, 4 * MIB, Backing::Small)],
        vec![r(&c, 0, 4 * MIB, 8 * MIB, Backing::Huge2M)],
    ])
    .unwrap()
}

/// Writes a non-zero byte into every page of every region.
fn populate(t: &Tiers) {
    for i in 0..t.len() {
        for r in t.tier(i).unwrap().regions() {
            for p in 0..r.len() / PAGE_SIZE {
                // SAFETY: inside the region's live read-write mapping.
                unsafe {
                    r.as_ptr()
                        .add((p * PAGE_SIZE) as usize)
                        .write_volatile(0xa5)
                };
            }
        }
    }
}

fn region_of(t: &Tiers, gpa: u64) -> &Region {
    (0..t.len())
        .flat_map(|i| t.tier(i).unwrap().regions())
        .find(|r| r.gpa() <= gpa && gpa < r.gpa() + r.len())
        .unwrap()
}

/// Residency of the page at `gpa` in its region's mapping (mincore).
fn resident(t: &Tiers, gpa: u64) -> bool {
    let r = region_of(t, gpa);
    let mut v = [0u8; 1];
    // SAFETY: page-aligned address inside a live mapping, 1-byte out vector.
    let rc = unsafe {
        libc::mincore(
            r.as_ptr().add((gpa - r.gpa()) as usize).cast(),
            PAGE_SIZE as usize,
            v.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "{}", io::Error::last_os_error());
    v[0] & 1 == 1
}

fn read_byte(t: &Tiers, gpa: u64) -> u8 {
    let r = region_of(t, gpa);
    // SAFETY: inside the region's live mapping.
    unsafe { r.as_ptr().add((gpa - r.gpa()) as usize).read_volatile() }
}

fn write_byte(t: &Tiers, gpa: u64, v: u8) {
    let r = region_of(t, gpa);
    // SAFETY: inside the region's live read-write mapping.
    unsafe { r.as_ptr().add((gpa - r.gpa()) as usize).write_volatile(v) }
}

/// 4 KiB pages allocated to the file behind `fd` (st_blocks is in 512 B).
fn file_pages(fd: BorrowedFd<'_>) -> u64 {
    // SAFETY: zeroed POD out buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out pointer.
    assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
    st.st_blocks as u64 * 512 / PAGE_SIZE
}

fn fd_pages(t: &Tiers, gpa: u64) -> u64 {
    file_pages(region_of(t, gpa).fd())
}

fn chain(pfns: &[u32]) -> Vec<u8> {
    pfns.iter().flat_map(|p| p.to_le_bytes()).collect()
}

fn pfn(gpa: u64) -> u32 {
    (gpa / PAGE_SIZE) as u32
}

#[test]
fn inflate_per_tier_releases_coalesced_runs_and_accounts() {
    let mut t = layout();
    populate(&t);
    assert_eq!(fd_pages(&t, 0), 512);
    assert_eq!(fd_pages(&t, 4 * MIB), 512);

    // Tier 0: 64 contiguous pages at GPA 0, two lone pages, and a run of 3 in
    // the second region; given unsorted. Expect 4 runs.
    let mut pfns: Vec<u32> = (0..64).rev().collect();
    pfns.extend([100, 102]);
    pfns.extend([
        pfn(2 * MIB + 8 * PAGE_SIZE),
        pfn(2 * MIB),
        pfn(2 * MIB + 4096),
    ]);
    pfns.push(pfn(2 * MIB + 2 * PAGE_SIZE));
    pfns.swap(3, 66);
    let mut rel = Recording::default();
    let out = t
        .tier_mut(0)
        .unwrap()
        .process_chain(Op::Inflate, &[&chain(&pfns)], &mut rel)
        .unwrap();
    assert_eq!(out.pages, 70);
    assert_eq!(out.errors, 0);
    assert_eq!(
        rel.released,
        vec![
            (0, 64 * PAGE_SIZE),
            (100 * PAGE_SIZE, PAGE_SIZE),
            (102 * PAGE_SIZE, PAGE_SIZE),
            (2 * MIB, 3 * PAGE_SIZE),
            (2 * MIB + 8 * PAGE_SIZE, PAGE_SIZE),
        ]
    );
    assert_eq!(out.runs, 5);
    assert_eq!(out.host_pages, 70);
    for &p in &pfns {
        let gpa = u64::from(p) * PAGE_SIZE;
        assert!(!resident(&t, gpa), "gpa {gpa:#x} still resident");
        assert!(t.tier(0).unwrap().is_ballooned(p));
    }
    for gpa in [64 * PAGE_SIZE, 101 * PAGE_SIZE, 2 * MIB + 3 * PAGE_SIZE] {
        assert!(resident(&t, gpa), "neighbour {gpa:#x} released");
        assert_eq!(read_byte(&t, gpa), 0xa5);
    }
    assert_eq!(fd_pages(&t, 0), 512 - 70);
    let s = t.tier(0).unwrap().stats().clone();
    assert_eq!(s.ballooned_pages, 70);
    assert_eq!(s.inflated_pfns, 70);
    assert_eq!(s.release_calls, 5);
    assert_eq!(s.released_pages, 70);
    assert_eq!(s.rejected_total(), 0);

    // Tier 1 is independent: its memfd untouched so far.
    assert_eq!(fd_pages(&t, 4 * MIB), 512);
    let slow: Vec<u32> = (0..256).map(|i| pfn(4 * MIB) + i).collect();
    let out = t
        .tier_mut(1)
        .unwrap()
        .process_pfns(Op::Inflate, &slow, &mut SysReleaser::default())
        .unwrap();
    assert_eq!((out.pages, out.runs), (256, 1));
    assert_eq!(fd_pages(&t, 4 * MIB), 256);
    assert!(!resident(&t, 4 * MIB + 255 * PAGE_SIZE));
    assert!(resident(&t, 4 * MIB + 256 * PAGE_SIZE));
    assert_eq!(t.tier(1).unwrap().stats().ballooned_pages, 256);
    assert_eq!(t.tier(0).unwrap().stats().ballooned_pages, 70);
}

#[test]
fn deflate_then_retouch_and_reinflate() {
    let mut t = layout();
    populate(&t);
    let pfns: Vec<u32> = (10..42).collect();
    let tier = t.tier_mut(0).unwrap();
    tier.process_pfns(Op::Inflate, &pfns, &mut SysReleaser::default())
        .unwrap();
    let mut rel = Recording::default();
    let out = tier
        .process_pfns(Op::Deflate, &pfns[..16], &mut rel)
        .unwrap();
    assert_eq!((out.pages, out.runs), (16, 1));
    assert_eq!(rel.reclaimed, vec![(10 * PAGE_SIZE, 16 * PAGE_SIZE)]);
    assert!(rel.released.is_empty());
    let s = tier.stats().clone();
    assert_eq!(
        (s.ballooned_pages, s.inflated_pfns, s.deflated_pfns),
        (16, 32, 16)
    );
    assert!(!tier.is_ballooned(10) && tier.is_ballooned(26));
    // Deflate released nothing by itself: still not resident, reads as zero,
    // a write faults a page in.
    assert!(!resident(&t, 10 * PAGE_SIZE));
    // (A read fault on a shmem hole allocates a zeroed page too.)
    assert_eq!(read_byte(&t, 10 * PAGE_SIZE), 0);
    write_byte(&t, 11 * PAGE_SIZE, 7);
    assert!(resident(&t, 11 * PAGE_SIZE));
    assert_eq!(read_byte(&t, 11 * PAGE_SIZE), 7);
    assert_eq!(fd_pages(&t, 0), 512 - 32 + 2);
    // Re-inflate the deflated half: accepted, releases again.
    let tier = t.tier_mut(0).unwrap();
    let out = tier
        .process_pfns(Op::Inflate, &pfns[..16], &mut SysReleaser::default())
        .unwrap();
    assert_eq!(out.runs, 1);
    assert_eq!(tier.stats().ballooned_pages, 32);
    assert!(!resident(&t, 11 * PAGE_SIZE));
    assert_eq!(fd_pages(&t, 0), 512 - 32);
    // v53.0's MADV_WILLNEED on deflate also works on a punched range.
    let mut willneed = SysReleaser {
        willneed_on_deflate: true,
    };
    let tier = t.tier_mut(0).unwrap();
    let out = tier
        .process_pfns(Op::Deflate, &pfns, &mut willneed)
        .unwrap();
    assert_eq!((out.runs, out.errors), (1, 0));
    assert_eq!(tier.stats().ballooned_pages, 0);
}

/// Every rejection: whole chain refused, counted by reason, nothing released
/// or accounted, even when all other PFNs of the chain are fine.
#[test]
fn each_rejection_reason_releases_nothing() {
    let mut t = layout();
    populate(&t);
    t.tier_mut(0)
        .unwrap()
        .process_pfns(Op::Inflate, &[5, 6], &mut SysReleaser::default())
        .unwrap();
    let good: Vec<u32> = (20..30).collect();
    let with = |extra: &[u32]| {
        let mut v = good.clone();
        v.extend_from_slice(extra);
        v
    };
    let cases: Vec<(Op, Vec<u8>, RejectReason, Option<u32>)> = vec![
        (
            Op::Inflate,
            chain(&good)[..39].to_vec(),
            RejectReason::MalformedLength,
            None,
        ),
        (
            Op::Inflate,
            chain(&vec![1u32; tier_balloon::MAX_CHAIN_PFNS + 1]),
            RejectReason::TooLong,
            None,
        ),
        // In the hole of the split zone (1-2 MiB): no tier's memory.
        (
            Op::Inflate,
            chain(&with(&[pfn(MIB + PAGE_SIZE)])),
            RejectReason::OutsideGuestMemory,
            Some(pfn(MIB + PAGE_SIZE)),
        ),
        (
            Op::Inflate,
            chain(&with(&[u32::MAX])),
            RejectReason::OutsideGuestMemory,
            Some(u32::MAX),
        ),
        // Last page of tier 1 and first of tier 2.
        (
            Op::Inflate,
            chain(&with(&[pfn(6 * MIB) - 1])),
            RejectReason::WrongTier,
            Some(pfn(6 * MIB) - 1),
        ),
        (
            Op::Deflate,
            chain(&[pfn(8 * MIB)]),
            RejectReason::WrongTier,
            Some(pfn(8 * MIB)),
        ),
        (
            Op::Inflate,
            chain(&with(&[25])),
            RejectReason::DuplicateInChain,
            Some(25),
        ),
        (
            Op::Inflate,
            chain(&with(&[6])),
            RejectReason::AlreadyBallooned,
            Some(6),
        ),
        (
            Op::Deflate,
            chain(&[5, 6, 7]),
            RejectReason::NotBallooned,
            Some(7),
        ),
    ];
    let before_blocks = fd_pages(&t, 0);
    for (n, (op, bytes, reason, pfn)) in cases.iter().enumerate() {
        let mut rel = Recording::default();
        let tier = t.tier_mut(0).unwrap();
        let before = tier.stats().clone();
        let e = tier.process_chain(*op, &[bytes], &mut rel).unwrap_err();
        assert_eq!(e.reason, *reason, "case {n}");
        assert_eq!(e.pfn, *pfn, "case {n}");
        assert_eq!(e.tier, 0);
        assert_eq!(e.pfns, bytes.len() / 4);
        assert!(
            rel.released.is_empty() && rel.reclaimed.is_empty(),
            "case {n}"
        );
        let s = tier.stats();
        assert_eq!(s.rejected(*reason), before.rejected(*reason) + 1);
        assert_eq!(
            s.rejected_pfns,
            before.rejected_pfns + (bytes.len() / 4) as u64
        );
        assert_eq!(
            (
                s.ballooned_pages,
                s.inflated_pfns,
                s.deflated_pfns,
                s.release_calls
            ),
            (2, 2, 0, 1)
        );
        assert!(tier.is_ballooned(5) && tier.is_ballooned(6) && !tier.is_ballooned(20));
        assert_eq!(fd_pages(&t, 0), before_blocks, "case {n}");
        assert!(resident(&t, 20 * PAGE_SIZE));
    }
    let s = t.tier(0).unwrap().stats();
    for r in RejectReason::ALL {
        let want = cases.iter().filter(|c| c.2 == r).count() as u64;
        assert_eq!(s.rejected(r), want, "{}", r.name());
    }
    // Other tiers untouched; the backend keeps serving afterwards.
    assert_eq!(t.tier(1).unwrap().stats().rejected_total(), 0);
    assert_eq!(fd_pages(&t, 4 * MIB), 512);
    t.tier_mut(0)
        .unwrap()
        .process_pfns(Op::Inflate, &good, &mut SysReleaser::default())
        .unwrap();
    assert_eq!(fd_pages(&t, 0), before_blocks - 10);
}

#[test]
fn a_pfn_may_straddle_descriptors() {
    let mut t = layout();
    populate(&t);
    let bytes = chain(&[7, 8, 9]);
    let mut rel = Recording::default();
    let out = t
        .tier_mut(0)
        .unwrap()
        .process_chain(
            Op::Inflate,
            &[&bytes[..5], &bytes[5..6], &bytes[6..]],
            &mut rel,
        )
        .unwrap();
    assert_eq!((out.pages, out.runs), (3, 1));
    assert_eq!(rel.released, vec![(7 * PAGE_SIZE, 3 * PAGE_SIZE)]);
    // Empty chain: accepted, does nothing.
    let out = t
        .tier_mut(0)
        .unwrap()
        .process_chain(Op::Inflate, &[], &mut rel)
        .unwrap();
    assert_eq!(out.pages, 0);
}

#[test]
fn huge_page_regions_release_only_whole_2m_blocks() {
    let mut t = layout();
    populate(&t);
    let base = pfn(8 * MIB);
    let per = (HUGE_PAGE_SIZE / PAGE_SIZE) as u32;
    let mut rel = Recording::default();
    let tier = t.tier_mut(2).unwrap();
    // 511 of the first block's 512 pages: accounted, nothing released.
    let first: Vec<u32> = (base..base + per - 1).collect();
    let out = tier.process_pfns(Op::Inflate, &first, &mut rel).unwrap();
    assert_eq!((out.pages, out.runs, out.host_pages), (511, 0, 0));
    assert!(rel.released.is_empty());
    assert_eq!(tier.stats().ballooned_pages, 511);
    assert!(resident(&t, 8 * MIB));
    // The last page completes the block: one 2 MiB release.
    let tier = t.tier_mut(2).unwrap();
    let out = tier
        .process_pfns(Op::Inflate, &[base + per - 1], &mut rel)
        .unwrap();
    assert_eq!((out.runs, out.host_pages), (1, 512));
    assert_eq!(rel.released, vec![(8 * MIB, HUGE_PAGE_SIZE)]);
    assert!(!resident(&t, 8 * MIB) && !resident(&t, 10 * MIB - PAGE_SIZE));
    assert!(resident(&t, 10 * MIB));
    // Deflate one page: nothing released, the page refaults on touch.
    let tier = t.tier_mut(2).unwrap();
    tier.process_pfns(Op::Deflate, &[base + 3], &mut rel)
        .unwrap();
    write_byte(&t, 8 * MIB + 3 * PAGE_SIZE, 1);
    // Re-inflating it completes the block again: released again.
    rel.released.clear();
    let tier = t.tier_mut(2).unwrap();
    tier.process_pfns(Op::Inflate, &[base + 3], &mut rel)
        .unwrap();
    assert_eq!(rel.released, vec![(8 * MIB, HUGE_PAGE_SIZE)]);
    assert!(!resident(&t, 8 * MIB + 3 * PAGE_SIZE));
}

#[test]
fn adjacent_full_huge_blocks_coalesce() {
    let mut t = layout();
    populate(&t);
    let base = pfn(8 * MIB);
    let all: Vec<u32> = (base..base + 1024).collect();
    let mut rel = Recording::default();
    let out = t
        .tier_mut(2)
        .unwrap()
        .process_pfns(Op::Inflate, &all, &mut rel)
        .unwrap();
    assert_eq!((out.runs, out.host_pages), (1, 1024));
    assert_eq!(rel.released, vec![(8 * MIB, 4 * MIB)]);
    assert_eq!(fd_pages(&t, 8 * MIB), 0);
}

#[test]
fn external_mapping_is_used_and_not_unmapped() {
    let fd = memfd("ext", MIB, false).unwrap();
    // SAFETY: fresh shared mapping of our own memfd.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            MIB as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let p = p.cast::<u8>();
    for i in 0..256 {
        // SAFETY: inside the 1 MiB mapping.
        unsafe { p.add(i * 4096).write_volatile(1) };
    }
    // SAFETY: p maps [0, 1 MiB) of fd shared and outlives the region (unmapped below).
    let region =
        unsafe { Region::from_mapping(fd.try_clone().unwrap(), 0, MIB, 0, p, Backing::Small) }
            .unwrap();
    let mut t = Tiers::new(vec![vec![region]]).unwrap();
    t.tier_mut(0)
        .unwrap()
        .process_pfns(Op::Inflate, &[1, 2], &mut SysReleaser::default())
        .unwrap();
    drop(t);
    assert_eq!(file_pages(std::os::fd::AsFd::as_fd(&fd)), 254);
    // SAFETY: still mapped (the region did not unmap it).
    assert_eq!(unsafe { p.add(4096).read_volatile() }, 0);
    // SAFETY: as above.
    assert_eq!(unsafe { p.read_volatile() }, 1);
    // SAFETY: our mapping, unmapped once.
    unsafe { libc::munmap(p.cast(), MIB as usize) };
}
