//! The ageing driver of the EPT backends: tierd marks a sample of each VM's
//! guest pages idle in `/sys/kernel/mm/page_idle/bitmap`. For every page
//! that is young, the kernel clears the young bits through the MMU notifier,
//! which runs `kvm_age_gfn` (and, with the TDP MMU, emits
//! `kvm_tdp_mmu_spte_changed` per young SPTE) in tierd's own thread: that is
//! what the BPF programs count, attributed to the VM tierd is ageing.
//!
//! PFNs come from `/proc/PID/pagemap` and folios from `/proc/kpageflags`
//! (both need CAP_SYS_ADMIN; without it pagemap reports PFN 0, refused).
//! The sample is taken by folio ([`super::folio`]).

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::folio::{self, PageFlags, PageKind};

/// The kernel's idle-page bitmap (CONFIG_IDLE_PAGE_TRACKING).
pub const BITMAP: &str = "/sys/kernel/mm/page_idle/bitmap";
const PAGE: u64 = 4096;
const PRESENT: u64 = 1 << 63;
const PFN_MASK: u64 = (1 << 55) - 1;
/// pagemap entries read per pread.
const CHUNK: u64 = 8192;

/// What one ageing pass takes from a range.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSample {
    /// Pages the taken folios hold inside the range: the pages examined.
    pub pages: u64,
    /// Head PFN of each taken folio: what is marked idle.
    pub heads: Vec<u64>,
    /// Each taken folio's `[start, end)` host virtual addresses inside the
    /// range, in address order: the DAMON driver's regions.
    pub extents: Vec<(u64, u64)>,
}

/// Why a range cannot be sampled by page_idle.
#[derive(Debug, thiserror::Error)]
pub enum RangeError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(
        "pagemap shows pages present without PFNs: tierd lacks CAP_SYS_ADMIN \
         (fs/proc/task_mmu.c hides PFNs without it)"
    )]
    PfnsHidden,
    #[error(
        "guest memory is hugetlbfs-backed: page_idle ages LRU folios only \
         (mm/page_idle.c page_idle_get_folio), hugetlb pages never \
         (the DAMON ageing driver handles them)"
    )]
    Hugetlb,
}

/// Takes the folios of `[hva, hva + len)` met by every `stride`-th page and
/// kept by [`folio::keep`]; `seen` holds heads already taken this pass (a
/// folio met twice counts once). Pages not present, or not on the LRU,
/// are left out.
pub fn sample_range(
    pagemap: &File,
    flags: &PageFlags,
    hva: u64,
    len: u64,
    stride: u64,
    seen: &mut HashSet<u64>,
) -> Result<RangeSample, RangeError> {
    let stride = stride.max(1);
    let pages = len / PAGE;
    let mut out = RangeSample::default();
    // The folio of the previous grid page: grid pages inside the same
    // folio (a THP met 512 / stride times) need no second kpageflags read.
    let mut last: Option<(u64, u64)> = None;
    for (index, entry) in grid_entries(pagemap, hva / PAGE, pages, stride)? {
        if entry & PRESENT == 0 {
            continue;
        }
        let pfn = entry & PFN_MASK;
        if pfn == 0 {
            return Err(RangeError::PfnsHidden);
        }
        let (head, size) = match last.filter(|&(h, n)| (h..h + n).contains(&pfn)) {
            Some(f) => f,
            None => match flags.kind(pfn)? {
                PageKind::Folio { head, pages } => (head, pages),
                PageKind::Hugetlb => return Err(RangeError::Hugetlb),
                PageKind::NotLru => continue,
            },
        };
        last = Some((head, size));
        if !folio::keep(head, size, stride) || !seen.insert(head) {
            continue;
        }
        // The folio's pages around `index`, clipped to the range.
        let first = index.saturating_sub(pfn - head);
        let last = (first + size).min(pages);
        out.pages += last - first;
        out.heads.push(head);
        out.extents.push((hva + first * PAGE, hva + last * PAGE));
    }
    Ok(out)
}

/// Strides from this one on read one pagemap entry per grid page; below
/// it, whole chunks (one syscall costs about what 32 entries do).
const SPARSE_FROM: u64 = 32;

