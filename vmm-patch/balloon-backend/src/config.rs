//! The device config space of SPEC.md section 2 and the rules of section 6
//! for `VHOST_USER_GET_CONFIG` / `SET_CONFIG`.

use crate::release::PAGE_SIZE;
use crate::spec::TierSpec;

/// `VHOST_USER_CONFIG_SIZE`: the window GET_CONFIG may read.
pub const CONFIG_WINDOW: u32 = 0x1000;
/// Offset of `tier[0]`.
pub const TIER_BASE: u32 = 0x18;
/// Bytes per `struct virtio_balloon_tier`.
pub const TIER_ENTRY: u32 = 32;
/// Offset of the legacy `actual`.
pub const LEGACY_ACTUAL: u32 = 0x04;

/// Byte offset of `tier[i].actual`.
pub fn tier_actual_offset(i: usize) -> u32 {
    TIER_BASE + TIER_ENTRY * i as u32 + 4
}

/// Byte offset of `tier[i].num_pages`.
pub fn tier_target_offset(i: usize) -> u32 {
    TIER_BASE + TIER_ENTRY * i as u32
}

/// Targets and driver-written actuals, in pages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigValues {
    pub legacy_target: u32,
    pub legacy_actual: u32,
    pub targets: Vec<u32>,
    pub actuals: Vec<u32>,
}

impl ConfigValues {
    pub fn new(tiers: usize) -> Self {
        ConfigValues {
            targets: vec![0; tiers],
            actuals: vec![0; tiers],
            ..ConfigValues::default()
        }
    }
}

/// What a `SET_CONFIG` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigWrite {
    /// The legacy `actual` (offset 0x04).
    LegacyActual(u32),
    /// `tier[i].actual`.
    TierActual(usize, u32),
    /// Anything else: ignored (and counted), but still acknowledged.
    Ignored,
}

/// Classifies a write: only 4-byte writes of `actual` or `tier[i].actual`
/// (i < `tiers`) are accepted; `tier[i].actual` only when the driver
/// negotiated `F_TIERS` (SPEC section 1: without it the device ignores
/// writes to the per-tier part).
pub fn classify_write(
    offset: u32,
    buf: &[u8],
    tiers: usize,
    tiers_negotiated: bool,
) -> ConfigWrite {
    let Ok(b) = <[u8; 4]>::try_from(buf) else {
        return ConfigWrite::Ignored;
    };
    let v = u32::from_le_bytes(b);
    if offset == LEGACY_ACTUAL {
        return ConfigWrite::LegacyActual(v);
    }
    if tiers_negotiated
        && offset >= TIER_BASE
        && (offset - TIER_BASE) % TIER_ENTRY == 4
        && ((offset - TIER_BASE) / TIER_ENTRY) < tiers as u32
    {
        return ConfigWrite::TierActual(((offset - TIER_BASE) / TIER_ENTRY) as usize, v);
    }
    ConfigWrite::Ignored
}

/// The whole config space: `0x18 + 32 * N` bytes.
pub fn render(specs: &[TierSpec], v: &ConfigValues) -> Vec<u8> {
    let mut out = vec![0u8; (TIER_BASE + TIER_ENTRY * specs.len() as u32) as usize];
    let put32 = |out: &mut Vec<u8>, off: usize, x: u32| {
        out[off..off + 4].copy_from_slice(&x.to_le_bytes());
    };
    put32(&mut out, 0x00, v.legacy_target);
    put32(&mut out, 0x04, v.legacy_actual);
    // 0x08 free_page_hint_cmd_id and 0x0c poison_val: 0 (never offered).
    put32(&mut out, 0x10, specs.len() as u32);
    for (i, s) in specs.iter().enumerate() {
        let base = (TIER_BASE + TIER_ENTRY * i as u32) as usize;
        put32(&mut out, base, v.targets.get(i).copied().unwrap_or(0));
        put32(&mut out, base + 4, v.actuals.get(i).copied().unwrap_or(0));
        put32(&mut out, base + 8, s.guest_node.unwrap_or(u32::MAX));
        out[base + 0x10..base + 0x18].copy_from_slice(&s.gpa_start().to_le_bytes());
        // Both fit u32: spec parsing caps a zone at 2^32-1 pages; the span
        // is clamped rather than wrapped for a zone with a huge hole.
        let pages = |b: u64| u32::try_from(b / PAGE_SIZE).unwrap_or(u32::MAX);
        put32(&mut out, base + 0x18, pages(s.zone_bytes()));
        put32(&mut out, base + 0x1c, pages(s.span_bytes()));
    }
    out
}

