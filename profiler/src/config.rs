//! tierd's configuration: `/etc/tierd/tierd.toml`, then command-line flags
//! on top. Every key and its default is in docs/config.md. A bad value is a
//! `ConfigError` naming the key and the reason; tierd exits with status 2.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tier_proto::v1::TierKind;

use crate::sampler::pmu::events::EventTable;
use crate::sampler::pmu::source::PmuMode;

/// Where tierd looks when `--config` is not given (absent is fine there).
pub const DEFAULT_PATH: &str = "/etc/tierd/tierd.toml";

/// The file as written; every key optional.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub socket: PathBuf,
    pub socket_mode: String,
    pub socket_group: Option<String>,
    pub interval_ms: u64,
    pub passes_per_interval: u32,
    pub backend: String,
    pub ept_sample_stride: u32,
    /// DAMON driver: how often each sampled folio is aged, ms.
    pub damon_sample_ms: u64,
    /// The pmu source next to `backend`: "auto", "on" or "off".
    pub pmu: String,
    /// Event tables extending the built-in one (docs/pmu.md).
    pub pmu_events: Vec<PathBuf>,
    pub discover: bool,
    pub tier_kinds: BTreeMap<String, String>,
    pub demo_vm: bool,
    pub demo_slow_kind: String,
    /// Seconds between the demo VM's two phases; 0: one fixed phase.
    pub demo_cycle_s: u64,
    pub log_format: String,
    pub metrics: Metrics,
    pub health: HealthKeys,
    pub tcp: Tcp,
    pub controller: Controller,
    pub discovery: Discovery,
    pub sampler: SamplerKeys,
}

/// `[sampler]`: what sampling may cost (docs/config.md, "Sampler budget").
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SamplerKeys {
    /// CPU the sampler backends may use, % of one core; 0 = no budget.
    pub cpu_budget_pct: f64,
    /// CPU the estimator's full fits may take, % of one core; 0 = no
    /// budget (docs/estimate.md).
    pub fit_budget_pct: f64,
    /// Working-set horizons, seconds, ascending (docs/working-set.md).
    pub ws_horizons_s: Vec<f64>,
    /// hostpte: one interval in this many is a long pass; 0 = never.
    pub ws_long_pass_every: u32,
    /// hostpte: length of a sweep, seconds; 0 = no sweep.
    pub ws_sweep_s: f64,
    /// hostpte: a sweep starts this often, seconds; 0 = no sweep.
    pub ws_sweep_every_s: f64,
}

/// Default sampler budget: 5 % of one core. At 1 % tierd's own demo VM
/// (about 4 ms per hostpte pass, 5 passes a second) lost every other
/// interval; 5 % keeps small VMs sampled every interval and still holds a
/// host of large ones to a twentieth of a core.
pub const DEFAULT_CPU_BUDGET_PCT: f64 = 5.0;

impl Default for SamplerKeys {
    fn default() -> SamplerKeys {
        SamplerKeys {
            cpu_budget_pct: DEFAULT_CPU_BUDGET_PCT,
            fit_budget_pct: crate::aggregate::FIT_BUDGET_PCT,
            ws_horizons_s: crate::ages::DEFAULT_HORIZONS_S.to_vec(),
            ws_long_pass_every: crate::ages::DEFAULT_LONG_PASS_EVERY,
            ws_sweep_s: crate::ages::DEFAULT_SWEEP_S,
            ws_sweep_every_s: crate::ages::DEFAULT_SWEEP_EVERY_S,
        }
    }
}

impl SamplerKeys {
    /// The budget in % of one core: finite, 0 (off) up to every CPU of
    /// this host (`cpus` x 100).
    fn validate(&self, cpus: usize) -> Result<f64, ConfigError> {
        let pct = self.cpu_budget_pct;
        let max = 100.0 * cpus.max(1) as f64;
        if !pct.is_finite() || pct < 0.0 || pct > max {
            return Err(invalid(
                "sampler.cpu_budget_pct",
                format!(
                    "{pct} is not in [0, {max}] (% of one core; 0 = no budget; {cpus} CPUs here)"
                ),
            ));
        }
        Ok(pct)
    }

    /// The estimator's budget in % of one core: finite, 0 (off) up to one
    /// core (the estimate runs on the sampling thread).
    fn fit_budget(&self) -> Result<f64, ConfigError> {
        let pct = self.fit_budget_pct;
        if !pct.is_finite() || !(0.0..=100.0).contains(&pct) {
            return Err(invalid(
                "sampler.fit_budget_pct",
                format!(
                    "{pct} is not in [0, 100] (% of one core the estimator's full fits may take; 0 = no budget)"
                ),
            ));
        }
        Ok(pct)
    }

