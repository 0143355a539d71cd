//! Capability probe: what this host lets tierd measure, each answer from a
//! real attempt (BPF load/attach, perf_event_open, files the kernel exposes).

pub mod programs;

use std::mem::MaybeUninit;
use std::path::Path;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use tier_proto::v1::{Backend, Capability};

use crate::bpf::probe::ProbeSkelBuilder;

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Check {
    pub name: &'static str,
    #[serde(serialize_with = "ser_backend")]
    pub backend: Backend,
    pub available: bool,
    pub reason: String,
    /// Finer lines under the check (e.g. one per PMU event), for humans.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
}

fn ser_backend<S: serde::Serializer>(b: &Backend, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(b.short_name())
}

impl Check {
    fn yes(name: &'static str, backend: Backend, reason: impl Into<String>) -> Check {
        Check {
            name,
            backend,
            available: true,
            reason: reason.into(),
            details: Vec::new(),
        }
    }
    fn no(name: &'static str, backend: Backend, reason: impl Into<String>) -> Check {
        Check {
            name,
            backend,
            available: false,
            reason: reason.into(),
            details: Vec::new(),
        }
    }
}

/// The whole report, in the order it is printed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub kvm_impl: Option<String>,
    pub checks: Vec<Check>,
}

impl Report {
    pub fn get(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }

    fn ok(&self, name: &str) -> bool {
        self.get(name).is_some_and(|c| c.available)
    }

    /// Hardware virtualisation (VMX/SVM): guests run on EPT/NPT, not on
    /// the host page tables.
    pub fn hardware_virt(&self) -> bool {
        matches!(self.kvm_impl.as_deref(), Some("kvm_intel" | "kvm_amd"))
    }

    /// The sampler tierd would pick: EPT ageing with an ageing driver beats
    /// host page tables, which are exact only for emulated guests and are
    /// never picked under hardware virtualisation (`clear_refs 4` zaps
    /// every SPTE of the VM each pass: docs/hostpte.md).
    pub fn best_backend(&self) -> Option<Backend> {
        let driver = self.ageing_driver();
        if self.ok("ept-fexit") && driver {
            Some(Backend::EptFexit)
        } else if self.ok("ept-tracepoint") && driver {
            Some(Backend::EptTracepoint)
        } else if self.ok("hostpte") && !self.hardware_virt() {
            Some(Backend::Hostpte)
        } else {
            None
        }
    }

    /// An ageing driver exists: page_idle, or DAMON free for tierd.
    pub fn ageing_driver(&self) -> bool {
        self.ok("page_idle") || self.ok("damon")
    }

    /// Why neither ageing driver can run, with what would fix it.
    pub fn no_ageing_driver_reason(&self) -> String {
        let why = |n: &str| {
            self.get(n)
                .map_or("not probed".to_string(), |c| c.reason.clone())
        };
        format!("no ageing driver ({}; {})", why("page_idle"), why("damon"))
    }

    /// Why `auto` picks no sampler here, for every VM's `not_measured`.
    pub fn no_sampler_reason(&self) -> String {
        let why = |n: &str| {
            self.get(n)
                .map_or("not probed".to_string(), |c| c.reason.clone())
        };
        let mut parts = Vec::new();
        if !self.ok("ept-fexit") && !self.ok("ept-tracepoint") {
            parts.push(format!(
                "no EPT hook ({}; {})",
                why("ept-fexit"),
                why("ept-tracepoint")
            ));
        }
        if !self.ageing_driver() {
            parts.push(self.no_ageing_driver_reason());
        }
        if self.hardware_virt() {
            parts.push("hostpte not used under hardware virtualisation".into());
        } else if !self.ok("hostpte") {
            parts.push(format!("hostpte: {}", why("hostpte")));
        }
        format!("no sampler backend: {}", parts.join("; "))
    }

