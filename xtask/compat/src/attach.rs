//! Attach targets of programs, from their ELF section names: fentry/fexit
//! need a FUNC in vmlinux or module BTF whose prototype has the arguments
//! the program reads; raw_tp needs the tracepoint (`btf_trace_<name>`
//! typedef) with at least as many arguments as the program reads.

use crate::btf::{Btf, Kind};
use crate::kernel::Kernel;
use crate::object::{Object, Program};
use crate::types;

/// An argument a program reads, as its BPF source declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg {
    /// A pointer to `struct NAME`.
    PtrTo(&'static str),
    /// An integer (or enum, or bool) of this many bytes.
    Int(u32),
}

/// What the programs read, taken from bpf/*.bpf.c: BPF_PROG() programs
/// have only a `u64 *ctx` prototype in BTF (the typed inner function is
/// inlined away), so the typed arguments are written down here. Change
/// together with the sources.
const READS: &[(&str, &[Arg], Option<Arg>)] = &[
    // fexit(struct kvm *kvm, struct kvm_gfn_range *range, bool ret)
    (
        "ept_fexit_age_gfn",
        &[Arg::PtrTo("kvm"), Arg::PtrTo("kvm_gfn_range")],
        Some(Arg::Int(1)),
    ),
    (
        "probe_fexit_age_gfn",
        &[Arg::PtrTo("kvm"), Arg::PtrTo("kvm_gfn_range")],
        Some(Arg::Int(1)),
    ),
    // raw_tp(int as_id, u64 gfn, int level, u64 old_spte, u64 new_spte)
    (
        "ept_spte_changed",
        &[
            Arg::Int(4),
            Arg::Int(8),
            Arg::Int(4),
            Arg::Int(8),
            Arg::Int(8),
        ],
        None,
    ),
    // raw_tp(struct kvm_vcpu *vcpu): reads only the first argument
    ("pmu_kvm_entry", &[Arg::PtrTo("kvm_vcpu")], None),
    // Read no arguments.
    ("pmu_kvm_userspace_exit", &[], None),
    ("probe_raw_tp_spte", &[], None),
    ("raw_tp_empty", &[], None),
];

/// Result of one program's attach check.
#[derive(Debug, Clone)]
pub struct AttachCheck {
    /// `fexit kvm_age_gfn`, `raw_tp kvm_entry`, `perf_event`, ...
    pub target: String,
    pub ok: bool,
    /// Target missing or mismatching is refused at load (fentry/fexit) rather
    /// than at attach (raw_tp).
    pub resolved_at_load: bool,
    pub detail: String,
}

fn arg_fits(btf: &Btf, id: u32, want: Arg) -> bool {
    let (_, t) = btf.skip_mods(id);
    match (want, &t.kind) {
        (Arg::PtrTo(name), Kind::Ptr(to)) => {
            let (_, s) = btf.skip_mods(*to);
            matches!(s.kind, Kind::Struct { .. }) && s.name == name
        }
        (Arg::Int(n), Kind::Int { size, .. } | Kind::Enum { size, .. }) => *size == n,
        _ => false,
    }
}