    /// The working-set ages' settings at an interval of `interval_ms`.
    fn ages(&self, interval_ms: u64) -> Result<crate::ages::AgesConfig, ConfigError> {
        crate::ages::check_horizons(&self.ws_horizons_s)
            .map_err(|e| invalid("sampler.ws_horizons_s", e))?;
        // The controller's working_set mode holds hostpte's last measured
        // view for its hysteresis window: a rarer long pass would make a
        // VM switch modes between them.
        let most = tier_controller::policy::config::Tuning::default().hysteresis_window;
        if self.ws_long_pass_every > most {
            return Err(invalid(
                "sampler.ws_long_pass_every",
                format!(
                    "{} is not in [0, {most}] (working_set mode holds a measured view for {most} intervals)",
                    self.ws_long_pass_every
                ),
            ));
        }
        let interval_s = interval_ms as f64 / 1000.0;
        let (len, every) = (self.ws_sweep_s, self.ws_sweep_every_s);
        if !len.is_finite() || !(0.0..=86_400.0).contains(&len) {
            return Err(invalid(
                "sampler.ws_sweep_s",
                format!("{len} is not in [0, 86400] (seconds; 0 = no sweep)"),
            ));
        }
        // The ratio estimate gets no pass during a sweep: at most half
        // the time.
        if !every.is_finite()
            || !(every == 0.0 || (2.0 * len.max(interval_s)..=864_000.0).contains(&every))
        {
            return Err(invalid(
                "sampler.ws_sweep_every_s",
                format!(
                    "{every} is not 0 (no sweep) or in [{}, 864000] (seconds; at least twice ws_sweep_s and the interval: no ratio estimate during a sweep)",
                    2.0 * len.max(interval_s)
                ),
            ));
        }
        Ok(crate::ages::AgesConfig {
            horizons: self.ws_horizons_s.clone(),
            long_pass_every: self.ws_long_pass_every,
            sweep_s: len,
            sweep_every_s: every,
            interval_s,
        })
    }
}

/// `[discovery]`: cloud-hypervisor API sockets (docs/discovery.md).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Discovery {
    /// Directory of API sockets (and one level below); "" for none.
    pub ch_api_dir: String,
    /// Also the `--api-socket` of processes holding a kvm-vm fd.
    pub ch_cmdline: bool,
    /// Per-attempt timeout of cloud-hypervisor API calls.
    pub ch_timeout_ms: u64,
    /// Also track any other process holding a kvm-vm fd (by its memfds).
    pub kvm_fd: bool,
    /// QEMU QMP sockets: absolute paths, `*` / `?` within a component.
    pub qemu_qmp: Vec<String>,
    /// Per-step timeout of QMP calls.
    pub qemu_timeout_ms: u64,
}

/// Where cloud-hypervisor API sockets are looked for unless configured.
pub const DEFAULT_CH_API_DIR: &str = "/run/cloud-hypervisor";

/// Where QMP sockets for tierd are looked for unless configured: not
/// libvirt's own monitor (libvirt holds its one connection), a second
/// `-qmp` added for tierd (docs/discovery.md).
pub const DEFAULT_QEMU_QMP: &str = "/run/tierd/qmp/*.sock";

impl Default for Discovery {
    fn default() -> Discovery {
        Discovery {
            ch_api_dir: DEFAULT_CH_API_DIR.into(),
            ch_cmdline: true,
            ch_timeout_ms: 2000,
            kvm_fd: true,
            qemu_qmp: vec![DEFAULT_QEMU_QMP.into()],
            qemu_timeout_ms: 2000,
        }
    }
}

/// `[metrics]`: Prometheus endpoint.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Metrics {
    /// Loopback `address:port`, or "" for none.
    pub listen: String,
}

/// `[health]`: grpc.health.v1 alone over plaintext TCP, for probes that
/// cannot speak TLS or reach the unix socket (Kubernetes' gRPC probes).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HealthKeys {
    /// `address:port`, or "" for none.
    pub listen: String,
}

/// `[tcp]`: optional gRPC over TCP with TLS.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Tcp {
    pub listen: String,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub client_ca: Option<PathBuf>,
}

/// `[controller]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Controller {
    pub enabled: bool,
    /// What the policy acts on (docs/controller.md, "Interval").
    pub act_on: ActOn,
    /// Where `SetPolicy` is kept across restarts; "" = nowhere.
    pub policy_file: PathBuf,
    /// What moves memory between tiers (docs/controller.md, "Actuators").
    pub actuator: crate::actuator::Preference,
    /// Per-VM `actuator`, by VM name or id.
    pub actuators: BTreeMap<String, crate::actuator::Preference>,
}

/// `[controller] act_on`: which part of the DRAM-hit interval decides.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum ActOn {
    /// Move only when the whole interval is outside the hold band.
    #[default]
    Interval,
    /// The point estimate, as before intervals.
    Point,
    /// Give DRAM when the interval's low end is below the band.
    Protective,
}

impl From<ActOn> for tier_controller::policy::ActOn {
    fn from(a: ActOn) -> Self {
        match a {
            ActOn::Interval => tier_controller::policy::ActOn::Interval,
            ActOn::Point => tier_controller::policy::ActOn::Point,
            ActOn::Protective => tier_controller::policy::ActOn::Protective,
        }
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            socket: PathBuf::from(tier_proto::DEFAULT_SOCKET),
            socket_mode: "0660".into(),
            socket_group: None,
            interval_ms: 1000,
            passes_per_interval: 5,
            backend: "auto".into(),
            ept_sample_stride: 1,
            damon_sample_ms: 100,
            pmu: "auto".into(),
            pmu_events: Vec::new(),
            discover: true,
            tier_kinds: BTreeMap::new(),
            demo_vm: false,
            demo_slow_kind: "cxl".into(),
            demo_cycle_s: 0,
            log_format: "text".into(),
            metrics: Metrics::default(),
            health: HealthKeys::default(),
            tcp: Tcp::default(),
            controller: Controller::default(),
            discovery: Discovery::default(),
            sampler: SamplerKeys::default(),
        }
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            listen: "127.0.0.1:9464".into(),
        }
    }
}

