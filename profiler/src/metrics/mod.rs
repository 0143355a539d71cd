//! Prometheus `/metrics` on a loopback address: per VM and tier accesses,
//! hit ratio, balloon target/actual, sampler health and scan cost. Fleets
//! aggregate hosts with Prometheus, not with a collector of ours. The
//! estimate's intervals are in `bounds`, the sampler budget's in `budget`,
//! the controller's in `control`, the working-set ages' in `ages`,
//! virtio-mem zones and the actuator in `hotplug`,
//! the process series in `process`.

mod age_series;
mod bounds;
mod budget;
mod control;
mod hotplug;
mod hotset;
mod process;
mod text;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tier_proto::v1::{Backend, StatsUpdate, TierKind};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierLabels {
    vm: String,
    tier: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VmLabels {
    vm: String,
    name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabels {
    backend: String,
}

type FGauge<L> = Family<L, Gauge<f64, AtomicU64>>;

/// Sets `f` to `v` where there is a value, removes the series otherwise.
fn set<L: Clone + std::hash::Hash + Eq>(f: &FGauge<L>, l: &L, v: Option<f64>) {
    match v.filter(|v| v.is_finite()) {
        Some(v) => {
            f.get_or_create(l).set(v);
        }
        None => {
            f.remove(l);
        }
    }
}

/// Every family tierd exports, and the label sets live per VM (removed when
/// the VM goes away, so dashboards do not show ghosts).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    young: Family<TierLabels, Gauge>,
    sampled: Family<TierLabels, Gauge>,
    access_rate: FGauge<TierLabels>,
    saturation: FGauge<TierLabels>,
    resident: Family<TierLabels, Gauge>,
    balloon_target: Family<TierLabels, Gauge>,
    balloon_actual: Family<TierLabels, Gauge>,
    pmu_rate: FGauge<TierLabels>,
    pmu_measured: Family<TierLabels, Gauge>,
    pmu_running: FGauge<TierLabels>,
    hit: FGauge<VmLabels>,
    hit_error: FGauge<VmLabels>,
    bounds: bounds::Bounds,
    budget: budget::Budget,
    ages: age_series::Ages,
    control: control::Control,
    hotplug: hotplug::Hotplug,
    hot_set: hotset::HotSet,
    measured: Family<VmLabels, Gauge>,
    active: Family<BackendLabels, Gauge>,
    scan_seconds: Family<BackendLabels, Counter<f64, AtomicU64>>,
    events: Family<BackendLabels, Counter>,
    lost: Family<BackendLabels, Counter>,
    /// EPT health signals, pages: unattributed, foreign young, unmapped.
    signals: [Family<BackendLabels, Counter>; 3],
    errors: Family<BackendLabels, Counter>,
    vms: Gauge,
    updates: Counter,
    live: HashMap<String, (VmLabels, Vec<TierLabels>)>,
    /// Each live VM's tiers' virtio-mem parts, in tier order.
    hotplug_of: HashMap<String, Vec<Option<tier_proto::v1::TierHotplug>>>,
}

/// Label sets of a VM and its tiers, in tier order.
fn labels(vm: &tier_proto::v1::Vm) -> (VmLabels, Vec<TierLabels>) {
    let tiers = vm
        .tiers
        .iter()
        .map(|t| TierLabels {
            vm: vm.id.clone(),
            tier: t.name.clone(),
            kind: TierKind::try_from(t.kind)
                .unwrap_or(TierKind::Unknown)
                .short_name()
                .into(),
        })
        .collect();
    (
        VmLabels {
            vm: vm.id.clone(),
            name: vm.name.clone(),
        },
        tiers,
    )
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Metrics {
    pub fn new() -> Metrics {
        // tierd's own families under `tierd_`; the process series keep
        // their standard names at the root.
        let mut registry = Registry::default();
        registry.register_collector(Box::new(process::Process));
        let mut m = Metrics {
            young: Family::default(),
            sampled: Family::default(),
            access_rate: Family::default(),
            saturation: Family::default(),
            resident: Family::default(),
            balloon_target: Family::default(),
            balloon_actual: Family::default(),
            pmu_rate: Family::default(),
            pmu_measured: Family::default(),
            pmu_running: Family::default(),
            hit: Family::default(),
            hit_error: Family::default(),
            bounds: bounds::Bounds::default(),
            budget: budget::Budget::default(),
            ages: age_series::Ages::default(),
            control: control::Control::default(),
            hotplug: hotplug::Hotplug::default(),
            hot_set: hotset::HotSet::default(),
            measured: Family::default(),
            active: Family::default(),
            scan_seconds: Family::default(),
            events: Family::default(),
            lost: Family::default(),
            signals: Default::default(),
            errors: Family::default(),
            vms: Gauge::default(),
            updates: Counter::default(),
            live: HashMap::new(),
            hotplug_of: HashMap::new(),
            registry: Registry::default(),
        };
        let r = registry.sub_registry_with_prefix("tierd");
        let build: Family<BuildLabels, Gauge> = Family::default();
        build
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").into(),
            })
            .set(1);
        r.register(
            "build_info",
            "Always 1; the version of tierd serving these series (rules join on it to find tierd's process series)",
            build,
        );
        r.register(
            "tier_young_pages",
            "Pages of the tier found accessed in the last interval",
            m.young.clone(),
        );
        r.register(
            "tier_sampled_pages",
            "Pages of the tier examined in the last interval",
            m.sampled.clone(),
        );
        r.register(
            "tier_estimated_accesses_per_second",
            "Estimated accesses to the tier per second (host-sampled)",
            m.access_rate.clone(),
        );
        r.register(
            "tier_rate_saturation_ratio",
            "Share of the tier's active pages young in the shortest pass; near 0.95 the access estimate counts pages, not touches (absent when the passes cannot tell)",
            m.saturation.clone(),
        );
        r.register(
            "tier_resident_bytes",
            "Host-resident bytes of the tier",
            m.resident.clone(),
        );
        r.register(
            "tier_balloon_target_bytes",
            "Balloon target of the tier",
            m.balloon_target.clone(),
        );
        r.register(
            "tier_balloon_actual_bytes",
            "Balloon size the guest reports for the tier",
            m.balloon_actual.clone(),
        );
        r.register(
            "tier_pmu_events_per_second",
            "Accesses served by the tier's memory per second, counted guest-only on the VM's vCPU threads by the pmu source and scaled for multiplexing (absent when not measured)",
            m.pmu_rate.clone(),
        );
        r.register(
            "tier_pmu_measured",
            "1 if the pmu source measured the tier in the last interval, 0 if it cannot (no event for its memory, placement unknown, counters multiplexed out: see the stream's not_measured)",
            m.pmu_measured.clone(),
        );
        r.register(
            "tier_pmu_running_ratio",
            "Share of their enabled time the tier's PMU counters ran; below 1 they were multiplexed and the counts scaled",
            m.pmu_running.clone(),
        );
        r.register(
            "vm_dram_hit_ratio",
            "Estimated share of accesses that hit DRAM",
            m.hit.clone(),
        );
        r.register(
            "vm_dram_hit_sampling_error_ratio",
            "Half-width of the ~95% interval of the hit ratio from page sampling alone (0 when every page is examined); the estimate's interval is vm_dram_hit_ratio_low/_high",
            m.hit_error.clone(),
        );
        m.bounds.register(r);
        m.budget.register(r);
        m.ages.register(r);
        m.control.register(r);
        m.hotplug.register(r);
        m.hot_set.register(r);
        r.register(
            "vm_measured",
            "1 if the host sampler read the VM in the last interval, 0 if it cannot (the reason is the stream's VmStats.not_measured and `tierctl top`); hit-ratio series are absent meanwhile",
            m.measured.clone(),
        );
        r.register(
            "sampler_active",
            "1 if the backend produced the last interval",
            m.active.clone(),
        );
        r.register(
            "sampler_scan_seconds",
            "CPU time spent sampling",
            m.scan_seconds.clone(),
        );
        r.register(
            "sampler_events",
            "Pages or events processed by the sampler",
            m.events.clone(),
        );
        r.register("sampler_lost", "Events the sampler lost", m.lost.clone());
        for (name, help, f) in [
            (
                "sampler_unattributed_pages",
                "EPT ageing events no VM was found for (another ager, or an unknown VM)",
                &m.signals[0],
            ),
            (
                "sampler_foreign_young_pages",
                "Young pages of known VMs cleared by another ager (reclaim, MGLRU, another DAMON); tierd's passes miss them (fexit only)",
                &m.signals[1],
            ),
            (
                "sampler_unmapped_pages",
                "Pages tierd aged outside every tier range of their VM: the tier map misses memory the guest uses",
                &m.signals[2],
            ),
        ] {
            r.register(name, help, f.clone());
        }
        r.register(
            "sampler_errors",
            "Intervals in which sampling some VM failed",
            m.errors.clone(),
        );
        r.register("vms", "VMs tierd tracks", m.vms.clone());
        r.register("updates", "Sampling intervals completed", m.updates.clone());
        m.registry = registry;
        m
    }

