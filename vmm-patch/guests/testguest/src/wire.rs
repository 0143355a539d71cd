//! The guest driver's wire-format code (`guest/proto.c`), compiled for the
//! host: config-space decoding, queue order and stats encoding exactly as
//! the guest does them.

use thiserror::Error;

/// Most tiers a balloon has (`VIRTIO_BALLOON_TIERS_MAX`).
pub const TIERS_MAX: usize = 8;
/// Stats entries the driver writes at most (3 standard + 3 per tier).
pub const STATS_MAX_ENTRIES: usize = 3 + 3 * TIERS_MAX;
/// Bytes per stats entry (`le16 tag; le64 val`).
pub const STATS_ENTRY_SIZE: usize = 10;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct CTierCfg {
    num_pages: u32,
    actual: u32,
    guest_node: u32,
    gpa_start: u64,
    zone_pages: u32,
    span_pages: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct CBalloonCfg {
    num_pages: u32,
    actual: u32,
    tier_count: u32,
    tier: [CTierCfg; TIERS_MAX],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct CTierStats {
    accesses: u64,
    free_bytes: u64,
    total_bytes: u64,
}

unsafe extern "C" {
    fn tg_cfg_size(tiers: u32) -> usize;
    fn tg_cfg_tier_field(tier: u32, field: u32) -> u32;
    fn tg_cfg_parse(buf: *const u8, len: usize, out: *mut CBalloonCfg) -> i32;
    fn tg_queue_count(stats: i32, reporting: i32, tiers: u32) -> u32;
    fn tg_queue_stats(stats: i32) -> i32;
    fn tg_queue_reporting(stats: i32, reporting: i32) -> i32;
    fn tg_queue_tier(stats: i32, reporting: i32, tier: u32, inflate: i32) -> u32;
    fn tg_stat_tier_tag(tier: u32, kind: u32) -> u16;
    fn tg_stats_build(tags: *mut u16, vals: *mut u64, tiers: *const CTierStats, n: u32) -> usize;
    fn tg_stats_lie(tiers: *mut CTierStats, n: u32);
    fn tg_stats_encode(
        buf: *mut u8,
        cap: usize,
        tags: *const u16,
        vals: *const u64,
        n: usize,
    ) -> usize;
}

/// One tier of the config space as the driver decodes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierConfig {
    pub num_pages: u32,
    pub actual: u32,
    pub guest_node: u32,
    pub gpa_start: u64,
    pub zone_pages: u32,
    pub span_pages: u32,
}

/// The config space as the driver decodes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BalloonConfig {
    pub num_pages: u32,
    pub actual: u32,
    pub tiers: Vec<TierConfig>,
}

/// Per-tier entry fields (`VIRTIO_BALLOON_TIER_*`), offsets inside `tier[i]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TierField {
    NumPages = 0x00,
    Actual = 0x04,
    GuestNode = 0x08,
    Reserved = 0x0c,
    GpaStart = 0x10,
    ZonePages = 0x18,
    SpanPages = 0x1c,
}

/// Kinds of per-tier stats tags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TierStat {
    Accesses = 0,
    Free = 1,
    Total = 2,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum WireError {
    #[error("config space of {len} bytes: too short, or tier_count above 8 or past its end")]
    BadConfig { len: usize },
    #[error("{0} tiers: at most 8")]
    TooManyTiers(usize),
}

/// Config-space size with `tiers` tiers (8 bytes without tiers).
pub fn config_size(tiers: u32) -> usize {
    // SAFETY: a pure C function of its integer argument.
    unsafe { tg_cfg_size(tiers) }
}

/// Offset of `field` of tier `tier` in the config space.
pub fn tier_field_offset(tier: u32, field: TierField) -> u32 {
    // SAFETY: a pure C function of its integer arguments.
    unsafe { tg_cfg_tier_field(tier, field as u32) }
}

