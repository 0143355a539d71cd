//! CO-RE relocations: the `.BTF.ext` core_relo records of an object, and
//! resolving each against a kernel's BTF the way libbpf does
//! (tools/lib/bpf/relo_core.c: candidates by essential name and kind, spec
//! matching by member name through anonymous members,
//! bpf_core_fields_are_compat / bpf_core_types_are_compat).

use crate::error::{Context, bail};

use crate::Result;
use crate::btf::{Btf, KernelBtf, Kind, essential};
use crate::elf::{u16_at, u32_at};
use crate::types::{fields_are_compat, kinds_compat, type_size, types_are_compat, types_match};

/// One `struct bpf_core_relo`, with its ELF section name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreRelo {
    pub section: String,
    pub insn_off: u32,
    pub type_id: u32,
    pub access: String,
    pub kind: u32,
}

/// enum bpf_core_relo_kind, in order.
pub const KIND_NAMES: [&str; 13] = [
    "field_byte_offset",
    "field_byte_size",
    "field_exists",
    "field_signed",
    "field_lshift_u64",
    "field_rshift_u64",
    "type_id_local",
    "type_id_target",
    "type_exists",
    "type_size",
    "enumval_exists",
    "enumval_value",
    "type_matches",
];

impl CoreRelo {
    pub fn kind_name(&self) -> &'static str {
        KIND_NAMES
            .get(self.kind as usize)
            .copied()
            .unwrap_or("unknown")
    }

    /// Existence checks legitimately evaluate to 0 when nothing matches.
    pub fn is_existence_check(&self) -> bool {
        matches!(self.kind, 2 | 8 | 10 | 12)
    }

    fn is_type_based(&self) -> bool {
        matches!(self.kind, 6..=9 | 12)
    }

    fn is_enumval(&self) -> bool {
        matches!(self.kind, 10 | 11)
    }
}

/// The core_relo records of a `.BTF.ext` section (libbpf_internal.h
/// btf_ext_header: magic, version, flags, hdr_len, func_info off/len,
/// line_info off/len, core_relo off/len).
pub fn parse_btf_ext(ext: &[u8], btf: &Btf) -> Result<Vec<CoreRelo>> {
    if u16_at(ext, 0)? != 0xeb9f {
        bail!(Format, "bad .BTF.ext magic");
    }
    let hdr_len = u32_at(ext, 4)? as usize;
    if hdr_len < 32 {
        return Ok(Vec::new()); // no core_relo part
    }
    let off = hdr_len + u32_at(ext, 24)? as usize;
    let len = u32_at(ext, 28)? as usize;
    let sec = ext
        .get(off..off + len)
        .context(".BTF.ext core_relo past the end")?;
    let mut out = Vec::new();
    if sec.is_empty() {
        return Ok(out);
    }
    let rec_size = u32_at(sec, 0)? as usize;
    if rec_size < 16 {
        bail!(Format, ".BTF.ext core_relo record size {rec_size} < 16");
    }
    let mut p = 4;
    while p < sec.len() {
        let section = btf.name_at(u32_at(sec, p)?)?;
        let n = u32_at(sec, p + 4)? as usize;
        p += 8;
        for _ in 0..n {
            out.push(CoreRelo {
                section: section.clone(),
                insn_off: u32_at(sec, p)?,
                type_id: u32_at(sec, p + 4)?,
                access: btf.name_at(u32_at(sec, p + 8)?)?,
                kind: u32_at(sec, p + 12)?,
            });
            p += rec_size;
        }
    }
    Ok(out)
}

/// One step of an access spec (libbpf's bpf_core_accessor).
#[derive(Debug, Clone)]
struct Acc {
    type_id: u32,
    idx: u32,
    name: Option<String>,
}

/// What a relocation resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Matched; the value libbpf would patch in, and where the type was found.
    Resolved { value: u64, btf: String },
    /// No candidate matched: 0 for an existence check, a poisoned insn otherwise.
    Absent,
    /// Candidates disagree: libbpf fails the object.
    Ambiguous(String),
}

/// The local spec: root id, and the accessors (named members and array
/// indexes; anonymous members skipped as in bpf_core_parse_spec).
fn local_spec(local: &Btf, r: &CoreRelo) -> Result<Vec<Acc>> {
    let raw: Vec<u32> = r
        .access
        .split(':')
        .map(|s| {
            s.parse::<u32>()
                .with_context(|| format!("access string {:?}", r.access))
        })
        .collect::<Result<_>>()?;
    let first = *raw.first().context("empty access string")?;
    let mut accs = vec![Acc {
        type_id: r.type_id,
        idx: first,
        name: None,
    }];
    if r.is_type_based() {
        return Ok(accs);
    }
    if r.is_enumval() {
        let (_, t) = local.skip_mods(r.type_id);
        let Kind::Enum { values, .. } = &t.kind else {
            bail!(Format, "enumval relocation on a non-enum");
        };
        accs[0].name = Some(
            values
                .get(first as usize)
                .context("enumerator index")?
                .0
                .clone(),
        );
        return Ok(accs);
    }
    let mut id = r.type_id;
    for idx in &raw[1..] {
        let (sid, t) = local.skip_mods(id);
        match &t.kind {
            Kind::Struct { members, .. } | Kind::Union { members, .. } => {
                let m = members
                    .get(*idx as usize)
                    .context("member index out of range")?;
                if !m.name.is_empty() {
                    accs.push(Acc {
                        type_id: sid,
                        idx: *idx,
                        name: Some(m.name.clone()),
                    });
                }
                id = m.ty;
            }
            Kind::Array { elem, .. } => {
                accs.push(Acc {
                    type_id: sid,
                    idx: *idx,
                    name: None,
                });
                id = *elem;
            }
            _ => bail!(
                Format,
                "access {:?} walks into a {}",
                r.access,
                t.core_kind()
            ),
        }
    }
    Ok(accs)
}

