//! Sampling by folio: which host folios an ageing pass marks idle, and how
//! many pages each stands for.
//!
//! page_idle acts on whole folios (6.12's `page_idle_get_folio` ignores
//! tail pages; 6.1's `page_idle_get_page` ages the whole folio from any of
//! them; mm/page_idle.c), and KVM ages every SPTE of the folio's range.
//! Marking every `stride`-th page of a THP-backed range idle would age each
//! 2 MiB folio whole while counting only 512/stride pages as sampled: young
//! counts inflated up to ×stride. Here a folio is the unit: it is taken whole (all its pages
//! count as sampled) with probability 1/stride, so every page still has the
//! same chance 1/stride of being in the sample and young/sampled stays an
//! unbiased ratio.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// `/proc/kpageflags`: one u64 of KPF_* bits per PFN (needs CAP_SYS_ADMIN).
pub const KPAGEFLAGS: &str = "/proc/kpageflags";

// include/uapi/linux/kernel-page-flags.h
const KPF_LRU: u64 = 1 << 5;
const KPF_COMPOUND_HEAD: u64 = 1 << 15;
const KPF_COMPOUND_TAIL: u64 = 1 << 16;
const KPF_HUGE: u64 = 1 << 17;
const KPF_ZERO_PAGE: u64 = 1 << 24;

/// Largest folio looked for: a PMD THP (512 pages of 4 KiB). Larger
/// compound pages (1 GiB hugetlb) are hugetlb, refused before this matters.
const MAX_FOLIO: u64 = 512;

/// What the host page at one PFN is, for ageing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageKind {
    /// A folio page_idle can age: head PFN and its size in pages.
    Folio { head: u64, pages: u64 },
    /// A hugetlb page: not on the LRU, so page_idle never ages it.
    Hugetlb,
    /// Not on the LRU (zero page, isolated, driver memory): not ageable now.
    NotLru,
}

/// Reads `/proc/kpageflags`.
#[derive(Debug)]
pub struct PageFlags(File);

impl PageFlags {
    pub fn open() -> std::io::Result<PageFlags> {
        File::open(KPAGEFLAGS)
            .map(PageFlags)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{KPAGEFLAGS}: {e}")))
    }

    fn read(&self, first: u64, out: &mut [u64]) -> std::io::Result<()> {
        let mut buf = vec![0u8; out.len() * 8];
        self.0.read_exact_at(&mut buf, first * 8)?;
        for (o, b) in out.iter_mut().zip(buf.chunks_exact(8)) {
            let mut w = [0u8; 8];
            w.copy_from_slice(b);
            *o = u64::from_ne_bytes(w);
        }
        Ok(())
    }

    /// The folio `pfn` belongs to.
    pub fn kind(&self, pfn: u64) -> std::io::Result<PageKind> {
        let mut one = [0u64; 1];
        self.read(pfn, &mut one)?;
        let f = one[0];
        if f & (KPF_COMPOUND_HEAD | KPF_COMPOUND_TAIL) == 0 {
            return Ok(classify(f, pfn, 1));
        }
        // Folios are naturally aligned: read the aligned block that holds
        // any folio up to MAX_FOLIO and walk to its head and end.
        let base = pfn & !(MAX_FOLIO - 1);
        let mut block = vec![0u64; MAX_FOLIO as usize];
        self.read(base, &mut block)?;
        Ok(folio_in_block(&block, base, pfn))
    }
}

fn classify(flags: u64, head: u64, pages: u64) -> PageKind {
    if flags & KPF_HUGE != 0 {
        PageKind::Hugetlb
    } else if flags & KPF_LRU == 0 || flags & KPF_ZERO_PAGE != 0 {
        PageKind::NotLru
    } else {
        PageKind::Folio { head, pages }
    }
}

/// The folio holding `pfn` from the flags of the aligned block at `base`.
fn folio_in_block(block: &[u64], base: u64, pfn: u64) -> PageKind {
    let at = (pfn - base) as usize;
    let mut head = at;
    while head > 0 && block[head] & KPF_COMPOUND_TAIL != 0 {
        head -= 1;
    }
    let mut end = head + 1;
    while end < block.len() && block[end] & KPF_COMPOUND_TAIL != 0 {
        end += 1;
    }
    // LRU and hugetlb are flags of the head (fs/proc/page.c reads the
    // folio's flags for every page, but the head is the one that counts).
    classify(block[head], base + head as u64, (end - head) as u64)
}