/// (index, pagemap entry) of every `stride`-th page from `first`: the
/// pagemap work is O(pages / stride) once the stride is large.
fn grid_entries(
    pagemap: &File,
    first: u64,
    pages: u64,
    stride: u64,
) -> std::io::Result<Vec<(u64, u64)>> {
    let mut out = Vec::with_capacity((pages / stride + 1) as usize);
    let mut w = [0u8; 8];
    if stride >= SPARSE_FROM {
        for index in (0..pages).step_by(stride as usize) {
            pagemap.read_exact_at(&mut w, (first + index) * 8)?;
            out.push((index, u64::from_ne_bytes(w)));
        }
        return Ok(out);
    }
    let mut buf = vec![0u8; (CHUNK * 8) as usize];
    let mut start = 0;
    while start < pages {
        let n = CHUNK.min(pages - start);
        let bytes = &mut buf[..(n * 8) as usize];
        pagemap.read_exact_at(bytes, (first + start) * 8)?;
        for (i, e) in bytes.chunks_exact(8).enumerate() {
            let index = start + i as u64;
            if index.is_multiple_of(stride) {
                w.copy_from_slice(e);
                out.push((index, u64::from_ne_bytes(w)));
            }
        }
        start += n;
    }
    Ok(out)
}

/// The bitmap words (index -> bits) that mark `pfns` idle.
pub fn words(pfns: impl IntoIterator<Item = u64>) -> BTreeMap<u64, u64> {
    let mut out = BTreeMap::new();
    for pfn in pfns {
        *out.entry(pfn / 64).or_insert(0) |= 1 << (pfn % 64);
    }
    out
}

/// The open idle-page bitmap.
#[derive(Debug)]
pub struct Bitmap(File);

impl Bitmap {
    /// Opens the bitmap read-write; the error names the file.
    pub fn open(path: &Path) -> std::io::Result<Bitmap> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map(Bitmap)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
    }

    /// Marks the pages idle: one write per run of nearby words (offset and
    /// length multiples of 8, as the kernel requires); the zero words
    /// filling a gap mark nothing. Returns the writes made.
    pub fn mark_idle(&self, words: &BTreeMap<u64, u64>) -> std::io::Result<usize> {
        let runs = runs(words);
        for (first, buf) in &runs {
            self.0.write_all_at(buf, first * 8)?;
        }
        Ok(runs.len())
    }

    /// Whether each of `heads` is still idle (not accessed since it was
    /// marked): one read per run of nearby words. Reading makes the kernel
    /// test (and clear) the young bits of folios still marked idle, through
    /// the MMU notifier: call it while the ager is the scan owner.
    pub fn idle(&self, heads: &[u64]) -> std::io::Result<Vec<bool>> {
        let mut buf = IdleBuf::default();
        self.idle_into(heads, &mut buf)?;
        Ok(buf.idle)
    }

    /// [`Bitmap::idle`] into `buf`, whose vectors are kept between passes:
    /// nothing is allocated once they have grown to the sample.
    pub fn idle_into<'a>(
        &self,
        heads: &[u64],
        buf: &'a mut IdleBuf,
    ) -> std::io::Result<&'a [bool]> {
        let IdleBuf {
            index,
            bits,
            bytes,
            idle,
        } = buf;
        // The words to read: sorted, each once.
        index.clear();
        index.extend(heads.iter().map(|pfn| pfn / 64));
        index.sort_unstable();
        index.dedup();
        // Runs of words closer than MAX_GAP_WORDS, one read each; `bits`
        // gets every word of each run, in order.
        bits.clear();
        let mut i = 0;
        while let Some(&first) = index.get(i) {
            let mut last = first;
            i += 1;
            while let Some(&w) = index.get(i).filter(|&&w| w - last <= MAX_GAP_WORDS + 1) {
                last = w;
                i += 1;
            }
            let len = ((last - first + 1) * 8) as usize;
            bytes.clear();
            bytes.resize(len, 0);
            self.0.read_exact_at(bytes, first * 8)?;
            bits.extend(bytes.chunks_exact(8).enumerate().map(|(k, w)| {
                let mut b = [0u8; 8];
                b.copy_from_slice(w);
                (first + k as u64, u64::from_ne_bytes(b))
            }));
        }
        idle.clear();
        idle.extend(heads.iter().map(|pfn| {
            bits.binary_search_by_key(&(pfn / 64), |b| b.0)
                .ok()
                .and_then(|k| bits.get(k))
                .is_some_and(|b| b.1 & (1 << (pfn % 64)) != 0)
        }));
        Ok(idle)
    }

    /// A bitmap stand-in at `path` (a plain file), for timing the writes
    /// where the kernel has no page_idle.
    pub fn stand_in(path: &Path) -> std::io::Result<Bitmap> {
        Bitmap::open(path)
    }
}

