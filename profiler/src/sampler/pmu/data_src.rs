//! Decoding of `union perf_mem_data_src` (PERF_SAMPLE_DATA_SRC), the memory
//! source of a precise sample, into a tier kind.
//!
//! Bit layout (include/uapi/linux/perf_event.h, little-endian):
//!
//! | bits  | field      | values used here |
//! |-------|------------|------------------|
//! | 0-4   | mem_op     | NA 0x01, LOAD 0x02, STORE 0x04, PFETCH 0x08, EXEC 0x10 |
//! | 5-18  | mem_lvl    | NA 0x01, HIT 0x02, MISS 0x04, L1 0x08, LFB 0x10, L2 0x20, L3 0x40, LOC_RAM 0x80, REM_RAM1 0x100, REM_RAM2 0x200, REM_CCE1 0x400, REM_CCE2 0x800, IO 0x1000, UNC 0x2000 |
//! | 19-23 | mem_snoop  | NA 0x01, NONE 0x02, HIT 0x04, MISS 0x08, HITM 0x10 |
//! | 24-25 | mem_lock   | NA 0x01, LOCKED 0x02 |
//! | 26-32 | mem_dtlb   | NA 0x01, HIT 0x02, MISS 0x04, L1 0x08, L2 0x10, WK 0x20, OS 0x40 |
//! | 33-36 | mem_lvl_num| L1 0x01, L2 0x02, L3 0x03, L4 0x04, L2_MHB 0x05, MSC 0x06, UNC 0x08, CXL 0x09, IO 0x0a, ANY_CACHE 0x0b, LFB 0x0c, RAM 0x0d, PMEM 0x0e, NA 0x0f |
//! | 37    | mem_remote | REMOTE 0x01 |
//! | 38-39 | mem_snoopx | FWD 0x01, PEER 0x02 |
//! | 40-42 | mem_blk    | NA 0x01, DATA 0x02, ADDR 0x04 |
//! | 43-45 | mem_hops   | HOPS_0 0x01 (other core, same node), HOPS_1 0x02 (other node, same socket), HOPS_2 0x03 (other socket), HOPS_3 0x04 (other board) |
//!
//! `bpf/pmu_data_src.h` decodes the same way in BPF; a unit test checks
//! that its constants equal these, and `profiler/tests/gated/pmu.rs` runs both
//! decoders over a sweep of encodings.
//!
//! `PERF_MEM_LVLNUM_CXL` is 0x09 (Linux 6.2+; this machine's uapi header
//! has it); `UNC` 0x08, `L2_MHB` 0x05 and `MSC` 0x06 came with 6.10 and
//! are not in older headers. `mem_lvl` is the older, deprecated encoding;
//! kernels fill `mem_lvl_num` where they can, and it wins here.

use super::events::TierKind;

pub const OP_SHIFT: u32 = 0;
pub const LVL_SHIFT: u32 = 5;
pub const SNOOP_SHIFT: u32 = 19;
pub const LOCK_SHIFT: u32 = 24;
pub const DTLB_SHIFT: u32 = 26;
pub const LVLNUM_SHIFT: u32 = 33;
pub const REMOTE_SHIFT: u32 = 37;
pub const SNOOPX_SHIFT: u32 = 38;
pub const BLK_SHIFT: u32 = 40;
pub const HOPS_SHIFT: u32 = 43;
/// Widths of the fields the decoding reads.
pub const LVL_BITS: u32 = 14;
pub const LVLNUM_BITS: u32 = 4;
pub const HOPS_BITS: u32 = 3;

pub const LVL_NA: u64 = 0x01;
pub const LVL_HIT: u64 = 0x02;
pub const LVL_MISS: u64 = 0x04;
pub const LVL_L1: u64 = 0x08;
pub const LVL_LFB: u64 = 0x10;
pub const LVL_L2: u64 = 0x20;
pub const LVL_L3: u64 = 0x40;
pub const LVL_LOC_RAM: u64 = 0x80;
pub const LVL_REM_RAM1: u64 = 0x100;
pub const LVL_REM_RAM2: u64 = 0x200;
pub const LVL_REM_CCE1: u64 = 0x400;
pub const LVL_REM_CCE2: u64 = 0x800;
pub const LVL_IO: u64 = 0x1000;
pub const LVL_UNC: u64 = 0x2000;

