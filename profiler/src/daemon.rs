//! The daemon's lifecycle: listeners, sampling loop, gRPC servers, metrics,
//! shutdown. Shutdown detaches everything and leaves VMs and balloons as
//! they are.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};

use tier_profiler::aggregate::{Aggregator, pass_ends};
use tier_profiler::config::Settings;
use tier_profiler::control::InProcess;
use tier_profiler::demo_vm::{DemoVm, DemoVmConfig, tracked::DemoTracked};
use tier_profiler::discovery::Discoverer;
use tier_profiler::registry::Registry;
use tier_profiler::sampler::pmu::source::PmuState;
use tier_profiler::sampler::{self, Sampler};
use tier_profiler::server::Shared;
use tier_profiler::synthetic::SyntheticVm;
use tier_profiler::watch::Routes;
use tier_proto::v1::DaemonInfo;

use crate::listen;
use crate::metrics::{self, Metrics};

/// How long shutdown waits for clients to hang up.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);

pub fn kernel_release() -> String {
    read_trimmed("/proc/sys/kernel/osrelease")
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// `synthetic`: (VMs, tiers each) of synthetic sources, for benchmarks.
pub fn run(settings: Settings, synthetic: (u32, u32)) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("tierd-rt")
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(serve(settings, synthetic))
}

async fn serve(s: Settings, synthetic: (u32, u32)) -> anyhow::Result<()> {
    let report = tier_profiler::probe::run();
    for c in &report.checks {
        tracing::info!(check = c.name, available = c.available, reason = %c.reason, "probe");
    }
    let (backend, no_sampler) = select_sampler(&s, &report)?;
    // The pmu source runs next to the backend (docs/pmu.md); unavailable
    // is logged and the daemon goes on without it.
    let pmu = PmuState::start(s.pmu, &s.pmu_events);
    let shared = shared_state(&s, &report, backend.as_deref(), &pmu)?;
    // cloud-hypervisor VMs found through their API sockets: the controller
    // and SetBalloonTargets drive their per-tier balloons.
    let fleet = tier_profiler::ch::Fleet::default();
    shared.set_fleet(fleet.clone());
    // QEMU VMs found through QMP: their virtio-mem devices, resized.
    let qemu_fleet = tier_profiler::qemu::Fleet::default();
    shared.set_qemu_fleet(qemu_fleet.clone());
    let metrics = Arc::new(Mutex::new(Metrics::new()));
    let metrics_served = s.metrics.is_some();
    if let Some(addr) = s.metrics {
        let bound = metrics::serve(addr, metrics.clone()).await?;
        tracing::info!(%bound, "metrics on http://{bound}/metrics");
    }
    let controller = controller(&s, &shared, &metrics, &fleet, &qemu_fleet)?;
    let registry = registry(&s, synthetic)?;
    shared.set_vms(registry.iter().map(|v| v.vm().clone()).collect());
    let registry = Arc::new(Mutex::new(registry));
    let listeners = bind(&s).await?;
    let discover = s.discover.then(|| discoverer(&s, &fleet, &qemu_fleet));
    let sampling = tokio::spawn(sample_loop(Sampling {
        registry: registry.clone(),
        discover,
        backend,
        controller,
        shared: shared.clone(),
        metrics,
        metrics_served,
        interval: s.interval,
        passes: s.passes,
        fit_budget_pct: s.fit_budget_pct,
        pmu,
        no_sampler,
    }));
    let served = serve_until_signal(&shared, listeners, s.interval).await;
    sampling.abort();
    if let Err(e) = std::fs::remove_file(&s.socket) {
        tracing::warn!(error = %e, "removing the socket");
    }
    // Dropping the registry stops the demo VM's vCPU thread.
    drop(registry);
    tracing::info!("stopped");
    served
}

/// Why no sampler runs, when none does.
type NoSampler = Option<String>;

