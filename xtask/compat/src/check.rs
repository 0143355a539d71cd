//! Checks of one BPF object against one kernel: CO-RE relocations, kfunc /
//! ksym externs and attach targets, with the rule that decides whether
//! libbpf would refuse the object (docs/compat.md).

use crate::Result;
use crate::attach::{self, AttachCheck};
use crate::btf::Kind;
use crate::core::{self, Outcome};
use crate::kernel::Kernel;
use crate::object::Object;
use crate::types;

/// How the daemon loads a program (profiler/src/probe.rs,
/// sampler/ept/load.rs, sampler/pmu/loader.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Loaded alone or per backend; a refusal only turns that probe or
    /// backend off (`tierd probe`, ept-fexit / ept-tracepoint).
    Optional,
    /// Loaded with the whole object (pmu.bpf.o's autoload set): a refusal
    /// at load fails the object.
    Together,
    /// Only loaded by tests or benchmarks (autoload off in the daemon).
    TestOnly,
}

pub fn program_use(object: &str, program: &str) -> Use {
    match (object, program) {
        ("pmu", "pmu_account_test") | ("ept", "raw_tp_empty" | "ept_age_test") => Use::TestOnly,
        ("pmu", _) => Use::Together,
        _ => Use::Optional,
    }
}

/// State of one CO-RE relocation on one kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelocState {
    Resolved,
    /// An existence check that evaluates to 0.
    ExistsZero,
    /// No target, but the program checks existence of the same field first.
    GuardedAbsent,
    /// No target in a program only tests load.
    TestOnlyAbsent,
    /// No target (poisoned instruction) or ambiguous: the load fails.
    Failed,
}

#[derive(Debug, Clone)]
pub struct RelocResult {
    pub programs: Vec<String>,
    pub what: String,
    pub kind: &'static str,
    pub outcome: Outcome,
    pub state: RelocState,
}

#[derive(Debug, Clone)]
pub struct ExternResult {
    pub name: String,
    pub weak: bool,
    /// Where it was found ("vmlinux", "kvm"), or None.
    pub found_in: Option<String>,
    pub detail: String,
    pub failure: bool,
}

#[derive(Debug, Clone)]
pub struct ObjectReport {
    pub object: String,
    pub relocs: Vec<RelocResult>,
    pub externs: Vec<ExternResult>,
    pub attach: Vec<(String, Use, AttachCheck)>,
    /// Why libbpf would refuse the object on this kernel (empty: it loads).
    pub failures: Vec<String>,
}

impl ObjectReport {
    pub fn resolved(&self) -> (usize, usize) {
        let ok = self
            .relocs
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Resolved { .. }))
            .count();
        (ok, self.relocs.len())
    }
}

/// Runs every check of `obj` against `kernel`.
pub fn check_object(obj: &Object, kernel: &Kernel) -> Result<ObjectReport> {
    let mut relocs = Vec::new();
    let mut failures = Vec::new();
    for r in &obj.relos {
        let outcome = core::resolve(&obj.btf, r, &kernel.btf)?;
        let progs = obj.programs_of(r);
        let loaded = progs
            .iter()
            .any(|p| program_use(&obj.name, &p.name) != Use::TestOnly);
        // Guard: an existence check of the same type and access in the same program.
        let guarded = obj.relos.iter().any(|g| {
            g.is_existence_check()
                && g.type_id == r.type_id
                && g.access == r.access
                && g.section == r.section
                && obj
                    .programs_of(g)
                    .iter()
                    .any(|p| progs.iter().any(|q| q.name == p.name))
        });
        let what = core::describe(&obj.btf, r);
        let state = match &outcome {
            Outcome::Resolved { .. } => RelocState::Resolved,
            Outcome::Absent if r.is_existence_check() => RelocState::ExistsZero,
            Outcome::Absent if guarded => RelocState::GuardedAbsent,
            Outcome::Absent if !loaded => RelocState::TestOnlyAbsent,
            Outcome::Absent => RelocState::Failed,
            // libbpf fails the whole object on an ambiguous relocation.
            Outcome::Ambiguous(_) => RelocState::Failed,
        };
        let names: Vec<String> = progs.iter().map(|p| p.name.clone()).collect();
        if state == RelocState::Failed {
            failures.push(format!(
                "CO-RE {} {what} in {}: {:?}",
                r.kind_name(),
                names.join(","),
                outcome
            ));
        }
        relocs.push(RelocResult {
            programs: names,
            what,
            kind: r.kind_name(),
            outcome,
            state,
        });
    }
    let externs = obj
        .externs
        .iter()
        .map(|e| check_extern(obj, e, kernel))
        .collect::<Vec<_>>();
    for e in externs.iter().filter(|e| e.failure) {
        failures.push(format!("extern {}: {}", e.name, e.detail));
    }
    let mut attach = Vec::new();
    for p in &obj.programs {
        let usage = program_use(&obj.name, &p.name);
        let a = attach::check(obj, p, kernel);
        // fentry/fexit targets are resolved at load: fatal for a program
        // loaded with the whole object.
        if usage == Use::Together && a.resolved_at_load && !a.ok {
            failures.push(format!("{}: {}: {}", p.name, a.target, a.detail));
        }
        attach.push((p.name.clone(), usage, a));
    }
    Ok(ObjectReport {
        object: obj.name.clone(),
        relocs,
        externs,
        attach,
        failures,
    })
}

/// libbpf's bpf_object__resolve_ksyms: a kfunc must be a FUNC in vmlinux or
/// a module with a compatible prototype; a ksym variable a VAR.
fn check_extern(obj: &Object, e: &crate::object::Extern, kernel: &Kernel) -> ExternResult {
    let kind = if e.is_func { "func" } else { "var" };
    let mut res = ExternResult {
        name: e.name.clone(),
        weak: e.weak,
        found_in: None,
        detail: String::new(),
        failure: false,
    };
    match kernel.btf.find(&e.name, kind) {
        Some((kb, id)) => {
            res.found_in = Some(kb.label.clone());
            let compat = match (&obj.btf.ty(e.btf_id).kind, &kb.ty(id).kind) {
                (Kind::Func { proto: l }, Kind::Func { proto: t }) => {
                    types::types_are_compat(&obj.btf, *l, kb, *t, 32)
                }
                _ => true,
            };
            if compat {
                res.detail = format!("present ({})", kb.label);
            } else {
                res.detail = format!("prototype incompatible with {} [{id}]", kb.label);
                res.failure = true;
            }
        }
        None if e.weak => res.detail = "weak, absent".into(),
        None => {
            res.detail = format!("strong {kind} absent from vmlinux and module BTF");
            res.failure = true;
        }
    }
    res
}