/// Target member of local accessor `acc`, searched by name through
/// anonymous members (bpf_core_match_member): (member type, bit offset).
fn match_member(l: &Btf, acc: &Acc, t: &Btf, tid: u32) -> Option<(u32, u64)> {
    let lm = l.ty(acc.type_id).members()?.get(acc.idx as usize)?;
    let (_, tt) = t.skip_mods(tid);
    for m in tt.members()? {
        if m.name.is_empty() {
            if let Some((ty, off)) = match_member(l, acc, t, m.ty) {
                return Some((ty, off + u64::from(m.bit_offset)));
            }
        } else if m.name == lm.name {
            return fields_are_compat(l, lm.ty, t, m.ty).then_some((m.ty, u64::from(m.bit_offset)));
        }
    }
    None
}

/// The value a matching candidate gives, or None when it does not match.
fn match_candidate(l: &Btf, r: &CoreRelo, accs: &[Acc], t: &Btf, cand: u32) -> Option<u64> {
    match r.kind {
        6 => return Some(u64::from(r.type_id)),
        7..=9 => {
            return types_are_compat(l, r.type_id, t, cand, 32).then(|| match r.kind {
                7 => u64::from(cand),
                8 => 1,
                _ => type_size(t, cand),
            });
        }
        12 => return types_match(l, r.type_id, t, cand, 32).then_some(1),
        10 | 11 => {
            let (_, tt) = t.skip_mods(cand);
            let Kind::Enum { values, .. } = &tt.kind else {
                return None;
            };
            let want = essential(accs[0].name.as_deref()?);
            let (_, v) = values.iter().find(|(n, _)| essential(n) == want)?;
            return Some(if r.kind == 10 { 1 } else { *v as u64 });
        }
        _ => {}
    }
    // Field relocations: walk the target along the local accessors.
    let mut id = cand;
    let mut bit_off = u64::from(accs[0].idx) * type_size(t, cand) * 8;
    for acc in accs.iter().skip(1) {
        if acc.name.is_some() {
            let (ty, off) = match_member(l, acc, t, id)?;
            bit_off += off;
            id = ty;
        } else {
            let (_, tt) = t.skip_mods(id);
            let Kind::Array { elem, nelems } = tt.kind else {
                return None;
            };
            // nelems 0: a flexible array, any index goes (is_flex_arr).
            if nelems != 0 && acc.idx >= nelems {
                return None;
            }
            bit_off += u64::from(acc.idx) * type_size(t, elem) * 8;
            id = elem;
        }
    }
    let (_, ft) = t.skip_mods(id);
    Some(match r.kind {
        0 => bit_off / 8,
        1 => type_size(t, id),
        2 => 1,
        3 => u64::from(matches!(ft.kind, Kind::Int { signed: true, .. })),
        _ => bit_off, // shifts: derived from the offset; compared for ambiguity only
    })
}

/// Resolves one relocation against the kernel: candidates from vmlinux
/// first, modules only when vmlinux has none (libbpf's bpf_core_find_cands).
pub fn resolve(local: &Btf, r: &CoreRelo, kernel: &KernelBtf) -> Result<Outcome> {
    if r.kind == 6 {
        return Ok(Outcome::Resolved {
            value: u64::from(r.type_id),
            btf: "local".into(),
        });
    }
    let accs = local_spec(local, r)?;
    let root = local.ty(r.type_id);
    let ess = essential(&root.name);
    if ess.is_empty() {
        bail!(
            Format,
            "relocation against an anonymous type ({})",
            r.access
        );
    }
    let mut found: Option<(u64, String)> = None;
    for (at, btf) in kernel.all().enumerate() {
        let cands: Vec<u32> = btf
            .own_essential(ess)
            .iter()
            .copied()
            .filter(|c| kinds_compat(local, r.type_id, btf, *c))
            .collect();
        if cands.is_empty() {
            continue;
        }
        for c in cands {
            let Some(v) = match_candidate(local, r, &accs, btf, c) else {
                continue;
            };
            match &found {
                Some((old, _)) if *old != v && r.kind != 7 => {
                    return Ok(Outcome::Ambiguous(format!(
                        "candidates give {old} and {v} ({} [{c}])",
                        btf.label
                    )));
                }
                Some(_) => {}
                None => found = Some((v, btf.label.clone())),
            }
        }
        // bpf_core_find_cands: candidates in vmlinux end the search;
        // otherwise every module's candidates count together.
        if at == 0 {
            break;
        }
    }
    Ok(match found {
        Some((value, btf)) => Outcome::Resolved { value, btf },
        None => Outcome::Absent,
    })
}

/// "struct kvm.userspace_pid"-style spelling of a relocation's target.
pub fn describe(local: &Btf, r: &CoreRelo) -> String {
    let root = local.ty(r.type_id);
    let mut s = format!("{} {}", root.core_kind(), root.name);
    match local_spec(local, r) {
        Ok(accs) if r.is_enumval() => {
            s.push_str(&format!("::{}", accs[0].name.clone().unwrap_or_default()));
        }
        Ok(accs) => {
            for a in accs.iter().skip(1) {
                match &a.name {
                    Some(n) => s.push_str(&format!(".{n}")),
                    None => s.push_str(&format!("[{}]", a.idx)),
                }
            }
        }
        Err(e) => s.push_str(&format!(" (bad spec: {e})")),
    }
    s
}
