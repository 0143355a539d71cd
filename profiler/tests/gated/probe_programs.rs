//! `tierd probe --programs` run through the real binary on this host's
//! kernel: every program of every object is listed (against the skeletons
//! and the SEC() lines of bpf/*.bpf.c, so a program added later must show),
//! each is loaded or says why, and the verdicts agree with `tierd probe`.
//!
//! Custom harness: without root the command cannot load anything, and the
//! tests are ignored with that reason, never passed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::collections::BTreeSet;
use std::mem::MaybeUninit;
use std::path::Path;
use std::process::Command;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libtest_mimic::{Completion, Trial};
use tier_profiler::bpf::{ept::EptSkelBuilder, pmu::PmuSkelBuilder, probe::ProbeSkelBuilder};
use tier_profiler::probe::programs::{Programs, Verdict};

fn tierd(args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_tierd"))
        .args(args)
        .env("TIERD_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tierd {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn programs_json() -> Programs {
    serde_json::from_slice(&tierd(&["probe", "--programs", "--json"]).stdout).unwrap()
}

fn names<'o>(open: impl OpenSkel<'o>) -> BTreeSet<String> {
    open.open_object()
        .progs()
        .map(|p| p.name().to_string_lossy().into_owned())
        .collect()
}

/// Program names per object, as the skeletons tierd is built with expose them.
fn skeleton_names() -> Vec<(&'static str, BTreeSet<String>)> {
    let (mut a, mut b, mut c) = (
        MaybeUninit::uninit(),
        MaybeUninit::uninit(),
        MaybeUninit::uninit(),
    );
    vec![
        (
            "ept.bpf.o",
            names(EptSkelBuilder::default().open(&mut a).unwrap()),
        ),
        (
            "pmu.bpf.o",
            names(PmuSkelBuilder::default().open(&mut b).unwrap()),
        ),
        (
            "probe.bpf.o",
            names(ProbeSkelBuilder::default().open(&mut c).unwrap()),
        ),
    ]
}

/// Programs in a .bpf.c: its SEC() lines that are neither maps nor license.
fn sec_programs(object: &str) -> usize {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../bpf")
        .join(object.replace(".bpf.o", ".bpf.c"));
    std::fs::read_to_string(&src)
        .unwrap()
        .lines()
        .filter(|l| l.trim_start().starts_with("SEC(\""))
        .count()
}

fn every_program_of_every_object_is_listed() {
    let report = programs_json();
    for (object, want) in skeleton_names() {
        let got: BTreeSet<String> = report
            .programs
            .iter()
            .filter(|v| v.object == object)
            .map(|v| v.program.clone())
            .collect();
        assert_eq!(got, want, "{object}: --programs against the skeleton");
        assert_eq!(want.len(), sec_programs(object), "{object}: SEC() lines");
    }
    let per: BTreeSet<(&str, &str)> = report
        .programs
        .iter()
        .map(|v| (v.object.as_str(), v.program.as_str()))
        .collect();
    assert_eq!(per.len(), report.programs.len(), "listed once each");
    let text = String::from_utf8(tierd(&["probe", "--programs"]).stdout).unwrap();
    for v in &report.programs {
        assert!(text.contains(&v.program), "{}: not in\n{text}", v.program);
    }
}

fn every_entry_is_loaded_or_says_why() {
    let report = programs_json();
    let uname = Command::new("uname").arg("-r").output().unwrap();
    assert_eq!(
        report.kernel,
        String::from_utf8(uname.stdout).unwrap().trim()
    );
    let why = |v: &Verdict| v.error.as_deref().is_some_and(|e| !e.trim().is_empty());
    for v in &report.programs {
        assert!(v.loaded || why(v), "{v:?}");
        if !v.loaded {
            assert_eq!(v.attached, None, "{v:?}");
            assert!(v.error.as_deref().unwrap().starts_with("load: "), "{v:?}");
        }
        if v.attached == Some(false) {
            assert!(why(v), "{v:?}");
        }
        // Everything with a hook is attached or says why not.
        if v.loaded && (v.section.contains('/') || v.section == "perf_event") {
            assert!(v.attached.is_some(), "{v:?}");
        }
    }
}

/// `tierd probe`'s ept-fexit and ept-tracepoint lines come from the same
/// probe.bpf.o programs: loaded and attached exactly when those say so.
fn agrees_with_tierd_probe() {
    let probe: serde_json::Value =
        serde_json::from_slice(&tierd(&["probe", "--json"]).stdout).unwrap();
    let check = |name: &str| {
        let c = probe["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("{name} not in tierd probe"));
        (
            c["available"].as_bool().unwrap(),
            c["reason"].as_str().unwrap().to_string(),
        )
    };
    let report = programs_json();
    let verdict = |program: &str| {
        report
            .programs
            .iter()
            .find(|v| v.object == "probe.bpf.o" && v.program == program)
            .unwrap_or_else(|| panic!("{program} not listed"))
            .clone()
    };
    let works = |v: &Verdict| v.loaded && v.attached == Some(true);

    let (fexit, reason) = check("ept-fexit");
    let v = verdict("probe_fexit_age_gfn");
    assert_eq!(fexit, works(&v), "{reason} vs {v:?}");
    if !fexit {
        // The same refusal, with the same errno text, at the same stage.
        let error = v.error.clone().unwrap();
        let (stage, _) = error.split_once(": ").unwrap();
        let os = error
            .rfind("(os error")
            .map_or(error.as_str(), |i| &error[i..]);
        assert!(
            reason.contains(&format!("{stage}: ")),
            "{reason} vs {error}"
        );
        assert!(reason.contains(os), "{reason} vs {error}");
    }

    // ept-tracepoint also needs TDP paging: "attaches, but ..." when not.
    let (tracepoint, reason) = check("ept-tracepoint");
    let v = verdict("probe_raw_tp_spte");
    if tracepoint || reason.starts_with("raw_tp attaches, but") {
        assert!(works(&v), "{reason} vs {v:?}");
    } else {
        assert!(!works(&v), "{reason} vs {v:?}");
    }
}

/// This file's trials, named `probe_programs::NAME`.
pub fn trials() -> Vec<Trial> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let trial = |name: &'static str, f: fn()| {
        Trial::ignorable_test(name, move || {
            if !root {
                return Ok(Completion::ignored_with(
                    "not root: bpf() refuses every program".to_string(),
                ));
            }
            f();
            Ok(Completion::Completed)
        })
    };
    let tests = vec![
        trial(
            "probe_programs::every_program_of_every_object_is_listed",
            every_program_of_every_object_is_listed,
        ),
        trial(
            "probe_programs::every_entry_is_loaded_or_says_why",
            every_entry_is_loaded_or_says_why,
        ),
        trial(
            "probe_programs::agrees_with_tierd_probe",
            agrees_with_tierd_probe,
        ),
    ];
    tests
}