    /// Protocol form; `selected` marks the backend the daemon runs.
    pub fn to_proto(&self, selected: Option<Backend>) -> Vec<Capability> {
        self.checks
            .iter()
            .map(|c| Capability {
                name: c.name.to_string(),
                backend: c.backend as i32,
                available: c.available,
                reason: c.reason.clone(),
                selected: c.available
                    && Some(c.backend) == selected
                    && c.backend != Backend::Unspecified,
            })
            .collect()
    }

    /// Aligned text for `tierd probe` and the demo.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        for c in &self.checks {
            let state = if c.available {
                "available  "
            } else {
                "unavailable"
            };
            out.push_str(&format!("  {:width$}  {state}  {}\n", c.name, c.reason));
            for d in &c.details {
                out.push_str(&format!("  {:width$}               {d}\n", ""));
            }
        }
        match self.best_backend() {
            Some(b) => out.push_str(&format!(
                "  best sampler backend here: {}\n",
                b.short_name()
            )),
            None => out.push_str("  best sampler backend here: none\n"),
        }
        out
    }
}

/// Runs every check. Never fails: a check that cannot run says why.
pub fn run() -> Report {
    let kvm_impl = kvm_implementation();
    let checks = vec![
        check_kvm(kvm_impl.as_deref()),
        check_btf(),
        check_fexit(),
        check_tracepoint(),
        check_page_idle(),
        check_damon(),
        check_pagemap(),
        check_hostpte(kvm_impl.as_deref()),
        with_kvm_run_watch(with_pmu_events(check_pmu())),
    ];
    Report { kvm_impl, checks }
}

/// Which KVM module backs /dev/kvm: kvm_intel, kvm_amd or kvm_pvm.
fn kvm_implementation() -> Option<String> {
    ["kvm_intel", "kvm_amd", "kvm_pvm"]
        .into_iter()
        .find(|m| Path::new("/sys/module").join(m).exists())
        .map(str::to_string)
}

fn check_kvm(implementation: Option<&str>) -> Check {
    let name = "kvm";
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => {
            let how = match implementation {
                Some("kvm_pvm") => "kvm_pvm: guest code is emulated, no EPT",
                Some("kvm_intel") => "kvm_intel (VMX)",
                Some("kvm_amd") => "kvm_amd (SVM)",
                _ => "unknown KVM module",
            };
            Check::yes(name, Backend::Unspecified, format!("/dev/kvm opens; {how}"))
        }
        Err(e) => Check::no(name, Backend::Unspecified, format!("/dev/kvm: {e}")),
    }
}

fn check_btf() -> Check {
    if Path::new("/sys/kernel/btf/vmlinux").exists() {
        Check::yes(
            "btf",
            Backend::Unspecified,
            "/sys/kernel/btf/vmlinux present (CO-RE works)",
        )
    } else {
        Check::no(
            "btf",
            Backend::Unspecified,
            "/sys/kernel/btf/vmlinux absent: kernel built without CONFIG_DEBUG_INFO_BTF",
        )
    }
}

/// Which probe program to load; the others get autoload off so that one
/// refused hook does not hide another.
#[derive(Clone, Copy)]
enum ProbeProg {
    Fexit,
    RawTp,
}

/// Loads one program of probe.bpf.c and attaches it; returns the error text
/// with the stage (load or attach) that failed.
fn load_and_attach(which: ProbeProg) -> Result<(), String> {
    let mut storage = MaybeUninit::uninit();
    let mut open = ProbeSkelBuilder::default()
        .open(&mut storage)
        .map_err(|e| format!("open: {e}"))?;
    open.progs
        .probe_fexit_age_gfn
        .set_autoload(matches!(which, ProbeProg::Fexit));
    open.progs
        .probe_raw_tp_spte
        .set_autoload(matches!(which, ProbeProg::RawTp));
    let skel = open.load().map_err(|e| format!("load: {e}"))?;
    let attached = match which {
        ProbeProg::Fexit => skel.progs.probe_fexit_age_gfn.attach(),
        ProbeProg::RawTp => skel.progs.probe_raw_tp_spte.attach(),
    };
    attached.map(drop).map_err(|e| format!("attach: {e}"))
}