/// `GET_CONFIG` of `[offset, offset + size)`: exactly `size` bytes, zeros
/// past the config space. `None` outside the 4 KiB window (the vhost crate
/// refuses those before asking).
pub fn read(space: &[u8], offset: u32, size: u32) -> Option<Vec<u8>> {
    let end = offset.checked_add(size)?;
    if end > CONFIG_WINDOW {
        return None;
    }
    let mut out = vec![0u8; size as usize];
    let (o, e) = (offset as usize, (end as usize).min(space.len()));
    if o < e {
        out[..e - o].copy_from_slice(&space[o..e]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::parse_tier;

    /// The example of SPEC.md section 2, byte for byte.
    #[test]
    fn renders_the_spec_example() {
        let specs = vec![
            parse_tier("name=dram,ranges=0-0x10000000,node=0").unwrap(),
            parse_tier("name=slow,ranges=0x10000000-0x20000000,node=1").unwrap(),
        ];
        let v = ConfigValues {
            legacy_target: 0,
            legacy_actual: 0,
            targets: vec![0x4000, 0x8000],
            actuals: vec![0x1000, 0x8000],
        };
        let want: [u8; 88] = [
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, //
            0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0x40, 0, 0, 0, 0x10, 0, 0, //
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, //
            0, 0, 0x01, 0, 0, 0, 0x01, 0, 0, 0x80, 0, 0, 0, 0x80, 0, 0, //
            0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, //
            0, 0, 0x01, 0, 0, 0, 0x01, 0,
        ];
        assert_eq!(render(&specs, &v), want);
    }

    #[test]
    fn only_actual_writes_are_accepted() {
        let w = |off, buf: &[u8], neg| classify_write(off, buf, 2, neg);
        assert_eq!(w(4, &[1, 0, 0, 0], false), ConfigWrite::LegacyActual(1));
        assert_eq!(w(0x1c, &[2, 0, 0, 0], true), ConfigWrite::TierActual(0, 2));
        assert_eq!(w(0x3c, &[3, 0, 0, 0], true), ConfigWrite::TierActual(1, 3));
        // Without F_TIERS, a target, a wrong size, past the last tier.
        assert_eq!(w(0x1c, &[2, 0, 0, 0], false), ConfigWrite::Ignored);
        assert_eq!(w(0x18, &[2, 0, 0, 0], true), ConfigWrite::Ignored);
        assert_eq!(w(0, &[2, 0, 0, 0], true), ConfigWrite::Ignored);
        assert_eq!(w(0x1c, &[2, 0], true), ConfigWrite::Ignored);
        assert_eq!(w(4, &[2, 0, 0, 0, 0, 0, 0, 0], true), ConfigWrite::Ignored);
        assert_eq!(w(0x5c, &[2, 0, 0, 0], true), ConfigWrite::Ignored);
    }

    #[test]
    fn reads_inside_the_window_pad_with_zeros() {
        let space = vec![7u8; 88];
        assert_eq!(read(&space, 84, 8), Some(vec![7, 7, 7, 7, 0, 0, 0, 0]));
        assert_eq!(read(&space, 0xff0, 16), Some(vec![0; 16]));
        assert_eq!(read(&space, 0, 0x1000).map(|v| v.len()), Some(0x1000));
        assert_eq!(read(&space, 0xff0, 17), None);
        assert_eq!(read(&space, u32::MAX, 2), None);
    }
}
