//! The guest program, its parameter block and the CPU state it starts in.

use super::Phase;
use kvm_bindings::{kvm_segment, kvm_sregs};

pub const PAGE_SIZE: u64 = 4096;
/// GPA of the guest code (slot 0).
pub const CODE_GPA: u64 = 0x1000;
/// GPA of the parameter block (slot 0, its own page).
pub const PARAM_GPA: u64 = 0x2000;
/// First work page in the dram region; below it only code and params.
pub const DRAM_WORK_GPA: u64 = 0x10_0000;
/// Base GPA of the slow region (slot 1); its work pages start here.
pub const SLOW_GPA: u64 = 0x1000_0000;
/// The guest does `out ROUND_PORT, al` once per finished round (0x80 = the
/// classic POST/delay port, never used for anything else here).
pub const ROUND_PORT: u16 = 0x80;

/// 32-bit code, paging off, flat segments. Parameter block at 0x2000:
/// two segments of {base_gpa, pages, repeat: u32}. It is re-read every
/// round (and every repeat) so the host can change it at a round boundary.
/// Assembled with `as --32`, checked with `objdump -d`; the test
/// `guest_code_matches_assembler` re-checks it.
#[rustfmt::skip]
pub const GUEST_CODE: [u8; 50] = [
    // 00 top:
    0xbe, 0x00, 0x20, 0x00, 0x00,       // mov  esi, 0x2000        ; param block
    0xbf, 0x02, 0x00, 0x00, 0x00,       // mov  edi, 2             ; segments left
    // 0a seg:
    0x8b, 0x56, 0x08,                   // mov  edx, [esi+8]       ; repeat
    0x85, 0xd2,                         // test edx, edx
    0x74, 0x17,                         // jz   seg_next
    // 11 rep_loop:
    0x8b, 0x1e,                         // mov  ebx, [esi]         ; base_gpa
    0x8b, 0x4e, 0x04,                   // mov  ecx, [esi+4]       ; pages
    0x85, 0xc9,                         // test ecx, ecx
    0x74, 0x0e,                         // jz   seg_next
    // 1a page_loop:
    0xff, 0x03,                         // inc  dword [ebx]        ; read+write the page
    0x81, 0xc3, 0x00, 0x10, 0x00, 0x00, // add  ebx, 0x1000
    0x49,                               // dec  ecx
    0x75, 0xf5,                         // jnz  page_loop
    0x4a,                               // dec  edx
    0x75, 0xe9,                         // jnz  rep_loop
    // 28 seg_next:
    0x83, 0xc6, 0x0c,                   // add  esi, 12
    0x4f,                               // dec  edi
    0x75, 0xdc,                         // jnz  seg
    0xe6, 0x80,                         // out  0x80, al           ; round done
    0xeb, 0xce,                         // jmp  top
];

/// The parameter block words for a phase.
pub(crate) fn param_words(p: Phase) -> [u32; 6] {
    // Both GPAs are < 4 GiB by construction (constants above).
    [
        DRAM_WORK_GPA as u32,
        p.dram_pages,
        p.dram_repeat,
        SLOW_GPA as u32,
        p.slow_pages,
        p.slow_repeat,
    ]
}

/// Flat 4 GiB code/data segments, CR0.PE=1, paging off: no GDT or page
/// tables needed in guest memory, so the guest touches only code+params+work.
pub(crate) fn flat_protected_mode(sregs: &mut kvm_sregs) {
    let seg = |selector: u16, type_: u8| kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_,
        present: 1,
        dpl: 0,
        db: 1,
        s: 1,
        l: 0,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    };
    sregs.cs = seg(0x08, 0xb); // execute/read, accessed
    let data = seg(0x10, 0x3); // read/write, accessed
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.cr0 = (sregs.cr0 | 1) & !(1 << 31); // PE on, PG off
    sregs.cr4 = 0;
    sregs.efer = 0;
}