fn check_fexit() -> Check {
    let name = "ept-fexit";
    match load_and_attach(ProbeProg::Fexit) {
        Ok(()) => Check::yes(
            name,
            Backend::EptFexit,
            "fexit on kvm_age_gfn loads and attaches",
        ),
        Err(e) => Check::no(
            name,
            Backend::EptFexit,
            format!("fexit on kvm_age_gfn: {e}"),
        ),
    }
}

fn check_tracepoint() -> Check {
    let name = "ept-tracepoint";
    if let Err(e) = load_and_attach(ProbeProg::RawTp) {
        return Check::no(
            name,
            Backend::EptTracepoint,
            format!("raw_tp kvm_tdp_mmu_spte_changed: {e}"),
        );
    }
    // kvm.tdp_mmu=Y alone says little (6.1 latches it per VM and reads Y
    // with ept=N): the vendor module's paging mode decides.
    use crate::sampler::ept::HostMode;
    match HostMode::detect_host().and_then(|m| m.tracepoint_masks().map(|_| m)) {
        Ok(m) => Check::yes(
            name,
            Backend::EptTracepoint,
            format!("raw_tp kvm_tdp_mmu_spte_changed attaches; {}", m.describe()),
        ),
        Err(e) => Check::no(
            name,
            Backend::EptTracepoint,
            format!("raw_tp attaches, but {e}"),
        ),
    }
}

fn check_page_idle() -> Check {
    let p = Path::new("/sys/kernel/mm/page_idle/bitmap");
    if p.exists() {
        Check::yes(
            "page_idle",
            Backend::Unspecified,
            "ageing driver: /sys/kernel/mm/page_idle/bitmap present",
        )
    } else {
        Check::no(
            "page_idle",
            Backend::Unspecified,
            "ageing driver: /sys/kernel/mm/page_idle/bitmap absent (kernel built without CONFIG_IDLE_PAGE_TRACKING=y, as all of Debian 12's 6.1 and 6.12 kernels are; docs/ept.md)",
        )
    }
}

/// Read-only: tierd never writes /sys/kernel/mm/damon it did not set up.
fn check_damon() -> Check {
    let name = "damon";
    let nr = std::fs::read_to_string("/sys/kernel/mm/damon/admin/kdamonds/nr_kdamonds");
    match nr.map(|s| s.trim().parse::<u32>()) {
        Err(_) => Check::no(
            name,
            Backend::Unspecified,
            "ageing driver: DAMON sysfs absent (CONFIG_DAMON_SYSFS and CONFIG_DAMON_VADDR off, as in Debian 12's 6.1)",
        ),
        Ok(Ok(0)) => Check::yes(
            name,
            Backend::Unspecified,
            "ageing driver: DAMON sysfs present and unused: the ept backends would create tierd's own kdamonds, one per VM (needs CONFIG_DAMON_VADDR)",
        ),
        Ok(Ok(n)) => Check::no(
            name,
            Backend::Unspecified,
            format!(
                "ageing driver: {n} kdamond(s) not created by tierd are configured; tierd never touches them (writing nr_kdamonds would destroy their settings)"
            ),
        ),
        Ok(Err(e)) => Check::no(
            name,
            Backend::Unspecified,
            format!("ageing driver: nr_kdamonds unreadable: {e}"),
        ),
    }
}

/// PFNs in pagemap need CAP_SYS_ADMIN (`pagemap_read`: `show_pfn`);
/// without them the ept backends refuse every VM.
fn check_pagemap() -> Check {
    let name = "pagemap";
    let page = vec![1u8; 8192];
    let addr = (page.as_ptr() as u64).next_multiple_of(4096);
    let read = std::fs::File::open("/proc/self/pagemap").and_then(|f| {
        let mut e = [0u8; 8];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut e, addr / 4096 * 8)?;
        Ok(u64::from_ne_bytes(e))
    });
    match read {
        Ok(e) if e & (1 << 63) != 0 && e & ((1 << 55) - 1) != 0 => Check::yes(
            name,
            Backend::Unspecified,
            "pagemap shows PFNs (CAP_SYS_ADMIN)",
        ),
        Ok(_) => Check::no(
            name,
            Backend::Unspecified,
            "pagemap hides PFNs: tierd lacks CAP_SYS_ADMIN; the ept backends refuse every VM",
        ),
        Err(e) => Check::no(
            name,
            Backend::Unspecified,
            format!("/proc/self/pagemap: {e}"),
        ),
    }
}

