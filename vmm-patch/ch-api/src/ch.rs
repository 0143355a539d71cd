//! [`Vmm`] over the patched cloud-hypervisor's HTTP API (vmm-patch/SPEC.md
//! section 5): `PUT /api/v1/vm.resize` with `desired_balloon_zones`,
//! `GET /api/v1/vm.info` (`balloon`, `memory_zones`), `GET /api/v1/vm.counters`.
//!
//! Retries: transport failures (connect, reset, timeout, a truncated or
//! malformed answer) are retried with [`Backoff`] on every call. A 5xx is
//! retried on the GETs only: on `vm.resize` cloud-hypervisor answers 500 for
//! a request it rejected (unknown zone, target above the zone size, no
//! tiers), with no target changed, and the same request would be rejected
//! again. Re-sending a `vm.resize` after a transport failure is safe even if
//! the first one was applied: the body carries absolute per-zone targets,
//! so applying it twice leaves the VMM where applying it once does.

use std::collections::{BTreeMap, HashSet};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::http::{self, HttpError, Response};
use crate::{ActuateError, Backoff, TierState, Vmm};

const PING: &str = "GET /api/v1/vmm.ping";
const INFO: &str = "GET /api/v1/vm.info";
const COUNTERS: &str = "GET /api/v1/vm.counters";
const RESIZE: &str = "PUT /api/v1/vm.resize";
const RESIZE_ZONE: &str = "PUT /api/v1/vm.resize-zone";

/// The balloon device id cloud-hypervisor uses unless `--balloon id=` was
/// given.
pub const BALLOON_DEVICE: &str = "__balloon";

/// The cloud-hypervisor API on its unix socket (`--api-socket path=`).
#[derive(Debug, Clone)]
pub struct ChApi {
    socket: PathBuf,
    timeout: Duration,
    backoff: Backoff,
}

/// `GET /api/v1/vmm.ping`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct VmmPing {
    pub build_version: String,
    pub version: String,
    #[serde(default)]
    pub pid: Option<u64>,
}

/// The parts of `GET /api/v1/vm.info` tierd uses.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct VmInfo {
    pub state: String,
    #[serde(default)]
    pub memory_actual_size: Option<u64>,
    /// Absent (or null) before boot and without the patch.
    #[serde(default)]
    pub balloon: Option<BalloonInfo>,
    #[serde(default)]
    pub memory_zones: Option<Vec<MemoryZone>>,
    /// The VM's configuration as the VMM keeps it (upstream too): the
    /// zones' boot and hot-plug sizes.
    #[serde(default)]
    pub config: Option<VmConfigInfo>,
}

/// vm.info `config`, the parts tierd reads.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
pub struct VmConfigInfo {
    #[serde(default)]
    pub memory: Option<MemoryConfigInfo>,
    /// `--balloon` as configured (any shape; only its presence is read).
    #[serde(default)]
    pub balloon: Option<serde_json::Value>,
}

/// vm.info `config.memory`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
pub struct MemoryConfigInfo {
    /// `Acpi` or `VirtioMem` (cloud-hypervisor's `HotplugMethod`).
    #[serde(default)]
    pub hotplug_method: Option<String>,
    /// `--memory size=` (0 with zones).
    #[serde(default)]
    pub size: Option<u64>,
    #[serde(default)]
    pub zones: Option<Vec<ZoneConfig>>,
}

/// vm.info `config.memory.zones[]`: `--memory-zone` as configured, with
/// `hotplugged_size` kept up to date by `vm.resize-zone` (cloud-hypervisor
/// stores the request whether or not the guest follows it).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ZoneConfig {
    pub id: String,
    /// Boot size: `vm.resize-zone` refuses anything below it.
    pub size: u64,
    #[serde(default)]
    pub host_numa_node: Option<u32>,
    /// The most that can be hot-plugged.
    #[serde(default)]
    pub hotplug_size: Option<u64>,
    /// What is requested now (last `vm.resize-zone`, minus `size`).
    #[serde(default)]
    pub hotplugged_size: Option<u64>,
}

impl VmInfo {
    /// `config.memory.zones`, empty when absent.
    pub fn zone_configs(&self) -> &[ZoneConfig] {
        self.config
            .as_ref()
            .and_then(|c| c.memory.as_ref())
            .and_then(|m| m.zones.as_deref())
            .unwrap_or(&[])
    }

