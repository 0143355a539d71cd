//! Demo VM: a real KVM guest (one vCPU, two memory slots "dram" and "slow")
//! that read-modify-writes a known set of pages per round, with exact
//! ground-truth counters, for testing host-side per-tier access measurement.
//!
//! The guest runs 32-bit protected mode with paging off (see `guest.rs`);
//! each finished round exits to the VMM via `out 0x80, al` ([`ROUND_PORT`]).

#![deny(clippy::undocumented_unsafe_blocks)]

mod counters;
mod error;
mod guest;
mod mem;
mod phase_log;
#[cfg(test)]
mod tests;
pub mod tracked;
mod vcpu;

pub use error::DemoVmError;
pub use guest::{CODE_GPA, DRAM_WORK_GPA, PAGE_SIZE, PARAM_GPA, ROUND_PORT, SLOW_GPA};

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VmFd};
use mem::HostMapping;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use vcpu::{Shared, VcpuThread, lock};

/// Work per round. A segment with 0 pages or 0 repeats is idle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Phase {
    pub dram_pages: u32,
    pub dram_repeat: u32,
    pub slow_pages: u32,
    pub slow_repeat: u32,
}

impl Default for Phase {
    /// 48 dram pages x4 and 96 slow pages x1: 2/3 of the accesses hit dram
    /// although slow has twice as many distinct pages, so a page-count view
    /// (young bits) and the access-weighted truth clearly disagree.
    /// About 1,400 rounds/s on kvm_pvm.
    fn default() -> Self {
        Phase {
            dram_pages: 48,
            dram_repeat: 4,
            slow_pages: 96,
            slow_repeat: 1,
        }
    }
}

impl Phase {
    /// The two phases of `tierd run --demo-cycle-s`: the default, then a
    /// hot set mostly in DRAM (162 of 194 pages, 91 % of the accesses).
    pub fn cycle() -> [Phase; 2] {
        [
            Phase::default(),
            Phase {
                dram_pages: 160,
                dram_repeat: 2,
                slow_pages: 32,
                slow_repeat: 1,
            },
        ]
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DemoVmConfig {
    pub dram_bytes: u64,
    pub slow_bytes: u64,
    pub phase: Phase,
}

impl Default for DemoVmConfig {
    fn default() -> Self {
        DemoVmConfig {
            dram_bytes: 16 << 20,
            slow_bytes: 16 << 20,
            phase: Phase::default(),
        }
    }
}

/// One guest memory region and the host mapping behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestRegion {
    pub name: &'static str,
    pub gpa: u64,
    pub size: u64,
    /// Host virtual address of the region's first byte (its own VMA).
    pub hva: u64,
    pub slot: u32,
}

/// Exact ground truth, updated by the vCPU thread at every exit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuestCounters {
    /// Finished rounds.
    pub rounds: u64,
    /// Dword read-modify-writes per region: [dram, slow].
    pub accesses: [u64; 2],
    /// Returns from KVM_RUN (round exits plus kicks).
    pub exits: u64,
}

#[derive(Debug)]
pub struct DemoVm {
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
    regions: [GuestRegion; 2],
    /// Work pages available in [dram, slow].
    capacity: [u64; 2],
    // Field order matters for drop: VM (and KVM) close before memory unmaps.
    _vm: VmFd,
    _kvm: Kvm,
    mem: [Arc<HostMapping>; 2],
}

const MIB: u64 = 1 << 20;

fn validate_config(cfg: &DemoVmConfig) -> Result<[u64; 2], DemoVmError> {
    let bad = |m: String| Err(DemoVmError::Config(m));
    for (name, size) in [
        ("dram_bytes", cfg.dram_bytes),
        ("slow_bytes", cfg.slow_bytes),
    ] {
        if size == 0 || size % PAGE_SIZE != 0 {
            return bad(format!(
                "{name} = {size} is not a non-zero multiple of 4 KiB"
            ));
        }
    }
    if cfg.dram_bytes < 2 * MIB || cfg.dram_bytes > SLOW_GPA {
        return bad(format!(
            "dram_bytes = {} must be in [2 MiB, {} MiB] (dram must end before slow at {SLOW_GPA:#x})",
            cfg.dram_bytes,
            SLOW_GPA / MIB
        ));
    }
    // The 32-bit guest addresses at most 4 GiB.
    if cfg.slow_bytes > (1 << 32) - SLOW_GPA {
        return bad(format!(
            "slow_bytes = {} would end above 4 GiB",
            cfg.slow_bytes
        ));
    }
    let capacity = [
        (cfg.dram_bytes - DRAM_WORK_GPA) / PAGE_SIZE,
        cfg.slow_bytes / PAGE_SIZE,
    ];
    validate_phase(cfg.phase, capacity).map_err(|e| match e {
        DemoVmError::Phase(m) => DemoVmError::Config(format!("phase: {m}")),
        other => other,
    })?;
    Ok(capacity)
}