fn check_hostpte(implementation: Option<&str>) -> Check {
    let name = "hostpte";
    if let Err(e) = std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/self/clear_refs")
    {
        return Check::no(
            name,
            Backend::Hostpte,
            format!("/proc/self/clear_refs: {e}"),
        );
    }
    match std::fs::read_to_string("/proc/self/smaps") {
        Ok(s) if s.contains("Referenced:") => {
            let scope = match implementation {
                Some("kvm_pvm") => "guest accesses fault through host page tables here",
                Some("kvm_intel" | "kvm_amd") => {
                    "only when forced (backend = \"hostpte\"), never by auto: under EPT/NPT it sees guest accesses only because clear_refs 4 zaps every SPTE of the VM each pass, a VM-wide TLB flush and a refault of the working set per pass under the VMM's mmap lock"
                }
                _ => {
                    "guest accesses are seen only when KVM faults pages in (under EPT/NPT after an invalidation)"
                }
            };
            Check::yes(
                name,
                Backend::Hostpte,
                format!("clear_refs + smaps Referenced present; {scope}"),
            )
        }
        Ok(_) => Check::no(
            name,
            Backend::Hostpte,
            "/proc/self/smaps has no Referenced: field",
        ),
        Err(e) => Check::no(name, Backend::Hostpte, format!("/proc/self/smaps: {e}")),
    }
}

/// Opens a guest-only cycles counter on this thread: the least any PMU
/// backend needs.
fn check_pmu() -> Check {
    let name = "pmu";
    // SAFETY: perf_event_attr is a plain C struct for which all-zero is valid.
    let mut attr: PerfEventAttr = unsafe { std::mem::zeroed() };
    attr.type_ = 0; // PERF_TYPE_HARDWARE
    attr.size = std::mem::size_of::<PerfEventAttr>() as u32;
    attr.config = 0; // PERF_COUNT_HW_CPU_CYCLES
    attr.flags = 1 | (1 << 19); // bit 0 disabled, bit 19 exclude_host
    // SAFETY: attr is initialised and outlives the call; pid 0 / cpu -1 is
    // "this thread on any CPU"; the returned fd is closed below.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            0,
            -1,
            -1,
            0,
        )
    };
    if fd >= 0 {
        // SAFETY: fd was just returned by perf_event_open and is ours.
        unsafe { libc::close(fd as i32) };
        return Check::yes(
            name,
            Backend::Pmu,
            "guest-only (exclude_host) cycles counter opens",
        );
    }
    let err = std::io::Error::last_os_error();
    let why = match err.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) | Some(libc::ENODEV) => "no hardware PMU",
        Some(libc::EACCES) | Some(libc::EPERM) => {
            "not permitted (perf_event_paranoid or missing CAP_PERFMON)"
        }
        _ => "perf_event_open failed",
    };
    Check::no(
        name,
        Backend::Pmu,
        format!("{why} (perf_event_open cycles, exclude_host: {err})"),
    )
}

/// One line per memory-source event the built-in table selects for this
/// CPU, with whether it opens guest-only here.
fn with_pmu_events(mut check: Check) -> Check {
    use crate::sampler::pmu::{self, events::CpuId, events::EventTable};
    let (cpu, table) = match (CpuId::current(), EventTable::builtin()) {
        (Ok(c), Ok(t)) => (c, t),
        (Err(e), _) => {
            check
                .details
                .push(format!("events: cannot read the CPU model: {e}"));
            return check;
        }
        (_, Err(e)) => {
            check.details.push(format!("events: built-in table: {e}"));
            return check;
        }
    };
    let status = pmu::events_status(&cpu, &table, false);
    if status.is_empty() {
        check
            .details
            .push(format!("events: none in the table for {cpu}"));
    }
    for (event, result) in status {
        check.details.push(match result {
            Ok(()) => format!("{event}: opens"),
            Err(e) => format!("{event}: {e}"),
        });
    }
    check.details.extend(pmu_coverage(&cpu, &table));
    check
}

