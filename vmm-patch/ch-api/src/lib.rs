//! tier-ch-api: the patched cloud-hypervisor's HTTP API as both sides of
//! tierd use it. Its types (`vm.info`: memory zones, their ranges and
//! virtio-mem regions, the tiered balloon; `vm.counters`) are what tierd's
//! discovery builds a VM's tier map from (profiler/src/ch/); its client
//! ([`ChApi`], over the API's unix socket, vmm-patch/SPEC.md section 5) is
//! how the controller's targets reach the VMM. [`ResizableZone`] maps the
//! same balloon-style targets onto `vm.resize-zone` of a virtio-mem zone
//! ([`ChApi::resize_zone`], docs/virtio-mem.md).
//!
//! [`Vmm`] is what the controller needs from a VMM, with the error
//! ([`ActuateError`]) and retry policy ([`Backoff`]) every VMM client
//! shares: tier-controller's `actuate` re-exports all of this beside its
//! vhost-user balloon client.
//!
//! The trait is async: tierd runs the controller on its tokio runtime, and a
//! VMM call may take up to its timeout (seconds) per attempt plus backoff;
//! blocking a runtime worker for that long would stall the gRPC service and
//! the samplers sharing it. Timeouts and backoff are tokio timers, and a
//! caller can drop (cancel) a call. The futures are `Send` so the calls can
//! be spawned; the trait is generic-only (no `dyn Vmm`), which is all the
//! controller needs.

mod ch;
mod http;
mod zone;

use std::future::Future;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::Duration;

pub use ch::{
    BALLOON_DEVICE, BalloonInfo, BalloonZone, ChApi, Counters, MemoryConfigInfo, MemoryZone,
    VirtioMem, VmConfigInfo, VmInfo, VmmPing, ZoneConfig, ZoneRange, parse_counters, parse_vm_info,
    resize_zone_body, resize_zones_body, tier_states,
};
pub use zone::{DEFAULT_BLOCK, LINUX_MEMORY_BLOCK, ResizableZone};

/// One tier's sub-balloon as the VMM reports it, in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierState {
    /// The memory zone (cloud-hypervisor `--memory-zone id=`).
    pub zone: String,
    /// The target in force.
    pub target: u64,
    /// What the guest driver says it has put in the balloon (untrusted,
    /// reported as the VMM has it: 0 until the driver negotiates tiers).
    pub actual: u64,
    /// What the device counted from accepted PFNs (trusted; SPEC.md
    /// `host_ballooned`).
    pub host_ballooned: u64,
}

/// What the controller needs from a VMM.
pub trait Vmm {
    /// Sets the balloon target of each listed zone (bytes; the VMM rounds
    /// down to 4 KiB). Zones not listed keep their target. All or nothing:
    /// on error no target changed (SPEC.md section 5). Absolute targets, so
    /// applying the same list twice is the same as applying it once.
    fn set_tier_targets(
        &self,
        targets: &[(String, u64)],
    ) -> impl Future<Output = Result<(), ActuateError>> + Send;

    /// The target and actual of every tier, in tier order.
    fn tier_state(&self) -> impl Future<Output = Result<Vec<TierState>, ActuateError>> + Send;
}

/// Retries with exponential backoff: `attempts` tries in all, waiting
/// `initial`, then `initial * 2`, ... (at most `max`) between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub attempts: u32,
    pub initial: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            attempts: 4,
            initial: Duration::from_millis(100),
            max: Duration::from_secs(2),
        }
    }
}

