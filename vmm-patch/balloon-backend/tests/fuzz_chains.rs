#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose
//! Seeded property test over random descriptor chains: the real validator and
//! coalescer, with a releaser that checks every range it receives against the
//! registered regions (independently of the crate), and an independent model
//! of the expected decision (accept, or the reject reason and PFN) and of the
//! exact pages released. The first `REAL` cases of each run also do the real
//! punch-hole + madvise on the memfds, checked afterwards with mincore.
//!
//! Two tests x `CASES` (default 500,000 each, so 10^6 in total);
//! `TIER_BALLOON_FUZZ_CASES` overrides the per-test count.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use tier_balloon::release::HUGE_PAGE_SIZE;
use tier_balloon::{
    Backing, HostRange, MAX_CHAIN_PFNS, Op, PAGE_SIZE, Region, RejectReason, Releaser, SysReleaser,
    Tiers, memfd,
};

const MIB: u64 = 1 << 20;
const REAL: u64 = 20_000;
const TIERS: usize = 3;
/// Guest-physical space we draw "nearby" PFNs from (12 MiB of layout + 4 MiB).
const SPACE_PFNS: u32 = (16 * MIB / PAGE_SIZE) as u32;
const PER_HUGE: u64 = HUGE_PAGE_SIZE / PAGE_SIZE;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// A region as the test registered it, recorded independently of the crate.
#[derive(Clone, Copy)]
struct Reg {
    tier: usize,
    gpa: u64,
    len: u64,
    fd: RawFd,
    file_offset: u64,
    host: usize,
    huge: bool,
}

/// Checks each range against the regions of the tier being served.
struct Checking {
    regs: Vec<Reg>,
    tier: usize,
    real: Option<SysReleaser>,
    released: Vec<(u64, u64)>,
    reclaimed: Vec<(u64, u64)>,
    checked: u64,
    out_of_range: u64,
}

impl Checking {
    fn check(&mut self, r: &HostRange<'_>) {
        self.checked += 1;
        let ok = !r.is_empty()
            && r.len() % PAGE_SIZE == 0
            && self.regs.iter().any(|g| {
                let rel = r.gpa().wrapping_sub(g.gpa);
                g.tier == self.tier
                    && g.fd == r.fd().as_raw_fd()
                    && r.gpa() >= g.gpa
                    && rel % PAGE_SIZE == 0
                    && rel + r.len() <= g.len
                    && r.file_offset() == g.file_offset + rel
                    && r.host_addr() == g.host + rel as usize
                    && (!g.huge || (rel % HUGE_PAGE_SIZE == 0 && r.len() % HUGE_PAGE_SIZE == 0))
            });
        if !ok {
            self.out_of_range += 1;
        }
    }
}

impl Releaser for Checking {
    fn release(&mut self, r: &HostRange<'_>) -> io::Result<()> {
        self.check(r);
        self.released.push((r.gpa(), r.len()));
        match &mut self.real {
            Some(s) => s.release(r),
            None => Ok(()),
        }
    }
    fn reclaim(&mut self, r: &HostRange<'_>) -> io::Result<()> {
        self.check(r);
        self.reclaimed.push((r.gpa(), r.len()));
        match &mut self.real {
            Some(s) => s.reclaim(r),
            None => Ok(()),
        }
    }
}

/// Same layout as tests/release.rs: tier 0 split around a hole, tier 1,
/// tier 2 declared huge-page backed.
fn layout() -> (Tiers, Vec<Reg>, Vec<OwnedFd>) {
    let a = memfd("dram", 2 * MIB, false).unwrap();
    let b = memfd("slow", 2 * MIB, false).unwrap();
    let c = memfd("huge", 4 * MIB, false).unwrap();
    let spec = [
        (0, &a, 0, MIB, 0, false),
        (0, &a, MIB, MIB, 2 * MIB, false),
        (1, &b, 0, 2 * MIB, 4 * MIB, false),
        (2, &c, 0, 4 * MIB, 8 * MIB, true),
    ];
    let mut tiers: Vec<Vec<Region>> = (0..TIERS).map(|_| Vec::new()).collect();
    let mut regs = Vec::new();
    for (tier, fd, off, len, gpa, huge) in spec {
        let backing = if huge {
            Backing::Huge2M
        } else {
            Backing::Small
        };
        let r = Region::map(fd.try_clone().unwrap(), off, len, gpa, backing).unwrap();
        // Populate so that real releases have something to free.
        for p in 0..len / PAGE_SIZE {
            // SAFETY: inside the region's live read-write mapping.
            unsafe { r.as_ptr().add((p * PAGE_SIZE) as usize).write_volatile(1) };
        }
        regs.push(Reg {
            tier,
            gpa,
            len,
            fd: r.fd().as_raw_fd(),
            file_offset: off,
            host: r.as_ptr() as usize,
            huge,
        });
        tiers[tier].push(r);
    }
    (Tiers::new(tiers).unwrap(), regs, vec![a, b, c])
}