    /// Takes one interval's update. Label sets are built when a VM appears
    /// and reused every interval after; a VM's series go when it does.
    pub fn update(&mut self, u: &StatsUpdate) {
        if !u.vms_unchanged {
            let listed: std::collections::HashSet<&str> =
                u.vms.iter().map(|v| v.id.as_str()).collect();
            let gone: Vec<String> = self
                .live
                .keys()
                .filter(|id| !listed.contains(id.as_str()))
                .cloned()
                .collect();
            for id in gone {
                self.forget(&id);
            }
            for vm in &u.vms {
                self.live.entry(vm.id.clone()).or_insert_with(|| labels(vm));
                self.hotplug_of
                    .insert(vm.id.clone(), vm.tiers.iter().map(|t| t.hotplug).collect());
            }
        }
        let secs = (u.interval_ns as f64 / 1e9).max(1e-9);
        for stats in &u.stats {
            let Some((vl, tiers)) = self.live.get(&stats.vm_id) else {
                continue;
            };
            let hotplug = self.hotplug_of.get(&stats.vm_id);
            for (i, (tl, s)) in tiers.iter().zip(&stats.tiers).enumerate() {
                self.young.get_or_create(tl).set(clamp(s.young_pages));
                self.sampled.get_or_create(tl).set(clamp(s.sampled_pages));
                self.access_rate
                    .get_or_create(tl)
                    .set(s.estimated_accesses / secs);
                match s.saturation {
                    Some(v) => {
                        self.saturation.get_or_create(tl).set(v);
                    }
                    None => {
                        self.saturation.remove(tl);
                    }
                }
                if s.resident_not_measured.is_empty() {
                    self.resident.get_or_create(tl).set(clamp(s.resident_bytes));
                } else {
                    // Unknown, not 0.
                    self.resident.remove(tl);
                }
                self.balloon_target
                    .get_or_create(tl)
                    .set(clamp(s.balloon_target_bytes));
                self.balloon_actual
                    .get_or_create(tl)
                    .set(clamp(s.balloon_actual_bytes));
                self.pmu(tl, s, secs);
                self.bounds.tier(tl, s, secs);
                self.ages.tier(tl, s);
                let hp = hotplug.and_then(|h| h.get(i).copied().flatten());
                self.hotplug.tier(tl, hp, s);
            }
            let measured = stats.not_measured.is_empty();
            self.measured.get_or_create(vl).set(i64::from(measured));
            // A 0-100 % interval is no measurement: no ratio, no bounds.
            let ratio_ok = stats.has_accesses && measured && stats.dram_hit_not_measured.is_empty();
            if ratio_ok {
                self.hit.get_or_create(vl).set(stats.dram_hit_ratio);
            } else {
                // No stale ratio from an earlier interval.
                self.hit.remove(vl);
            }
            // The sampling error alone only where no interval says more.
            if ratio_ok && stats.dram_hit_low.is_none() {
                self.hit_error.get_or_create(vl).set(stats.dram_hit_error);
            } else {
                self.hit_error.remove(vl);
            }
            self.bounds.vm(vl, stats, ratio_ok);
            self.hot_set.vm(vl, stats, ratio_ok);
            self.budget.vm(vl, stats, secs);
            self.hotplug.vm(vl, stats);
        }
        for h in &u.health {
            let b = BackendLabels {
                backend: Backend::try_from(h.backend)
                    .unwrap_or(Backend::Unspecified)
                    .short_name()
                    .into(),
            };
            self.active.get_or_create(&b).set(i64::from(h.active));
            self.scan_seconds
                .get_or_create(&b)
                .inc_by(h.scan_cost_ns as f64 / 1e9);
            self.events.get_or_create(&b).inc_by(h.events);
            self.budget.health(&b, h, secs);
            self.lost.get_or_create(&b).inc_by(h.lost);
            for (f, v) in self.signals.iter().zip([
                h.unattributed_pages,
                h.foreign_young_pages,
                h.unmapped_pages,
            ]) {
                f.get_or_create(&b).inc_by(v);
            }
            // Created at 0, so rate() sees the first error.
            let errors = self.errors.get_or_create(&b);
            if !h.error.is_empty() {
                errors.inc();
            }
        }
        self.vms.set(clamp(self.live.len() as u64));
        self.updates.inc();
    }