/// The sampler backend the config and the probe allow, or why none runs.
fn select_sampler(
    s: &Settings,
    report: &tier_profiler::probe::Report,
) -> anyhow::Result<(Option<Box<dyn Sampler>>, NoSampler)> {
    let budget = sampler::budget::Budget::new(
        s.cpu_budget_pct,
        s.interval,
        s.passes,
        u64::from(s.ept_sample_stride),
    );
    if budget.is_on() {
        tracing::info!(
            cpu_budget_pct = s.cpu_budget_pct,
            "sampler CPU budget: strides and passes per VM are chosen to stay inside it"
        );
    }
    let mut backend = sampler::select(
        &s.backend,
        report,
        s.ept_sample_stride,
        s.damon_sample,
        budget,
    )?;
    if let Some(b) = backend.as_mut() {
        b.set_ages(&s.ages);
    }
    let no_sampler = match &backend {
        Some(b) => {
            tracing::info!(backend = b.backend().short_name(), "sampler selected");
            None
        }
        None => {
            let why = if s.backend == "none" {
                "no sampler backend: backend = \"none\" in the config".to_string()
            } else {
                report.no_sampler_reason()
            };
            tracing::warn!(reason = %why, "stats carry residency and guest reports only");
            Some(why)
        }
    };
    Ok((backend, no_sampler))
}

/// What the servers share: the daemon's description and the policy in
/// force (restored from the policy file, if one is kept).
fn shared_state(
    s: &Settings,
    report: &tier_profiler::probe::Report,
    backend: Option<&dyn Sampler>,
    pmu: &PmuState,
) -> anyhow::Result<Arc<Shared>> {
    let mut capabilities = report.to_proto(backend.map(|b| b.backend()));
    for c in capabilities.iter_mut().filter(|c| c.name == "pmu") {
        c.selected = pmu.is_running();
    }
    let interval_ns = u64::try_from(s.interval.as_nanos()).unwrap_or(u64::MAX);
    let shared = Shared::new(DaemonInfo {
        protocol_version: tier_proto::PROTOCOL_VERSION,
        daemon_version: env!("CARGO_PKG_VERSION").into(),
        hostname: read_trimmed("/proc/sys/kernel/hostname"),
        kernel: kernel_release(),
        capabilities,
        interval_ns,
        controller_enabled: s.controller,
    });
    if let Some(path) = &s.policy_file {
        let found = shared
            .keep_policy_in(path.clone())
            .context("[controller] policy_file")?;
        tracing::info!(
            file = %path.display(),
            "{}",
            if found {
                "policy restored from the policy file"
            } else {
                "no policy file yet: the default policy until SetPolicy writes one"
            }
        );
    }
    Ok(shared)
}

/// The in-process controller, when `[controller] enabled`.
fn controller(
    s: &Settings,
    shared: &Arc<Shared>,
    metrics: &Arc<Mutex<Metrics>>,
    fleet: &tier_profiler::ch::Fleet,
    qemu_fleet: &tier_profiler::qemu::Fleet,
) -> anyhow::Result<Option<InProcess>> {
    if !s.controller {
        tracing::info!("controller disabled");
        return Ok(None);
    }
    let (sink_shared, sink_metrics) = (shared.clone(), metrics.clone());
    let sink: tier_profiler::control::DecisionSink =
        Arc::new(move |d| publish_decision(&sink_shared, &sink_metrics, d));
    // A vm.info older than three intervals (plus a slow answer) is stale.
    let max_age = s.interval * 3 + (s.ch.timeout * 2).max(s.ch.qemu_timeout * 3);
    let c = InProcess::acting_on(&shared.policy(), s.act_on.into())
        .context("the policy in force at start")?
        .with_actuation(fleet.clone(), sink, max_age)
        .with_qemu(qemu_fleet.clone())
        .with_actuators(s.actuators.clone(), s.interval);
    tracing::info!(
        actuator = s.actuators.default.name(),
        "controller runs in-process; it drives the per-tier balloons (or virtio-mem zones, vm.resize-zone) of cloud-hypervisor VMs found through their API sockets, and the virtio-mem devices of QEMU VMs found through QMP"
    );
    Ok(Some(c))
}

