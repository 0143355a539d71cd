//! Backend `pmu`: guest-only memory-source events per vCPU thread
//! (`docs/pmu.md`).
//!
//! - [`vcpus`]: the vCPU threads of a VMM process (`vcpuN`), followed as
//!   they come and go;
//! - [`events`]: the per-CPU-model event table (`profiler/events/*.toml`):
//!   which event counts accesses to which kind of tier;
//! - [`data_src`]: `perf_mem_data_src` of precise samples -> tier kind;
//! - [`loader`]: `bpf/pmu.bpf.c`, perf events per thread, the BPF program
//!   attached to each with the tier as cookie, per-(VM, tier) counters,
//!   and the KVM_RUN watch (threads seen in `kvm_entry` /
//!   `kvm_userspace_exit`) for VMMs that do not name vCPU threads;
//! - [`counting`]: per-interval counter changes scaled for multiplexing,
//!   and a tier's verdict: counts, or why it is not measured;
//! - [`placement`]: host topology, vCPU affinity and node, and the tier a
//!   local/remote event counts in;
//! - [`source`]: the source as the daemon runs it next to the
//!   page-sampling backend (`TierSample.sources`), counting per interval.

pub mod counting;
pub mod data_src;
pub mod events;
pub mod kvm_probe;
pub mod loader;
pub mod placement;
pub mod source;
pub mod vcpus;

use events::{CpuId, EventTable};
use loader::{EventSpec, OpenOptions};

/// Tries to open each event the table selects for `cpu` as a guest-only
/// counter on the calling thread, and reports per event: `Ok` if it opens,
/// else why not (the kernel's errno). Nothing is attached or kept open.
pub fn events_status(
    cpu: &CpuId,
    table: &EventTable,
    include_unverified: bool,
) -> Vec<(String, Result<(), String>)> {
    let opts = OpenOptions {
        guest_only: true,
        ..OpenOptions::default()
    };
    table
        .select(cpu, include_unverified)
        .into_iter()
        .map(|e| {
            let spec = EventSpec::from(e);
            let label = format!(
                "{} ({}, config {:#x})",
                e.name,
                e.tier.short_name(),
                e.config
            );
            let status = loader::open_event(0, &spec, &opts)
                .map(drop)
                .map_err(|err| open_failure(&err));
            (label, status)
        })
        .collect()
}

/// Why an event does not open, for humans: the kernel's answer, prefixed
/// with what it means for the errnos of a missing PMU or event.
pub fn open_failure(err: &loader::PmuError) -> String {
    match err {
        loader::PmuError::PerfOpen {
            errno: Some(libc::ENOENT | libc::ENODEV | libc::EOPNOTSUPP),
            ..
        } => format!("no hardware PMU or event not supported: {err}"),
        _ => err.to_string(),
    }
}