/// Decode a config-space image with the driver's code.
pub fn parse_config(bytes: &[u8]) -> Result<BalloonConfig, WireError> {
    let mut out = CBalloonCfg::default();
    // SAFETY: `bytes` is valid for `bytes.len()` reads and `out` is a
    // writable struct with the C layout (checked by the layout test).
    let rc = unsafe { tg_cfg_parse(bytes.as_ptr(), bytes.len(), &mut out) };
    if rc != 0 {
        return Err(WireError::BadConfig { len: bytes.len() });
    }
    Ok(BalloonConfig {
        num_pages: out.num_pages,
        actual: out.actual,
        tiers: out.tier[..out.tier_count as usize]
            .iter()
            .map(|t| TierConfig {
                num_pages: t.num_pages,
                actual: t.actual,
                guest_node: t.guest_node,
                gpa_start: t.gpa_start,
                zone_pages: t.zone_pages,
                span_pages: t.span_pages,
            })
            .collect(),
    })
}

/// Queue order for the negotiated features (SPEC.md section 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueLayout {
    pub stats: bool,
    pub reporting: bool,
    pub tiers: u32,
}

impl QueueLayout {
    /// Number of queues the driver enables.
    pub fn count(&self) -> u32 {
        // SAFETY: a pure C function of its integer arguments.
        unsafe { tg_queue_count(self.stats.into(), self.reporting.into(), self.tiers) }
    }

    /// Index of the stats queue, if negotiated.
    pub fn stats_queue(&self) -> Option<u32> {
        // SAFETY: a pure C function of its integer argument.
        let q = unsafe { tg_queue_stats(self.stats.into()) };
        u32::try_from(q).ok()
    }

    /// Index of the reporting queue, if negotiated.
    pub fn reporting_queue(&self) -> Option<u32> {
        // SAFETY: a pure C function of its integer arguments.
        let q = unsafe { tg_queue_reporting(self.stats.into(), self.reporting.into()) };
        u32::try_from(q).ok()
    }

    /// Index of tier `tier`'s inflate (`inflate`) or deflate queue.
    pub fn tier_queue(&self, tier: u32, inflate: bool) -> u32 {
        // SAFETY: a pure C function of its integer arguments.
        unsafe {
            tg_queue_tier(
                self.stats.into(),
                self.reporting.into(),
                tier,
                inflate.into(),
            )
        }
    }
}

/// Stats tag of `kind` for tier `tier`.
pub fn stat_tier_tag(tier: u32, kind: TierStat) -> u16 {
    // SAFETY: a pure C function of its integer arguments.
    unsafe { tg_stat_tier_tag(tier, kind as u32) }
}

/// What the driver knows about one tier when it fills the stats buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    pub accesses: u64,
    pub free_bytes: u64,
    pub total_bytes: u64,
}

/// The (tag, value) entries the driver sends for these tiers.
pub fn stats_entries(tiers: &[TierStats]) -> Result<Vec<(u16, u64)>, WireError> {
    if tiers.len() > TIERS_MAX {
        return Err(WireError::TooManyTiers(tiers.len()));
    }
    let c: Vec<CTierStats> = tiers
        .iter()
        .map(|t| CTierStats {
            accesses: t.accesses,
            free_bytes: t.free_bytes,
            total_bytes: t.total_bytes,
        })
        .collect();
    let mut tags = [0u16; STATS_MAX_ENTRIES];
    let mut vals = [0u64; STATS_MAX_ENTRIES];
    // SAFETY: `tags`/`vals` hold STATS_MAX_ENTRIES (3 + 3 * 8), the most
    // tg_stats_build writes for at most 8 tiers; `c` holds `c.len()` structs
    // with the C layout.
    let n = unsafe {
        tg_stats_build(
            tags.as_mut_ptr(),
            vals.as_mut_ptr(),
            c.as_ptr(),
            c.len() as u32,
        )
    };
    Ok(tags[..n]
        .iter()
        .copied()
        .zip(vals[..n].iter().copied())
        .collect())
}

