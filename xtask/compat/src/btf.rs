//! BTF (include/uapi/linux/btf.h), including split BTF: a module's types
//! continue the ids of vmlinux, and its string offsets continue vmlinux's
//! string section.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{Context, bail};

use crate::Result;
use crate::elf::{cstr, u16_at, u32_at};

/// One member of a struct or union.
#[derive(Debug, Clone)]
pub struct Member {
    pub name: String,
    pub ty: u32,
    pub bit_offset: u32,
}

/// A BTF type, with its trailing data decoded.
#[derive(Debug, Clone)]
pub enum Kind {
    Void,
    Int {
        size: u32,
        signed: bool,
        bit_offset: u32,
    },
    Ptr(u32),
    Array {
        elem: u32,
        nelems: u32,
    },
    Struct {
        size: u32,
        members: Vec<Member>,
    },
    Union {
        size: u32,
        members: Vec<Member>,
    },
    Enum {
        size: u32,
        values: Vec<(String, i64)>,
    },
    Fwd,
    /// Typedef, volatile, const, restrict, type tag: all "see `0`".
    Modifier(u32, &'static str),
    Func {
        proto: u32,
    },
    FuncProto {
        ret: u32,
        params: Vec<(String, u32)>,
    },
    Var,
    Datasec {
        vars: Vec<u32>,
    },
    Float(u32),
    DeclTag,
}

#[derive(Debug, Clone)]
pub struct Type {
    pub name: String,
    pub kind: Kind,
}

impl Type {
    /// Kinds CO-RE treats as the same (btf_kind_core_compat): equal kinds,
    /// or any two enums.
    pub fn core_kind(&self) -> &'static str {
        match &self.kind {
            Kind::Void => "void",
            Kind::Int { .. } => "int",
            Kind::Ptr(_) => "ptr",
            Kind::Array { .. } => "array",
            Kind::Struct { .. } => "struct",
            Kind::Union { .. } => "union",
            Kind::Enum { .. } => "enum",
            Kind::Fwd => "fwd",
            Kind::Modifier(_, m) => m,
            Kind::Func { .. } => "func",
            Kind::FuncProto { .. } => "func_proto",
            Kind::Var => "var",
            Kind::Datasec { .. } => "datasec",
            Kind::Float(_) => "float",
            Kind::DeclTag => "decl_tag",
        }
    }

    pub fn members(&self) -> Option<&[Member]> {
        match &self.kind {
            Kind::Struct { members, .. } | Kind::Union { members, .. } => Some(members),
            _ => None,
        }
    }
}

/// A BTF blob; `base` is set for split BTF (a module on top of vmlinux).
#[derive(Debug)]
pub struct Btf {
    pub label: String,
    base: Option<Arc<Btf>>,
    /// Id of `types[0]`: 1 for a base, base's type count for split BTF.
    start_id: u32,
    types: Vec<Type>,
    by_name: HashMap<String, Vec<u32>>,
    /// String section (kept for .BTF.ext names).
    strings: Vec<u8>,
    str_start: u32,
}

static VOID: Type = Type {
    name: String::new(),
    kind: Kind::Void,
};