/// A 64-bit mix (splitmix64's finaliser): spreads head PFNs evenly.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Whether a folio reached through the stride grid joins the sample.
///
/// A folio of `pages` >= `stride` is met by the grid on every pass, so it
/// is kept with probability 1/stride; a smaller one is met with
/// probability pages/stride and kept with 1/pages. Either way each page is
/// in the sample with probability 1/stride. The choice hashes the head PFN,
/// so the same folios are aged pass after pass, like the grid's pages.
pub fn keep(head: u64, pages: u64, stride: u64) -> bool {
    let m = pages.min(stride).max(1);
    m == 1 || mix(head).is_multiple_of(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LRU: u64 = KPF_LRU;

    #[test]
    fn a_tail_page_leads_to_its_head_and_size() {
        // Block: small page, 4-page folio at 4, 8-page folio at 8.
        let mut b = vec![LRU; 16];
        b[4] |= KPF_COMPOUND_HEAD;
        for t in &mut b[5..8] {
            *t |= KPF_COMPOUND_TAIL;
        }
        b[8] |= KPF_COMPOUND_HEAD;
        for t in &mut b[9..16] {
            *t |= KPF_COMPOUND_TAIL;
        }
        assert_eq!(
            folio_in_block(&b, 1024, 1024 + 6),
            PageKind::Folio {
                head: 1028,
                pages: 4
            }
        );
        assert_eq!(
            folio_in_block(&b, 1024, 1024 + 8),
            PageKind::Folio {
                head: 1032,
                pages: 8
            }
        );
        assert_eq!(
            folio_in_block(&b, 1024, 1024 + 15),
            PageKind::Folio {
                head: 1032,
                pages: 8
            }
        );
    }

    #[test]
    fn hugetlb_and_non_lru_pages_are_named() {
        assert_eq!(
            classify(KPF_HUGE | KPF_COMPOUND_HEAD, 0, 512),
            PageKind::Hugetlb
        );
        assert_eq!(classify(0, 7, 1), PageKind::NotLru);
        assert_eq!(classify(LRU | KPF_ZERO_PAGE, 7, 1), PageKind::NotLru);
        assert_eq!(classify(LRU, 7, 1), PageKind::Folio { head: 7, pages: 1 });
    }

    #[test]
    fn every_page_has_the_same_chance_whatever_its_folio() {
        // Folios of 512 pages met by a stride-8 grid on every pass: about
        // 1/8 of them kept. Folios of 2 pages met with probability 2/8,
        // kept with 1/2: 1/8 of pages overall.
        let stride = 8;
        let big = (0..20_000u64)
            .filter(|h| keep(h * 512, 512, stride))
            .count() as f64;
        assert!((big / 20_000.0 - 0.125).abs() < 0.01, "{big}");
        let small = (0..20_000u64).filter(|h| keep(h * 2, 2, stride)).count() as f64;
        assert!((small / 20_000.0 - 0.5).abs() < 0.02, "{small}");
        // Single pages are kept whenever the grid meets them.
        assert!((0..100).all(|p| keep(p, 1, stride)));
        // Stride 1: everything.
        assert!((0..100).all(|p| keep(p * 512, 512, 1)));
    }

    #[test]
    #[cfg_attr(
        not(has_kpageflags),
        ignore = "needs CAP_SYS_ADMIN for PFNs and /proc/kpageflags"
    )]
    fn kpageflags_of_this_process_names_its_pages() {
        let flags = PageFlags::open().unwrap();
        let v = vec![1u8; 1 << 16];
        let page = (v.as_ptr() as u64).next_multiple_of(4096);
        let pagemap = File::open("/proc/self/pagemap").unwrap();
        let mut e = [0u8; 8];
        pagemap.read_exact_at(&mut e, page / 4096 * 8).unwrap();
        let pfn = u64::from_ne_bytes(e) & ((1 << 55) - 1);
        assert_ne!(pfn, 0, "root sees PFNs");
        match flags.kind(pfn).unwrap() {
            PageKind::Folio { head, pages } => {
                assert!(head <= pfn && pfn < head + pages, "{head} {pages} {pfn}");
            }
            // Just faulted anonymous pages may sit in a per-CPU LRU batch.
            PageKind::NotLru => {}
            PageKind::Hugetlb => panic!("a Vec is never hugetlb"),
        }
    }
}
