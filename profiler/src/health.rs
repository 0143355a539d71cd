//! grpc.health.v1 and server reflection beside tier.v1 (docs/grpc.md).
//!
//! Health: `tier.v1.TierService` and `""` (the server as a whole) are
//! NOT_SERVING until the first interval is published, and again when no
//! interval has come for [`STALE_INTERVALS`] intervals (a stuck or ended
//! sampling loop). `tier.v1.TierService` is also NOT_SERVING while the
//! intervals carry no active sampler (backend `none` or none available):
//! tierd then measures nothing, though it runs (what a readiness probe
//! asks), while `""` says it runs (what a liveness probe asks).

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_reflection::server::v1::{ServerReflection, ServerReflectionServer};

use tier_proto::v1::tier_service_server::SERVICE_NAME;

/// Intervals without an update after which tierd reports NOT_SERVING.
pub const STALE_INTERVALS: u32 = 3;

/// What the sampling loop last said, for the health service.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Beat {
    /// When the last interval was published.
    pub at: Instant,
    /// Whether a sampler produced it.
    pub sampled: bool,
}

/// The sampling loop's side: one beat per published interval.
#[derive(Debug)]
pub struct Heartbeat {
    tx: watch::Sender<Option<Beat>>,
}

impl Default for Heartbeat {
    fn default() -> Heartbeat {
        Heartbeat {
            tx: watch::Sender::new(None),
        }
    }
}

impl Heartbeat {
    /// One interval was published; `sampled`: an active sampler made it.
    pub fn beat(&self, sampled: bool) {
        self.tx.send_replace(Some(Beat {
            at: Instant::now(),
            sampled,
        }));
    }

    fn subscribe(&self) -> watch::Receiver<Option<Beat>> {
        self.tx.subscribe()
    }
}

/// The status a beat (or none yet) means at `now`; `sampler`: a sampler
/// must have made it (tier.v1.TierService), or any interval will do ("").
pub fn status(
    beat: Option<Beat>,
    now: Instant,
    interval: Duration,
    sampler: bool,
) -> ServingStatus {
    match beat {
        Some(b)
            if (b.sampled || !sampler)
                && now.saturating_duration_since(b.at) < interval * STALE_INTERVALS =>
        {
            ServingStatus::Serving
        }
        _ => ServingStatus::NotServing,
    }
}

/// The health service, NOT_SERVING for now, and the task that keeps it
/// up to date from `heartbeat` (run it beside the servers).
pub fn health(
    heartbeat: &Heartbeat,
    interval: Duration,
) -> (
    HealthServer<impl Health>,
    impl Future<Output = ()> + Send + 'static,
) {
    let (reporter, server) = tonic_health::server::health_reporter();
    let mut beats = heartbeat.subscribe();
    let task = async move {
        let mut shown = None;
        loop {
            let now = Instant::now();
            let beat = *beats.borrow_and_update();
            let st = (
                status(beat, now, interval, false),
                status(beat, now, interval, true),
            );
            if shown != Some(st) {
                // The service first: whoever sees "" change sees both.
                reporter.set_service_status(SERVICE_NAME, st.1).await;
                reporter.set_service_status("", st.0).await;
                tracing::info!(server = ?st.0, service = ?st.1, "grpc.health.v1");
                shown = Some(st);
            }
            // Re-checked each interval even without a beat: staleness.
            tokio::select! {
                r = beats.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(interval) => {}
            }
        }
    };
    (server, task)
}

/// Server reflection (v1) of tier.v1 and grpc.health.v1.
pub fn reflection() -> Result<ServerReflectionServer<impl ServerReflection>, HealthError> {
    Ok(tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(tier_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?)
}

/// Reflection could not be built from the descriptor sets.
#[derive(Debug, thiserror::Error)]
#[error("server reflection: {0}")]
pub struct HealthError(#[from] tonic_reflection::server::Error);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_only_after_a_sampled_interval_that_is_recent() {
        let i = Duration::from_secs(1);
        let t0 = Instant::now();
        for sampler in [false, true] {
            assert_eq!(status(None, t0, i, sampler), ServingStatus::NotServing);
        }
        let sampled = Beat {
            at: t0,
            sampled: true,
        };
        assert_eq!(status(Some(sampled), t0, i, true), ServingStatus::Serving);
        assert_eq!(
            status(Some(sampled), t0 + i * 2, i, true),
            ServingStatus::Serving
        );
        assert_eq!(
            status(Some(sampled), t0 + i * STALE_INTERVALS, i, false),
            ServingStatus::NotServing,
            "no interval for three: the loop is stuck"
        );
        let unsampled = Beat {
            at: t0,
            sampled: false,
        };
        assert_eq!(
            status(Some(unsampled), t0, i, true),
            ServingStatus::NotServing,
            "tier.v1 measures nothing"
        );
        assert_eq!(
            status(Some(unsampled), t0, i, false),
            ServingStatus::Serving,
            "the server runs"
        );
    }

    #[test]
    fn reflection_builds_from_the_descriptor_sets() {
        assert!(reflection().is_ok());
    }
}