impl Btf {
    /// Parses raw `.BTF` section bytes.
    pub fn parse(label: &str, data: &[u8], base: Option<Arc<Btf>>) -> Result<Btf> {
        if u16_at(data, 0)? != 0xeb9f {
            bail!(Format, "{label}: bad BTF magic");
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let type_off = hdr_len + u32_at(data, 8)? as usize;
        let type_len = u32_at(data, 12)? as usize;
        let str_off = hdr_len + u32_at(data, 16)? as usize;
        let str_len = u32_at(data, 20)? as usize;
        let strings = data
            .get(str_off..str_off + str_len)
            .with_context(|| format!("{label}: BTF strings past the end"))?
            .to_vec();
        let (start_id, str_start) = match &base {
            Some(b) => (b.type_count(), b.str_end()),
            None => (1, 0),
        };
        let mut btf = Btf {
            label: label.to_string(),
            base,
            start_id,
            types: Vec::new(),
            by_name: HashMap::new(),
            strings,
            str_start,
        };
        let types = data
            .get(type_off..type_off + type_len)
            .with_context(|| format!("{label}: BTF types past the end"))?;
        let mut off = 0;
        while off < types.len() {
            let (t, len) = btf.parse_type(types, off).with_context(|| {
                format!(
                    "{label}: BTF type {}",
                    btf.start_id as usize + btf.types.len()
                )
            })?;
            let id = btf.start_id + btf.types.len() as u32;
            if !t.name.is_empty() {
                let key = essential(&t.name).to_string();
                btf.by_name.entry(key).or_default().push(id);
            }
            btf.types.push(t);
            off += len;
        }
        Ok(btf)
    }

    fn parse_type(&self, d: &[u8], off: usize) -> Result<(Type, usize)> {
        let name = self.name_at(u32_at(d, off)?)?;
        let info = u32_at(d, off + 4)?;
        let st = u32_at(d, off + 8)?;
        let vlen = (info & 0xffff) as usize;
        let kflag = info >> 31 == 1;
        let rest = off + 12;
        let member = |i: usize| -> Result<Member> {
            let m = rest + i * 12;
            let raw = u32_at(d, m + 8)?;
            Ok(Member {
                name: self.name_at(u32_at(d, m)?)?,
                ty: u32_at(d, m + 4)?,
                bit_offset: if kflag { raw & 0xff_ffff } else { raw },
            })
        };
        let (kind, extra) = match (info >> 24) & 0x1f {
            1 => {
                let enc = u32_at(d, rest)?;
                let kind = Kind::Int {
                    size: st,
                    signed: (enc >> 24) & 1 == 1,
                    bit_offset: (enc >> 16) & 0xff,
                };
                (kind, 4)
            }
            2 => (Kind::Ptr(st), 0),
            3 => {
                let kind = Kind::Array {
                    elem: u32_at(d, rest)?,
                    nelems: u32_at(d, rest + 8)?,
                };
                (kind, 12)
            }
            k @ (4 | 5) => {
                let members = (0..vlen).map(member).collect::<Result<Vec<_>>>()?;
                let kind = if k == 4 {
                    Kind::Struct { size: st, members }
                } else {
                    Kind::Union { size: st, members }
                };
                (kind, vlen * 12)
            }
            6 => {
                let mut values = Vec::with_capacity(vlen);
                for i in 0..vlen {
                    let e = rest + i * 8;
                    let v = u32_at(d, e + 4)?;
                    let v = if kflag {
                        i64::from(v as i32)
                    } else {
                        i64::from(v)
                    };
                    values.push((self.name_at(u32_at(d, e)?)?, v));
                }
                (Kind::Enum { size: st, values }, vlen * 8)
            }
            7 => (Kind::Fwd, 0),
            8 => (Kind::Modifier(st, "typedef"), 0),
            9 => (Kind::Modifier(st, "volatile"), 0),
            10 => (Kind::Modifier(st, "const"), 0),
            11 => (Kind::Modifier(st, "restrict"), 0),
            12 => (Kind::Func { proto: st }, 0),
            13 => {
                let mut params = Vec::with_capacity(vlen);
                for i in 0..vlen {
                    let p = rest + i * 8;
                    params.push((self.name_at(u32_at(d, p)?)?, u32_at(d, p + 4)?));
                }
                (Kind::FuncProto { ret: st, params }, vlen * 8)
            }
            14 => (Kind::Var, 4),
            15 => {
                let vars = (0..vlen)
                    .map(|i| u32_at(d, rest + i * 12))
                    .collect::<Result<Vec<_>>>()?;
                (Kind::Datasec { vars }, vlen * 12)
            }
            16 => (Kind::Float(st), 0),
            17 => (Kind::DeclTag, 4),
            18 => (Kind::Modifier(st, "type_tag"), 0),
            19 => {
                let mut values = Vec::with_capacity(vlen);
                for i in 0..vlen {
                    let e = rest + i * 12;
                    let v = u64::from(u32_at(d, e + 4)?) | (u64::from(u32_at(d, e + 8)?) << 32);
                    values.push((self.name_at(u32_at(d, e)?)?, v as i64));
                }
                (Kind::Enum { size: st, values }, vlen * 12)
            }
            k => bail!(Format, "unknown BTF kind {k}"),
        };
        Ok((Type { name, kind }, 12 + extra))
    }

    /// String at offset `off` of this BTF's (or its base's) string section.
    pub fn name_at(&self, off: u32) -> Result<String> {
        if off < self.str_start {
            return self
                .base
                .as_ref()
                .context("string offset in missing base")?
                .name_at(off);
        }
        cstr(&self.strings, (off - self.str_start) as usize)
    }

    fn str_end(&self) -> u32 {
        self.str_start + self.strings.len() as u32
    }

    /// Ids in use are `0..type_count()`.
    pub fn type_count(&self) -> u32 {
        self.start_id + self.types.len() as u32
    }

    pub fn ty(&self, id: u32) -> &Type {
        if id == 0 {
            return &VOID;
        }
        if id < self.start_id {
            return self.base.as_ref().map_or(&VOID, |b| b.ty(id));
        }
        self.types
            .get((id - self.start_id) as usize)
            .unwrap_or(&VOID)
    }

    /// Own ids (not the base's) whose essential name is `ess`.
    pub fn own_essential(&self, ess: &str) -> &[u32] {
        self.by_name.get(ess).map_or(&[], Vec::as_slice)
    }

    /// Own ids named exactly `name`.
    pub fn own_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = u32> + 'a {
        self.own_essential(essential(name))
            .iter()
            .copied()
            .filter(move |id| self.ty(*id).name == name)
    }

