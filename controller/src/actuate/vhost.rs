//! [`Vmm`] over the control socket of the `tier-balloon` vhost-user
//! backend (vmm-patch/balloon-backend, protocol in
//! docs/balloon-backend.md "Control socket"): one JSON object per line,
//! one answer line per request, on a unix stream socket. The controller
//! sets targets and reads the balloon without going through the VMM.
//!
//! Retries: transport failures (connect, reset, timeout, a truncated or
//! unparsable answer) and 5xx answers (503: the backend has too many control
//! connections) are retried with [`Backoff`] on every call; a 4xx (400
//! malformed, 422 targets refused: unknown zone, above the zone size) is
//! not: nothing changed and the same request would be refused again.
//! `set_targets` carries absolute targets, so sending it again after a lost
//! answer leaves the backend where one application does.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use super::{ActuateError, Backoff, TierState, Vmm};

const PING: &str = "tier-balloon ping";
const STATE: &str = "tier-balloon state";
const SET_TARGETS: &str = "tier-balloon set_targets";

/// Largest answer line accepted (a state answer is a few KiB).
const MAX_ANSWER: u64 = 4 << 20;

/// The backend's control socket (`tier-balloon --control PATH`).
#[derive(Debug, Clone)]
pub struct VhostBalloon {
    socket: PathBuf,
    timeout: Duration,
    backoff: Backoff,
}

/// `{"op":"ping"}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BackendPing {
    pub protocol: u32,
    pub version: String,
    /// Zone names in tier order.
    pub tiers: Vec<String>,
}

/// `{"op":"state"}`: the parts tierd uses (the backend sends more).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BackendState {
    pub protocol: u32,
    pub tiers_offered: bool,
    /// The guest driver negotiated `F_TIERS`.
    pub tiers_negotiated: bool,
    pub stats_negotiated: bool,
    pub frontend: BackendFrontend,
    pub legacy_target: u64,
    pub legacy_actual: u64,
    pub zones: Vec<BackendZone>,
    pub config: BackendConfig,
    pub stats: BackendStats,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BackendFrontend {
    pub connected: bool,
    pub connections: u64,
    pub acked_features: u64,
    pub memory_regions: u64,
    pub notify_channel: bool,
}

/// One tier: bytes, and cumulative PFN / chain counts.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BackendZone {
    pub id: String,
    pub tier: u32,
    pub target: u64,
    /// Driver-written (untrusted).
    pub actual: u64,
    /// Counted by the backend from accepted PFNs (trusted).
    pub host_ballooned: u64,
    pub zone_bytes: u64,
    pub mapped_bytes: u64,
    pub inflated_pfns: u64,
    pub deflated_pfns: u64,
    pub rejected_pfns: u64,
    pub rejected_chains: u64,
    /// Rejected chains by reason.
    pub rejected: BTreeMap<String, u64>,
    pub release_calls: u64,
    pub released_bytes: u64,
    pub release_errors: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BackendConfig {
    pub writes_accepted: u64,
    pub writes_ignored: u64,
    pub changes_sent: u64,
    pub change_errors: u64,
    pub changes_suppressed: u64,
}

/// The guest's stats queue (SPEC.md section 4), names as `vm.counters`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BackendStats {
    pub updates: u64,
    pub bad_buffers: u64,
    pub values: BTreeMap<String, u64>,
}

/// The `set_targets` request line (without the newline), zones in the
/// caller's order: `{"op":"set_targets","targets":{"dram":67108864}}`.
/// An empty or duplicate zone id is refused.
pub fn set_targets_line(targets: &[(String, u64)]) -> Result<String, ActuateError> {
    let mut seen = HashSet::new();
    let mut line = String::from("{\"op\":\"set_targets\",\"targets\":{");
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
            line.push(',');
        }
        line.push_str(&Value::from(zone.as_str()).to_string());
        line.push(':');
        line.push_str(&bytes.to_string());
    }
    line.push_str("}}");
    Ok(line)
}

/// One request line out, one answer line back, on a fresh connection.
async fn exchange(socket: &Path, line: &str) -> io::Result<Vec<u8>> {
    let mut stream = UnixStream::connect(socket).await?;
    let mut out = Vec::with_capacity(line.len() + 1);
    out.extend_from_slice(line.as_bytes());
    out.push(b'\n');
    stream.write_all(&out).await?;
    let mut answer = Vec::new();
    let mut reader = BufReader::new(stream).take(MAX_ANSWER);
    reader.read_until(b'\n', &mut answer).await?;
    if answer.last() != Some(&b'\n') {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before a complete answer line",
        ));
    }
    Ok(answer)
}

enum Outcome {
    Ok(Value),
    /// `ok: false` with its status and message.
    Refused(u16, String),
    /// Not an answer of this protocol.
    Garbled(String),
}