pub const LVLNUM_L1: u64 = 0x01;
pub const LVLNUM_L2: u64 = 0x02;
pub const LVLNUM_L3: u64 = 0x03;
pub const LVLNUM_L4: u64 = 0x04;
pub const LVLNUM_L2_MHB: u64 = 0x05;
pub const LVLNUM_MSC: u64 = 0x06;
pub const LVLNUM_UNC: u64 = 0x08;
pub const LVLNUM_CXL: u64 = 0x09;
pub const LVLNUM_IO: u64 = 0x0a;
pub const LVLNUM_ANY_CACHE: u64 = 0x0b;
pub const LVLNUM_LFB: u64 = 0x0c;
pub const LVLNUM_RAM: u64 = 0x0d;
pub const LVLNUM_PMEM: u64 = 0x0e;
pub const LVLNUM_NA: u64 = 0x0f;

pub const HOPS_1: u64 = 0x02;

/// Where a sampled access was served from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemSource {
    /// Memory of a tier kind.
    Memory(TierKind),
    /// A cache (L1..L4, LFB, memory-side cache, any cache, a peer's cache).
    Cache,
    /// I/O (MMIO).
    Io,
    /// Uncached memory.
    Uncached,
    /// Not recorded (NA, 0, or an encoding we do not know).
    Unknown,
}

impl MemSource {
    /// The number `bpf/pmu_data_src.h` gives this source (`PMU_SRC_*`):
    /// 0 unknown, 1..4 the tier kinds as numbered in tier.v1, 5 cache,
    /// 6 I/O, 7 uncached.
    pub fn bpf_code(self) -> u32 {
        match self {
            MemSource::Unknown => 0,
            MemSource::Memory(kind) => kind as u32,
            MemSource::Cache => 5,
            MemSource::Io => 6,
            MemSource::Uncached => 7,
        }
    }
}

/// The fields of a `perf_mem_data_src` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataSrc(pub u64);

impl DataSrc {
    fn field(self, shift: u32, bits: u32) -> u64 {
        (self.0 >> shift) & ((1u64 << bits) - 1)
    }
    pub fn op(self) -> u64 {
        self.field(OP_SHIFT, 5)
    }
    pub fn lvl(self) -> u64 {
        self.field(LVL_SHIFT, LVL_BITS)
    }
    pub fn snoop(self) -> u64 {
        self.field(SNOOP_SHIFT, 5)
    }
    pub fn lock(self) -> u64 {
        self.field(LOCK_SHIFT, 2)
    }
    pub fn dtlb(self) -> u64 {
        self.field(DTLB_SHIFT, 7)
    }
    pub fn lvl_num(self) -> u64 {
        self.field(LVLNUM_SHIFT, LVLNUM_BITS)
    }
    pub fn remote(self) -> bool {
        self.field(REMOTE_SHIFT, 1) != 0
    }
    pub fn snoopx(self) -> u64 {
        self.field(SNOOPX_SHIFT, 2)
    }
    pub fn blk(self) -> u64 {
        self.field(BLK_SHIFT, 3)
    }
    pub fn hops(self) -> u64 {
        self.field(HOPS_SHIFT, HOPS_BITS)
    }

    /// The memory source: `mem_lvl_num` when set, else the older `mem_lvl`
    /// (only its HIT entries say where the data came from).
    pub fn source(self) -> MemSource {
        let other_node = self.remote() || self.hops() >= HOPS_1;
        match self.lvl_num() {
            LVLNUM_RAM if other_node => MemSource::Memory(TierKind::Remote),
            LVLNUM_RAM => MemSource::Memory(TierKind::Dram),
            LVLNUM_PMEM => MemSource::Memory(TierKind::Pmem),
            LVLNUM_CXL => MemSource::Memory(TierKind::Cxl),
            LVLNUM_L1 | LVLNUM_L2 | LVLNUM_L3 | LVLNUM_L4 | LVLNUM_L2_MHB | LVLNUM_MSC
            | LVLNUM_ANY_CACHE | LVLNUM_LFB => MemSource::Cache,
            LVLNUM_IO => MemSource::Io,
            LVLNUM_UNC => MemSource::Uncached,
            0 | LVLNUM_NA => self.legacy_source(),
            _ => MemSource::Unknown,
        }
    }

