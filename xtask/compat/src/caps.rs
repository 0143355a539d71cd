//! Kernel capabilities from the config and BTF, and what they mean for
//! tierd: ageing drivers and backends (README.md's backend table).

use crate::btf::Kind;
use crate::check::ObjectReport;
use crate::kernel::Kernel;

/// Config options the report shows, and why each matters.
pub const CONFIG_KEYS: [(&str, &str); 17] = [
    ("CONFIG_DEBUG_INFO_BTF", "vmlinux BTF: CO-RE, fexit"),
    (
        "CONFIG_DEBUG_INFO_BTF_MODULES",
        "kvm.ko BTF: fexit on kvm_age_gfn",
    ),
    ("CONFIG_BPF_JIT", "BPF trampolines"),
    ("CONFIG_FUNCTION_TRACER", "fexit trampolines"),
    (
        "CONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS",
        "fexit trampolines",
    ),
    ("CONFIG_KPROBES", "kprobes"),
    ("CONFIG_IDLE_PAGE_TRACKING", "page_idle ageing driver"),
    ("CONFIG_DAMON", "DAMON"),
    ("CONFIG_DAMON_VADDR", "DAMON vaddr ops"),
    ("CONFIG_DAMON_SYSFS", "DAMON sysfs"),
    ("CONFIG_LRU_GEN", "MGLRU"),
    ("CONFIG_LRU_GEN_ENABLED", "MGLRU on by default"),
    ("CONFIG_PERF_EVENTS", "perf_event programs"),
    ("CONFIG_KVM", "kvm"),
    ("CONFIG_KVM_INTEL", "kvm-intel"),
    ("CONFIG_KVM_AMD", "kvm-amd"),
    ("CONFIG_TRANSPARENT_HUGEPAGE", "huge SPTEs"),
];