    /// Follows typedefs and modifiers: (id, type).
    pub fn skip_mods(&self, mut id: u32) -> (u32, &Type) {
        for _ in 0..64 {
            match self.ty(id).kind {
                Kind::Modifier(next, _) => id = next,
                _ => break,
            }
        }
        (id, self.ty(id))
    }

    /// A readable C-ish spelling of a type, for reports.
    pub fn describe(&self, id: u32) -> String {
        let t = self.ty(id);
        match &t.kind {
            Kind::Void => "void".into(),
            Kind::Ptr(to) => format!("{} *", self.describe(*to)),
            Kind::Struct { .. } => format!("struct {}", t.name),
            Kind::Union { .. } => format!("union {}", t.name),
            Kind::Enum { .. } => format!("enum {}", t.name),
            Kind::Modifier(_, "typedef") => t.name.clone(),
            Kind::Modifier(to, m) => format!("{m} {}", self.describe(*to)),
            Kind::Array { elem, nelems } => format!("{}[{nelems}]", self.describe(*elem)),
            _ if !t.name.is_empty() => t.name.clone(),
            _ => t.core_kind().into(),
        }
    }
}

/// libbpf's bpf_core_essential_name_len: `name___flavor` -> `name`.
pub fn essential(name: &str) -> &str {
    let b = name.as_bytes();
    let n = b.len();
    if n >= 5 {
        for i in (0..=n - 5).rev() {
            if b[i] != b'_' && &b[i + 1..i + 4] == b"___" && b[i + 4] != b'_' {
                return &name[..=i];
            }
        }
    }
    name
}

/// The kernel's BTF as libbpf sees it: vmlinux, then each module's split BTF.
#[derive(Debug)]
pub struct KernelBtf {
    pub vmlinux: Arc<Btf>,
    pub modules: Vec<Btf>,
}

impl KernelBtf {
    /// vmlinux first; modules in order (libbpf's search order).
    pub fn all(&self) -> impl Iterator<Item = &Btf> {
        std::iter::once(self.vmlinux.as_ref()).chain(self.modules.iter())
    }

    /// The first own type called `name` of the wanted core kind, and where.
    pub fn find(&self, name: &str, kind: &str) -> Option<(&Btf, u32)> {
        self.all().find_map(|b| {
            b.own_named(name)
                .find(|id| b.ty(*id).core_kind() == kind)
                .map(|id| (b, id))
        })
    }
}