impl Default for Controller {
    fn default() -> Controller {
        Controller {
            enabled: true,
            act_on: ActOn::Interval,
            policy_file: PathBuf::new(),
            actuator: crate::actuator::Preference::Auto,
            actuators: BTreeMap::new(),
        }
    }
}

/// A configuration problem, phrased for the operator.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{path}: cannot read: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("config key `{key}`: {reason}")]
    Invalid { key: String, reason: String },
}

fn invalid(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

/// Sampler backends `backend` may name.
pub const BACKENDS: &[&str] = &["auto", "ept-fexit", "ept-tracepoint", "hostpte", "none"];

/// The configuration after validation, in the types tierd uses.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub socket: PathBuf,
    pub socket_mode: u32,
    pub socket_group: Option<(String, u32)>,
    pub interval: Duration,
    pub passes: u32,
    pub backend: String,
    /// The ept backends age every n-th 4 KiB page of each tier.
    pub ept_sample_stride: u32,
    /// The DAMON driver ages each sampled folio this often.
    pub damon_sample: Duration,
    /// Sampler CPU budget, % of one core; 0 = none.
    pub cpu_budget_pct: f64,
    /// The estimator's CPU budget for full fits, % of one core; 0 = none.
    pub fit_budget_pct: f64,
    /// Working-set horizons and hostpte's long passes.
    pub ages: crate::ages::AgesConfig,
    /// Whether the pmu source runs next to the backend.
    pub pmu: PmuMode,
    /// User event tables, each checked to parse.
    pub pmu_events: Vec<PathBuf>,
    pub discover: bool,
    pub tier_kinds: BTreeMap<String, TierKind>,
    pub demo_vm: bool,
    pub demo_slow_kind: TierKind,
    /// `None`: the demo VM keeps one phase.
    pub demo_cycle: Option<std::time::Duration>,
    pub json_logs: bool,
    pub metrics: Option<SocketAddr>,
    /// `[health] listen`: grpc.health.v1 alone, plaintext.
    pub health: Option<SocketAddr>,
    pub tcp: Option<TcpSettings>,
    pub controller: bool,
    pub act_on: ActOn,
    /// `[controller] policy_file`, absolute; `None`: the policy is not kept.
    pub policy_file: Option<PathBuf>,
    /// `[controller] actuator` and `[controller.actuators]`.
    pub actuators: crate::actuator::Preferences,
    pub ch: ChSettings,
}

/// Validated `[discovery]` keys (cloud-hypervisor, QEMU, kvm-fd).
#[derive(Debug, Clone, PartialEq)]
pub struct ChSettings {
    /// `None`: no directory scan.
    pub api_dir: Option<PathBuf>,
    pub cmdline: bool,
    pub timeout: Duration,
    /// `[discovery] kvm_fd`.
    pub kvm_fd: bool,
    /// `[discovery] qemu_qmp` (and `--qmp`).
    pub qemu_qmp: Vec<PathBuf>,
    pub qemu_timeout: Duration,
}

/// Validated `[tcp]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TcpSettings {
    pub listen: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