    /// Upstream's plugged size of its one hot-pluggable virtio-mem zone:
    /// cloud-hypervisor v53.0's `memory_actual_size` is the boot sizes
    /// (`memory.size` + every zone's `size`) minus the balloon plus every
    /// virtio-mem device's plugged size (vmm/src/lib.rs `vm_info`), so
    /// with no balloon and one such zone the rest is that zone's. `None`
    /// where that does not hold.
    pub fn upstream_plugged(&self) -> Option<u64> {
        let c = self.config.as_ref()?;
        if c.balloon.is_some() {
            return None;
        }
        let m = c.memory.as_ref()?;
        let zones = m.zones.as_deref().unwrap_or(&[]);
        if zones
            .iter()
            .filter(|z| z.hotplug_size.unwrap_or(0) > 0)
            .count()
            != 1
        {
            return None;
        }
        let boot = zones
            .iter()
            .fold(m.size.unwrap_or(0), |n, z| n.saturating_add(z.size));
        self.memory_actual_size?.checked_sub(boot)
    }

    /// Whether the zones' hot-plug goes through virtio-mem.
    pub fn virtio_mem_hotplug(&self) -> bool {
        self.config
            .as_ref()
            .and_then(|c| c.memory.as_ref())
            .and_then(|m| m.hotplug_method.as_deref())
            .is_some_and(|m| m.eq_ignore_ascii_case("virtiomem") || m == "virtio-mem")
    }
}

/// vm.info `balloon`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BalloonInfo {
    pub tiers_offered: bool,
    pub tiers_negotiated: bool,
    pub legacy_target: u64,
    pub legacy_actual: u64,
    pub zones: Vec<BalloonZone>,
}

/// vm.info `balloon.zones[]`, bytes and cumulative PFN counts.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BalloonZone {
    pub id: String,
    pub tier: u32,
    pub target: u64,
    pub actual: u64,
    pub host_ballooned: u64,
    pub inflated_pfns: u64,
    pub deflated_pfns: u64,
    pub rejected_pfns: u64,
}

/// vm.info `memory_zones[]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct MemoryZone {
    pub id: String,
    pub host_numa_node: Option<u32>,
    pub guest_numa_node: Option<u32>,
    pub ranges: Vec<ZoneRange>,
    /// The zone's virtio-mem region and sizes (vmm-patch 0009); absent
    /// for a zone without virtio-mem and from VMMs without the patch.
    #[serde(default)]
    pub virtio_mem: Option<VirtioMem>,
}

/// vm.info `memory_zones[].virtio_mem` (vmm-patch 0009), bytes. The region
/// is not in `ranges`: only its plugged blocks are guest RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct VirtioMem {
    /// Guest-physical start and size of the hot-pluggable region.
    pub start: u64,
    pub size: u64,
    /// Where the VMM maps `start`.
    pub host_address: u64,
    /// What `vm.resize-zone` last asked for (zone total minus boot size).
    pub requested_size: u64,
    /// What the guest driver has plugged.
    pub plugged_size: u64,
    /// Plug/unplug granularity; 0 before the device exists.
    pub block_size: u64,
}

/// A guest-physical RAM range of a zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct ZoneRange {
    pub start: u64,
    pub size: u64,
    /// Where the VMM maps `start` in its own address space (vmm-patch
    /// 0005); absent from VMMs without it.
    #[serde(default)]
    pub host_address: Option<u64>,
}

/// The `vm.resize` body of SPEC.md section 5, zones in the caller's order:
/// `{"desired_balloon_zones":{"dram":67108864,"slow":134217728}}`.
/// An empty or duplicate zone id is refused (a JSON object with a repeated
/// key would silently keep one of them).
pub fn resize_zones_body(targets: &[(String, u64)]) -> Result<String, ActuateError> {
    let mut seen = HashSet::new();
    let mut body = String::from("{\"desired_balloon_zones\":{");
    for (i, (zone, bytes)) in targets.iter().enumerate() {
        if zone.is_empty() {
            return Err(ActuateError::InvalidTargets("empty zone id".into()));
        }
        if !seen.insert(zone.as_str()) {
            return Err(ActuateError::InvalidTargets(format!(
                "zone {zone:?} listed twice"
            )));
        }
        if i > 0 {
            body.push(',');
        }
        // A JSON string (escaped); serializing a &str cannot fail.
        body.push_str(&serde_json::Value::from(zone.as_str()).to_string());
        body.push(':');
        body.push_str(&bytes.to_string());
    }
    body.push_str("}}");
    Ok(body)
}

/// The `vm.resize-zone` body: `{"id":"dram","desired_ram":402653184}`,
/// `desired_ram` being the zone's total (boot size + hot-plugged).
pub fn resize_zone_body(zone: &str, desired_ram: u64) -> Result<String, ActuateError> {
    if zone.is_empty() {
        return Err(ActuateError::InvalidTargets("empty zone id".into()));
    }
    Ok(format!(
        "{{\"id\":{},\"desired_ram\":{desired_ram}}}",
        serde_json::Value::from(zone)
    ))
}