fn describe_params(btf: &Btf, params: &[(String, u32)]) -> String {
    params
        .iter()
        .map(|(n, t)| format!("{} {n}", btf.describe(*t)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks `params` (and `ret` for fexit) against what the program reads.
fn compare(
    btf: &Btf,
    params: &[(String, u32)],
    ret: Option<u32>,
    reads: &[Arg],
    want_ret: Option<Arg>,
    exact: bool,
) -> Result<(), String> {
    let sig = describe_params(btf, params);
    if (exact && params.len() != reads.len()) || params.len() < reads.len() {
        return Err(format!(
            "has {} args ({sig}), program reads {}",
            params.len(),
            reads.len()
        ));
    }
    for (i, (want, (name, id))) in reads.iter().zip(params).enumerate() {
        if !arg_fits(btf, *id, *want) {
            return Err(format!(
                "arg {i} {name} is {}, program reads {want:?}",
                btf.describe(*id)
            ));
        }
    }
    if let (Some(want), Some(r)) = (want_ret, ret)
        && !arg_fits(btf, r, want)
    {
        return Err(format!(
            "returns {}, program reads {want:?}",
            btf.describe(r)
        ));
    }
    Ok(())
}

/// The program's own FUNC_PROTO params when they are typed, i.e. not the
/// single context pointer every BPF_PROG() program has.
fn typed_proto<'a>(obj: &'a Object, prog: &Program) -> Option<&'a [(String, u32)]> {
    let Kind::FuncProto { params, .. } = &obj.btf.ty(prog.proto?).kind else {
        return None;
    };
    (params.len() > 1).then_some(params.as_slice())
}

/// A typed program prototype against the target's: same count for fexit
/// (the return value follows the arguments), no more otherwise.
fn compare_typed(
    local: &Btf,
    own: &[(String, u32)],
    kb: &Btf,
    params: &[(String, u32)],
    exact: bool,
) -> Result<(), String> {
    // fexit programs take the return value after the arguments.
    let args = if exact {
        own.len().saturating_sub(1)
    } else {
        own.len()
    };
    if (exact && args != params.len()) || args > params.len() {
        return Err(format!(
            "has {} args, program takes {}",
            params.len(),
            own.len()
        ));
    }
    for (i, ((_, l), (name, t))) in own[..args].iter().zip(params).enumerate() {
        if !types::types_are_compat(local, *l, kb, *t, 32) {
            return Err(format!(
                "arg {i} {name} is {}, program takes {}",
                kb.describe(*t),
                local.describe(*l)
            ));
        }
    }
    Ok(())
}

pub fn check(obj: &Object, prog: &Program, kernel: &Kernel) -> AttachCheck {
    let sec = prog.section.as_str();
    let table = READS.iter().find(|(n, _, _)| *n == prog.name);
    let mut out = AttachCheck {
        target: sec.replace('/', " "),
        ok: true,
        resolved_at_load: false,
        detail: String::new(),
    };
    let (kind, target) = sec.split_once('/').unwrap_or((sec, ""));
    match kind {
        "fexit" | "fentry" | "fmod_ret" => {
            out.resolved_at_load = true;
            let Some((kb, id)) = kernel.btf.find(target, "func") else {
                out.ok = false;
                out.detail = "absent: no FUNC in vmlinux or module BTF".into();
                return out;
            };
            let Kind::Func { proto } = kb.ty(id).kind else {
                return out;
            };
            let Kind::FuncProto { ret, params } = &kb.ty(proto).kind else {
                return out;
            };
            let result = match (typed_proto(obj, prog), table) {
                // A typed prototype in the object (not BPF_PROG's `u64 *ctx`):
                // its parameters against the target's, by CO-RE compatibility.
                (Some(own), _) => compare_typed(&obj.btf, own, kb, params, kind == "fexit"),
                (None, Some((_, reads, want_ret))) => compare(
                    kb,
                    params,
                    Some(*ret),
                    reads,
                    if kind == "fexit" { *want_ret } else { None },
                    kind == "fexit",
                ),
                (None, None) => Err("no argument table for this program (attach.rs READS)".into()),
            };
            out.detail = match result {
                Ok(()) => format!("ok ({}: {})", kb.label, describe_params(kb, params)),
                Err(e) => {
                    out.ok = false;
                    format!("mismatch: {e}")
                }
            };
        }
        "raw_tp" | "raw_tracepoint" | "tp_btf" if !target.is_empty() => {
            out.resolved_at_load = kind == "tp_btf";
            let Some((kb, id)) = kernel.btf.find(&format!("btf_trace_{target}"), "typedef") else {
                out.ok = false;
                out.detail = format!("absent: no btf_trace_{target} in vmlinux or module BTF");
                return out;
            };
            let (_, ptr) = kb.skip_mods(id);
            let proto = match ptr.kind {
                Kind::Ptr(p) => kb.ty(p),
                _ => ptr,
            };
            let Kind::FuncProto { params, .. } = &proto.kind else {
                out.ok = false;
                out.detail = "btf_trace typedef is not a function pointer".into();
                return out;
            };
            // params[0] is the tracepoint's `void *__data`.
            let args = params.get(1..).unwrap_or(&[]);
            let reads = table.map_or(&[][..], |(_, r, _)| *r);
            out.detail = match compare(kb, args, None, reads, None, false) {
                Ok(()) => format!("ok ({}: {})", kb.label, describe_params(kb, args)),
                Err(e) => {
                    out.ok = false;
                    format!("mismatch: {e}")
                }
            };
        }
        "raw_tp" | "raw_tracepoint" => out.detail = "no target (BPF_PROG_TEST_RUN only)".into(),
        "perf_event" => out.detail = "perf event fd (needs a PMU at run time)".into(),
        _ => out.detail = "not checked (program type without a BTF target)".into(),
    }
    out
}