/// The VM sources known at start: the demo VM and synthetic ones (VMMs
/// found later join through discovery).
fn registry(s: &Settings, synthetic: (u32, u32)) -> anyhow::Result<Registry> {
    let mut registry = Registry::default();
    if s.demo_vm {
        let vm = DemoVm::start(DemoVmConfig::default()).context("starting the demo VM")?;
        let tracked = Arc::new(DemoTracked::new(vm, s.demo_slow_kind));
        tracing::info!(id = %tracked.id(), "demo VM running");
        if let Some(every) = s.demo_cycle {
            tokio::spawn(demo_cycle(tracked.clone(), every));
        }
        registry.insert(Box::new(tracked));
    }
    if synthetic.0 > 0 {
        tracing::warn!(
            vms = synthetic.0,
            tiers = synthetic.1,
            "adding synthetic VM sources (benchmark mode)"
        );
        for i in 0..synthetic.0 {
            registry.insert(Box::new(SyntheticVm::new(i, synthetic.1)));
        }
    }
    Ok(registry)
}

/// Discovery of cloud-hypervisor, QEMU and other KVM VMs under /proc.
fn discoverer(
    s: &Settings,
    fleet: &tier_profiler::ch::Fleet,
    qemu_fleet: &tier_profiler::qemu::Fleet,
) -> Discoverer {
    Discoverer::new(
        std::path::Path::new("/proc"),
        s.tier_kinds.clone().into_iter().collect(),
    )
    .with_cloud_hypervisor(
        tier_profiler::ch::ChConfig {
            api_dir: s.ch.api_dir.clone(),
            cmdline: s.ch.cmdline,
            timeout: s.ch.timeout,
            memtier_root: tier_profiler::memtier::SYSFS.into(),
        },
        fleet.clone(),
    )
    .with_qemu(
        tier_profiler::qemu::QemuConfig {
            sockets: s.ch.qemu_qmp.clone(),
            timeout: s.ch.qemu_timeout,
            memtier_root: tier_profiler::memtier::SYSFS.into(),
        },
        qemu_fleet.clone(),
    )
    .with_kvm_fd(s.ch.kvm_fd)
}

/// The bound listeners: the unix socket, tier.v1 over TLS, health alone.
struct Listeners {
    unix: tokio::net::UnixListener,
    tcp: Option<(tokio::net::TcpListener, tonic::transport::ServerTlsConfig)>,
    health: Option<tokio::net::TcpListener>,
}

async fn bind(s: &Settings) -> anyhow::Result<Listeners> {
    let unix = listen::unix(
        &s.socket,
        s.socket_mode,
        s.socket_group.as_ref().map(|g| g.1),
    )?;
    tracing::info!(socket = %s.socket.display(), interval_ms = s.interval.as_millis() as u64, "serving tier.v1");
    let tcp = match &s.tcp {
        Some(t) => {
            let tls = listen::tls(t)?;
            let l = tokio::net::TcpListener::bind(t.listen)
                .await
                .with_context(|| format!("binding tcp.listen {}", t.listen))?;
            let bound: SocketAddr = l.local_addr().context("tcp local address")?;
            tracing::info!(%bound, mutual = t.client_ca.is_some(), "serving tier.v1 over TLS");
            Some((l, tls))
        }
        None => None,
    };
    // Health alone, plaintext: it tells only SERVING or not, nothing of
    // the VMs, so it may face the pod network for the kubelet's probes.
    let health = match s.health {
        Some(addr) => {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding health.listen {addr}"))?;
            let bound: SocketAddr = l.local_addr().context("health local address")?;
            tracing::info!(%bound, "serving grpc.health.v1 alone, plaintext");
            Some(l)
        }
        None => None,
    };
    Ok(Listeners { unix, tcp, health })
}