/// What the driver reports inside a `lie=` window instead of `tiers`: tier
/// i gets tier (n - 1 - i)'s access count x 1000 (saturating; with two
/// tiers the counts swap), every tier's free bytes are 0 (so `MEMFREE` and
/// `AVAIL` are 0), total bytes stay true. The guest's own code.
pub fn lie_stats(tiers: &[TierStats]) -> Result<Vec<TierStats>, WireError> {
    if tiers.len() > TIERS_MAX {
        return Err(WireError::TooManyTiers(tiers.len()));
    }
    let mut c: Vec<CTierStats> = tiers
        .iter()
        .map(|t| CTierStats {
            accesses: t.accesses,
            free_bytes: t.free_bytes,
            total_bytes: t.total_bytes,
        })
        .collect();
    // SAFETY: `c` holds `c.len()` (at most 8) structs with the C layout,
    // which tg_stats_lie rewrites in place.
    unsafe { tg_stats_lie(c.as_mut_ptr(), c.len() as u32) };
    Ok(c.iter()
        .map(|t| TierStats {
            accesses: t.accesses,
            free_bytes: t.free_bytes,
            total_bytes: t.total_bytes,
        })
        .collect())
}

/// Pack entries into a stats buffer with the driver's encoder.
pub fn encode_stats(entries: &[(u16, u64)]) -> Vec<u8> {
    let tags: Vec<u16> = entries.iter().map(|e| e.0).collect();
    let vals: Vec<u64> = entries.iter().map(|e| e.1).collect();
    let mut buf = vec![0u8; entries.len() * STATS_ENTRY_SIZE];
    // SAFETY: `buf` has room for `buf.len()` bytes; `tags` and `vals` hold
    // `entries.len()` elements each.
    let n = unsafe {
        tg_stats_encode(
            buf.as_mut_ptr(),
            buf.len(),
            tags.as_ptr(),
            vals.as_ptr(),
            entries.len(),
        )
    };
    buf.truncate(n);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrored_structs_match_the_c_layout() {
        assert_eq!(crate::c_layout(0), size_of::<CTierCfg>());
        assert_eq!(crate::c_layout(1), size_of::<CBalloonCfg>());
        assert_eq!(crate::c_layout(2), size_of::<CTierStats>());
        assert_eq!(crate::c_layout(7), std::mem::offset_of!(CBalloonCfg, tier));
    }

    #[test]
    fn short_or_oversized_config_is_an_error() {
        assert_eq!(parse_config(&[0; 4]), Err(WireError::BadConfig { len: 4 }));
        let mut cfg = vec![0u8; config_size(2)];
        cfg[0x10] = 9; // tier_count 9 > 8
        assert_eq!(parse_config(&cfg), Err(WireError::BadConfig { len: 88 }));
        cfg[0x10] = 3; // says 3 tiers, holds 2
        assert!(parse_config(&cfg).is_err());
        cfg[0x10] = 2;
        assert_eq!(parse_config(&cfg).unwrap().tiers.len(), 2);
        assert_eq!(
            stats_entries(&[TierStats::default(); 9]),
            Err(WireError::TooManyTiers(9))
        );
    }

    #[test]
    fn lies_are_the_documented_ones() {
        let t = |accesses, free_bytes, total_bytes| TierStats {
            accesses,
            free_bytes,
            total_bytes,
        };
        let truth = [t(900, 4096, 8192), t(100, 0, 16384)];
        let lie = lie_stats(&truth).unwrap();
        assert_eq!(lie, vec![t(100_000, 0, 8192), t(900_000, 0, 16384)]);
        let e = stats_entries(&lie).unwrap();
        // MEMFREE, MEMTOT, AVAIL: free 0, total true.
        assert_eq!(
            e[..3].iter().map(|x| x.1).collect::<Vec<_>>(),
            [0, 24576, 0]
        );
        // Three tiers: reversed; one tier: scaled; saturating.
        let three = lie_stats(&[t(1, 1, 1), t(2, 2, 2), t(3, 3, 3)]).unwrap();
        assert_eq!(
            three.iter().map(|x| x.accesses).collect::<Vec<_>>(),
            [3000, 2000, 1000]
        );
        assert_eq!(lie_stats(&[t(7, 1, 1)]).unwrap()[0].accesses, 7000);
        assert_eq!(
            lie_stats(&[t(u64::MAX / 999, 1, 1)]).unwrap()[0].accesses,
            u64::MAX
        );
        assert!(lie_stats(&[t(0, 0, 0); 9]).is_err());
    }

    #[test]
    fn encoder_stops_at_whole_entries() {
        let bytes = encode_stats(&[(4, 1), (5, 2)]);
        assert_eq!(bytes.len(), 20);
        assert_eq!(&bytes[..10], &[4, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
    }
}
