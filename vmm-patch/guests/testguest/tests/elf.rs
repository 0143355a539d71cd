//! The built guest is a PVH kernel cloud-hypervisor can load: an x86_64
//! ELF whose PT_NOTE holds XEN_ELFNOTE_PHYS32_ENTRY pointing into its
//! executable segment, loaded at or above 1 MiB.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes(b[o..o + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

struct Phdr {
    kind: u32,
    flags: u32,
    offset: usize,
    paddr: u64,
    filesz: u64,
    memsz: u64,
}

#[test]
fn guest_elf_is_a_pvh_kernel() {
    let elf = std::fs::read(tier_testguest::elf_path()).unwrap();
    assert_eq!(&elf[..4], b"\x7fELF");
    assert_eq!(elf[4], 2, "ELF64");
    assert_eq!(u16_at(&elf, 18), 62, "EM_X86_64");
    let (phoff, phentsize, phnum) = (
        u64_at(&elf, 32) as usize,
        u16_at(&elf, 54) as usize,
        u16_at(&elf, 56) as usize,
    );
    let phdrs: Vec<Phdr> = (0..phnum)
        .map(|i| {
            let o = phoff + i * phentsize;
            Phdr {
                kind: u32_at(&elf, o),
                flags: u32_at(&elf, o + 4),
                offset: u64_at(&elf, o + 8) as usize,
                paddr: u64_at(&elf, o + 24),
                filesz: u64_at(&elf, o + 32),
                memsz: u64_at(&elf, o + 40),
            }
        })
        .collect();
    let loads: Vec<&Phdr> = phdrs.iter().filter(|p| p.kind == 1).collect();
    assert!(!loads.is_empty());
    for p in &loads {
        assert!(p.paddr >= 0x10_0000, "loaded below 1 MiB: {:#x}", p.paddr);
        assert!(
            p.paddr + p.memsz < 0x100_0000,
            "image (with bss) stays below 16 MiB"
        );
        assert!(p.memsz >= p.filesz);
    }
    let note = phdrs.iter().find(|p| p.kind == 4).expect("PT_NOTE");
    let n = &elf[note.offset..note.offset + note.filesz as usize];
    let (namesz, descsz, kind) = (u32_at(n, 0), u32_at(n, 4), u32_at(n, 8));
    assert_eq!(
        (namesz, descsz, kind),
        (4, 4, 18),
        "Xen note XEN_ELFNOTE_PHYS32_ENTRY"
    );
    assert_eq!(&n[12..16], b"Xen\0");
    let entry = u64::from(u32_at(n, 16));
    let text = loads
        .iter()
        .find(|p| (p.paddr..p.paddr + p.filesz).contains(&entry))
        .expect("entry inside a loaded segment");
    assert_eq!(text.flags & 1, 1, "entry segment is executable");
    let size = std::fs::metadata(tier_testguest::elf_path()).unwrap().len();
    eprintln!("guest ELF: {} bytes, PVH entry {entry:#x}", size);
}
