//! Walking a split-virtqueue descriptor chain with explicit bounds.
//!
//! Why not `virtio_queue::DescriptorChain`'s iterator: its only loop
//! protection is a TTL of `queue_size` descriptors, and every way a chain
//! can be broken (the TTL running out on a loop, a `next` index past the
//! table, an unreadable descriptor, a bad indirect table) ends the
//! iteration exactly like a proper last descriptor does. A looping chain
//! therefore came back as `queue_size` valid-looking descriptors and its
//! PFNs were released. Here every such chain is an error, so the caller
//! rejects it whole (virtio 1.2, 2.7.5.3.1 / 2.7.5.3.2: the driver must not
//! create loops; a device may treat a chain longer than the queue size, or
//! an indirect table longer than its `len / 16` entries, as an error).
//!
//! Bounds: a direct chain visits at most `queue_size` descriptors, an
//! indirect table at most `len / 16` entries, and no index twice in
//! either (a bitmap per table, so the walk is O(descriptors)).

use virtio_queue::desc::split::Descriptor;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory};

/// Bytes per split-queue descriptor.
const DESC_SIZE: u64 = 16;
/// Most entries of an indirect table: its `next` fields are `u16`.
pub const MAX_INDIRECT_ENTRIES: u32 = u16::MAX as u32;

/// Why a chain is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error("descriptor index {index} outside a table of {entries}{}", if *.indirect { " (indirect)" } else { "" })]
    IndexOutOfRange {
        index: u16,
        entries: u32,
        indirect: bool,
    },
    #[error("descriptor {index} visited twice: the chain loops{}", if *.indirect { " (indirect)" } else { "" })]
    Loop { index: u16, indirect: bool },
    #[error("descriptor table entry at {0:#x} is not readable guest memory")]
    Unreadable(u64),
    #[error("indirect descriptor inside an indirect table")]
    NestedIndirect,
    #[error("indirect descriptor with NEXT set")]
    IndirectWithNext,
    #[error("indirect table of {0} bytes (not 16..={max} in steps of 16)", max = MAX_INDIRECT_ENTRIES as u64 * DESC_SIZE)]
    BadIndirectLength(u32),
}

/// Reusable state of chain walks (the visited bitmap).
#[derive(Debug, Default)]
pub struct Walker {
    seen: Vec<u64>,
}

impl Walker {
    fn reset(&mut self, entries: u32) {
        self.seen.clear();
        self.seen.resize((entries as usize).div_ceil(64), 0);
    }

    /// Marks `index`; false if it was already marked.
    fn visit(&mut self, index: u16) -> bool {
        let (w, b) = (usize::from(index) / 64, index % 64);
        let fresh = self.seen[w] & (1 << b) == 0;
        self.seen[w] |= 1 << b;
        fresh
    }