    /// The controller's series of every VM tracked, after its step (None:
    /// the controller is off).
    pub fn controller(&self, c: Option<&tier_profiler::control::InProcess>) {
        for (vl, _) in self.live.values() {
            self.control.vm(vl, c);
        }
    }

    /// Counts one published controller decision.
    pub fn decision(&self, d: &tier_proto::v1::Decision) {
        self.control.decision(d);
    }

    /// The pmu source's series of one tier: a rate only when measured.
    fn pmu(&self, tl: &TierLabels, s: &tier_proto::v1::TierSample, secs: f64) {
        let Some(c) = s.sources.iter().find(|c| c.source() == Backend::Pmu) else {
            self.pmu_measured.remove(tl);
            self.pmu_rate.remove(tl);
            self.pmu_running.remove(tl);
            return;
        };
        let measured = c.not_measured.is_empty();
        self.pmu_measured.get_or_create(tl).set(i64::from(measured));
        if measured {
            // The span the counts cover, where the source says it.
            let span = if c.seconds > 0.0 { c.seconds } else { secs };
            self.pmu_rate.get_or_create(tl).set(c.events as f64 / span);
            self.pmu_running.get_or_create(tl).set(c.running_ratio);
        } else {
            self.pmu_rate.remove(tl);
            self.pmu_running.remove(tl);
        }
    }