/// The independent model.
struct Model {
    regs: Vec<Reg>,
    /// Ballooned pages, per tier, indexed by PFN (all regions lie below
    /// `SPACE_PFNS`).
    ballooned: Vec<Vec<bool>>,
    /// Valid PFNs of each tier, ascending.
    pages: Vec<Vec<u32>>,
}

impl Model {
    fn is(&self, tier: usize, pfn: u32) -> bool {
        self.ballooned[tier]
            .get(pfn as usize)
            .copied()
            .unwrap_or(false)
    }

    fn reg_of(&self, pfn: u32) -> Option<&Reg> {
        let gpa = u64::from(pfn) * PAGE_SIZE;
        self.regs
            .iter()
            .find(|g| g.gpa <= gpa && gpa < g.gpa + g.len)
    }

    /// Expected decision for a chain of `bytes` bytes whose whole PFNs are `pfns`.
    fn expect(
        &self,
        tier: usize,
        op: Op,
        bytes: usize,
        pfns: &[u32],
    ) -> Result<(), (RejectReason, Option<u32>)> {
        if !bytes.is_multiple_of(4) {
            return Err((RejectReason::MalformedLength, None));
        }
        if pfns.len() > MAX_CHAIN_PFNS {
            return Err((RejectReason::TooLong, None));
        }
        let mut sorted = pfns.to_vec();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err((RejectReason::DuplicateInChain, Some(w[0])));
        }
        for &p in &sorted {
            match self.reg_of(p) {
                None => return Err((RejectReason::OutsideGuestMemory, Some(p))),
                Some(g) if g.tier != tier => return Err((RejectReason::WrongTier, Some(p))),
                Some(_) => {}
            }
            let b = self.is(tier, p);
            match op {
                Op::Inflate if b => return Err((RejectReason::AlreadyBallooned, Some(p))),
                Op::Deflate if !b => return Err((RejectReason::NotBallooned, Some(p))),
                _ => {}
            }
        }
        Ok(())
    }
}

fn gen_chain(rng: &mut Rng, m: &Model, tier: usize, op: Op) -> Vec<u32> {
    let len = match rng.below(1000) {
        0 => MAX_CHAIN_PFNS as u64 + 1 + rng.below(8),
        1..=20 => rng.below(600),
        _ => rng.below(48),
    } as usize;
    let pages = &m.pages[tier];
    let mut out = Vec::with_capacity(len);
    if rng.chance(500) {
        // Well-formed intent: contiguous scan from a random start over the
        // tier's pages in the state the op needs (duplicates impossible).
        let want_ballooned = op == Op::Deflate;
        let start = rng.below(pages.len() as u64) as usize;
        let stride = if rng.chance(700) {
            1
        } else {
            1 + rng.below(5) as usize
        };
        let mut i = start;
        let mut steps = 0;
        while out.len() < len && steps < pages.len().min(4 * len + 16) {
            let p = pages[i % pages.len()];
            if m.is(tier, p) == want_ballooned {
                out.push(p);
            }
            i += stride;
            steps += 1;
        }
        // Occasionally one poisoned entry at a random position.
        if !out.is_empty() && rng.chance(100) {
            let k = rng.below(out.len() as u64) as usize;
            out[k] = rng.next() as u32;
        }
    } else {
        for _ in 0..len {
            let p = match rng.below(100) {
                0..=59 => pages[rng.below(pages.len() as u64) as usize],
                60..=79 => rng.below(u64::from(SPACE_PFNS)) as u32,
                80..=84 => out.last().copied().unwrap_or(0),
                85..=89 => u32::MAX - rng.below(4) as u32,
                _ => rng.next() as u32,
            };
            out.push(p);
        }
    }
    out
}