    fn legacy_source(self) -> MemSource {
        let lvl = self.lvl();
        if lvl & LVL_HIT == 0 {
            return MemSource::Unknown;
        }
        if lvl & LVL_LOC_RAM != 0 {
            MemSource::Memory(TierKind::Dram)
        } else if lvl & (LVL_REM_RAM1 | LVL_REM_RAM2) != 0 {
            MemSource::Memory(TierKind::Remote)
        } else if lvl & (LVL_L1 | LVL_LFB | LVL_L2 | LVL_L3 | LVL_REM_CCE1 | LVL_REM_CCE2) != 0 {
            MemSource::Cache
        } else if lvl & LVL_IO != 0 {
            MemSource::Io
        } else if lvl & LVL_UNC != 0 {
            MemSource::Uncached
        } else {
            MemSource::Unknown
        }
    }
}

/// [`DataSrc::source`] of a raw value.
pub fn decode(data_src: u64) -> MemSource {
    DataSrc(data_src).source()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Hand-assembled values; each component is written out:
    // op LOAD = 0x2; lvl << 5; snoop << 19; lvl_num << 33 (0x2_0000_0000 per
    // unit); remote << 37 = 0x20_0000_0000; hops << 43 = 0x800_0000_0000 per unit.

    /// Intel PEBS local DRAM (arch/x86/events/intel/ds.c: OP_LH |
    /// P(LVL, LOC_RAM) | LEVEL(RAM) | P(SNOOP, MISS)):
    /// 0x2 | (HIT 0x2 | LOC_RAM 0x80) << 5 = 0x1040 | MISS 0x8 << 19 = 0x40_0000
    /// | RAM 0xd << 33 = 0x1a_0000_0000.
    const INTEL_LOCAL_DRAM: u64 = 0x1a_0040_1042;
    /// Intel remote DRAM (OP_LH | P(LVL, REM_RAM1) | REM | LEVEL(RAM) |
    /// P(SNOOP, HIT)): 0x2 | (0x2 | 0x100) << 5 = 0x2040 | HIT 0x4 << 19 =
    /// 0x20_0000 | 0x1a_0000_0000 | 0x20_0000_0000.
    const INTEL_REMOTE_DRAM: u64 = 0x3a_0020_2042;
    /// Local PMEM: 0x2 | HIT << 5 = 0x40 | NONE 0x2 << 19 = 0x10_0000 |
    /// PMEM 0xe << 33 = 0x1c_0000_0000.
    const LOCAL_PMEM: u64 = 0x1c_0010_0042;
    /// Remote PMEM: LOCAL_PMEM | remote.
    const REMOTE_PMEM: u64 = 0x3c_0010_0042;
    /// CXL: 0x2 | 0x40 | CXL 0x9 << 33 = 0x12_0000_0000.
    const CXL: u64 = 0x12_0000_0042;
    /// AMD IBS-style remote DRAM: RAM | remote | HOPS_2 (0x3 << 43 =
    /// 0x1800_0000_0000) | 0x42.
    const AMD_REMOTE_SOCKET: u64 = 0x183a_0000_0042;
    /// RAM, other node of the same socket, by hops alone (HOPS_1 = 0x2 <<
    /// 43 = 0x1000_0000_0000), no remote bit.
    const RAM_HOPS_1: u64 = 0x101a_0000_0042;
    /// RAM, HOPS_0 (another core of the same node): still local DRAM.
    const RAM_HOPS_0: u64 = 0x081a_0000_0042;
    /// L1 hit: 0x2 | (HIT | L1 0x8) << 5 = 0x140 | NONE << 19 = 0x10_0000 |
    /// L1 0x1 << 33 = 0x2_0000_0000.
    const L1_HIT: u64 = 0x2_0010_0142;
    /// Legacy (no lvl_num): load, HIT | LOC_RAM.
    const LEGACY_LOCAL: u64 = 0x1042;
    /// Legacy: load, HIT | REM_RAM2 = 0x202 << 5 = 0x4040.
    const LEGACY_REMOTE: u64 = 0x4042;
    /// Legacy: load, MISS | LOC_RAM (a miss says nothing about the source).
    const LEGACY_MISS: u64 = 0x1082;
    /// Nothing known: op NA 0x1 | lvl NA 0x1 << 5 = 0x20 | NA 0xf << 33 =
    /// 0x1e_0000_0000.
    const ALL_NA: u64 = 0x1e_0000_0021;
    /// I/O: IO 0xa << 33 = 0x14_0000_0000 | 0x42.
    const IO: u64 = 0x14_0000_0042;
    /// Uncached: UNC 0x8 << 33 = 0x10_0000_0000 | 0x42.
    const UNCACHED: u64 = 0x10_0000_0042;
    /// A store to local DRAM: op STORE 0x4 | 0x1040 | RAM.
    const STORE_DRAM: u64 = 0x1a_0000_1044;

    #[test]
    fn fields_are_where_the_layout_says() {
        let d = DataSrc(INTEL_REMOTE_DRAM);
        assert_eq!(d.op(), 0x2);
        assert_eq!(d.lvl(), LVL_HIT | LVL_REM_RAM1);
        assert_eq!(d.snoop(), 0x4);
        assert_eq!(d.lvl_num(), LVLNUM_RAM);
        assert!(d.remote());
        assert_eq!(d.hops(), 0);
        assert_eq!(DataSrc(AMD_REMOTE_SOCKET).hops(), 0x3);
        let every = DataSrc(
            (0x1f << OP_SHIFT)
                | (0x3 << LOCK_SHIFT)
                | (0x7f << DTLB_SHIFT)
                | (0x3 << SNOOPX_SHIFT)
                | (0x7 << BLK_SHIFT),
        );
        assert_eq!(
            (
                every.op(),
                every.lock(),
                every.dtlb(),
                every.snoopx(),
                every.blk()
            ),
            (0x1f, 0x3, 0x7f, 0x3, 0x7)
        );
        assert_eq!((every.lvl(), every.snoop(), every.lvl_num()), (0, 0, 0));
    }

    #[test]
    fn memory_tiers() {
        use MemSource::Memory;
        for (v, want) in [
            (INTEL_LOCAL_DRAM, Memory(TierKind::Dram)),
            (INTEL_REMOTE_DRAM, Memory(TierKind::Remote)),
            (LOCAL_PMEM, Memory(TierKind::Pmem)),
            (REMOTE_PMEM, Memory(TierKind::Pmem)),
            (CXL, Memory(TierKind::Cxl)),
            (AMD_REMOTE_SOCKET, Memory(TierKind::Remote)),
            (RAM_HOPS_1, Memory(TierKind::Remote)),
            (RAM_HOPS_0, Memory(TierKind::Dram)),
            (LEGACY_LOCAL, Memory(TierKind::Dram)),
            (LEGACY_REMOTE, Memory(TierKind::Remote)),
            (STORE_DRAM, Memory(TierKind::Dram)),
        ] {
            assert_eq!(decode(v), want, "{v:#x}");
        }
    }

    #[test]
    fn not_memory() {
        for (v, want) in [
            (L1_HIT, MemSource::Cache),
            (IO, MemSource::Io),
            (UNCACHED, MemSource::Uncached),
            (ALL_NA, MemSource::Unknown),
            (LEGACY_MISS, MemSource::Unknown),
            (0, MemSource::Unknown),
            (0x7 << LVLNUM_SHIFT | 0x42, MemSource::Unknown), // 0x7: unassigned
        ] {
            assert_eq!(decode(v), want, "{v:#x}");
        }
        for lvl_num in [1, 2, 3, 4, 5, 6, 0xb, 0xc] {
            assert_eq!(decode(lvl_num << LVLNUM_SHIFT | 0x42), MemSource::Cache);
        }
    }

    /// `bpf/pmu_data_src.h` says the same as this file.
    #[test]
    fn bpf_header_constants_match() {
        const HEADER: &str = include_str!("../../../../bpf/pmu_data_src.h");
        let defs: std::collections::BTreeMap<&str, u64> = HEADER
            .lines()
            .filter_map(|l| {
                let mut w = l.strip_prefix("#define ")?.split_whitespace();
                let (name, value) = (w.next()?, w.next()?);
                let v = match value.strip_prefix("0x") {
                    Some(hex) => u64::from_str_radix(hex, 16).ok()?,
                    None => value.parse().ok()?,
                };
                Some((name, v))
            })
            .collect();
        let kind = |k: TierKind| u64::from(MemSource::Memory(k).bpf_code());
        let want: Vec<(&str, u64)> = vec![
            ("PMU_DS_LVL_SHIFT", LVL_SHIFT.into()),
            ("PMU_DS_LVL_BITS", LVL_BITS.into()),
            ("PMU_DS_LVLNUM_SHIFT", LVLNUM_SHIFT.into()),
            ("PMU_DS_LVLNUM_BITS", LVLNUM_BITS.into()),
            ("PMU_DS_REMOTE_SHIFT", REMOTE_SHIFT.into()),
            ("PMU_DS_HOPS_SHIFT", HOPS_SHIFT.into()),
            ("PMU_DS_HOPS_BITS", HOPS_BITS.into()),
            ("PMU_DS_LVL_HIT", LVL_HIT),
            ("PMU_DS_LVL_L1", LVL_L1),
            ("PMU_DS_LVL_LFB", LVL_LFB),
            ("PMU_DS_LVL_L2", LVL_L2),
            ("PMU_DS_LVL_L3", LVL_L3),
            ("PMU_DS_LVL_LOC_RAM", LVL_LOC_RAM),
            ("PMU_DS_LVL_REM_RAM1", LVL_REM_RAM1),
            ("PMU_DS_LVL_REM_RAM2", LVL_REM_RAM2),
            ("PMU_DS_LVL_REM_CCE1", LVL_REM_CCE1),
            ("PMU_DS_LVL_REM_CCE2", LVL_REM_CCE2),
            ("PMU_DS_LVL_IO", LVL_IO),
            ("PMU_DS_LVL_UNC", LVL_UNC),
            ("PMU_DS_LVLNUM_L1", LVLNUM_L1),
            ("PMU_DS_LVLNUM_L2", LVLNUM_L2),
            ("PMU_DS_LVLNUM_L3", LVLNUM_L3),
            ("PMU_DS_LVLNUM_L4", LVLNUM_L4),
            ("PMU_DS_LVLNUM_L2_MHB", LVLNUM_L2_MHB),
            ("PMU_DS_LVLNUM_MSC", LVLNUM_MSC),
            ("PMU_DS_LVLNUM_UNC", LVLNUM_UNC),
            ("PMU_DS_LVLNUM_CXL", LVLNUM_CXL),
            ("PMU_DS_LVLNUM_IO", LVLNUM_IO),
            ("PMU_DS_LVLNUM_ANY_CACHE", LVLNUM_ANY_CACHE),
            ("PMU_DS_LVLNUM_LFB", LVLNUM_LFB),
            ("PMU_DS_LVLNUM_RAM", LVLNUM_RAM),
            ("PMU_DS_LVLNUM_PMEM", LVLNUM_PMEM),
            ("PMU_DS_LVLNUM_NA", LVLNUM_NA),
            ("PMU_DS_HOPS_1", HOPS_1),
            ("PMU_SRC_UNKNOWN", MemSource::Unknown.bpf_code().into()),
            ("PMU_SRC_DRAM", kind(TierKind::Dram)),
            ("PMU_SRC_PMEM", kind(TierKind::Pmem)),
            ("PMU_SRC_CXL", kind(TierKind::Cxl)),
            ("PMU_SRC_REMOTE", kind(TierKind::Remote)),
            ("PMU_SRC_CACHE", MemSource::Cache.bpf_code().into()),
            ("PMU_SRC_IO", MemSource::Io.bpf_code().into()),
            ("PMU_SRC_UNCACHED", MemSource::Uncached.bpf_code().into()),
            ("PMU_SRC_COUNT", 8),
        ];
        for (name, v) in &want {
            assert_eq!(defs.get(name), Some(v), "{name}");
        }
        // Nothing in the header is left unchecked.
        let checked: std::collections::BTreeSet<&str> = want.iter().map(|(n, _)| *n).collect();
        let unchecked: Vec<&&str> = defs
            .keys()
            .filter(|n| n.starts_with("PMU_") && !checked.contains(*n))
            .collect();
        assert!(unchecked.is_empty(), "{unchecked:?}");
        // The kinds are tier.v1's numbers.
        assert_eq!(
            (
                kind(TierKind::Dram),
                kind(TierKind::Pmem),
                kind(TierKind::Cxl),
                kind(TierKind::Remote)
            ),
            (1, 2, 3, 4)
        );
    }
}
