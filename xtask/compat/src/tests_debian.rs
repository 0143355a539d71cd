//! The full check against the real Debian kernel packages; ignored with
//! the reason where apt does not know them (build.rs).

use std::sync::OnceLock;

use crate::check;
use crate::kernel;
use crate::tests::{compile, dirs};
use crate::{Options, check_all};

/// The check of the default kernels, run once for the tests here. apt
/// knows the packages (build.rs), so failing to fetch them is a failure.
fn debian_summary() -> &'static crate::Summary {
    static SUMMARY: OnceLock<Result<crate::Summary, String>> = OnceLock::new();
    match SUMMARY.get_or_init(|| {
        check_all(&Options::default(), &dirs(), &mut |_| {}).map_err(|e| format!("{e:#}"))
    }) {
        Ok(s) => s,
        Err(e) => panic!("Debian kernel packages known to apt but not checked: {e}"),
    }
}

#[test]
#[cfg_attr(
    not(debian_kernels),
    ignore = "apt knows no linux-image-6.1.0-* and 6.12.* packages here (not Debian 12, or no package lists)"
)]
fn debian_kernels_load_every_object_when_debian_packages_are_reachable() {
    let s = debian_summary();
    assert!(
        s.kernels.len() >= 4,
        "{:?}",
        s.kernels.iter().map(|k| &k.package).collect::<Vec<_>>()
    );
    assert_eq!(
        s.load_failures(),
        0,
        "{}",
        crate::report::matrix(&s.kernels)
    );
    for k in &s.kernels {
        let six_one = k.package.starts_with("linux-image-6.1.0-");
        let config = |key: &str| {
            k.caps
                .config
                .iter()
                .find(|(c, _)| *c == key)
                .unwrap()
                .1
                .clone()
        };
        let fact = |f: &str| k.caps.btf_facts.iter().find(|(n, _)| *n == f).unwrap().1;
        assert_eq!(config("CONFIG_IDLE_PAGE_TRACKING"), "n", "{}", k.package);
        assert_eq!(
            config("CONFIG_DEBUG_INFO_BTF_MODULES"),
            "y",
            "{}",
            k.package
        );
        assert_eq!(
            config("CONFIG_DAMON"),
            if six_one { "n" } else { "y" },
            "{}",
            k.package
        );
        assert_eq!(
            config("CONFIG_LRU_GEN_ENABLED"),
            if six_one { "n" } else { "y" },
            "{}",
            k.package
        );
        assert_eq!(
            fact("kfunc bpf_cast_to_kern_ctx"),
            !six_one,
            "{}",
            k.package
        );
        assert!(fact("kvm.userspace_pid") && fact("perf_sample_data.sample_flags"));
        for o in &k.objects {
            let (ok, total) = o.resolved();
            assert_eq!(ok, total, "{} on {}", o.object, k.package);
            for (prog, _, a) in &o.attach {
                assert!(a.ok, "{prog} on {}: {}", k.package, a.detail);
            }
        }
        // pmu.bpf.o needs no kfunc at all (docs/pmu.md, "Kernels").
        let pmu = k.objects.iter().find(|o| o.object == "pmu").unwrap();
        assert!(pmu.externs.is_empty(), "{:?}", pmu.externs);
        // The fexit targets live in kvm.ko's split BTF.
        let ept = k.objects.iter().find(|o| o.object == "ept").unwrap();
        let (_, _, fexit) = ept
            .attach
            .iter()
            .find(|(p, _, _)| p == "ept_fexit_age_gfn")
            .unwrap();
        assert!(fexit.detail.starts_with("ok (kvm:"), "{}", fexit.detail);
        // 6.1 has no ageing driver (no page_idle, no DAMON); 6.12 has
        // DAMON vaddr, which tierd drives.
        let ageing = k.caps.backends.iter().find(|b| b.0 == "ept-fexit").unwrap();
        if k.package.contains("6.1.0") {
            assert!(
                !ageing.1 && ageing.2.contains("no ageing driver"),
                "{ageing:?}"
            );
        } else {
            assert!(ageing.1 && ageing.2.contains("DAMON driver"), "{ageing:?}");
        }
    }
}

/// pmu.bpf.c's old form: `pmu_sample` read the sample's data_src through a
/// strong `bpf_cast_to_kern_ctx`. The checker must refuse it on 6.1 (no
/// such kfunc) and accept it on 6.12.
const STRONG_KFUNC: &str = r#"
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "GPL";

extern void *bpf_cast_to_kern_ctx(void *) __ksym;

__u64 out;

SEC("perf_event")
int pmu_sample(struct bpf_perf_event_data *ctx)
{
	struct bpf_perf_event_data_kern *kctx = bpf_cast_to_kern_ctx(ctx);
	struct perf_sample_data *data = BPF_CORE_READ(kctx, data);

	out = BPF_CORE_READ(data, data_src.val);
	return 0;
}
"#;

#[test]
#[cfg_attr(
    not(debian_kernels),
    ignore = "apt knows no linux-image-6.1.0-* and 6.12.* packages here (not Debian 12, or no package lists)"
)]
fn strong_kfunc_fails_on_6_1_only_when_debian_packages_are_reachable() {
    let s = debian_summary();
    let strong = STRONG_KFUNC;
    let dir = tempfile::tempdir().unwrap();
    let obj = compile(dir.path(), "pmu", strong);
    assert!(
        obj.externs
            .iter()
            .any(|e| e.name == "bpf_cast_to_kern_ctx" && !e.weak)
    );
    let dirs = dirs();
    for k in &s.kernels {
        let kernel = kernel::load(&k.package, &dirs.kernel(&k.package)).unwrap();
        let report = check::check_object(&obj, &kernel).unwrap();
        if k.package.starts_with("linux-image-6.1.0-") {
            eprintln!(
                "{} refuses the strong copy: {:?}",
                k.package, report.failures
            );
            assert_eq!(
                report.failures.len(),
                1,
                "{}: {:?}",
                k.package,
                report.failures
            );
            assert!(
                report.failures[0].contains("bpf_cast_to_kern_ctx"),
                "{:?}",
                report.failures
            );
        } else {
            eprintln!("{} accepts the strong copy", k.package);
            assert!(
                report.failures.is_empty(),
                "{}: {:?}",
                k.package,
                report.failures
            );
        }
    }
}