/// Scratch of [`Bitmap::idle_into`], kept by the caller between passes.
#[derive(Debug, Default)]
pub struct IdleBuf {
    /// Word indexes to read, sorted and deduplicated.
    index: Vec<u64>,
    /// (word index, bits) of every word read, ascending.
    bits: Vec<(u64, u64)>,
    /// One run's bytes.
    bytes: Vec<u8>,
    /// The answer, one per head.
    idle: Vec<bool>,
}

/// Words closer than this are written in one call (a syscall costs about
/// what writing 64 bytes of zeros does; a 2 MiB THP head is 8 words on).
const MAX_GAP_WORDS: u64 = 16;

/// Runs of words as (first word index, bytes), gaps up to MAX_GAP_WORDS
/// filled with zero words.
fn runs(words: &BTreeMap<u64, u64>) -> Vec<(u64, Vec<u8>)> {
    let mut out: Vec<(u64, Vec<u8>)> = Vec::new();
    for (&idx, bits) in words {
        match out.last_mut() {
            Some((first, buf)) if idx - (*first + buf.len() as u64 / 8) <= MAX_GAP_WORDS => {
                let end = *first + buf.len() as u64 / 8;
                buf.resize(buf.len() + ((idx - end) * 8) as usize, 0);
                buf.extend_from_slice(&bits.to_ne_bytes());
            }
            _ => out.push((idx, bits.to_ne_bytes().to_vec())),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_bits_read_back_per_head_from_a_stand_in() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bitmap");
        std::fs::write(&path, vec![0u8; 64 * 8]).unwrap();
        let b = Bitmap::stand_in(&path).unwrap();
        b.mark_idle(&words([3, 64, 200, 4000])).unwrap();
        // 5 and 201 were never marked; the rest read idle.
        let idle = b.idle(&[3, 5, 64, 200, 201, 4000]).unwrap();
        assert_eq!(idle, vec![true, false, true, true, false, true]);
    }

    /// The per-pass read reuses its scratch: the same sample read again
    /// allocates nothing (the answer stays in the same buffer) and answers
    /// as the allocating read does, across runs and gaps between words.
    #[test]
    fn idle_into_reuses_its_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bitmap");
        std::fs::write(&path, vec![0u8; 4096 * 8]).unwrap();
        let b = Bitmap::stand_in(&path).unwrap();
        let heads = [4000u64, 3, 64, 200, 5, 201, 64 * 40, 64 * 4000 + 7];
        b.mark_idle(&words([3, 64, 200, 4000, 64 * 4000 + 7]))
            .unwrap();
        let want = vec![true, true, true, true, false, false, false, true];
        let mut buf = IdleBuf::default();
        let first = b.idle_into(&heads, &mut buf).unwrap().to_vec();
        assert_eq!(first, want);
        assert_eq!(b.idle(&heads).unwrap(), want);
        let at = (buf.idle.as_ptr(), buf.bits.as_ptr(), buf.index.as_ptr());
        let caps = (
            buf.idle.capacity(),
            buf.bits.capacity(),
            buf.bytes.capacity(),
        );
        let again = b.idle_into(&heads, &mut buf).unwrap();
        assert_eq!(again, want.as_slice());
        assert_eq!(
            (buf.idle.as_ptr(), buf.bits.as_ptr(), buf.index.as_ptr()),
            at
        );
        assert_eq!(
            (
                buf.idle.capacity(),
                buf.bits.capacity(),
                buf.bytes.capacity()
            ),
            caps
        );
    }

    #[test]
    fn words_group_pfns_by_64() {
        let w = words([0, 1, 63, 64, 130, 130]);
        assert_eq!(
            w,
            BTreeMap::from([(0, 1 | 2 | (1 << 63)), (1, 1), (2, 1 << 2)])
        );
    }

    /// An aligned, page-granular buffer of `pages` pages, freshly mapped:
    /// a heap allocation of this size may reuse pages the test process
    /// touched before (glibc raises its mmap threshold after large frees),
    /// and pages the test never wrote must not be present.
    struct Buf {
        map: *mut libc::c_void,
        len: usize,
        off: usize,
    }

    impl Buf {
        fn new(pages: u64, align: u64) -> Buf {
            let len = (pages * PAGE + align) as usize;
            // SAFETY: a new private anonymous mapping; no existing memory
            // is affected. Checked against MAP_FAILED below.
            let map = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(map, libc::MAP_FAILED, "mmap");
            let off = ((map as u64).next_multiple_of(align) - map as u64) as usize;
            Buf { map, len, off }
        }
        fn base(&self) -> u64 {
            self.map as u64 + self.off as u64
        }
        fn touch(&mut self, page: u64) {
            let at = self.off + (page * PAGE) as usize;
            assert!(at < self.len);
            // SAFETY: `at` is inside the mapping (checked), which is
            // readable and writable and owned by this Buf.
            unsafe { (self.map as *mut u8).add(at).write_volatile(1) };
        }
    }

    impl Drop for Buf {
        fn drop(&mut self) {
            // SAFETY: unmaps exactly the mapping this Buf created.
            unsafe { libc::munmap(self.map, self.len) };
        }
    }

    /// One pass over `b`'s pages with nothing taken yet.
    fn fresh(pagemap: &File, flags: &PageFlags, b: &Buf, pages: u64, stride: u64) -> RangeSample {
        sample_range(
            pagemap,
            flags,
            b.base(),
            pages * PAGE,
            stride,
            &mut HashSet::new(),
        )
        .unwrap()
    }

    #[test]
    #[cfg_attr(
        not(has_kpageflags),
        ignore = "needs CAP_SYS_ADMIN for PFNs and /proc/kpageflags"
    )]
    fn touched_small_pages_are_sampled_on_the_grid() {
        let pages = 1024u64;
        let mut b = Buf::new(pages, PAGE);
        // Touch the even pages only; the odd ones were never written, so
        // a fresh anonymous mapping has them not present.
        for i in (0..pages).step_by(2) {
            b.touch(i);
        }
        let pagemap = File::open("/proc/self/pagemap").unwrap();
        let flags = PageFlags::open().unwrap();
        let mut seen = HashSet::new();
        let all = sample_range(&pagemap, &flags, b.base(), pages * PAGE, 1, &mut seen).unwrap();
        // Freshly faulted pages may still sit in a per-CPU LRU batch (not
        // on the LRU yet, at most 15 per CPU): all but those are taken.
        assert!(all.pages <= pages / 2, "{all:?}");
        assert!(all.pages >= pages / 2 - 64, "{all:?}");
        assert_eq!(all.pages, all.heads.len() as u64, "small pages: one each");
        // A second pass with the same `seen` takes no folio twice (only
        // pages that reached the LRU since).
        let again = sample_range(&pagemap, &flags, b.base(), pages * PAGE, 1, &mut seen).unwrap();
        assert!(
            again.heads.iter().all(|h| !all.heads.contains(h)),
            "{again:?}"
        );
        assert!(all.pages + again.pages <= pages / 2, "{again:?}");
        // Stride 4 meets every 4th page: at most a quarter.
        let strided = fresh(&pagemap, &flags, &b, pages, 4);
        assert!(strided.pages <= pages / 4, "{strided:?}");
        // The sparse reader (one pread per grid page) agrees with chunks.
        let (first, n) = (b.base() / PAGE, pages);
        let sparse = grid_entries(&pagemap, first, n, SPARSE_FROM).unwrap();
        let dense: Vec<_> = grid_entries(&pagemap, first, n, 1)
            .unwrap()
            .into_iter()
            .filter(|(i, _)| i % SPARSE_FROM == 0)
            .collect();
        assert_eq!(sparse, dense);
    }

    #[test]
    #[cfg_attr(
        not(all(has_kpageflags, has_thp)),
        ignore = "needs CAP_SYS_ADMIN and transparent hugepages (always or madvise)"
    )]
    fn a_thp_is_one_folio_of_512_pages_whatever_the_stride() {
        let pages = 1024u64;
        let mut b = Buf::new(pages, 2 << 20);
        // SAFETY: the range lies inside `b`'s allocation; MADV_HUGEPAGE only
        // changes how it is backed, not its contents.
        let rc = unsafe {
            libc::madvise(
                b.base() as *mut libc::c_void,
                (pages * PAGE) as usize,
                libc::MADV_HUGEPAGE,
            )
        };
        assert_eq!(rc, 0);
        for i in 0..pages {
            b.touch(i);
        }
        let pagemap = File::open("/proc/self/pagemap").unwrap();
        let flags = PageFlags::open().unwrap();
        let s1 = fresh(&pagemap, &flags, &b, pages, 1);
        let huge = s1.heads.len() < s1.pages as usize;
        if huge {
            // Every page counted once, through 512-page folios.
            assert_eq!(s1.pages, pages, "{s1:?}");
            assert_eq!(s1.heads.len(), 2, "two 512-page folios: {s1:?}");
            // A stride above 1 takes whole folios or nothing: a multiple
            // of 512 pages, never 512 / stride of them.
            for stride in [2u64, 8, 64] {
                let s = fresh(&pagemap, &flags, &b, pages, stride);
                assert_eq!(s.pages % 512, 0, "stride {stride}: {s:?}");
                assert_eq!(s.pages, 512 * s.heads.len() as u64);
            }
        } else {
            // No THP was given (fragmented memory): small pages, one each.
            assert_eq!(s1.pages, s1.heads.len() as u64);
        }
    }

    #[test]
    #[cfg_attr(
        not(has_kpageflags),
        ignore = "needs root: drops CAP_SYS_ADMIN on one thread to show the refusal"
    )]
    fn without_cap_sys_admin_pfns_are_hidden_and_refused() {
        let flags = PageFlags::open().unwrap();
        // Its own thread: capabilities are per thread.
        let got = std::thread::spawn(move || {
            let mut b = Buf::new(8, PAGE);
            for i in 0..8 {
                b.touch(i);
            }
            drop_cap_sys_admin_on_this_thread();
            // Opened without CAP_SYS_ADMIN: PFNs read 0
            // (pagemap_read: `pm.show_pfn = file_ns_capable(...)`).
            let pagemap = File::open("/proc/thread-self/pagemap").unwrap();
            sample_range(&pagemap, &flags, b.base(), 8 * PAGE, 1, &mut HashSet::new())
                .map(|s| s.pages)
                .map_err(|e| e.to_string())
        })
        .join()
        .unwrap();
        let e = got.unwrap_err();
        assert!(e.contains("CAP_SYS_ADMIN"), "{e}");
    }

    /// Clears CAP_SYS_ADMIN (21) from the calling thread's effective set.
    fn drop_cap_sys_admin_on_this_thread() {
        // _LINUX_CAPABILITY_VERSION_3: two 32-bit words per set.
        let mut header = [0x2008_0522u32, 0];
        let mut data = [0u32; 6];
        // SAFETY: capget fills `data` (2 x {effective, permitted,
        // inheritable}) for the calling thread (pid 0); both buffers are
        // the sizes version 3 expects.
        let rc = unsafe { libc::syscall(libc::SYS_capget, header.as_mut_ptr(), data.as_mut_ptr()) };
        assert_eq!(rc, 0);
        data[0] &= !(1 << 21);
        // SAFETY: raw capset changes the calling thread's capabilities only
        // (no libc broadcast to other threads); this test thread ends soon.
        let rc = unsafe { libc::syscall(libc::SYS_capset, header.as_mut_ptr(), data.as_ptr()) };
        assert_eq!(rc, 0);
    }

    #[test]
    fn nearby_words_go_in_one_write_far_ones_apart() {
        // Heads of 2 MiB folios: 8 words apart, one run; then a far one.
        let w = words([0, 512, 1024, 1 << 30]);
        let r = runs(&w);
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!(r[0].0, 0);
        assert_eq!(r[0].1.len(), 17 * 8);
        let word = |b: &[u8], i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_ne_bytes(x)
        };
        assert_eq!(word(&r[0].1, 0), 1);
        assert_eq!(word(&r[0].1, 8), 1);
        assert_eq!(word(&r[0].1, 16), 1);
        assert!((1..8).all(|i| word(&r[0].1, i) == 0));
        assert_eq!(r[1], ((1u64 << 30) / 64, 1u64.to_ne_bytes().to_vec()));
        // Written to a stand-in file, the words land where the kernel's
        // bitmap would have them.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bitmap");
        std::fs::write(&path, []).unwrap();
        let b = Bitmap::stand_in(&path).unwrap();
        assert_eq!(b.mark_idle(&w).unwrap(), 2);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, (1 << 30) / 64 * 8 + 8);
        assert_eq!(word(&bytes, 8), 1);
        assert_eq!(word(&bytes, 9), 0);
    }

    #[test]
    fn opening_a_missing_bitmap_names_it() {
        let e = Bitmap::open(Path::new("/nonexistent/page_idle/bitmap")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/page_idle/bitmap"));
    }
}