fn validate_phase(p: Phase, capacity: [u64; 2]) -> Result<(), DemoVmError> {
    for (name, pages, cap) in [
        ("dram", p.dram_pages, capacity[0]),
        ("slow", p.slow_pages, capacity[1]),
    ] {
        if u64::from(pages) > cap {
            return Err(DemoVmError::Phase(format!(
                "{name}_pages = {pages} exceeds the {cap} work pages of the {name} region"
            )));
        }
    }
    Ok(())
}

fn map_region(name: &'static str, size: u64) -> Result<HostMapping, DemoVmError> {
    let err = |source| DemoVmError::Mmap {
        region: name,
        size,
        source,
    };
    let len = usize::try_from(size).map_err(|_| err(std::io::ErrorKind::InvalidInput.into()))?;
    HostMapping::new(len, name).map_err(err)
}

impl DemoVm {
    /// Creates the VM, maps both regions, loads code and parameters and
    /// starts the "vcpu0" thread.
    pub fn start(cfg: DemoVmConfig) -> Result<DemoVm, DemoVmError> {
        DemoVm::start_named(cfg, "vcpu0")
    }

    /// [`DemoVm::start`] with the vCPU thread named `thread_name` (at most
    /// 15 bytes), e.g. to play a VMM that does not name threads `vcpuN`.
    pub fn start_named(cfg: DemoVmConfig, thread_name: &str) -> Result<DemoVm, DemoVmError> {
        if thread_name.is_empty() || thread_name.len() > 15 || thread_name.contains('\0') {
            return Err(DemoVmError::Config(format!(
                "vCPU thread name {thread_name:?} must be 1..=15 bytes without NUL"
            )));
        }
        let capacity = validate_config(&cfg)?;
        let kvm = Kvm::new().map_err(DemoVmError::dev_kvm)?;
        let vm = kvm.create_vm().map_err(DemoVmError::kvm("KVM_CREATE_VM"))?;
        let dram = Arc::new(map_region("dram", cfg.dram_bytes)?);
        let slow = Arc::new(map_region("slow", cfg.slow_bytes)?);
        let regions = [
            GuestRegion {
                name: "dram",
                gpa: 0,
                size: cfg.dram_bytes,
                hva: dram.hva(),
                slot: 0,
            },
            GuestRegion {
                name: "slow",
                gpa: SLOW_GPA,
                size: cfg.slow_bytes,
                hva: slow.hva(),
                slot: 1,
            },
        ];
        for r in &regions {
            let slot = kvm_userspace_memory_region {
                slot: r.slot,
                flags: 0,
                guest_phys_addr: r.gpa,
                memory_size: r.size,
                userspace_addr: r.hva,
            };
            // SAFETY: the slot's host range is our own mapping of exactly
            // r.size bytes, which DemoVm keeps alive until the VM fd closes.
            unsafe { vm.set_user_memory_region(slot) }
                .map_err(DemoVmError::kvm("KVM_SET_USER_MEMORY_REGION"))?;
        }
        let load_err = || DemoVmError::Config("guest image does not fit in dram".to_string());
        dram.write_bytes(CODE_GPA, &guest::GUEST_CODE)
            .ok_or_else(load_err)?;
        for (i, w) in guest::param_words(cfg.phase).into_iter().enumerate() {
            dram.write_u32(PARAM_GPA + 4 * i as u64, w)
                .ok_or_else(load_err)?;
        }

        let vcpu = vm
            .create_vcpu(0)
            .map_err(DemoVmError::kvm("KVM_CREATE_VCPU"))?;
        let mut sregs = vcpu
            .get_sregs()
            .map_err(DemoVmError::kvm("KVM_GET_SREGS"))?;
        guest::flat_protected_mode(&mut sregs);
        vcpu.set_sregs(&sregs)
            .map_err(DemoVmError::kvm("KVM_SET_SREGS"))?;
        let mut regs = vcpu.get_regs().map_err(DemoVmError::kvm("KVM_GET_REGS"))?;
        regs.rip = CODE_GPA;
        regs.rflags = 0x2; // reserved bit 1; IF=0, we inject no interrupts
        vcpu.set_regs(&regs)
            .map_err(DemoVmError::kvm("KVM_SET_REGS"))?;

        vcpu::install_kick_handler().map_err(DemoVmError::Spawn)?;
        let shared = Arc::new(Shared::new(cfg.phase));
        let worker = VcpuThread {
            vcpu,
            shared: Arc::clone(&shared),
            dram: Arc::clone(&dram),
        };
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name(thread_name.to_string())
            .spawn(move || worker.run(ready_tx))
            .map_err(|e| DemoVmError::Spawn(e.to_string()))?;
        // Wait for the TID; an Err just means the thread already ended,
        // which is_running()/last_error() then report.
        let _ = ready_rx.recv();
        Ok(DemoVm {
            thread: Some(thread),
            shared,
            regions,
            capacity,
            _vm: vm,
            _kvm: kvm,
            mem: [dram, slow],
        })
    }