impl Config {
    /// Reads `path`; `required` false lets a missing file mean defaults.
    pub fn load(path: &Path, required: bool) -> Result<Config, ConfigError> {
        let shown = path.display().to_string();
        match std::fs::read_to_string(path) {
            Ok(text) => Config::parse(&text, &shown),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
                Ok(Config::default())
            }
            Err(source) => Err(ConfigError::Read {
                path: shown,
                source,
            }),
        }
    }

    /// Parses TOML text; `shown` names it in errors.
    pub fn parse(text: &str, shown: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: shown.into(),
            message: e.to_string().trim_end().to_string(),
        })
    }

    /// Checks every key, one section at a time; the first bad one is
    /// reported.
    pub fn validate(&self) -> Result<Settings, ConfigError> {
        let (socket_mode, socket_group) = self.check_socket()?;
        self.check_sampling()?;
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cpu_budget_pct = self.sampler.validate(cpus)?;
        let fit_budget_pct = self.sampler.fit_budget()?;
        let ages = self.sampler.ages(self.interval_ms)?;
        let (tier_kinds, demo_slow_kind, demo_cycle) = self.check_kinds_and_demo()?;
        let json_logs = self.check_log_format()?;
        let (metrics, health, tcp) = self.check_listeners()?;
        let ch = self.discovery.validate()?;
        let pmu = self.check_pmu()?;
        let policy_file = self.check_policy_file()?;
        Ok(Settings {
            socket: self.socket.clone(),
            socket_mode,
            socket_group,
            interval: Duration::from_millis(self.interval_ms),
            passes: self.passes_per_interval,
            backend: self.backend.clone(),
            ept_sample_stride: self.ept_sample_stride,
            damon_sample: Duration::from_millis(self.damon_sample_ms),
            cpu_budget_pct,
            fit_budget_pct,
            ages,
            pmu,
            pmu_events: self.pmu_events.clone(),
            discover: self.discover,
            tier_kinds,
            demo_vm: self.demo_vm,
            demo_slow_kind,
            demo_cycle,
            json_logs,
            metrics,
            health,
            tcp,
            controller: self.controller.enabled,
            act_on: self.controller.act_on,
            policy_file,
            actuators: crate::actuator::Preferences {
                default: self.controller.actuator,
                per_vm: self.controller.actuators.clone(),
            },
            ch,
        })
    }

    /// `socket`, `socket_mode`, `socket_group`.
    fn check_socket(&self) -> Result<(u32, Option<(String, u32)>), ConfigError> {
        let socket_mode = u32::from_str_radix(self.socket_mode.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| {
                invalid(
                    "socket_mode",
                    format!("{:?} is not an octal mode like \"0660\"", self.socket_mode),
                )
            })?;
        if !self.socket.is_absolute() {
            return Err(invalid(
                "socket",
                format!("{} is not an absolute path", self.socket.display()),
            ));
        }
        let socket_group = match &self.socket_group {
            None => None,
            Some(g) => Some((
                g.clone(),
                group_id(g)
                    .ok_or_else(|| invalid("socket_group", format!("no group named {g:?}")))?,
            )),
        };
        Ok((socket_mode, socket_group))
    }

    /// `interval_ms`, `passes_per_interval`, `ept_sample_stride`,
    /// `damon_sample_ms`, `backend`.
    fn check_sampling(&self) -> Result<(), ConfigError> {
        if !(10..=3_600_000).contains(&self.interval_ms) {
            return Err(invalid(
                "interval_ms",
                format!("{} is not in [10, 3600000]", self.interval_ms),
            ));
        }
        if !(1..=64).contains(&self.passes_per_interval) {
            return Err(invalid(
                "passes_per_interval",
                format!("{} is not in [1, 64]", self.passes_per_interval),
            ));
        }
        let shortest = crate::estimate::shortest_pass(
            std::time::Duration::from_millis(self.interval_ms),
            self.passes_per_interval,
        );
        if shortest < crate::estimate::MIN_PASS {
            return Err(invalid(
                "passes_per_interval",
                format!(
                    "{} passes in {} ms leave {:.1} ms for the shortest (short and long passes alternate, 1:{}); at least {} ms",
                    self.passes_per_interval,
                    self.interval_ms,
                    shortest.as_secs_f64() * 1e3,
                    crate::estimate::LONG_OVER_SHORT,
                    crate::estimate::MIN_PASS.as_millis()
                ),
            ));
        }
        if !(1..=4096).contains(&self.ept_sample_stride) {
            return Err(invalid(
                "ept_sample_stride",
                format!("{} is not in [1, 4096]", self.ept_sample_stride),
            ));
        }
        if !(5..=10_000).contains(&self.damon_sample_ms) {
            return Err(invalid(
                "damon_sample_ms",
                format!("{} is not in [5, 10000]", self.damon_sample_ms),
            ));
        }
        if !BACKENDS.contains(&self.backend.as_str()) {
            return Err(invalid(
                "backend",
                format!("{:?} is not one of {}", self.backend, BACKENDS.join(", ")),
            ));
        }
        Ok(())
    }

    /// `tier_kinds`, `demo_slow_kind`, `demo_cycle_s`.
    #[allow(clippy::type_complexity)] // three settings of one section, named where used
    fn check_kinds_and_demo(
        &self,
    ) -> Result<(BTreeMap<String, TierKind>, TierKind, Option<Duration>), ConfigError> {
        let kind = |key: &str, v: &str| {
            TierKind::from_short_name(v).ok_or_else(|| {
                invalid(
                    key,
                    format!("{v:?} is not a tier kind (dram, pmem, cxl, remote, unknown)"),
                )
            })
        };
        let mut tier_kinds = BTreeMap::new();
        for (name, v) in &self.tier_kinds {
            tier_kinds.insert(name.clone(), kind(&format!("tier_kinds.{name}"), v)?);
        }
        let demo_slow_kind = kind("demo_slow_kind", &self.demo_slow_kind)?;
        if self.demo_cycle_s > 3600 {
            return Err(invalid(
                "demo_cycle_s",
                format!("{} is not in [0, 3600] seconds", self.demo_cycle_s),
            ));
        }
        let demo_cycle =
            (self.demo_cycle_s > 0).then(|| std::time::Duration::from_secs(self.demo_cycle_s));
        Ok((tier_kinds, demo_slow_kind, demo_cycle))
    }

    /// `log_format`: whether logs are JSON.
    fn check_log_format(&self) -> Result<bool, ConfigError> {
        let json_logs = match self.log_format.as_str() {
            "text" => false,
            "json" => true,
            other => {
                return Err(invalid(
                    "log_format",
                    format!("{other:?} is not \"text\" or \"json\""),
                ));
            }
        };
        Ok(json_logs)
    }

    /// `metrics.listen` (loopback only), `health.listen`, `tcp.*`.
    #[allow(clippy::type_complexity)] // the three listeners, named where used
    fn check_listeners(
        &self,
    ) -> Result<(Option<SocketAddr>, Option<SocketAddr>, Option<TcpSettings>), ConfigError> {
        let metrics = match self.metrics.listen.as_str() {
            "" => None,
            s => {
                let addr: SocketAddr = s.parse().map_err(|e| {
                    invalid(
                        "metrics.listen",
                        format!("{s:?}: {e} (expected address:port)"),
                    )
                })?;
                if !addr.ip().is_loopback() {
                    return Err(invalid(
                        "metrics.listen",
                        format!(
                            "{addr} is not a loopback address; expose metrics through a local scraper or proxy"
                        ),
                    ));
                }
                Some(addr)
            }
        };
        let health = match self.health.listen.as_str() {
            "" => None,
            s => Some(s.parse().map_err(|e| {
                invalid(
                    "health.listen",
                    format!("{s:?}: {e} (expected address:port)"),
                )
            })?),
        };
        let tcp =
            match self.tcp.listen.as_str() {
                "" => None,
                s => {
                    let listen = s.parse().map_err(|e| {
                        invalid("tcp.listen", format!("{s:?}: {e} (expected address:port)"))
                    })?;
                    let cert = self.tcp.cert.clone().ok_or_else(|| {
                        invalid("tcp.cert", "required with tcp.listen (TLS only)")
                    })?;
                    let key =
                        self.tcp.key.clone().ok_or_else(|| {
                            invalid("tcp.key", "required with tcp.listen (TLS only)")
                        })?;
                    Some(TcpSettings {
                        listen,
                        cert,
                        key,
                        client_ca: self.tcp.client_ca.clone(),
                    })
                }
            };
        Ok((metrics, health, tcp))
    }

    /// `pmu`, `pmu_events` (each file parsed).
    fn check_pmu(&self) -> Result<PmuMode, ConfigError> {
        let pmu = PmuMode::parse(&self.pmu).ok_or_else(|| {
            invalid(
                "pmu",
                format!("{:?} is not \"auto\", \"on\" or \"off\"", self.pmu),
            )
        })?;
        for p in &self.pmu_events {
            if !p.is_absolute() {
                return Err(invalid(
                    "pmu_events",
                    format!("{} is not an absolute path", p.display()),
                ));
            }
            EventTable::from_file(p).map_err(|e| invalid("pmu_events", e.to_string()))?;
        }
        Ok(pmu)
    }

    /// `controller.policy_file`: absolute, or empty for none.
    fn check_policy_file(&self) -> Result<Option<PathBuf>, ConfigError> {
        let policy_file = match &self.controller.policy_file {
            p if p.as_os_str().is_empty() => None,
            p if !p.is_absolute() => {
                return Err(invalid(
                    "controller.policy_file",
                    format!("{} is not an absolute path", p.display()),
                ));
            }
            p => Some(p.clone()),
        };
        Ok(policy_file)
    }
}