fn runs_of(mut pages: Vec<u64>) -> Vec<(u64, u64)> {
    pages.sort_unstable();
    let mut v: Vec<(u64, u64)> = Vec::new();
    for p in pages {
        match v.last_mut() {
            Some((s, l)) if *s + *l == p => *l += 1,
            _ => v.push((p, 1)),
        }
    }
    v
}

fn fuzz(seed: u64) {
    let cases: u64 = std::env::var("TIER_BALLOON_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500_000);
    let (mut tiers, regs, _fds) = layout();
    let mut m = Model {
        pages: (0..TIERS)
            .map(|t| {
                regs.iter()
                    .filter(|g| g.tier == t)
                    .flat_map(|g| {
                        let f = (g.gpa / PAGE_SIZE) as u32;
                        f..f + (g.len / PAGE_SIZE) as u32
                    })
                    .collect()
            })
            .collect(),
        ballooned: vec![vec![false; SPACE_PFNS as usize]; TIERS],
        regs: regs.clone(),
    };
    let mut chk = Checking {
        regs,
        tier: 0,
        real: None,
        released: Vec::new(),
        reclaimed: Vec::new(),
        checked: 0,
        out_of_range: 0,
    };
    let mut rng = Rng(seed);
    let (mut accepted, mut rejected) = (0u64, [0u64; 7]);
    let mut bytes = Vec::new();
    for case in 0..cases {
        let tier = rng.below(TIERS as u64) as usize;
        let op = if rng.chance(550) {
            Op::Inflate
        } else {
            Op::Deflate
        };
        let pfns = gen_chain(&mut rng, &m, tier, op);
        bytes.clear();
        bytes.extend(pfns.iter().flat_map(|p| p.to_le_bytes()));
        if rng.chance(20) {
            bytes.truncate(bytes.len().saturating_sub(1 + rng.below(3) as usize));
        }
        let whole = &pfns[..bytes.len() / 4];
        let expected = m.expect(tier, op, bytes.len(), whole);
        chk.tier = tier;
        chk.real = (case < REAL).then(SysReleaser::default);
        chk.released.clear();
        chk.reclaimed.clear();
        // Split the chain into 1-3 descriptors at arbitrary byte offsets.
        let (c1, c2) = {
            let n = bytes.len() as u64 + 1;
            let (x, y) = (rng.below(n) as usize, rng.below(n) as usize);
            (x.min(y), x.max(y))
        };
        let parts: [&[u8]; 3] = [&bytes[..c1], &bytes[c1..c2], &bytes[c2..]];
        let got = tiers
            .tier_mut(tier)
            .unwrap()
            .process_chain(op, &parts, &mut chk);
        match (&got, &expected) {
            (Ok(out), Ok(())) => {
                accepted += 1;
                assert_eq!(out.pages, whole.len(), "case {case}");
                for &p in whole {
                    m.ballooned[tier][p as usize] = op == Op::Inflate;
                }
                // Expected ranges (in pages), per region, maximal runs.
                let mut want = Vec::new();
                for g in m.regs.iter().filter(|g| g.tier == tier) {
                    let (f, n) = (g.gpa / PAGE_SIZE, g.len / PAGE_SIZE);
                    let mine: Vec<u64> = whole
                        .iter()
                        .map(|&p| u64::from(p))
                        .filter(|p| (f..f + n).contains(p))
                        .collect();
                    if g.huge {
                        if op == Op::Inflate {
                            let blocks: BTreeSet<u64> =
                                mine.iter().map(|p| (p - f) / PER_HUGE).collect();
                            let full: Vec<u64> = blocks
                                .into_iter()
                                .filter(|b| {
                                    (0..PER_HUGE).all(|i| m.is(tier, (f + b * PER_HUGE + i) as u32))
                                })
                                .flat_map(|b| (0..PER_HUGE).map(move |i| f + b * PER_HUGE + i))
                                .collect();
                            want.extend(runs_of(full));
                        }
                    } else {
                        want.extend(runs_of(mine));
                    }
                }
                want.sort_unstable();
                let got_ranges: Vec<(u64, u64)> = match op {
                    Op::Inflate => &chk.released,
                    Op::Deflate => &chk.reclaimed,
                }
                .iter()
                .map(|&(g, l)| (g / PAGE_SIZE, l / PAGE_SIZE))
                .collect();
                let mut sorted = got_ranges.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, want, "case {case}: runs");
                assert_eq!(out.runs, got_ranges.len(), "case {case}");
                if op == Op::Inflate {
                    assert!(chk.reclaimed.is_empty());
                } else {
                    assert!(chk.released.is_empty());
                }
            }
            (Err(e), Err((reason, pfn))) => {
                rejected[e.reason as usize] += 1;
                assert_eq!((e.reason, e.pfn), (*reason, *pfn), "case {case}");
                assert!(
                    chk.released.is_empty() && chk.reclaimed.is_empty(),
                    "case {case}: a rejected chain released"
                );
            }
            _ => panic!("case {case}: got {got:?}, expected {expected:?} for {whole:?}"),
        }
        if case == REAL - 1 || case == cases - 1 {
            // Accounting agrees with the model.
            for t in 0..TIERS {
                let tb = tiers.tier(t).unwrap();
                let n = m.ballooned[t].iter().filter(|b| **b).count() as u64;
                assert_eq!(tb.stats().ballooned_pages, n);
                for &p in m.pages[t].iter().step_by(7) {
                    assert_eq!(tb.is_ballooned(p), m.is(t, p));
                }
            }
        }
        if case == REAL - 1 {
            // The real releases freed what the model says: every page that
            // is ballooned (small regions) or in a fully ballooned block
            // (huge regions) is not resident.
            for g in &m.regs {
                let n = (g.len / PAGE_SIZE) as usize;
                let mut v = vec![0u8; n];
                // SAFETY: the registered live mapping, one byte per page.
                let rc = unsafe { libc::mincore(g.host as *mut _, g.len as usize, v.as_mut_ptr()) };
                assert_eq!(rc, 0);
                let f = (g.gpa / PAGE_SIZE) as u32;
                for (i, r) in v.iter().enumerate() {
                    let p = f + i as u32;
                    let ballooned = if g.huge {
                        let b0 = f + ((i as u64 / PER_HUGE) * PER_HUGE) as u32;
                        (b0..b0 + PER_HUGE as u32).all(|q| m.is(g.tier, q))
                    } else {
                        m.is(g.tier, p)
                    };
                    if ballooned {
                        assert_eq!(r & 1, 0, "pfn {p:#x} ballooned but resident");
                    }
                }
            }
        }
    }
    assert_eq!(chk.out_of_range, 0, "out-of-range releases");
    let stats_rejected: u64 = (0..TIERS)
        .map(|t| tiers.tier(t).unwrap().stats().rejected_total())
        .sum();
    assert_eq!(stats_rejected, rejected.iter().sum::<u64>());
    eprintln!(
        "seed {seed:#x}: {cases} chains, {accepted} accepted, rejected by reason {rejected:?}, \
         {} ranges checked, 0 out of range, first {REAL} with real release",
        chk.checked
    );
    // Enough of each outcome to mean something.
    assert!(accepted > cases / 10, "{accepted}");
    for (i, r) in rejected.iter().enumerate() {
        assert!(*r > 0 || cases < 100_000, "reason {i} never hit");
    }
}