/// Which tier kinds this CPU's table can count, which it cannot, and what
/// the host's NUMA layout means for local/remote DRAM events.
fn pmu_coverage(
    cpu: &crate::sampler::pmu::events::CpuId,
    table: &crate::sampler::pmu::events::EventTable,
) -> Vec<String> {
    use crate::sampler::pmu::events::TierKind;
    use crate::sampler::pmu::placement::Topology;
    let kinds = table.tiers_for(cpu, false);
    let name = |k: &TierKind| k.short_name();
    let (have, missing): (Vec<TierKind>, Vec<TierKind>) = [
        TierKind::Dram,
        TierKind::Remote,
        TierKind::Pmem,
        TierKind::Cxl,
    ]
    .into_iter()
    .partition(|k| kinds.contains(k));
    let mut out = vec![format!(
        "tiers: counts {}; not measured: {} (no event on this CPU: such tiers read `not measured`, never 0)",
        if have.is_empty() {
            "none".into()
        } else {
            have.iter().map(name).collect::<Vec<_>>().join(", ")
        },
        if missing.is_empty() {
            "none".into()
        } else {
            missing.iter().map(name).collect::<Vec<_>>().join(", ")
        },
    )];
    let topo = Topology::read();
    out.push(format!(
        "placement: {} NUMA node(s) with CPUs; local/remote DRAM events are relative to the vCPU's node, so a VM with DRAM tiers on several nodes needs its vCPUs pinned to one node each (else those tiers read `not measured` when a vCPU moves)",
        topo.cpu_nodes()
    ));
    out.extend(topo.sub_numa_clustering());
    out
}

/// Lines on how the pmu backend finds vCPU threads not named vcpuN: which
/// KVM_RUN tracepoints fire here, from a one-vCPU test VM.
fn with_kvm_run_watch(mut check: Check) -> Check {
    check
        .details
        .extend(crate::sampler::pmu::kvm_probe::report());
    check
}

/// The prefix of `struct perf_event_attr` (PERF_ATTR_SIZE_VER0 plus the
/// fields up to config2), enough for a counting event.
#[repr(C)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(kvm: &str, ok: &[&'static str]) -> Report {
        let names = ["ept-fexit", "ept-tracepoint", "page_idle", "hostpte"];
        Report {
            kvm_impl: Some(kvm.into()),
            checks: names
                .iter()
                .map(|&n| {
                    if ok.contains(&n) {
                        Check::yes(n, Backend::Unspecified, "ok")
                    } else {
                        Check::no(n, Backend::Unspecified, format!("{n} missing"))
                    }
                })
                .collect(),
        }
    }

    #[test]
    fn auto_never_picks_hostpte_under_hardware_virtualisation() {
        assert_eq!(
            report("kvm_pvm", &["hostpte"]).best_backend(),
            Some(Backend::Hostpte)
        );
        for kvm in ["kvm_intel", "kvm_amd"] {
            let r = report(kvm, &["hostpte", "ept-tracepoint"]);
            assert_eq!(r.best_backend(), None, "{kvm}: no ageing driver");
            let why = r.no_sampler_reason();
            assert!(why.contains("page_idle missing"), "{why}");
            assert!(why.contains("hostpte not used under hardware"), "{why}");
        }
        assert_eq!(
            report("kvm_intel", &["hostpte", "ept-tracepoint", "page_idle"]).best_backend(),
            Some(Backend::EptTracepoint)
        );
    }

    #[test]
    fn no_sampler_reason_names_every_missing_piece() {
        let why = report("kvm_pvm", &[]).no_sampler_reason();
        for part in [
            "ept-fexit missing",
            "ept-tracepoint missing",
            "page_idle missing",
            "hostpte missing",
        ] {
            assert!(why.contains(part), "{part}: {why}");
        }
    }
}