    /// The buffer descriptors of the chain at `head` of the descriptor
    /// table at `table` (`queue_size` entries), in order, into `out`
    /// (cleared first); an indirect descriptor is replaced by its table's
    /// chain. Any malformation is an error and `out` must then be ignored.
    pub fn walk<M: GuestMemory + ?Sized>(
        &mut self,
        mem: &M,
        table: GuestAddress,
        queue_size: u16,
        head: u16,
        out: &mut Vec<Descriptor>,
    ) -> Result<(), ChainError> {
        out.clear();
        let (mut table, mut entries, mut index, mut indirect) =
            (table, u32::from(queue_size), head, false);
        self.reset(entries);
        loop {
            if u32::from(index) >= entries {
                return Err(ChainError::IndexOutOfRange {
                    index,
                    entries,
                    indirect,
                });
            }
            // At most `entries` descriptors per table: each index once.
            if !self.visit(index) {
                return Err(ChainError::Loop { index, indirect });
            }
            let at = table.raw_value().wrapping_add(u64::from(index) * DESC_SIZE);
            let desc: Descriptor = table
                .checked_add(u64::from(index) * DESC_SIZE)
                .and_then(|a| mem.read_obj(a).ok())
                .ok_or(ChainError::Unreadable(at))?;
            if desc.refers_to_indirect_table() {
                if indirect {
                    return Err(ChainError::NestedIndirect);
                }
                if desc.has_next() {
                    return Err(ChainError::IndirectWithNext);
                }
                let len = desc.len();
                let n = len / DESC_SIZE as u32;
                if n == 0 || !len.is_multiple_of(DESC_SIZE as u32) || n > MAX_INDIRECT_ENTRIES {
                    return Err(ChainError::BadIndirectLength(len));
                }
                (table, entries, index, indirect) = (desc.addr(), n, 0, true);
                self.reset(entries);
                continue;
            }
            out.push(desc);
            if !desc.has_next() {
                return Ok(());
            }
            index = desc.next();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    const NEXT: u16 = 1;
    const WRITE: u16 = 2;
    const INDIRECT: u16 = 4;
    const TABLE: u64 = 0x1000;
    const ITABLE: u64 = 0x8000;

    fn mem() -> GuestMemoryMmap<()> {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap()
    }

    fn put(
        m: &GuestMemoryMmap<()>,
        table: u64,
        i: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) {
        m.write_obj(
            Descriptor::new(addr, len, flags, next),
            GuestAddress(table + 16 * u64::from(i)),
        )
        .unwrap();
    }

    fn walk(m: &GuestMemoryMmap<()>, size: u16, head: u16) -> Result<Vec<(u64, u32)>, ChainError> {
        let mut out = Vec::new();
        Walker::default().walk(m, GuestAddress(TABLE), size, head, &mut out)?;
        Ok(out
            .iter()
            .map(|d| (d.addr().raw_value(), d.len()))
            .collect())
    }

    #[test]
    fn a_proper_chain_is_walked_in_order() {
        let m = mem();
        put(&m, TABLE, 3, 0x100, 8, NEXT, 7);
        put(&m, TABLE, 7, 0x200, 4, NEXT | WRITE, 1);
        put(&m, TABLE, 1, 0x300, 12, 0, 3); // `next` ignored without NEXT
        assert_eq!(
            walk(&m, 8, 3),
            Ok(vec![(0x100, 8), (0x200, 4), (0x300, 12)])
        );
    }

    /// The hostile frontend's case (a): all 64 descriptors of the queue,
    /// the last pointing back at the first.
    #[test]
    fn a_loop_through_the_whole_queue_is_an_error() {
        let m = mem();
        for i in 0..64u16 {
            put(
                &m,
                TABLE,
                i,
                0x100 + 4 * u64::from(i),
                4,
                NEXT,
                (i + 1) % 64,
            );
        }
        assert_eq!(
            walk(&m, 64, 0),
            Err(ChainError::Loop {
                index: 0,
                indirect: false
            })
        );
        // A loop that does not go through the head, and a self-loop.
        put(&m, TABLE, 10, 0x100, 4, NEXT, 5);
        assert_eq!(
            walk(&m, 64, 3),
            Err(ChainError::Loop {
                index: 5,
                indirect: false
            })
        );
        put(&m, TABLE, 20, 0x100, 4, NEXT, 20);
        assert!(matches!(walk(&m, 64, 20), Err(ChainError::Loop { .. })));
    }

    /// Case (b): an indirect table whose second entry points back at the
    /// first, NEXT on both.
    #[test]
    fn a_loop_inside_an_indirect_table_is_an_error() {
        let m = mem();
        put(&m, TABLE, 0, ITABLE, 32, INDIRECT, 0);
        put(&m, ITABLE, 0, 0x100, 4, NEXT, 1);
        put(&m, ITABLE, 1, 0x104, 4, NEXT, 0);
        assert_eq!(
            walk(&m, 8, 0),
            Err(ChainError::Loop {
                index: 0,
                indirect: true
            })
        );
        // The same table, properly ended, is fine.
        put(&m, ITABLE, 1, 0x104, 4, 0, 0);
        assert_eq!(walk(&m, 8, 0), Ok(vec![(0x100, 4), (0x104, 4)]));
        // An entry past the table's len / 16 entries.
        put(&m, ITABLE, 1, 0x104, 4, NEXT, 2);
        assert_eq!(
            walk(&m, 8, 0),
            Err(ChainError::IndexOutOfRange {
                index: 2,
                entries: 2,
                indirect: true
            })
        );
    }

    #[test]
    fn broken_chains_are_errors_not_short_chains() {
        let m = mem();
        // `next` past the queue.
        put(&m, TABLE, 0, 0x100, 4, NEXT, 8);
        assert!(matches!(
            walk(&m, 8, 0),
            Err(ChainError::IndexOutOfRange { index: 8, .. })
        ));
        // Head past the queue.
        assert!(matches!(
            walk(&m, 8, 9),
            Err(ChainError::IndexOutOfRange { index: 9, .. })
        ));
        // Indirect: nested, with NEXT, bad lengths, unreadable table.
        put(&m, TABLE, 0, ITABLE, 16, INDIRECT, 0);
        put(&m, ITABLE, 0, ITABLE, 16, INDIRECT, 0);
        assert_eq!(walk(&m, 8, 0), Err(ChainError::NestedIndirect));
        put(&m, TABLE, 0, ITABLE, 16, INDIRECT | NEXT, 1);
        assert_eq!(walk(&m, 8, 0), Err(ChainError::IndirectWithNext));
        for len in [0, 8, 24] {
            put(&m, TABLE, 0, ITABLE, len, INDIRECT, 0);
            assert_eq!(walk(&m, 8, 0), Err(ChainError::BadIndirectLength(len)));
        }
        put(&m, TABLE, 0, 0x2000_0000, 16, INDIRECT, 0);
        assert_eq!(walk(&m, 8, 0), Err(ChainError::Unreadable(0x2000_0000)));
        // The table itself past guest memory.
        let mut out = Vec::new();
        let r = Walker::default().walk(&m, GuestAddress(0xfff0), 8, 1, &mut out);
        assert_eq!(r, Err(ChainError::Unreadable(0x10000)));
    }

    /// A direct prefix ending in an indirect descriptor (allowed by the
    /// spec, produced by no driver we know) is walked through.
    #[test]
    fn a_direct_prefix_then_an_indirect_table() {
        let m = mem();
        put(&m, TABLE, 2, 0x100, 4, NEXT, 5);
        put(&m, TABLE, 5, ITABLE, 16, INDIRECT, 0);
        put(&m, ITABLE, 0, 0x200, 8, 0, 0);
        assert_eq!(walk(&m, 8, 2), Ok(vec![(0x100, 4), (0x200, 8)]));
    }
}