/// Serves tier.v1, grpc.health.v1 and reflection on every listener until
/// a server fails or SIGINT/SIGTERM; then ends the streams and waits
/// `DRAIN_TIMEOUT` at most for clients to hang up.
async fn serve_until_signal(
    shared: &Arc<Shared>,
    l: Listeners,
    interval: Duration,
) -> anyhow::Result<()> {
    let Listeners {
        unix,
        tcp,
        health: health_listener,
    } = l;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let service = Routes::new(shared.clone());
    // grpc.health.v1 and reflection beside tier.v1 on every listener.
    let (health, health_task) = tier_profiler::health::health(shared.heartbeat(), interval);
    let health_task = tokio::spawn(health_task);
    let reflection = tier_profiler::health::reflection()?;
    let (health_tcp, health_alone) = (health.clone(), health.clone());
    let unix_server = tonic::transport::Server::builder()
        .add_service(service.clone())
        .add_service(health)
        .add_service(reflection.clone())
        .serve_with_incoming_shutdown(UnixListenerStream::new(unix), stopped(stop_rx.clone()));
    let tcp_server = async {
        match tcp {
            Some((l, tls)) => tonic::transport::Server::builder()
                .tls_config(tls)
                .context("TLS config")?
                .add_service(service)
                .add_service(health_tcp)
                .add_service(reflection)
                .serve_with_incoming_shutdown(TcpListenerStream::new(l), stopped(stop_rx.clone()))
                .await
                .context("gRPC over TCP"),
            None => {
                stopped(stop_rx.clone()).await;
                Ok(())
            }
        }
    };
    let health_server = async {
        match health_listener {
            Some(l) => tonic::transport::Server::builder()
                .add_service(health_alone)
                .serve_with_incoming_shutdown(TcpListenerStream::new(l), stopped(stop_rx.clone()))
                .await
                .context("grpc.health.v1 over TCP"),
            None => {
                stopped(stop_rx.clone()).await;
                Ok(())
            }
        }
    };
    let servers = async {
        tokio::try_join!(
            async { unix_server.await.context("gRPC over unix") },
            tcp_server,
            health_server
        )
    };
    tokio::pin!(servers);
    let served = tokio::select! {
        r = &mut servers => r.map(drop),
        _ = shutdown_signal() => {
            stop_tx.send_replace(true);
            shared.close_streams();
            // Clients get their streams ended and a GOAWAY; one that does not
            // hang up in time is not waited for.
            match tokio::time::timeout(DRAIN_TIMEOUT, &mut servers).await {
                Ok(r) => r.map(drop),
                Err(_) => {
                    tracing::warn!("connections did not drain in {DRAIN_TIMEOUT:?}; closing them");
                    Ok(())
                }
            }
        }
    };
    health_task.abort();
    served
}

/// What the sampling loop works with.
struct Sampling {
    registry: Arc<Mutex<Registry>>,
    discover: Option<Discoverer>,
    backend: Option<Box<dyn Sampler>>,
    controller: Option<InProcess>,
    shared: Arc<Shared>,
    metrics: Arc<Mutex<Metrics>>,
    /// Whether a metrics endpoint serves them: without one, the per-tier
    /// series are not kept up (nothing could read them).
    metrics_served: bool,
    interval: Duration,
    passes: u32,
    /// `[sampler] fit_budget_pct`: the estimator's CPU budget.
    fit_budget_pct: f64,
    pmu: PmuState,
    /// Why no sampler runs, when none does.
    no_sampler: Option<String>,
}