/// The VMM's message from an error body: cloud-hypervisor sends a JSON array
/// of strings (the error chain), joined here with ": "; anything else is
/// kept as text.
fn vmm_message(body: &[u8]) -> String {
    if let Ok(chain) = serde_json::from_slice::<Vec<String>>(body) {
        return chain.join(": ");
    }
    String::from_utf8_lossy(body).trim().to_string()
}

/// Which failures of a call are worth another attempt.
#[derive(Clone, Copy)]
enum Retry {
    /// Transport failures and 5xx.
    Get,
    /// Transport failures only.
    Put,
}

impl ChApi {
    /// Per-attempt timeout unless set otherwise.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

    pub fn new(socket: impl Into<PathBuf>) -> Self {
        ChApi {
            socket: socket.into(),
            timeout: Self::DEFAULT_TIMEOUT,
            backoff: Backoff::default(),
        }
    }

    /// Timeout of each attempt (connect, send, whole answer).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `GET /api/v1/vmm.ping`.
    pub async fn ping(&self) -> Result<VmmPing, ActuateError> {
        let body = self
            .call(PING, "GET", "/api/v1/vmm.ping", None, Retry::Get)
            .await?;
        decode(PING, &body)
    }

    /// `GET /api/v1/vm.info`.
    pub async fn vm_info(&self) -> Result<VmInfo, ActuateError> {
        let body = self
            .call(INFO, "GET", "/api/v1/vm.info", None, Retry::Get)
            .await?;
        parse_vm_info(&body)
    }

    /// `GET /api/v1/vm.counters`: device id -> counter -> value.
    pub async fn counters(&self) -> Result<Counters, ActuateError> {
        let body = self
            .call(COUNTERS, "GET", "/api/v1/vm.counters", None, Retry::Get)
            .await?;
        parse_counters(&body)
    }

    /// `PUT /api/v1/vm.resize-zone`: zone `zone`'s total RAM (boot size +
    /// hot-plugged) becomes `desired_ram`. Absolute, so retried on
    /// transport errors only, like `vm.resize`; cloud-hypervisor answers
    /// 500 below the boot size, above boot + `hotplug_size`, off the block
    /// size, or equal to the size requested now.
    pub async fn resize_zone(&self, zone: &str, desired_ram: u64) -> Result<(), ActuateError> {
        let body = resize_zone_body(zone, desired_ram)?;
        self.call(
            RESIZE_ZONE,
            "PUT",
            "/api/v1/vm.resize-zone",
            Some(body.as_bytes()),
            Retry::Put,
        )
        .await?;
        Ok(())
    }

    /// One call with its retries; the body of a 2xx answer.
    async fn call(
        &self,
        endpoint: &'static str,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        retry: Retry,
    ) -> Result<Vec<u8>, ActuateError> {
        self.backoff
            .run(|attempt| async move {
                let result = tokio::time::timeout(
                    self.timeout,
                    http::request(&self.socket, method, path, body),
                )
                .await;
                let retryable = match &result {
                    Err(_) | Ok(Err(_)) => true,
                    Ok(Ok(resp)) => resp.status >= 500 && matches!(retry, Retry::Get),
                };
                let done = self.finish(endpoint, attempt, result);
                if retryable {
                    ControlFlow::Continue(done)
                } else {
                    ControlFlow::Break(done)
                }
            })
            .await
    }

    fn finish(
        &self,
        endpoint: &'static str,
        attempts: u32,
        result: Result<Result<Response, HttpError>, tokio::time::error::Elapsed>,
    ) -> Result<Vec<u8>, ActuateError> {
        match result {
            Err(_) => Err(ActuateError::Timeout {
                endpoint,
                socket: self.socket.clone(),
                timeout: self.timeout,
                attempts,
            }),
            Ok(Err(HttpError::Io(source))) => Err(ActuateError::Transport {
                endpoint,
                socket: self.socket.clone(),
                attempts,
                source,
            }),
            Ok(Err(HttpError::Protocol(detail))) => {
                Err(ActuateError::Protocol { endpoint, detail })
            }
            Ok(Ok(Response { status, body })) => match status {
                200..=299 => Ok(body),
                400..=499 => Err(ActuateError::Rejected {
                    endpoint,
                    status,
                    message: vmm_message(&body),
                }),
                500..=599 => Err(ActuateError::Vmm {
                    endpoint,
                    status,
                    message: vmm_message(&body),
                }),
                _ => Err(ActuateError::Protocol {
                    endpoint,
                    detail: format!("unexpected status {status}"),
                }),
            },
        }
    }
}