#[test]
fn fuzz_chains_seed_a() {
    fuzz(0x9e37_79b9_7f4a_7c15);
}

#[test]
fn fuzz_chains_seed_b() {
    fuzz(0xd1b5_4a32_d192_ed03);
}

/// Seeded property test of the descriptor-chain walker (`tier_balloon::
/// chain`) over random descriptor tables: random `next` indices (some past
/// the table), NEXT / WRITE / INDIRECT flags, indirect tables of random
/// (sometimes malformed) lengths, so loops of every shape occur. An
/// independent model follows the chain with a set of visited
/// (table, index) pairs; the walker must agree on the outcome (the
/// descriptors, or which kind of error), and never yield more than the
/// table sizes allow.
#[test]
fn fuzz_descriptor_walks() {
    use std::collections::HashSet;
    use tier_balloon::chain::{ChainError, Walker};
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    const TABLE: u64 = 0;
    const ITABLE: u64 = 0x10000;
    const NEXT: u16 = 1;
    const WRITE: u16 = 2;
    const INDIRECT: u16 = 4;
    /// (addr, len, flags, next)
    type Desc = (u64, u32, u16, u16);

    /// The model's verdict: the (addr, len, flags) walked, or the error.
    #[derive(Debug, PartialEq)]
    enum Want {
        Ok(Vec<(u64, u32, u16)>),
        Loop,
        Range,
        Nested,
        WithNext,
        BadLen,
    }

    fn model(direct: &[Desc], table: &[Desc], head: u16) -> Want {
        let mut seen: HashSet<(bool, u16)> = HashSet::new();
        let mut got = Vec::new();
        let (mut descs, mut indirect, mut idx) = (direct, false, head);
        loop {
            let Some(&(addr, len, flags, next)) = descs.get(usize::from(idx)) else {
                return Want::Range;
            };
            if !seen.insert((indirect, idx)) {
                return Want::Loop;
            }
            if flags & INDIRECT != 0 {
                if indirect {
                    return Want::Nested;
                }
                if flags & NEXT != 0 {
                    return Want::WithNext;
                }
                if len == 0 || len % 16 != 0 {
                    return Want::BadLen;
                }
                // Generated lengths never exceed the generated table.
                descs = &table[..(len / 16) as usize];
                (indirect, idx) = (true, 0);
                continue;
            }
            got.push((addr, len, flags));
            if flags & NEXT == 0 {
                return Want::Ok(got);
            }
            idx = next;
        }
    }

    fn random_table(rng: &mut Rng, n: u16, k: u16, indirect_per_mille: u64) -> Vec<Desc> {
        (0..n)
            .map(|_| {
                let mut flags = 0;
                if rng.chance(800) {
                    flags |= NEXT;
                }
                if rng.chance(30) {
                    flags |= WRITE;
                }
                let (mut addr, mut len) = (rng.below(0x1000) * 4, rng.below(64) as u32 * 4);
                if rng.chance(indirect_per_mille) {
                    flags |= INDIRECT;
                    if rng.chance(700) {
                        flags &= !NEXT;
                    }
                    addr = ITABLE;
                    len = if rng.chance(900) {
                        16 * (1 + rng.below(u64::from(k)) as u32)
                    } else {
                        // Malformed: zero or not a multiple of 16.
                        [0, 8, 17, 31][rng.below(4) as usize]
                    };
                }
                let next = if rng.chance(950) {
                    rng.below(u64::from(n)) as u16
                } else {
                    n + rng.below(3) as u16
                };
                (addr, len, flags, next)
            })
            .collect()
    }

    let cases: u64 = std::env::var("TIER_BALLOON_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let mem: GuestMemoryMmap<()> =
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x20000)]).unwrap();
    let mut rng = Rng(0x5eed_c4a1);
    let mut walker = Walker::default();
    let mut out = Vec::new();
    let (mut loops, mut accepted) = (0u64, 0u64);
    for _ in 0..cases {
        let q = 1 + rng.below(64) as u16;
        let k = 1 + rng.below(16) as u16;
        let direct = random_table(&mut rng, q, k, 60);
        let table = random_table(&mut rng, k, k, 10);
        for (base, descs) in [(TABLE, &direct), (ITABLE, &table)] {
            for (i, &(addr, len, flags, next)) in descs.iter().enumerate() {
                let mut d = [0u8; 16];
                d[0..8].copy_from_slice(&addr.to_le_bytes());
                d[8..12].copy_from_slice(&len.to_le_bytes());
                d[12..14].copy_from_slice(&flags.to_le_bytes());
                d[14..16].copy_from_slice(&next.to_le_bytes());
                mem.write_slice(&d, GuestAddress(base + 16 * i as u64))
                    .unwrap();
            }
        }
        let head = rng.below(u64::from(q)) as u16;
        let want = model(&direct, &table, head);
        let got = match walker.walk(&mem, GuestAddress(TABLE), q, head, &mut out) {
            Ok(()) => Want::Ok(
                out.iter()
                    .map(|d| (d.addr().0, d.len(), d.flags()))
                    .collect(),
            ),
            Err(ChainError::Loop { .. }) => Want::Loop,
            Err(ChainError::IndexOutOfRange { .. }) => Want::Range,
            Err(ChainError::NestedIndirect) => Want::Nested,
            Err(ChainError::IndirectWithNext) => Want::WithNext,
            Err(ChainError::BadIndirectLength(_)) => Want::BadLen,
            Err(e) => panic!("unexpected {e}"),
        };
        assert_eq!(got, want, "q {q} k {k} head {head}");
        match got {
            Want::Ok(v) => {
                accepted += 1;
                assert!(v.len() <= usize::from(q) + usize::from(k));
            }
            Want::Loop => loops += 1,
            _ => {}
        }
    }
    // The generator must exercise both sides.
    assert!(
        loops > cases / 20 && accepted > cases / 20,
        "loops {loops} accepted {accepted} of {cases}"
    );
    println!("{cases} walks: {loops} loops, {accepted} accepted");
}