    /// dram first, then slow.
    pub fn regions(&self) -> &[GuestRegion] {
        &self.regions
    }

    pub fn counters(&self) -> GuestCounters {
        self.shared.published.read().counters
    }

    /// Queues `p`; the vCPU thread writes it to the parameter block at the
    /// next round boundary. A later call before that boundary wins.
    pub fn set_phase(&self, p: Phase) -> Result<(), DemoVmError> {
        validate_phase(p, self.capacity)?;
        if !self.is_running() {
            let why = self.last_error().unwrap_or_else(|| "stopped".to_string());
            return Err(DemoVmError::NotRunning(why));
        }
        *lock(&self.shared.pending) = Some(p);
        Ok(())
    }

    /// The phase of the round the guest is running now (a phase passed to
    /// `set_phase` shows up here once it takes effect).
    pub fn phase(&self) -> Phase {
        self.shared.published.read().phase
    }

    /// Distinct 4 KiB pages per region [dram, slow] the guest touches each
    /// round in the current phase; dram includes the code and param pages.
    pub fn touched_pages(&self) -> [u64; 2] {
        touched_pages(self.phase())
    }

    /// Exact distinct pages [dram, slow] the guest touched in
    /// `[at - horizon, at]` (dram with the code and param pages), from the
    /// instants its phases took effect; None before the VM ran that long.
    pub fn touched_within(
        &self,
        at: std::time::Instant,
        horizon: std::time::Duration,
    ) -> Option<[u64; 2]> {
        lock(&self.shared.phases).touched_within(at, horizon)
    }

    /// Reads the guest dword at `gpa` through the host mapping (None if
    /// unaligned or outside both regions).
    pub fn read_u32(&self, gpa: u64) -> Option<u32> {
        self.regions
            .iter()
            .zip(&self.mem)
            .find(|(r, _)| gpa >= r.gpa && gpa - r.gpa < r.size)
            .and_then(|(r, m)| m.read_u32(gpa - r.gpa))
    }

    pub fn vcpu_tid(&self) -> Option<i32> {
        Some(self.shared.tid.load(Ordering::Acquire)).filter(|&t| t > 0)
    }

    pub fn is_running(&self) -> bool {
        self.shared.running.load(Ordering::Acquire)
    }

    pub fn last_error(&self) -> Option<String> {
        lock(&self.shared.error).clone()
    }

    /// Stops and joins vcpu0. Returns the final counters, or the error that
    /// ended the vCPU thread earlier.
    pub fn stop(mut self) -> Result<GuestCounters, DemoVmError> {
        self.shutdown();
        match self.last_error() {
            Some(e) => Err(DemoVmError::Vcpu(e)),
            None => Ok(self.counters()),
        }
    }

    fn shutdown(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.shared.stop.store(true, Ordering::Release);
        // A kick can land just before the thread re-enters KVM_RUN and be
        // lost, so repeat until it has left.
        while !thread.is_finished() {
            vcpu::kick(&thread);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if thread.join().is_err() {
            self.shared.fail("vCPU thread panicked".to_string());
        }
    }
}

impl Drop for DemoVm {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn touched_pages(p: Phase) -> [u64; 2] {
    let active = |pages: u32, repeat: u32| if repeat > 0 { u64::from(pages) } else { 0 };
    [
        2 + active(p.dram_pages, p.dram_repeat),
        active(p.slow_pages, p.slow_repeat),
    ]
}