/// One update per interval. The registry lock is held only for a pass.
async fn sample_loop(l: Sampling) {
    let Sampling {
        registry,
        mut discover,
        mut backend,
        mut controller,
        shared,
        metrics,
        metrics_served,
        interval,
        passes,
        fit_budget_pct,
        mut pmu,
        no_sampler,
    } = l;
    let mut agg = Aggregator::default();
    agg.set_fit_budget_pct(fit_budget_pct);
    if let Some(why) = no_sampler {
        agg.set_no_sampler_reason(why);
    }
    // `passes` ageing passes per interval, alternating short and long so
    // the estimate can tell touch rates from pages; the last closes it.
    let ends = pass_ends(interval, passes);
    let interval_ns = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX);
    // Discovery once before the first interval: VMs found now are sampled
    // in it, and their API probes answer by its end, so a restarted tierd
    // has its VMs and their balloons in its first update, not its third.
    if let Some(d) = discover.as_mut()
        && let Ok(mut reg) = registry.lock()
    {
        d.run(&mut reg);
    }
    let mut start = tokio::time::Instant::now();
    let mut pass = 0usize;
    loop {
        let Some(end) = ends.get(pass) else {
            return;
        };
        tokio::time::sleep_until(start + *end).await;
        pass += 1;
        let Ok(mut reg) = registry.lock() else {
            tracing::error!("registry lock poisoned; sampling stops");
            return;
        };
        let sampler = backend.as_deref_mut().map(|b| b as &mut dyn Sampler);
        if pass < ends.len() {
            agg.pass(&mut reg, sampler);
            continue;
        }
        pass = 0;
        // A late interval restarts the schedule from now rather than
        // running the missed passes back to back.
        start = (start + interval).max(tokio::time::Instant::now());
        if let Some(d) = discover.as_mut() {
            d.run(&mut reg);
        }
        let pmu_vms: Vec<&tier_proto::v1::Vm> = reg
            .iter()
            .filter(|t| !t.is_synthetic() && t.alive())
            .map(|t| t.vm())
            .collect();
        let pmu_readings = pmu.sample(&pmu_vms);
        drop(pmu_vms);
        let mut update = agg.tick(&mut reg, sampler, interval_ns);
        drop(reg);
        if let Some(b) = backend.as_deref_mut().and_then(|b| b.budget()) {
            sampler::budget_stream::close_interval(b, &mut update);
        }
        pmu.annotate(&mut update, pmu_readings.as_ref());
        if let Some(c) = controller.as_mut() {
            let vms = if update.vms_unchanged {
                shared.vms()
            } else {
                Arc::new(update.vms.clone())
            };
            c.annotate(&vms, &mut update);
        }
        for id in &update.departed_vm_ids {
            tracing::info!(vm = %id, "VM left");
        }
        if metrics_served && let Ok(mut m) = metrics.lock() {
            m.update(&update);
        }
        let update = shared.publish(update);
        if let Some(c) = controller.as_mut() {
            control_step(c, &shared, &metrics, &update);
        }
        if metrics_served && let Ok(m) = metrics.lock() {
            m.controller(controller.as_ref());
        }
    }
}

/// Runs the controller on one update and publishes and logs its decisions.
fn control_step(
    c: &mut InProcess,
    shared: &Shared,
    metrics: &Mutex<Metrics>,
    update: &tier_proto::v1::StatsUpdate,
) {
    if let Err(e) = c.set_policy(&shared.policy()) {
        tracing::error!(error = %e, "policy in force rejected by the controller; keeping the previous one");
    }
    for d in c.step(&shared.vms(), update) {
        publish_decision(shared, metrics, d);
    }
}

/// Logs one controller decision and streams it to the decision watchers.
fn publish_decision(shared: &Shared, metrics: &Mutex<Metrics>, d: tier_proto::v1::Decision) {
    tracing::info!(
        vm = %d.vm_id,
        reason = ?d.reason(),
        outcome = ?d.outcome(),
        observed = d.observed_ratio,
        target = d.target_ratio,
        expected = d.expected_ratio,
        changes = ?d.changes,
        detail = %d.detail,
        "controller decision"
    );
    if let Ok(m) = metrics.lock() {
        m.decision(&d);
    }
    shared.publish_decision(d);
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop tierd with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
}

/// Alternates the demo VM between two hot sets, both far smaller than its
/// tiers, so the working sets and the hot set's DRAM share move.
async fn demo_cycle(vm: Arc<DemoTracked>, every: std::time::Duration) {
    let phases = tier_profiler::demo_vm::Phase::cycle();
    let mut tick = tokio::time::interval(every);
    for p in phases.iter().cycle() {
        tick.tick().await;
        if let Err(e) = vm.demo().set_phase(*p) {
            tracing::warn!(error = %e, "demo VM phase not changed; the cycle stops");
            return;
        }
    }
}
