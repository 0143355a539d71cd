//! Type compatibility as libbpf judges it (tools/lib/bpf/relo_core.c):
//! for CO-RE field and type relocations and kfunc prototypes.

use crate::btf::{Btf, Kind, essential};

/// Byte size of a type (0 when it has none).
pub fn type_size(btf: &Btf, id: u32) -> u64 {
    let (_, t) = btf.skip_mods(id);
    match &t.kind {
        Kind::Int { size, .. }
        | Kind::Struct { size, .. }
        | Kind::Union { size, .. }
        | Kind::Enum { size, .. }
        | Kind::Float(size) => u64::from(*size),
        Kind::Ptr(_) => 8,
        Kind::Array { elem, nelems } => u64::from(*nelems) * type_size(btf, *elem),
        _ => 0,
    }
}

pub fn kinds_compat(a: &Btf, ai: u32, b: &Btf, bi: u32) -> bool {
    a.ty(ai).core_kind() == b.ty(bi).core_kind()
}

/// bpf_core_fields_are_compat.
pub fn fields_are_compat(l: &Btf, lid: u32, t: &Btf, tid: u32) -> bool {
    let (lid, lt) = l.skip_mods(lid);
    let (tid, tt) = t.skip_mods(tid);
    if lt.members().is_some() && tt.members().is_some() {
        return true;
    }
    if !kinds_compat(l, lid, t, tid) {
        return false;
    }
    match (&lt.kind, &tt.kind) {
        (Kind::Ptr(_), _) | (Kind::Float(_), _) => true,
        (Kind::Fwd | Kind::Enum { .. }, _) => {
            let (a, b) = (essential(&lt.name), essential(&tt.name));
            a.is_empty() || b.is_empty() || a == b
        }
        (Kind::Int { bit_offset: a, .. }, Kind::Int { bit_offset: b, .. }) => *a == 0 && *b == 0,
        (Kind::Array { elem: a, .. }, Kind::Array { elem: b, .. }) => {
            fields_are_compat(l, *a, t, *b)
        }
        _ => false,
    }
}

/// bpf_core_types_are_compat (also what libbpf checks a kfunc prototype with).
pub fn types_are_compat(l: &Btf, lid: u32, t: &Btf, tid: u32, depth: u32) -> bool {
    // Kinds are compared after modifiers and typedefs are skipped, at every
    // level (so `ptr -> const struct` matches `ptr -> struct`).
    if depth == 0 {
        return false;
    }
    let (lid, lt) = l.skip_mods(lid);
    let (tid, tt) = t.skip_mods(tid);
    if !kinds_compat(l, lid, t, tid) {
        return false;
    }
    match (&lt.kind, &tt.kind) {
        (Kind::Void | Kind::Struct { .. } | Kind::Union { .. } | Kind::Enum { .. }, _)
        | (Kind::Fwd, _) => true,
        (Kind::Int { bit_offset: a, .. }, Kind::Int { bit_offset: b, .. }) => *a == 0 && *b == 0,
        (Kind::Ptr(a), Kind::Ptr(b)) => types_are_compat(l, *a, t, *b, depth - 1),
        (Kind::Array { elem: a, .. }, Kind::Array { elem: b, .. }) => {
            types_are_compat(l, *a, t, *b, depth - 1)
        }
        (
            Kind::FuncProto {
                ret: lr,
                params: lp,
            },
            Kind::FuncProto {
                ret: tr,
                params: tp,
            },
        ) => {
            lp.len() == tp.len()
                && lp.iter().zip(tp).all(|((_, a), (_, b))| {
                    types_are_compat(l, l.skip_mods(*a).0, t, t.skip_mods(*b).0, depth - 1)
                })
                && types_are_compat(l, *lr, t, *tr, depth - 1)
        }
        _ => false,
    }
}

/// bpf_core_types_match (TYPE_MATCHES), simplified: same kind, ints of the
/// same size and sign, every local member / enumerator present by name with
/// a matching type, pointers and arrays recursively, prototypes by arity.
pub fn types_match(l: &Btf, lid: u32, t: &Btf, tid: u32, depth: u32) -> bool {
    let (lid, lt) = l.skip_mods(lid);
    let (tid, tt) = t.skip_mods(tid);
    if depth == 0 || !kinds_compat(l, lid, t, tid) {
        return false;
    }
    match (&lt.kind, &tt.kind) {
        (
            Kind::Int {
                size: a,
                signed: sa,
                ..
            },
            Kind::Int {
                size: b,
                signed: sb,
                ..
            },
        ) => a == b && sa == sb,
        (Kind::Enum { values: a, .. }, Kind::Enum { values: b, .. }) => a
            .iter()
            .all(|(n, _)| b.iter().any(|(m, _)| essential(m) == essential(n))),
        (Kind::Ptr(a), Kind::Ptr(b)) => types_match(l, *a, t, *b, depth - 1),
        (Kind::Array { elem: a, nelems: x }, Kind::Array { elem: b, nelems: y }) => {
            x == y && types_match(l, *a, t, *b, depth - 1)
        }
        (Kind::FuncProto { params: a, .. }, Kind::FuncProto { params: b, .. }) => {
            a.len() == b.len()
        }
        _ => match (lt.members(), tt.members()) {
            (Some(lm), Some(tm)) => lm.iter().all(|m| {
                tm.iter()
                    .any(|n| n.name == m.name && types_match(l, m.ty, t, n.ty, depth - 1))
            }),
            _ => true,
        },
    }
}
