//! The ageing driver of the EPT backends: tierd marks a sample of each VM's
//! guest pages idle in `/sys/kernel/mm/page_idle/bitmap`. For every page
//! that is young, the kernel clears the young bits through the MMU notifier,
//! which runs `kvm_age_gfn` (and, with the TDP MMU, emits
//! `kvm_tdp_mmu_spte_changed` per young SPTE) in tierd's own thread: that is
//! what the BPF programs count, attributed to the VM tierd is ageing.
//!
//! PFNs come from `/proc/PID/pagemap` (needs CAP_SYS_ADMIN; without it the
//! kernel reports PFN 0, which is treated as not present).

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The kernel's idle-page bitmap (CONFIG_IDLE_PAGE_TRACKING).
pub const BITMAP: &str = "/sys/kernel/mm/page_idle/bitmap";
const PAGE: u64 = 4096;
const PRESENT: u64 = 1 << 63;
const PFN_MASK: u64 = (1 << 55) - 1;
/// pagemap entries read per pread.
const CHUNK: u64 = 8192;

/// One sampled page: its index in the range and its PFN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampledPage {
    pub index: u64,
    pub pfn: u64,
}

/// PFNs of every `stride`-th page of `[hva, hva + len)` in `pagemap` (a
/// `/proc/PID/pagemap` file); pages not present are left out.
pub fn sampled_pfns(
    pagemap: &File,
    hva: u64,
    len: u64,
    stride: u64,
) -> std::io::Result<Vec<SampledPage>> {
    let stride = stride.max(1);
    let first = hva / PAGE;
    let pages = len / PAGE;
    let mut out = Vec::new();
    let mut buf = vec![0u8; (CHUNK * 8) as usize];
    let mut start = 0;
    while start < pages {
        let n = CHUNK.min(pages - start);
        let bytes = &mut buf[..(n * 8) as usize];
        pagemap.read_exact_at(bytes, (first + start) * 8)?;
        for (i, e) in bytes.chunks_exact(8).enumerate() {
            let index = start + i as u64;
            if !index.is_multiple_of(stride) {
                continue;
            }
            let mut w = [0u8; 8];
            w.copy_from_slice(e);
            let entry = u64::from_ne_bytes(w);
            let pfn = entry & PFN_MASK;
            if entry & PRESENT != 0 && pfn != 0 {
                out.push(SampledPage { index, pfn });
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

    /// Marks the pages idle: one 8-byte write per word, as the kernel
    /// requires (offset and length multiples of 8).
    pub fn mark_idle(&self, words: &BTreeMap<u64, u64>) -> std::io::Result<()> {
        for (idx, bits) in words {
            self.0.write_all_at(&bits.to_ne_bytes(), idx * 8)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_group_pfns_by_64() {
        let w = words([0, 1, 63, 64, 130, 130]);
        assert_eq!(
            w,
            BTreeMap::from([(0, 1 | 2 | (1 << 63)), (1, 1), (2, 1 << 2)])
        );
    }

    #[test]
    fn pagemap_of_this_process_has_pfns_for_touched_pages_only() {
        let pages = 64u64;
        let mut v = vec![0u8; (pages * PAGE) as usize + PAGE as usize];
        let base = (v.as_ptr() as u64).next_multiple_of(PAGE);
        let off = (base - v.as_ptr() as u64) as usize;
        // Touch the even pages only; the odd ones were never written, so
        // a fresh anonymous mapping has them not present.
        let len = v.len();
        let buf = &mut v[off..len];
        for i in (0..pages as usize).step_by(2) {
            buf[i * PAGE as usize] = 1;
        }
        let pagemap = File::open("/proc/self/pagemap").unwrap();
        let got = sampled_pfns(&pagemap, base, pages * PAGE, 1).unwrap();
        let uid0 = is_root();
        if uid0 {
            // Root sees PFNs: every even page, nothing else.
            let idx: Vec<u64> = got.iter().map(|p| p.index).collect();
            assert!(idx.iter().all(|i| i % 2 == 0), "{idx:?}");
            assert!(idx.len() >= (pages / 2) as usize - 1, "{idx:?}");
        } else {
            assert!(got.is_empty(), "PFNs are hidden without CAP_SYS_ADMIN");
        }
        // Stride keeps every 4th page.
        let strided = sampled_pfns(&pagemap, base, pages * PAGE, 4).unwrap();
        assert!(strided.iter().all(|p| p.index % 4 == 0));
    }

    fn is_root() -> bool {
        std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .is_some_and(|u| u.split_whitespace().nth(1) == Some("0"))
    }

    #[test]
    fn opening_a_missing_bitmap_names_it() {
        let e = Bitmap::open(Path::new("/nonexistent/page_idle/bitmap")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/page_idle/bitmap"));
    }
}