/// `vm.counters`: device id -> counter -> value.
pub type Counters = BTreeMap<String, BTreeMap<String, u64>>;

/// Decodes a `vm.info` answer body. The VMM is outside tierd's trust
/// boundary: any bytes give a value or an error (fuzzed by the `fuzz`
/// bench).
pub fn parse_vm_info(body: &[u8]) -> Result<VmInfo, ActuateError> {
    decode(INFO, body)
}

/// Decodes a `vm.counters` answer body (see [`parse_vm_info`]).
pub fn parse_counters(body: &[u8]) -> Result<Counters, ActuateError> {
    decode(COUNTERS, body)
}

/// The per-tier state of a decoded `vm.info`: its balloon zones in tier
/// order, or `NotTiered` without an offered per-tier balloon.
pub fn tier_states(info: VmInfo) -> Result<Vec<TierState>, ActuateError> {
    let balloon = match info.balloon {
        Some(b) if b.tiers_offered && !b.zones.is_empty() => b,
        _ => return Err(ActuateError::NotTiered { endpoint: INFO }),
    };
    let mut zones = balloon.zones;
    zones.sort_by_key(|z| z.tier);
    Ok(zones
        .into_iter()
        .map(|z| TierState {
            zone: z.id,
            target: z.target,
            actual: z.actual,
            host_ballooned: z.host_ballooned,
        })
        .collect())
}

fn decode<T: serde::de::DeserializeOwned>(
    endpoint: &'static str,
    body: &[u8],
) -> Result<T, ActuateError> {
    serde_json::from_slice(body).map_err(|e| ActuateError::Decode {
        endpoint,
        detail: e.to_string(),
    })
}

impl Vmm for ChApi {
    async fn set_tier_targets(&self, targets: &[(String, u64)]) -> Result<(), ActuateError> {
        if targets.is_empty() {
            return Ok(());
        }
        let body = resize_zones_body(targets)?;
        self.call(
            RESIZE,
            "PUT",
            "/api/v1/vm.resize",
            Some(body.as_bytes()),
            Retry::Put,
        )
        .await?;
        Ok(())
    }

    async fn tier_state(&self) -> Result<Vec<TierState>, ActuateError> {
        tier_states(self.vm_info().await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_decode_to_values_or_errors_and_tiers_come_in_order() {
        let z = |id: &str, tier: u32| {
            format!(
                r#"{{"id":"{id}","tier":{tier},"target":4096,"actual":0,"host_ballooned":0,"inflated_pfns":0,"deflated_pfns":0,"rejected_pfns":0}}"#
            )
        };
        let body = format!(
            r#"{{"state":"Running","balloon":{{"tiers_offered":true,"tiers_negotiated":true,"legacy_target":0,"legacy_actual":0,"zones":[{},{}]}}}}"#,
            z("slow", 1),
            z("dram", 0)
        );
        let info = parse_vm_info(body.as_bytes()).unwrap();
        let tiers = tier_states(info).unwrap();
        assert_eq!(tiers[0].zone, "dram");
        assert_eq!(tiers[1].zone, "slow");
        let bare = parse_vm_info(br#"{"state":"Created"}"#).unwrap();
        assert!(matches!(
            tier_states(bare),
            Err(ActuateError::NotTiered { .. })
        ));
        assert!(matches!(
            parse_vm_info(b"{\"state\":1}"),
            Err(ActuateError::Decode { .. })
        ));
        let c = parse_counters(br#"{"__balloon":{"tier0_guest_accesses":3}}"#).unwrap();
        assert_eq!(c[BALLOON_DEVICE]["tier0_guest_accesses"], 3);
        assert!(parse_counters(br#"{"__balloon":{"x":-1}}"#).is_err());
    }

    #[test]
    fn resize_body_escapes_zone_ids_and_keeps_order() {
        let body = resize_zones_body(&[("slow".into(), 4096), ("a\"b".into(), 0)]);
        assert_eq!(
            body.ok().as_deref(),
            Some(r#"{"desired_balloon_zones":{"slow":4096,"a\"b":0}}"#)
        );
        assert!(matches!(
            resize_zones_body(&[(String::new(), 0)]),
            Err(ActuateError::InvalidTargets(_))
        ));
    }

    #[test]
    fn vmm_message_joins_the_chain_or_keeps_text() {
        assert_eq!(vmm_message(br#"["a","b"]"#), "a: b");
        assert_eq!(vmm_message(b"plain text\n"), "plain text");
    }
}