#[derive(Debug, Clone)]
pub struct Caps {
    pub config: Vec<(&'static str, String)>,
    pub btf_facts: Vec<(&'static str, bool)>,
    pub drivers: Vec<String>,
    /// (backend, can run, why).
    pub backends: Vec<(&'static str, bool, String)>,
}

fn has_member(kernel: &Kernel, strukt: &str, member: &str) -> bool {
    kernel.btf.find(strukt, "struct").is_some_and(|(b, id)| {
        b.ty(id)
            .members()
            .is_some_and(|ms| ms.iter().any(|m| m.name == member))
    })
}

/// Attach verdict of `program` in `object`, if the object was checked.
fn attach_ok(objects: &[ObjectReport], object: &str, program: &str) -> Option<(bool, String)> {
    let o = objects.iter().find(|o| o.object == object)?;
    let (_, _, a) = o.attach.iter().find(|(p, _, _)| p == program)?;
    Some((a.ok, format!("{}: {}", a.target, a.detail)))
}

fn object_loads(objects: &[ObjectReport], object: &str) -> Result<(), String> {
    match objects.iter().find(|o| o.object == object) {
        Some(o) if o.failures.is_empty() => Ok(()),
        Some(o) => Err(format!(
            "{}.bpf.o refused: {}",
            object,
            o.failures.join("; ")
        )),
        None => Err(format!("{object}.bpf.o not checked")),
    }
}

pub fn derive(kernel: &Kernel, objects: &[ObjectReport]) -> Caps {
    let config = CONFIG_KEYS
        .iter()
        .map(|(k, _)| (*k, kernel.config_value(k).to_string()))
        .collect();
    let kfunc = kernel
        .btf
        .find("bpf_cast_to_kern_ctx", "func")
        .is_some_and(|(b, id)| matches!(b.ty(id).kind, Kind::Func { .. }));
    let btf_facts = vec![
        ("kfunc bpf_cast_to_kern_ctx", kfunc),
        (
            "perf_sample_data.sample_flags",
            has_member(kernel, "perf_sample_data", "sample_flags"),
        ),
        (
            "kvm.userspace_pid",
            has_member(kernel, "kvm", "userspace_pid"),
        ),
    ];
    let on = |k: &str| kernel.config_on(k);
    let page_idle = on("CONFIG_IDLE_PAGE_TRACKING");
    let damon = on("CONFIG_DAMON") && on("CONFIG_DAMON_VADDR") && on("CONFIG_DAMON_SYSFS");
    let mut drivers = Vec::new();
    if page_idle {
        drivers.push("page_idle".to_string());
    }
    if damon {
        drivers.push("DAMON vaddr (sysfs: tierd's own kdamonds when DAMON is unused)".to_string());
    }
    if on("CONFIG_LRU_GEN") {
        let default = if on("CONFIG_LRU_GEN_ENABLED") {
            "on"
        } else {
            "off"
        };
        drivers.push(format!("MGLRU (reclaim only, default {default})"));
    }
    let no_driver = if page_idle || damon {
        None
    } else {
        Some("no ageing driver: CONFIG_IDLE_PAGE_TRACKING and DAMON vaddr off")
    };
    let driver_note = if page_idle {
        "page_idle"
    } else {
        "DAMON driver (no page_idle; needs DAMON unused by others)"
    };
    let mut backends = Vec::new();
    // ept-fexit: trampolines, BTF of kvm.ko, the fexit program, a driver.
    let mut why: Vec<String> = Vec::new();
    for k in [
        "CONFIG_DEBUG_INFO_BTF",
        "CONFIG_DEBUG_INFO_BTF_MODULES",
        "CONFIG_BPF_JIT",
        "CONFIG_FUNCTION_TRACER",
        "CONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS",
        "CONFIG_KVM",
    ] {
        if !on(k) {
            why.push(format!("{k} off"));
        }
    }
    if let Err(e) = object_loads(objects, "ept") {
        why.push(e);
    }
    match attach_ok(objects, "ept", "ept_fexit_age_gfn") {
        Some((true, _)) => {}
        Some((false, d)) => why.push(d),
        None => why.push("ept_fexit_age_gfn not found".into()),
    }
    let hooks = why.is_empty();
    why.extend(no_driver.map(String::from));
    backends.push(verdict(
        "ept-fexit",
        hooks,
        why,
        &format!("fexit on kvm_age_gfn loads; ageing: {driver_note}"),
    ));
    let mut why = Vec::new();
    if !on("CONFIG_KVM") {
        why.push("CONFIG_KVM off".to_string());
    }
    if let Err(e) = object_loads(objects, "ept") {
        why.push(e);
    }
    match attach_ok(objects, "ept", "ept_spte_changed") {
        Some((true, _)) => {}
        Some((false, d)) => why.push(d),
        None => why.push("ept_spte_changed not found".into()),
    }
    let hooks = why.is_empty();
    why.extend(no_driver.map(String::from));
    backends.push(verdict(
        "ept-tracepoint",
        hooks,
        why,
        &format!(
            "raw_tp kvm_tdp_mmu_spte_changed exists (needs kvm.tdp_mmu=Y and EPT/NPT at run time); ageing: {driver_note}"
        ),
    ));
    let clear_refs = on("CONFIG_PROC_PAGE_MONITOR");
    backends.push((
        "hostpte",
        clear_refs,
        if clear_refs {
            "CONFIG_PROC_PAGE_MONITOR: clear_refs and smaps Referenced".to_string()
        } else {
            "CONFIG_PROC_PAGE_MONITOR off: no clear_refs".to_string()
        },
    ));
    let mut why = Vec::new();
    if !on("CONFIG_PERF_EVENTS") {
        why.push("CONFIG_PERF_EVENTS off".to_string());
    }
    if let Err(e) = object_loads(objects, "pmu") {
        why.push(e);
    }
    let pmu_ok = why.is_empty();
    let mut note = String::from("pmu.bpf.o loads; needs a hardware PMU at run time");
    for p in ["pmu_kvm_entry", "pmu_kvm_userspace_exit"] {
        if let Some((false, d)) = attach_ok(objects, "pmu", p) {
            note.push_str(&format!("; KVM_RUN watch: {d}"));
        }
    }
    backends.push(verdict("pmu", pmu_ok, why, &note));
    Caps {
        config,
        btf_facts,
        drivers,
        backends,
    }
}

/// "yes" only when the hooks load and nothing else is missing.
fn verdict(
    name: &'static str,
    hooks: bool,
    why: Vec<String>,
    ok_note: &str,
) -> (&'static str, bool, String) {
    if why.is_empty() {
        (name, true, ok_note.to_string())
    } else if hooks {
        (name, false, format!("hooks load; {}", why.join("; ")))
    } else {
        (name, false, why.join("; "))
    }
}