    /// Removes every series of a VM that went away.
    fn forget(&mut self, id: &str) {
        let Some((vm, tiers)) = self.live.remove(id) else {
            return;
        };
        self.hit.remove(&vm);
        self.hit_error.remove(&vm);
        self.measured.remove(&vm);
        self.bounds.forget_vm(&vm);
        self.budget.forget_vm(&vm);
        self.control.forget_vm(&vm);
        self.hotplug.forget_vm(&vm);
        self.hot_set.forget_vm(&vm);
        self.hotplug_of.remove(id);
        for t in tiers {
            self.bounds.forget_tier(&t);
            self.ages.forget_tier(&t);
            self.hotplug.forget_tier(&t);
            for f in [
                &self.young,
                &self.sampled,
                &self.resident,
                &self.balloon_target,
                &self.balloon_actual,
                &self.pmu_measured,
            ] {
                f.remove(&t);
            }
            self.access_rate.remove(&t);
            self.saturation.remove(&t);
            self.pmu_rate.remove(&t);
            self.pmu_running.remove(&t);
        }
    }

    /// OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "encoding metrics");
        }
        out
    }
}

/// Serves GET /metrics until the runtime ends.
pub async fn serve(addr: SocketAddr, metrics: Arc<Mutex<Metrics>>) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics endpoint {addr}"))?;
    let bound = listener.local_addr().context("metrics local address")?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move |headers: axum::http::HeaderMap| {
            let m = metrics.clone();
            async move {
                let body = m.lock().map(|m| m.encode()).unwrap_or_default();
                let accept = headers
                    .get(axum::http::header::ACCEPT)
                    .and_then(|v| v.to_str().ok());
                // Prometheus asks for OpenMetrics; promtool, curl and older
                // agents get the classic text format.
                let (kind, body) = if text::wants_openmetrics(accept) {
                    (text::OPENMETRICS, body)
                } else {
                    (text::TEXT, text::from_openmetrics(&body))
                };
                ([(axum::http::header::CONTENT_TYPE, kind)], body)
            }
        }),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics endpoint stopped");
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod tests;
