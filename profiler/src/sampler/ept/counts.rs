//! Counters read from the per-CPU maps, and BPF run-time statistics.

use std::os::fd::{FromRawFd, OwnedFd};

use super::{EptError, MAX_TIERS};

/// One (VM, tier) or unmapped or unattributed counter, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierCount {
    /// Pages the hook examined (= young for the tracepoint, which fires
    /// only for young SPTEs).
    pub checked_pages: u64,
    /// Pages found young (accessed since the previous ageing).
    pub young_pages: u64,
    /// Hook invocations that touched this counter.
    pub events: u64,
}

impl TierCount {
    pub(super) fn from_bytes(b: &[u8]) -> TierCount {
        TierCount {
            checked_pages: u64_at(b, 0),
            young_pages: u64_at(b, 8),
            events: u64_at(b, 16),
        }
    }

    pub(super) fn add(self, o: TierCount) -> TierCount {
        TierCount {
            checked_pages: self.checked_pages.wrapping_add(o.checked_pages),
            young_pages: self.young_pages.wrapping_add(o.young_pages),
            events: self.events.wrapping_add(o.events),
        }
    }

    pub(super) fn since(self, base: TierCount) -> TierCount {
        TierCount {
            checked_pages: self.checked_pages.wrapping_sub(base.checked_pages),
            young_pages: self.young_pages.wrapping_sub(base.young_pages),
            events: self.events.wrapping_sub(base.events),
        }
    }
}

/// All counters of one VM slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VmCounts {
    /// Indexed by tier.
    pub tiers: [TierCount; MAX_TIERS],
    /// Pages of the VM outside every one of its ranges (health: the gfn
    /// ranges tierd was given miss memory the guest uses).
    pub unmapped: TierCount,
    /// Ageing of this VM by threads that own no scan (reclaim, MGLRU,
    /// khugepaged, DAMON of others), seen by the fexit hook once the VM's
    /// kvm is learned (health: accessed bits tierd's next pass will miss).
    pub foreign: TierCount,
}

impl VmCounts {
    pub(super) fn since(&self, base: &VmCounts) -> VmCounts {
        let mut out = VmCounts {
            unmapped: self.unmapped.since(base.unmapped),
            foreign: self.foreign.since(base.foreign),
            ..VmCounts::default()
        };
        for (o, (a, b)) in out.tiers.iter_mut().zip(self.tiers.iter().zip(&base.tiers)) {
            *o = a.since(*b);
        }
        out
    }
}

/// In-kernel run statistics of one program (needs [`enable_run_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunStats {
    pub run_cnt: u64,
    pub run_time_ns: u64,
}

/// Keeps BPF run-time statistics (`run_cnt`, `run_time_ns` of every
/// program) on while alive, like `kernel.bpf_stats_enabled=1` but undone
/// when dropped.
#[derive(Debug)]
pub struct RunStatsGuard {
    _fd: OwnedFd,
}

/// Turns on BPF run-time statistics (BPF_ENABLE_STATS) until the guard drops.
pub fn enable_run_stats() -> Result<RunStatsGuard, EptError> {
    // SAFETY: a plain syscall wrapper without pointers.
    let fd = unsafe {
        libbpf_rs::libbpf_sys::bpf_enable_stats(libbpf_rs::libbpf_sys::BPF_STATS_RUN_TIME)
    };
    if fd < 0 {
        return Err(EptError::Os {
            what: "BPF_ENABLE_STATS",
            message: std::io::Error::from_raw_os_error(-fd).to_string(),
        });
    }
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(RunStatsGuard { _fd: fd })
}

/// The calling thread's id, the key of
/// [`EptPrograms::set_scan_owner`](super::EptPrograms::set_scan_owner).
pub fn current_tid() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    tid as u32
}

pub(super) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        v.copy_from_slice(s);
    }
    u64::from_ne_bytes(v)
}

pub(super) fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut v = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        v.copy_from_slice(s);
    }
    u32::from_ne_bytes(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_subtract_per_field() {
        let a = TierCount {
            checked_pages: 10,
            young_pages: 5,
            events: 2,
        };
        let b = TierCount {
            checked_pages: 4,
            young_pages: 1,
            events: 1,
        };
        assert_eq!(
            a.since(b),
            TierCount {
                checked_pages: 6,
                young_pages: 4,
                events: 1
            }
        );
    }
}