impl Discovery {
    fn validate(&self) -> Result<ChSettings, ConfigError> {
        let api_dir = match self.ch_api_dir.as_str() {
            "" => None,
            d => {
                let p = PathBuf::from(d);
                if !p.is_absolute() {
                    return Err(invalid(
                        "discovery.ch_api_dir",
                        format!(
                            "{d:?} is not an absolute path (\"\" turns the directory scan off)"
                        ),
                    ));
                }
                // Absent is fine (no VMM started yet); something else is not.
                if let Ok(m) = std::fs::metadata(&p)
                    && !m.is_dir()
                {
                    return Err(invalid(
                        "discovery.ch_api_dir",
                        format!("{d} exists and is not a directory"),
                    ));
                }
                Some(p)
            }
        };
        if !(50..=60_000).contains(&self.ch_timeout_ms) {
            return Err(invalid(
                "discovery.ch_timeout_ms",
                format!("{} is not in [50, 60000]", self.ch_timeout_ms),
            ));
        }
        let mut qemu_qmp = Vec::new();
        for (i, q) in self.qemu_qmp.iter().enumerate() {
            let p = PathBuf::from(q);
            if !p.is_absolute() || p.file_name().is_none() {
                return Err(invalid(
                    "discovery.qemu_qmp",
                    format!(
                        "[{i}] {q:?} is not an absolute path to a socket (a glob may use * and ?)"
                    ),
                ));
            }
            qemu_qmp.push(p);
        }
        if !(50..=60_000).contains(&self.qemu_timeout_ms) {
            return Err(invalid(
                "discovery.qemu_timeout_ms",
                format!("{} is not in [50, 60000]", self.qemu_timeout_ms),
            ));
        }
        Ok(ChSettings {
            api_dir,
            cmdline: self.ch_cmdline,
            timeout: Duration::from_millis(self.ch_timeout_ms),
            kvm_fd: self.kvm_fd,
            qemu_qmp,
            qemu_timeout: Duration::from_millis(self.qemu_timeout_ms),
        })
    }
}