impl Backoff {
    /// The wait after failed attempt `n` (1-based).
    pub fn delay(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.saturating_sub(1)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// Runs `attempt(n)` for n = 1, 2, ... until it breaks, or gives the
    /// last `Continue` value once `attempts` ran out, waiting
    /// [`Backoff::delay`] between attempts. `Break` is final (success, or an
    /// error not worth retrying); `Continue` is a failure worth retrying.
    pub async fn run<T, F, Fut>(&self, mut attempt: F) -> T
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = ControlFlow<T, T>>,
    {
        let attempts = self.attempts.max(1);
        let mut n = 1;
        loop {
            match attempt(n).await {
                ControlFlow::Break(v) => return v,
                ControlFlow::Continue(v) if n >= attempts => return v,
                ControlFlow::Continue(_) => {}
            }
            tokio::time::sleep(self.delay(n)).await;
            n += 1;
        }
    }
}

/// Why a VMM call failed. Every variant names the endpoint
/// (`"PUT /api/v1/vm.resize"`); the VMM's own message is kept verbatim.
#[derive(Debug, thiserror::Error)]
pub enum ActuateError {
    /// No complete answer within the per-call timeout, on every attempt.
    #[error(
        "{endpoint}: no answer from the VMM on {socket} within {timeout:?} ({attempts} attempts)"
    )]
    Timeout {
        endpoint: &'static str,
        socket: PathBuf,
        timeout: Duration,
        attempts: u32,
    },
    /// Connecting, writing or reading failed, on every attempt.
    #[error("{endpoint}: cannot talk to the VMM on {socket} ({attempts} attempts): {source}")]
    Transport {
        endpoint: &'static str,
        socket: PathBuf,
        attempts: u32,
        #[source]
        source: std::io::Error,
    },
    /// The answer is not HTTP/1.x we understand.
    #[error("{endpoint}: malformed HTTP response: {detail}")]
    Protocol {
        endpoint: &'static str,
        detail: String,
    },
    /// 4xx: the VMM refused the request as malformed.
    #[error("{endpoint}: the VMM refused the request (HTTP {status}): {message}")]
    Rejected {
        endpoint: &'static str,
        status: u16,
        message: String,
    },
    /// 5xx: the VMM could not do it. cloud-hypervisor answers 500 for an
    /// unknown zone, a target above the zone size or a VM without tiers
    /// (then no target changed).
    #[error("{endpoint}: the VMM failed (HTTP {status}): {message}")]
    Vmm {
        endpoint: &'static str,
        status: u16,
        message: String,
    },
    /// A 2xx whose body is not what SPEC.md describes.
    #[error("{endpoint}: unexpected response body: {detail}")]
    Decode {
        endpoint: &'static str,
        detail: String,
    },
    /// vm.info has no tiered balloon (`--balloon tiers=on` missing, or the
    /// VM is not booted yet).
    #[error("{endpoint}: the VM has no tiered balloon (--balloon tiers=on, booted)")]
    NotTiered { endpoint: &'static str },
    /// The caller's targets cannot be sent (checked before any I/O).
    #[error("invalid tier targets: {0}")]
    InvalidTargets(String),
}

impl ActuateError {
    /// The VMM's message for a 4xx/5xx answer.
    pub fn vmm_message(&self) -> Option<&str> {
        match self {
            ActuateError::Rejected { message, .. } | ActuateError::Vmm { message, .. } => {
                Some(message)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_retries_continues_and_stops_at_a_break() {
        let b = Backoff {
            attempts: 3,
            initial: Duration::from_millis(1),
            max: Duration::from_millis(1),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        // Always worth retrying: three attempts, the last one's value.
        let mut seen = Vec::new();
        let v = rt.block_on(b.run(|n| {
            seen.push(n);
            async move { ControlFlow::Continue::<u32, u32>(n * 10) }
        }));
        assert_eq!((v, seen), (30, vec![1, 2, 3]));
        // A break ends it at once.
        let mut seen = Vec::new();
        let v = rt.block_on(b.run(|n| {
            seen.push(n);
            async move {
                if n == 2 {
                    ControlFlow::Break(n)
                } else {
                    ControlFlow::Continue(0)
                }
            }
        }));
        assert_eq!((v, seen), (2, vec![1, 2]));
        // Zero attempts still makes one.
        let once = Backoff { attempts: 0, ..b };
        let v = rt.block_on(once.run(|n| async move { ControlFlow::Continue::<u32, u32>(n) }));
        assert_eq!(v, 1);
    }

    #[test]
    fn backoff_doubles_up_to_max() {
        let b = Backoff {
            attempts: 10,
            initial: Duration::from_millis(100),
            max: Duration::from_millis(500),
        };
        let delays: Vec<_> = (1..=5).map(|n| b.delay(n).as_millis()).collect();
        assert_eq!(delays, vec![100, 200, 400, 500, 500]);
        assert_eq!(b.delay(40), Duration::from_millis(500));
    }
}
