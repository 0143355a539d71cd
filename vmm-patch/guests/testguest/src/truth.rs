//! The guest's exact counts in its own memory (`struct tg_truth`,
//! `guest/proto.h`): the host reads them at any instant from the address
//! the `tg ready` line gives (`truth=`), instead of from serial lines that
//! cost the guest about a millisecond of exits per character.

use crate::params::MAX_SETS;

/// One read of the truth block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Truth {
    /// Accesses per zone.
    pub acc: [u64; MAX_SETS],
    pub total: u64,
    /// RTC second changes since the workload started.
    pub seconds: u64,
    /// The phase running.
    pub phase: u64,
    /// Canary losses per zone (the `lost=` of tick lines): accesses that
    /// found a workload page without its canary ([`crate::canary`]).
    pub lost: [u64; MAX_SETS],
    /// Per zone, its page stamps (`stamp_*` of the C struct).
    pub stamps: [Stamps; MAX_SETS],
}

/// Where one zone's page stamps are: `pages` little-endian u64s at
/// guest-physical `gpa`, one per page from `pfn`; each is the access count
/// (the sum of `acc`) when the guest last touched the page, plus one, and
/// 0 for a page never touched. `pages` 0: the zone has none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamps {
    pub gpa: u64,
    pub pfn: u64,
    pub pages: u64,
}

impl Truth {
    /// Bytes of the block.
    pub const SIZE: usize = (5 * MAX_SETS + 3) * 8;

    /// Accesses counted so far: every access adds one to one `acc`, so
    /// their sum moves with each access (`total` only once per batch).
    pub fn count(&self) -> u64 {
        self.acc.iter().sum()
    }

    /// Decodes the block as the guest lays it out (little-endian u64s);
    /// `None` if `b` is shorter than [`Truth::SIZE`].
    pub fn from_bytes(b: &[u8]) -> Option<Truth> {
        let mut words = b
            .get(..Self::SIZE)?
            .chunks_exact(8)
            .map(|c| c.try_into().map(u64::from_le_bytes));
        let mut next = || words.next().and_then(Result::ok);
        let mut acc = [0u64; MAX_SETS];
        for a in &mut acc {
            *a = next()?;
        }
        let (total, seconds, phase) = (next()?, next()?, next()?);
        let mut lost = [0u64; MAX_SETS];
        for l in &mut lost {
            *l = next()?;
        }
        let mut stamps = [Stamps::default(); MAX_SETS];
        for s in &mut stamps {
            s.gpa = next()?;
        }
        for s in &mut stamps {
            s.pfn = next()?;
        }
        for s in &mut stamps {
            s.pages = next()?;
        }
        Some(Truth {
            acc,
            total,
            seconds,
            phase,
            lost,
            stamps,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_c_struct() {
        assert_eq!(crate::c_layout(8), Truth::SIZE);
        assert_eq!(crate::c_layout(9), (MAX_SETS + 1) * 8);
        assert_eq!(crate::c_layout(10), (MAX_SETS + 2) * 8);
        assert_eq!(crate::c_layout(15), (MAX_SETS + 3) * 8);
        assert_eq!(crate::c_layout(18), (2 * MAX_SETS + 3) * 8);
    }

    #[test]
    fn decodes_each_field_and_rejects_a_short_read() {
        let words: Vec<u64> = (1..=(Truth::SIZE as u64 / 8)).collect();
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let t = Truth::from_bytes(&bytes).expect("full block");
        assert_eq!(t.acc[0], 1);
        assert_eq!(t.acc[MAX_SETS - 1], MAX_SETS as u64);
        assert_eq!(
            (t.total, t.seconds, t.phase),
            (
                MAX_SETS as u64 + 1,
                MAX_SETS as u64 + 2,
                MAX_SETS as u64 + 3
            )
        );
        assert_eq!(t.lost[0], MAX_SETS as u64 + 4);
        assert_eq!(t.lost[MAX_SETS - 1], 2 * MAX_SETS as u64 + 3);
        assert_eq!(t.stamps[0].gpa, 2 * MAX_SETS as u64 + 4);
        assert_eq!(t.stamps[0].pfn, 3 * MAX_SETS as u64 + 4);
        assert_eq!(t.stamps[MAX_SETS - 1].pages, 5 * MAX_SETS as u64 + 3);
        assert_eq!(t.count(), (1..=MAX_SETS as u64).sum::<u64>());
        assert_eq!(Truth::from_bytes(&bytes[..Truth::SIZE - 1]), None);
    }
}
