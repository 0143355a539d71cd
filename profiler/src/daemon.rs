//! The daemon's lifecycle: socket, sampling loop, gRPC server, shutdown.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use std::collections::{HashMap, HashSet};

use tier_profiler::aggregate::Aggregator;
use tier_profiler::demo_vm::{DemoVm, DemoVmConfig, tracked::DemoTracked};
use tier_profiler::discovery::{self, KvmFd, ProcessVm};
use tier_profiler::registry::Registry;
use tier_profiler::registry::TrackedVm;
use tier_profiler::sampler::{Sampler, hostpte::HostPte};
use tier_profiler::server::{Shared, TierServer};
use tier_proto::v1::{Backend, DaemonInfo, TierKind, tier_service_server::TierServiceServer};

use crate::RunArgs;

/// How long shutdown waits for clients to hang up.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);

pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("tierd-rt")
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(serve(args))
}

async fn serve(args: RunArgs) -> anyhow::Result<()> {
    let report = tier_profiler::probe::run();
    for c in &report.checks {
        tracing::info!(check = c.name, available = c.available, reason = %c.reason, "probe");
    }
    let interval = Duration::from_millis(args.interval_ms);
    let backend = choose_backend(&args.backend, &report)?;
    match &backend {
        Some(b) => tracing::info!(backend = b.backend().short_name(), "sampler selected"),
        None => tracing::warn!("no sampler backend: stats carry residency and guest reports only"),
    }
    let info = DaemonInfo {
        protocol_version: tier_proto::PROTOCOL_VERSION,
        daemon_version: env!("CARGO_PKG_VERSION").into(),
        hostname: hostname(),
        kernel: kernel_release(),
        capabilities: report.to_proto(backend.as_ref().map(|s| s.backend())),
        interval_ns: u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX),
        controller_enabled: false,
    };
    let shared = Shared::new(info);

    let mut registry = Registry::default();
    if args.demo_vm {
        let kind = TierKind::from_short_name(&args.demo_slow_kind).unwrap_or(TierKind::Unknown);
        let vm = DemoVm::start(DemoVmConfig::default()).context("starting the demo VM")?;
        let tracked = DemoTracked::new(vm, kind);
        tracing::info!(id = %tracked.id(), "demo VM running");
        registry.insert(Box::new(tracked));
    }
    shared.set_vms(registry.iter().map(|v| v.vm().clone()).collect());
    let registry = Arc::new(Mutex::new(registry));

    let listener = bind(&args.socket, args.socket_mode)?;
    tracing::info!(socket = %args.socket.display(), interval_ms = args.interval_ms, "serving tier.v1");

    let discover =
        (!args.no_discover).then(|| Discoverer::new(args.tier_kinds.iter().cloned().collect()));
    let sampler = tokio::spawn(sample_loop(
        registry.clone(),
        discover,
        backend,
        shared.clone(),
        interval,
    ));
    let closing = shared.clone();
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let server = tonic::transport::Server::builder()
        .add_service(TierServiceServer::new(TierServer::new(shared)))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
            let _ = stop_rx.wait_for(|s| *s).await;
            closing.close_streams();
        });
    tokio::pin!(server);
    let served = tokio::select! {
        r = &mut server => r.context("gRPC server"),
        _ = shutdown_signal() => {
            stop_tx.send_replace(true);
            // Clients get their streams ended and a GOAWAY; one that does not
            // hang up in time is not waited for.
            match tokio::time::timeout(DRAIN_TIMEOUT, &mut server).await {
                Ok(r) => r.context("gRPC server"),
                Err(_) => {
                    tracing::warn!("connections did not drain in {DRAIN_TIMEOUT:?}; closing them");
                    Ok(())
                }
            }
        }
    };
    sampler.abort();
    if let Err(e) = std::fs::remove_file(&args.socket) {
        tracing::warn!(error = %e, "removing the socket");
    }
    // Dropping the registry stops the demo VM's vCPU thread.
    drop(registry);
    tracing::info!("stopped");
    served
}

/// One update per interval. The registry lock is held only for the tick.
async fn sample_loop(
    registry: Arc<Mutex<Registry>>,
    mut discover: Option<Discoverer>,
    mut backend: Option<Box<dyn Sampler>>,
    shared: Arc<Shared>,
    interval: Duration,
) {
    let mut agg = Aggregator::default();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let interval_ns = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX);
    loop {
        ticker.tick().await;
        let update = match registry.lock() {
            Ok(mut reg) => {
                if let Some(d) = discover.as_mut() {
                    d.run(&mut reg);
                }
                agg.tick(
                    &mut reg,
                    backend.as_deref_mut().map(|b| b as &mut dyn Sampler),
                    interval_ns,
                )
            }
            Err(_) => {
                tracing::error!("registry lock poisoned; sampling stops");
                return;
            }
        };
        for id in &update.departed_vm_ids {
            tracing::info!(vm = %id, "VM left");
        }
        shared.publish(update);
    }
}

/// Finds VMs in other processes each interval and adds the new ones.
struct Discoverer {
    overrides: HashMap<String, TierKind>,
    /// kvm-vm fds that hold no memfd memory: reported once, not re-read.
    skipped: HashSet<KvmFd>,
}

impl Discoverer {
    fn new(overrides: HashMap<String, TierKind>) -> Discoverer {
        Discoverer {
            overrides,
            skipped: HashSet::new(),
        }
    }

    fn run(&mut self, reg: &mut Registry) {
        let me = std::process::id();
        let proc_root = Path::new("/proc");
        let found = discovery::scan(proc_root);
        self.skipped.retain(|k| found.contains(k));
        for key in found {
            let id = format!("kvm:{}:{}", key.pid, key.fd);
            if key.pid == me || reg.contains(&id) || self.skipped.contains(&key) {
                continue;
            }
            match ProcessVm::probe(proc_root, key, &self.overrides) {
                Some(vm) => {
                    tracing::info!(vm = %id, tiers = vm.vm().tiers.len(), "VM discovered");
                    reg.insert(Box::new(vm));
                }
                None => {
                    tracing::info!(vm = %id, "kvm-vm fd without memfd-backed memory: not tracked");
                    self.skipped.insert(key);
                }
            }
        }
    }
}

/// `auto` takes the probe's best backend; a forced one must be available.
fn choose_backend(
    name: &str,
    report: &tier_profiler::probe::Report,
) -> anyhow::Result<Option<Box<dyn Sampler>>> {
    let wanted = match name {
        "auto" => report.best_backend(),
        "none" => None,
        "hostpte" => Some(Backend::Hostpte),
        other => bail!("--backend {other}: not implemented yet (implemented: auto, hostpte, none)"),
    };
    match wanted {
        None => Ok(None),
        Some(Backend::Hostpte) => {
            if let Some(c) = report.get("hostpte").filter(|c| !c.available) {
                bail!("--backend hostpte: unavailable here: {}", c.reason);
            }
            Ok(Some(Box::new(HostPte::new())))
        }
        Some(other) => {
            tracing::warn!(
                backend = other.short_name(),
                "best backend is not implemented yet; running without a sampler"
            );
            Ok(None)
        }
    }
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

/// Binds the socket. A stale socket file (nobody listening) is replaced; a
/// live one or a non-socket file is an error, never deleted.
fn bind(path: &Path, mode: u32) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            bail!(
                "{} exists and is not a socket; not touching it",
                path.display()
            );
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!("another tierd is already serving on {}", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", path.display()))?;
    Ok(listener)
}
