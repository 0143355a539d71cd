//! Which tracepoints of the KVM_RUN watch fire on this host's KVM, found
//! the only reliable way: a one-vCPU test VM (the demo VM, its vCPU thread
//! named `tierd-kvmprobe`) runs a few rounds while the watch is attached.
//! On kvm_pvm only `kvm_userspace_exit` fires (the PVM vendor module does
//! not emit `kvm_entry`), so vCPU indices come from thread order there.

use std::time::{Duration, Instant};

use super::loader::PmuPrograms;
use crate::demo_vm::{DemoVm, DemoVmConfig, Phase};

/// Name of the test VM's vCPU thread.
pub const THREAD_NAME: &str = "tierd-kvmprobe";
/// How long the test VM may take to show up in the watch.
const WAIT: Duration = Duration::from_secs(2);
/// Returns from KVM_RUN to wait for.
const EXITS: u64 = 3;

/// One line per tracepoint for `tierd probe`, each starting with
/// "KVM_RUN watch"; or one line saying why it could not be checked.
pub fn report() -> Vec<String> {
    match check() {
        Ok(lines) => lines,
        Err(why) => vec![format!("KVM_RUN watch: not checked: {why}")],
    }
}

fn check() -> Result<Vec<String>, String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map_err(|e| format!("/dev/kvm: {e}"))?;
    let mut progs = PmuPrograms::load().map_err(|e| e.to_string())?;
    let mut lines = Vec::new();
    let mut attached = Vec::new();
    for (tp, r) in progs.watch_kvm_run() {
        match r {
            Ok(()) => attached.push(tp),
            Err(e) => lines.push(format!("KVM_RUN watch: {tp}: {e}")),
        }
    }
    if attached.is_empty() {
        lines.push("KVM_RUN watch: unavailable: vCPU threads must be named vcpuN".into());
        return Ok(lines);
    }
    let tiny = DemoVmConfig {
        dram_bytes: 2 << 20,
        slow_bytes: 64 << 10,
        phase: Phase {
            dram_pages: 1,
            dram_repeat: 1,
            slow_pages: 1,
            slow_repeat: 1,
        },
    };
    let vm = DemoVm::start_named(tiny, THREAD_NAME).map_err(|e| format!("test VM: {e}"))?;
    let tid = vm
        .vcpu_tid()
        .and_then(|t| u32::try_from(t).ok())
        .ok_or_else(|| format!("test VM: {}", vm.last_error().unwrap_or_default()))?;
    let deadline = Instant::now() + WAIT;
    let seen = loop {
        let seen = progs
            .kvm_threads()
            .map_err(|e| e.to_string())?
            .into_iter()
            .find(|t| t.tid == tid);
        if seen.is_some_and(|t| t.exits >= EXITS || t.entries >= EXITS) || Instant::now() > deadline
        {
            break seen;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let rounds = vm
        .stop()
        .map(|c| c.rounds)
        .map_err(|e| format!("test VM: {e}"))?;
    // The map entry of the probe's own thread is of no use to anyone.
    let _ = progs.forget_kvm_thread(tid);
    let (entries, exits, vcpu_id) = seen.map_or((0, 0, None), |t| (t.entries, t.exits, t.vcpu_id));
    let state = |tp: &str, hits: u64| {
        if !attached.contains(&tp) {
            None
        } else if hits > 0 {
            Some(format!(
                "KVM_RUN watch: {tp} fires ({hits} hits, test VM of {rounds} rounds)"
            ))
        } else {
            Some(format!(
                "KVM_RUN watch: {tp} attaches but did not fire for a test vCPU ({rounds} rounds): this KVM does not emit it"
            ))
        }
    };
    lines.extend(state("kvm_entry", entries));
    lines.extend(state("kvm_userspace_exit", exits));
    lines.push(match (entries, exits) {
        (0, 0) => {
            "KVM_RUN watch: no hit: only vCPU threads named vcpuN are found".to_string()
        }
        (0, _) => "KVM_RUN watch: vCPU threads not named vcpuN are found, indexed by thread order (no vcpu_id without kvm_entry)".to_string(),
        _ => format!(
            "KVM_RUN watch: vCPU threads not named vcpuN are found, indexed by vcpu_id (test vCPU: {vcpu_id:?})"
        ),
    });
    Ok(lines)
}