fn parse(answer: &[u8]) -> Outcome {
    let v: Value = match serde_json::from_slice(answer) {
        Ok(v) => v,
        Err(e) => return Outcome::Garbled(format!("answer is not JSON: {e}")),
    };
    match v.get("ok").and_then(Value::as_bool) {
        Some(true) => Outcome::Ok(v),
        Some(false) => {
            let status = v
                .get("status")
                .and_then(Value::as_u64)
                .and_then(|s| u16::try_from(s).ok())
                .unwrap_or(500);
            let msg = v
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("(no message)")
                .to_string();
            Outcome::Refused(status, msg)
        }
        None => Outcome::Garbled(format!("answer without \"ok\": {v}")),
    }
}

impl VhostBalloon {
    /// Per-attempt timeout unless set otherwise.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

    pub fn new(socket: impl Into<PathBuf>) -> Self {
        VhostBalloon {
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

    /// `{"op":"ping"}`.
    pub async fn ping(&self) -> Result<BackendPing, ActuateError> {
        let v = self.call(PING, r#"{"op":"ping"}"#).await?;
        decode(PING, v)
    }

    /// `{"op":"state"}`: targets, actuals, trusted counts, rejections,
    /// config-space counters and the guest's stats.
    pub async fn state(&self) -> Result<BackendState, ActuateError> {
        let mut v = self.call(STATE, r#"{"op":"state"}"#).await?;
        let state = v.get_mut("state").map(Value::take).unwrap_or(Value::Null);
        decode(STATE, state)
    }

    /// Sets the legacy (whole-VM) target in bytes.
    pub async fn set_legacy_target(&self, bytes: u64) -> Result<(), ActuateError> {
        let line = format!("{{\"op\":\"set_targets\",\"legacy\":{bytes}}}");
        self.call(SET_TARGETS, &line).await.map(drop)
    }

    /// One request with its retries; the `ok: true` answer.
    async fn call(&self, endpoint: &'static str, line: &str) -> Result<Value, ActuateError> {
        self.backoff
            .run(|attempt| async move {
                let result = tokio::time::timeout(self.timeout, exchange(&self.socket, line)).await;
                ControlFlow::Continue(Err(match result {
                    Err(_) => ActuateError::Timeout {
                        endpoint,
                        socket: self.socket.clone(),
                        timeout: self.timeout,
                        attempts: attempt,
                    },
                    Ok(Err(source)) => ActuateError::Transport {
                        endpoint,
                        socket: self.socket.clone(),
                        attempts: attempt,
                        source,
                    },
                    Ok(Ok(answer)) => match parse(&answer) {
                        Outcome::Ok(v) => return ControlFlow::Break(Ok(v)),
                        Outcome::Refused(status @ 400..=499, message) => {
                            return ControlFlow::Break(Err(ActuateError::Rejected {
                                endpoint,
                                status,
                                message,
                            }));
                        }
                        Outcome::Refused(status, message) => ActuateError::Vmm {
                            endpoint,
                            status,
                            message,
                        },
                        Outcome::Garbled(detail) => ActuateError::Protocol { endpoint, detail },
                    },
                }))
            })
            .await
    }
}

fn decode<T: serde::de::DeserializeOwned>(
    endpoint: &'static str,
    v: Value,
) -> Result<T, ActuateError> {
    serde_json::from_value(v).map_err(|e| ActuateError::Decode {
        endpoint,
        detail: e.to_string(),
    })
}

impl Vmm for VhostBalloon {
    async fn set_tier_targets(&self, targets: &[(String, u64)]) -> Result<(), ActuateError> {
        if targets.is_empty() {
            return Ok(());
        }
        let line = set_targets_line(targets)?;
        self.call(SET_TARGETS, &line).await.map(drop)
    }

    async fn tier_state(&self) -> Result<Vec<TierState>, ActuateError> {
        let state = self.state().await?;
        if !state.tiers_offered || state.zones.is_empty() {
            return Err(ActuateError::NotTiered { endpoint: STATE });
        }
        let mut zones = state.zones;
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_targets_line_escapes_and_refuses_duplicates() {
        assert_eq!(
            set_targets_line(&[("slow".into(), 4096), ("a\"b".into(), 0)])
                .ok()
                .as_deref(),
            Some(r#"{"op":"set_targets","targets":{"slow":4096,"a\"b":0}}"#)
        );
        assert!(matches!(
            set_targets_line(&[("x".into(), 1), ("x".into(), 2)]),
            Err(ActuateError::InvalidTargets(_))
        ));
        assert!(matches!(
            set_targets_line(&[(String::new(), 1)]),
            Err(ActuateError::InvalidTargets(_))
        ));
    }

    #[test]
    fn answers_are_classified() {
        assert!(matches!(parse(b"{\"ok\":true}\n"), Outcome::Ok(_)));
        assert!(matches!(
            parse(br#"{"ok":false,"status":422,"error":"unknown zone"}"#),
            Outcome::Refused(422, m) if m == "unknown zone"
        ));
        assert!(matches!(parse(b"{\"status\":1}"), Outcome::Garbled(_)));
        assert!(matches!(parse(b"HTTP/1.1 200 OK"), Outcome::Garbled(_)));
    }
}
