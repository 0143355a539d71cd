//! The canary the guest keeps in every page its workload uses
//! (`TG_CANARY` in `guest/proto.h`): the last 8 bytes of an in-use page hold
//! [`CANARY`] `^` the page's guest-physical address (little-endian); free and
//! ballooned pages hold 0 there. A page the host released reads as zeros,
//! so a harness that reads a zone's memory from outside (`/proc/PID/mem` of
//! the VMM at the zone's host address) can count the pages the guest uses
//! and see that none of them was released; the guest checks the same word
//! on every access and reports losses (`lost=`, `tg canary lost`).

/// The constant part of the canary.
pub const CANARY: u64 = 0x7A1E_DCA9_0000_0000;
/// Offset of the canary in its page (its last 8 bytes).
pub const OFFSET: usize = PAGE_SIZE - 8;
/// Guest page size.
pub const PAGE_SIZE: usize = 4096;

/// The canary of the page at guest-physical address `gpa` (page aligned).
pub fn value(gpa: u64) -> u64 {
    CANARY ^ gpa
}

/// Whether `page` (one page of guest memory, read from outside) is the
/// page at `gpa` with its canary.
pub fn carries(page: &[u8], gpa: u64) -> bool {
    page.get(OFFSET..PAGE_SIZE)
        .and_then(|b| b.try_into().ok())
        .is_some_and(|b| u64::from_le_bytes(b) == value(gpa))
}

/// Guest-physical addresses of the pages of `mem` that carry their canary,
/// `mem` being guest memory from `base_gpa` on (whole pages; a partial
/// last page is ignored).
pub fn stamped_pages(mem: &[u8], base_gpa: u64) -> Vec<u64> {
    mem.chunks_exact(PAGE_SIZE)
        .enumerate()
        .map(|(i, page)| (page, base_gpa + (i * PAGE_SIZE) as u64))
        .filter(|&(page, gpa)| carries(page, gpa))
        .map(|(_, gpa)| gpa)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_are_the_guests() {
        assert_eq!(crate::c_layout(16) as u64, CANARY);
        assert_eq!(crate::c_layout(17), OFFSET);
    }

    #[test]
    fn finds_stamped_pages_only() {
        let base = 0x1000_0000u64;
        let mut mem = vec![0u8; 4 * PAGE_SIZE + 100];
        for i in [1usize, 3] {
            let gpa = base + (i * PAGE_SIZE) as u64;
            mem[i * PAGE_SIZE + OFFSET..(i + 1) * PAGE_SIZE]
                .copy_from_slice(&value(gpa).to_le_bytes());
        }
        // Page 2 carries page 1's canary: copied, not its own.
        let c1 = value(base + PAGE_SIZE as u64).to_le_bytes();
        mem[2 * PAGE_SIZE + OFFSET..3 * PAGE_SIZE].copy_from_slice(&c1);
        assert_eq!(
            stamped_pages(&mem, base),
            vec![base + PAGE_SIZE as u64, base + 3 * PAGE_SIZE as u64]
        );
        assert!(!carries(&mem[..PAGE_SIZE - 1], base));
        assert_eq!(value(0x1234_5000), 0x7A1E_DCA9_1234_5000);
    }
}
