//! Just enough of ELF64 little-endian to read BPF objects, vmlinux and
//! kernel modules: section headers, section contents and the symbol table.

use crate::Result;
use crate::error::{Context, bail};

/// One section header.
#[derive(Debug, Clone)]
pub struct Section {
    pub name: String,
    pub kind: u32,
    pub offset: u64,
    pub size: u64,
    pub link: u32,
    pub entsize: u64,
}

/// One symbol of `.symtab`.
#[derive(Debug, Clone)]
pub struct Symbol {
    pub name: String,
    pub value: u64,
    pub size: u64,
    /// STB_*: 0 local, 1 global, 2 weak.
    pub bind: u8,
    /// STT_*: 0 notype, 1 object, 2 func, 3 section.
    pub kind: u8,
    pub shndx: u16,
}

pub const STB_WEAK: u8 = 2;
pub const STT_FUNC: u8 = 2;
const SHT_SYMTAB: u32 = 2;
const SHT_NOBITS: u32 = 8;

/// A parsed ELF file that owns its bytes.
#[derive(Debug)]
pub struct Elf {
    data: Vec<u8>,
    pub sections: Vec<Section>,
}

pub fn u16_at(d: &[u8], off: usize) -> Result<u16> {
    let b = d.get(off..off + 2).context("ELF/BTF read past the end")?;
    Ok(u16::from_le_bytes([b[0], b[1]]))
}

pub fn u32_at(d: &[u8], off: usize) -> Result<u32> {
    let b = d.get(off..off + 4).context("ELF/BTF read past the end")?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

pub fn u64_at(d: &[u8], off: usize) -> Result<u64> {
    let lo = u32_at(d, off)?;
    let hi = u32_at(d, off + 4)?;
    Ok(u64::from(lo) | (u64::from(hi) << 32))
}

/// NUL-terminated string at `off` of a string table.
pub fn cstr(d: &[u8], off: usize) -> Result<String> {
    let rest = d.get(off..).context("string offset past the table")?;
    let end = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
    Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
}

fn usize_of(v: u64) -> Result<usize> {
    usize::try_from(v).context("ELF offset does not fit usize")
}

impl Elf {
    pub fn parse(data: Vec<u8>) -> Result<Elf> {
        if data.get(..4) != Some(b"\x7fELF".as_slice()) {
            bail!(Format, "not an ELF file");
        }
        // EI_CLASS 2 = 64-bit, EI_DATA 1 = little-endian: BPF objects and x86_64 kernels.
        if data.get(4) != Some(&2) || data.get(5) != Some(&1) {
            bail!(Format, "not a 64-bit little-endian ELF file");
        }
        let shoff = usize_of(u64_at(&data, 0x28)?)?;
        let shentsize = usize::from(u16_at(&data, 0x3a)?);
        let shnum = usize::from(u16_at(&data, 0x3c)?);
        let shstrndx = usize::from(u16_at(&data, 0x3e)?);
        let mut raw = Vec::with_capacity(shnum);
        for i in 0..shnum {
            let h = shoff + i * shentsize;
            raw.push((
                u32_at(&data, h)?,
                Section {
                    name: String::new(),
                    kind: u32_at(&data, h + 4)?,
                    offset: u64_at(&data, h + 0x18)?,
                    size: u64_at(&data, h + 0x20)?,
                    link: u32_at(&data, h + 0x28)?,
                    entsize: u64_at(&data, h + 0x38)?,
                },
            ));
        }
        let strtab = raw.get(shstrndx).map(|(_, s)| s.clone());
        let mut sections = Vec::with_capacity(shnum);
        for (name_off, mut s) in raw {
            if let Some(st) = &strtab {
                let base = usize_of(st.offset)?;
                s.name = cstr(&data, base + name_off as usize)?;
            }
            sections.push(s);
        }
        Ok(Elf { data, sections })
    }

    pub fn read(path: &std::path::Path) -> Result<Elf> {
        let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        Elf::parse(data).with_context(|| format!("parsing {}", path.display()))
    }

    /// Contents of section `index` (empty for NOBITS).
    pub fn data_of(&self, index: usize) -> Result<&[u8]> {
        let s = self
            .sections
            .get(index)
            .context("section index out of range")?;
        if s.kind == SHT_NOBITS {
            return Ok(&[]);
        }
        let start = usize_of(s.offset)?;
        let end = start + usize_of(s.size)?;
        self.data
            .get(start..end)
            .with_context(|| format!("section {} lies past the end of the file", s.name))
    }

    /// Contents of the first section called `name`, if any.
    pub fn section(&self, name: &str) -> Result<Option<&[u8]>> {
        match self.sections.iter().position(|s| s.name == name) {
            Some(i) => self.data_of(i).map(Some),
            None => Ok(None),
        }
    }

    /// Every entry of `.symtab` but the null one.
    pub fn symbols(&self) -> Result<Vec<Symbol>> {
        let Some(idx) = self.sections.iter().position(|s| s.kind == SHT_SYMTAB) else {
            return Ok(Vec::new());
        };
        let tab = self.data_of(idx)?;
        let strs = self.data_of(self.sections[idx].link as usize)?;
        let ent = usize_of(self.sections[idx].entsize.max(24))?;
        let mut out = Vec::new();
        for i in 1..tab.len() / ent {
            let e = i * ent;
            let info = tab[e + 4];
            out.push(Symbol {
                name: cstr(strs, u32_at(tab, e)? as usize)?,
                bind: info >> 4,
                kind: info & 0xf,
                shndx: u16_at(tab, e + 6)?,
                value: u64_at(tab, e + 8)?,
                size: u64_at(tab, e + 16)?,
            });
        }
        Ok(out)
    }
}