/// The gid of a group name, from the system's group database.
pub fn group_id(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: getgrnam takes a valid C string; the result is read at once,
    // before any other call could reuse its static buffer.
    let gr = unsafe { libc::getgrnam(c.as_ptr()) };
    if gr.is_null() {
        return None;
    }
    // SAFETY: non-null pointer to a struct group returned just above.
    Some(unsafe { (*gr).gr_gid })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(text: &str) -> String {
        match Config::parse(text, "t.toml").and_then(|c| c.validate()) {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("expected an invalid key, got {other:?}"),
        }
    }

    #[test]
    fn empty_file_is_the_defaults() {
        let c = Config::parse("", "t.toml").unwrap();
        assert_eq!(c, Config::default());
        let s = c.validate().unwrap();
        assert_eq!(s.socket_mode, 0o660);
        assert_eq!(s.interval, Duration::from_secs(1));
        assert_eq!(s.metrics, Some("127.0.0.1:9464".parse().unwrap()));
        assert!(s.controller && s.discover && s.tcp.is_none());
        assert_eq!(s.ch.api_dir, Some(PathBuf::from(DEFAULT_CH_API_DIR)));
        assert!(s.ch.cmdline);
        assert_eq!(s.ch.timeout, Duration::from_secs(2));
        assert!(s.ch.kvm_fd);
        assert_eq!(s.ch.qemu_qmp, vec![PathBuf::from(DEFAULT_QEMU_QMP)]);
    }

    #[test]
    fn qemu_keys() {
        let s = Config::parse(
            "[discovery]\nqemu_qmp = [\"/run/q/*.sock\", \"/var/lib/vm1/qmp\"]\nqemu_timeout_ms = 700",
            "t.toml",
        )
        .unwrap()
        .validate()
        .unwrap();
        assert_eq!(s.ch.qemu_qmp.len(), 2);
        assert_eq!(s.ch.qemu_timeout, Duration::from_millis(700));
        let none = Config::parse("[discovery]\nqemu_qmp = []", "t.toml").unwrap();
        assert!(none.validate().unwrap().ch.qemu_qmp.is_empty());
        for bad in [
            "qemu_qmp = [\"run/q.sock\"]",
            "qemu_qmp = [\"/\"]",
            "qemu_timeout_ms = 10",
        ] {
            let c = Config::parse(&format!("[discovery]\n{bad}"), "t.toml").unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("discovery.qemu_"), "{bad}: {e}");
        }
    }

    #[test]
    fn discovery_keys() {
        let dir = tempfile::tempdir().unwrap();
        let s = Config::parse(
            &format!(
                "[discovery]\nch_api_dir = \"{}\"\nch_cmdline = false\nch_timeout_ms = 500\nkvm_fd = false",
                dir.path().display()
            ),
            "t.toml",
        )
        .unwrap()
        .validate()
        .unwrap();
        assert_eq!(s.ch.api_dir.as_deref(), Some(dir.path()));
        assert!(!s.ch.cmdline);
        assert_eq!(s.ch.timeout, Duration::from_millis(500));
        assert!(!s.ch.kvm_fd);
        let off = Config::parse("[discovery]\nch_api_dir = \"\"", "t.toml")
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(off.ch.api_dir, None);
        // Not there yet is fine: the VMMs create it.
        let absent = Config::parse(
            "[discovery]\nch_api_dir = \"/nonexistent/tierd-ch\"",
            "t.toml",
        )
        .unwrap()
        .validate()
        .unwrap();
        assert_eq!(
            absent.ch.api_dir,
            Some(PathBuf::from("/nonexistent/tierd-ch"))
        );
        let file = dir.path().join("f");
        std::fs::write(&file, "").unwrap();
        assert_eq!(
            key_of(&format!("[discovery]\nch_api_dir = \"{}\"", file.display())),
            "discovery.ch_api_dir"
        );
        assert_eq!(
            key_of("[discovery]\nch_api_dir = \"run/ch\""),
            "discovery.ch_api_dir"
        );
        assert_eq!(
            key_of("[discovery]\nch_timeout_ms = 0"),
            "discovery.ch_timeout_ms"
        );
        assert_eq!(
            key_of("[discovery]\nch_timeout_ms = 600000"),
            "discovery.ch_timeout_ms"
        );
        let e = Config::parse("[discovery]\nch_sockets = 1", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ch_sockets") && e.contains("unknown field"),
            "{e}"
        );
        let e = Config::parse("[discovery]\nch_cmdline = \"yes\"", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("ch_cmdline"), "{e}");
    }

    #[test]
    fn full_file_parses() {
        let s = Config::parse(
            r#"
            socket = "/run/x/tierd.sock"
            socket_mode = "0600"
            socket_group = "root"
            interval_ms = 250
            backend = "hostpte"
            discover = false
            log_format = "json"
            [tier_kinds]
            slow = "cxl"
            [metrics]
            listen = "[::1]:9999"
            [tcp]
            listen = "0.0.0.0:7443"
            cert = "/etc/tierd/cert.pem"
            key = "/etc/tierd/key.pem"
            [controller]
            enabled = false
            act_on = "protective"
            actuator = "balloon"
            [controller.actuators]
            vm1 = "resize-zone"
            "#,
            "t.toml",
        )
        .unwrap()
        .validate()
        .unwrap();
        assert_eq!(s.socket_group, Some(("root".into(), 0)));
        assert_eq!(s.tier_kinds.get("slow"), Some(&TierKind::Cxl));
        assert!(s.json_logs && !s.controller && !s.discover);
        assert_eq!(s.act_on, ActOn::Protective);
        assert_eq!(
            s.actuators.of("ch:1:2", "vm1"),
            (crate::actuator::Preference::ResizeZone, true)
        );
        assert_eq!(
            s.actuators.of("ch:1:3", "vm2"),
            (crate::actuator::Preference::Balloon, true)
        );
        assert_eq!(s.tcp.unwrap().listen.port(), 7443);
    }

    #[test]
    fn bad_values_name_their_key() {
        assert_eq!(key_of("socket_mode = \"0999\""), "socket_mode");
        assert_eq!(key_of("socket = \"rel/path\""), "socket");
        assert_eq!(
            key_of("socket_group = \"no-such-group-xyz\""),
            "socket_group"
        );
        assert_eq!(key_of("interval_ms = 5"), "interval_ms");
        assert_eq!(key_of("passes_per_interval = 0"), "passes_per_interval");
        assert_eq!(key_of("ept_sample_stride = 0"), "ept_sample_stride");
        assert_eq!(key_of("ept_sample_stride = 5000"), "ept_sample_stride");
        assert_eq!(key_of("damon_sample_ms = 1"), "damon_sample_ms");
        assert_eq!(key_of("damon_sample_ms = 60000"), "damon_sample_ms");
        assert_eq!(key_of("pmu = \"yes\""), "pmu");
        assert_eq!(key_of("pmu_events = [\"rel/table.toml\"]"), "pmu_events");
        assert_eq!(
            key_of("pmu_events = [\"/nonexistent/t.toml\"]"),
            "pmu_events"
        );
        assert_eq!(
            key_of("interval_ms = 20\npasses_per_interval = 8"),
            "passes_per_interval"
        );
        assert_eq!(key_of("backend = \"magic\""), "backend");
        assert_eq!(key_of("[health]\nlisten = \"nonsense\""), "health.listen");
        assert_eq!(
            key_of("[sampler]\ncpu_budget_pct = -1"),
            "sampler.cpu_budget_pct"
        );
        assert_eq!(
            key_of("[sampler]\ncpu_budget_pct = nan"),
            "sampler.cpu_budget_pct"
        );
        assert_eq!(key_of("[tier_kinds]\nslow = \"fast\""), "tier_kinds.slow");
        assert_eq!(key_of("log_format = \"xml\""), "log_format");
        assert_eq!(
            key_of("[metrics]\nlisten = \"10.0.0.1:9464\""),
            "metrics.listen"
        );
        assert_eq!(key_of("[metrics]\nlisten = \"nonsense\""), "metrics.listen");
        assert_eq!(key_of("[tcp]\nlisten = \"127.0.0.1:7443\""), "tcp.cert");
    }

    #[test]
    fn working_set_keys() {
        let s = Config::parse("", "t.toml").unwrap().validate().unwrap();
        assert_eq!(s.ages.horizons, vec![1.0, 10.0, 60.0, 600.0]);
        assert_eq!(s.ages.long_pass_every, 5);
        let s = Config::parse(
            "[sampler]\nws_horizons_s = [0.5, 2, 120]\nws_long_pass_every = 0",
            "t.toml",
        )
        .unwrap()
        .validate()
        .unwrap();
        assert_eq!(s.ages.horizons, vec![0.5, 2.0, 120.0]);
        assert_eq!(s.ages.long_pass_every, 0);
        for bad in [
            "ws_horizons_s = []",
            "ws_horizons_s = [10, 1]",
            "ws_horizons_s = [1, 1]",
            "ws_horizons_s = [0, 1]",
            "ws_horizons_s = [-1]",
            "ws_horizons_s = [1, 2, 3, 4, 5, 6, 7, 8, 9]",
        ] {
            let e = Config::parse(&format!("[sampler]\n{bad}"), "t.toml")
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string();
            assert!(e.contains("sampler.ws_horizons_s"), "{bad}: {e}");
        }
        let e = Config::parse("[sampler]\nws_long_pass_every = 11", "t.toml")
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("sampler.ws_long_pass_every"), "{e}");
    }

    #[test]
    fn sweep_keys() {
        let s = Config::parse("", "t.toml").unwrap().validate().unwrap();
        assert_eq!(s.ages.sweep(), Some((60, 1200)));
        let s = Config::parse(
            "interval_ms = 500\n[sampler]\nws_sweep_s = 10.2\nws_sweep_every_s = 100",
            "t.toml",
        )
        .unwrap()
        .validate()
        .unwrap();
        // Whole intervals: 10.2 s is 21 of 500 ms.
        assert_eq!(s.ages.sweep(), Some((21, 200)));
        for off in ["ws_sweep_s = 0", "ws_sweep_every_s = 0"] {
            let s = Config::parse(&format!("[sampler]\n{off}"), "t.toml")
                .unwrap()
                .validate()
                .unwrap();
            assert_eq!(s.ages.sweep(), None, "{off}");
        }
        for (bad, key) in [
            ("ws_sweep_s = -1", "sampler.ws_sweep_s"),
            ("ws_sweep_s = nan", "sampler.ws_sweep_s"),
            ("ws_sweep_s = 100000", "sampler.ws_sweep_s"),
            // More than half the time without a ratio pass.
            (
                "ws_sweep_s = 60\nws_sweep_every_s = 100",
                "sampler.ws_sweep_every_s",
            ),
            ("ws_sweep_every_s = 1", "sampler.ws_sweep_every_s"),
            ("ws_sweep_every_s = inf", "sampler.ws_sweep_every_s"),
        ] {
            let e = Config::parse(&format!("[sampler]\n{bad}"), "t.toml")
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{bad}: {e}");
        }
    }

    #[test]
    fn sampler_budget_key() {
        let s = Config::parse("", "t.toml").unwrap().validate().unwrap();
        assert_eq!(s.cpu_budget_pct, DEFAULT_CPU_BUDGET_PCT);
        let s = Config::parse("[sampler]\ncpu_budget_pct = 0", "t.toml")
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(s.cpu_budget_pct, 0.0, "0 turns the budget off");
        let s = Config::parse("[sampler]\ncpu_budget_pct = 2.5", "t.toml")
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(s.cpu_budget_pct, 2.5);
        // Above every CPU of the host: the error says the bound and why.
        let keys = SamplerKeys {
            cpu_budget_pct: 450.0,
            ..SamplerKeys::default()
        };
        let e = keys.validate(4).unwrap_err().to_string();
        assert!(e.contains("sampler.cpu_budget_pct"), "{e}");
        assert!(e.contains("[0, 400]") && e.contains("4 CPUs"), "{e}");
        assert_eq!(keys.validate(8).unwrap(), 450.0);
        let e = SamplerKeys {
            cpu_budget_pct: -0.5,
            ..SamplerKeys::default()
        }
        .validate(2)
        .unwrap_err()
        .to_string();
        assert!(e.contains("-0.5 is not in [0, 200]"), "{e}");
    }

    #[test]
    fn fit_budget_key() {
        let s = Config::parse("", "t.toml").unwrap().validate().unwrap();
        assert_eq!(s.fit_budget_pct, crate::aggregate::FIT_BUDGET_PCT);
        let s = Config::parse("[sampler]\nfit_budget_pct = 0", "t.toml")
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(s.fit_budget_pct, 0.0, "0 turns the budget off");
        let s = Config::parse("[sampler]\nfit_budget_pct = 2.5", "t.toml")
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(s.fit_budget_pct, 2.5);
        for bad in ["-1", "101", "nan", "inf"] {
            let e = Config::parse(&format!("[sampler]\nfit_budget_pct = {bad}"), "t.toml")
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string();
            assert!(e.contains("sampler.fit_budget_pct"), "{bad}: {e}");
            assert!(e.contains("is not in [0, 100]"), "{bad}: {e}");
        }
    }

    #[test]
    fn sampler_keys_are_documented() {
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/config.md"),
        )
        .unwrap();
        for key in [
            "cpu_budget_pct",
            "fit_budget_pct",
            "ws_horizons_s",
            "ws_long_pass_every",
            "ws_sweep_s",
            "ws_sweep_every_s",
        ] {
            assert!(
                doc.contains(&format!("`[sampler] {key}`")),
                "docs/config.md does not list `[sampler] {key}`"
            );
        }
    }

    #[test]
    fn pmu_keys() {
        let s = Config::parse("", "t.toml").unwrap().validate().unwrap();
        assert_eq!((s.pmu, s.pmu_events.len()), (PmuMode::Auto, 0));
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.toml");
        std::fs::write(
            &good,
            "[[event]]\nname = \"X\"\nvendor = \"GenuineIntel\"\nfamily = 6\nmodels = [0x6A]\nconfig = 0x01D3\ntier = \"dram\"\nsource = \"test\"\n",
        )
        .unwrap();
        let s = Config::parse(
            &format!("pmu = \"on\"\npmu_events = [\"{}\"]", good.display()),
            "t.toml",
        )
        .unwrap()
        .validate()
        .unwrap();
        assert_eq!((s.pmu, s.pmu_events), (PmuMode::On, vec![good]));
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "[[event]]\nname = \"X\"\ntier = \"hbm\"\n").unwrap();
        let e = Config::parse(&format!("pmu_events = [\"{}\"]", bad.display()), "t.toml")
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("config key `pmu_events`: ") && e.contains("bad.toml: event #0"),
            "{e}"
        );
    }

    #[test]
    fn parse_errors_show_the_key() {
        let e = Config::parse("interval_ms = \"fast\"", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("interval_ms") && e.contains("t.toml"), "{e}");
        let e = Config::parse("intervall_ms = 5", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("intervall_ms") && e.contains("unknown field"),
            "{e}"
        );
    }

    #[test]
    fn missing_default_file_is_fine_but_a_named_one_is_not() {
        let p = Path::new("/nonexistent/tierd.toml");
        assert_eq!(Config::load(p, false).unwrap(), Config::default());
        assert!(matches!(
            Config::load(p, true),
            Err(ConfigError::Read { .. })
        ));
    }
}
