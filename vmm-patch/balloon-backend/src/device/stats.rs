//! The stats queue's buffers: which tags the device keeps and their
//! counter names.

use super::*;

/// Counters of the stats queue.
#[derive(Debug, Default, Clone)]
pub(super) struct GuestStats {
    pub(super) updates: u64,
    pub(super) bad_buffers: u64,
    pub(super) values: BTreeMap<u16, u64>,
}

/// The entries of a stats buffer the device keeps, in buffer order:
/// 10-byte entries (le16 tag, le64 value); a trailing partial entry is
/// ignored, and so are tags SPEC.md does not define: a guest cycling
/// through all 65536 tags would otherwise grow the `state` answer past
/// what a VMM reads (about 2 MiB). The caller bounds the buffer
/// ([`MAX_STATS_BYTES`]). Fuzzed by the `fuzz` bench.
pub fn stats_entries(buf: &[u8]) -> impl Iterator<Item = (u16, u64)> + '_ {
    buf.chunks_exact(10).filter_map(|e| {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        if !known_tag(tag) {
            return None;
        }
        let mut v = [0u8; 8];
        v.copy_from_slice(&e[2..10]);
        Some((tag, u64::from_le_bytes(v)))
    })
}

/// Whether SPEC.md section 4 defines `tag`: the standard tags 0-15 and the
/// per-tier ones, `0x8000 + 0x10 * i + {0, 1, 2}` for the 8 possible tiers.
pub fn known_tag(tag: u16) -> bool {
    tag < 16 || ((0x8000..0x8080).contains(&tag) && (tag - 0x8000) % 0x10 < 3)
}

/// SPEC.md section 5 counter names of a stats tag.
pub fn stat_name(tag: u16) -> String {
    const STANDARD: [&str; 16] = [
        "stat_swap_in",
        "stat_swap_out",
        "stat_major_faults",
        "stat_minor_faults",
        "stat_free_memory",
        "stat_total_memory",
        "stat_available_memory",
        "stat_disk_caches",
        "stat_htlb_pgalloc",
        "stat_htlb_pgfail",
        "stat_oom_kills",
        "stat_alloc_stalls",
        "stat_async_scans",
        "stat_direct_scans",
        "stat_async_reclaims",
        "stat_direct_reclaims",
    ];
    if let Some(n) = STANDARD.get(usize::from(tag)) {
        return (*n).to_string();
    }
    if (0x8000..0x8080).contains(&tag) {
        let (i, k) = ((tag - 0x8000) / 0x10, (tag - 0x8000) % 0x10);
        match k {
            0 => return format!("tier{i}_guest_accesses"),
            1 => return format!("tier{i}_guest_free_bytes"),
            2 => return format!("tier{i}_guest_total_bytes"),
            _ => {}
        }
    }
    format!("tag_{tag:#06x}")
}
