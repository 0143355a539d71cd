//! A VM's gfn ranges: validation and the `struct vm_ranges` bytes.

use super::{EptError, HEAT_GRANULE_PAGES, MAX_RANGES, MAX_TIERS};

/// Byte sizes of `struct gfn_range` and `struct vm_ranges` (`tier_common.h`).
const GFN_RANGE_SIZE: usize = 32;
pub(super) const VM_RANGES_SIZE: usize = 8 + MAX_RANGES * GFN_RANGE_SIZE;

/// Heat slots `[base, base + len)` of one range's 2 MiB granules, counted
/// from the granule of its first page; `len` may be short (histogram full).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct HeatSpan {
    pub base: u32,
    pub len: u32,
}

/// `[start_gfn, end_gfn)` of guest-physical memory lying in `tier`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GfnRange {
    pub start_gfn: u64,
    pub end_gfn: u64,
    pub tier: u32,
}

pub(super) fn validate_ranges(ranges: &[GfnRange]) -> Result<(), EptError> {
    let bad = |reason: String| Err(EptError::BadRanges { reason });
    if ranges.len() > MAX_RANGES {
        return bad(format!("{} ranges, at most {MAX_RANGES}", ranges.len()));
    }
    for r in ranges {
        if r.start_gfn >= r.end_gfn {
            return bad(format!(
                "empty range [{:#x}, {:#x})",
                r.start_gfn, r.end_gfn
            ));
        }
        if r.tier as usize >= MAX_TIERS {
            return bad(format!("tier {} out of range (0..{MAX_TIERS})", r.tier));
        }
    }
    let mut sorted: Vec<&GfnRange> = ranges.iter().collect();
    sorted.sort_by_key(|r| r.start_gfn);
    for w in sorted.windows(2) {
        if w[1].start_gfn < w[0].end_gfn {
            return bad(format!(
                "[{:#x}, {:#x}) overlaps [{:#x}, {:#x})",
                w[0].start_gfn, w[0].end_gfn, w[1].start_gfn, w[1].end_gfn
            ));
        }
    }
    Ok(())
}

/// Index of the 2 MiB granule holding `gfn`.
pub(super) fn granule(gfn: u64) -> u64 {
    gfn / HEAT_GRANULE_PAGES
}

/// 2 MiB granules a (non-empty) range touches.
pub(super) fn granules(r: &GfnRange) -> u64 {
    granule(r.end_gfn - 1) - granule(r.start_gfn) + 1
}

/// The `struct vm_ranges` value: `sorted` ranges with their heat spans
/// (missing spans are empty: no heat recorded).
pub(super) fn encode(sorted: &[GfnRange], spans: &[HeatSpan]) -> Vec<u8> {
    let mut value = vec![0u8; VM_RANGES_SIZE];
    value[0..4].copy_from_slice(&(sorted.len() as u32).to_ne_bytes());
    for (i, r) in sorted.iter().enumerate() {
        let span = spans.get(i).copied().unwrap_or_default();
        let at = 8 + i * GFN_RANGE_SIZE;
        value[at..at + 8].copy_from_slice(&r.start_gfn.to_ne_bytes());
        value[at + 8..at + 16].copy_from_slice(&r.end_gfn.to_ne_bytes());
        value[at + 16..at + 20].copy_from_slice(&r.tier.to_ne_bytes());
        value[at + 20..at + 24].copy_from_slice(&span.base.to_ne_bytes());
        value[at + 24..at + 28].copy_from_slice(&span.len.to_ne_bytes());
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start_gfn: u64, end_gfn: u64, tier: u32) -> GfnRange {
        GfnRange {
            start_gfn,
            end_gfn,
            tier,
        }
    }

    #[test]
    fn ranges_are_validated() {
        assert!(validate_ranges(&[r(0, 10, 0), r(10, 20, 1)]).is_ok());
        assert!(validate_ranges(&[r(10, 20, 1), r(0, 10, 0)]).is_ok());
        assert!(validate_ranges(&[r(0, 11, 0), r(10, 20, 1)]).is_err());
        assert!(validate_ranges(&[r(5, 5, 0)]).is_err());
        assert!(validate_ranges(&[r(0, 1, 8)]).is_err());
        let many: Vec<GfnRange> = (0..17).map(|i| r(i * 2, i * 2 + 1, 0)).collect();
        assert!(validate_ranges(&many).is_err());
        assert!(validate_ranges(&many[..16]).is_ok());
    }

    #[test]
    fn granules_count_partial_ones_at_both_ends() {
        assert_eq!(granules(&r(0, 512, 0)), 1);
        assert_eq!(granules(&r(0, 513, 0)), 2);
        assert_eq!(granules(&r(511, 513, 0)), 2);
        assert_eq!(granules(&r(100, 101, 0)), 1);
        assert_eq!(granules(&r(0x10000, 0x20000, 0)), 128);
    }

    #[test]
    fn encoding_matches_the_c_layout() {
        let v = encode(
            &[r(1, 2, 3), r(0x200, 0x400, 1)],
            &[HeatSpan { base: 7, len: 1 }],
        );
        assert_eq!(v.len(), 8 + 16 * 32);
        assert_eq!(&v[0..4], &2u32.to_ne_bytes());
        assert_eq!(&v[8..16], &1u64.to_ne_bytes());
        assert_eq!(&v[16..24], &2u64.to_ne_bytes());
        assert_eq!(&v[24..28], &3u32.to_ne_bytes());
        assert_eq!(&v[28..32], &7u32.to_ne_bytes());
        assert_eq!(&v[32..36], &1u32.to_ne_bytes());
        // Second range: no span given, so none.
        assert_eq!(&v[40..48], &0x200u64.to_ne_bytes());
        assert_eq!(&v[60..68], &[0u8; 8]);
    }
}
