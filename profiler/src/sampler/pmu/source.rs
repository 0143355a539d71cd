//! The `pmu` source as the daemon runs it, next to the page-sampling
//! backend: per interval, per VM, per tier, the memory-source events
//! counted on the VM's vCPU threads, into `TierSample.sources`.
//!
//! Startup keeps the table entries for this CPU that open here (each
//! failure is logged) and loads the BPF programs; if nothing is left the
//! source is unavailable, which is logged (`pmu = "on"`: as an error) and
//! the daemon runs without it. Each interval, for each VM: its vCPU
//! threads are followed ([`VcpuTracker`], falling back to the KVM_RUN
//! watch), events opened on new threads with the VM's tier of the entry's
//! kind as cookie, and the counts since the last interval read.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::Instant;

use tier_proto::v1::{Backend, SamplerHealth, SourceCount, StatsUpdate, Vm};

use super::events::{CpuId, EventEntry, EventTable, EventType, TierKind};
use super::loader::{
    self, EventSpec, MAX_TIERS, MAX_VMS, NO_TIER, OpenOptions, PmuCount, PmuPrograms, ThreadEvents,
};
use super::vcpus::{Found, KvmRunThread, VcpuError, VcpuTracker};

/// Config key `pmu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PmuMode {
    /// Run the source if any event of the table opens; say why not otherwise.
    #[default]
    Auto,
    /// Run it; not being able to is an error in the log and in the stats
    /// stream's health (the daemon still runs).
    On,
    /// Do not run it.
    Off,
}

impl PmuMode {
    /// Parses a config value.
    pub fn parse(s: &str) -> Option<PmuMode> {
        match s {
            "auto" => Some(PmuMode::Auto),
            "on" => Some(PmuMode::On),
            "off" => Some(PmuMode::Off),
            _ => None,
        }
    }
}

/// Why the source does not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PmuUnavailable {
    #[error("event table: {0}")]
    Table(String),
    #[error("no event in the table for {cpu}")]
    NoEvents { cpu: String },
    #[error("no event of the table for {cpu} opens here: {details}")]
    NoneOpens { cpu: String, details: String },
    #[error("BPF: {0}")]
    Bpf(String),
}

/// Per interval: counts per VM and tier, and the source's health.
#[derive(Debug, Clone, Default)]
pub struct PmuReadings {
    /// VM id -> one count per tier, in `Vm.tiers` order, for the interval.
    pub per_vm: HashMap<String, Vec<PmuCount>>,
    pub health: SamplerHealth,
}

/// One VM the source counts for.
#[derive(Debug)]
struct VmPmu {
    pid: u32,
    slot: u32,
    kinds: Vec<TierKind>,
    /// Events opened on each of its vCPU threads, with their cookie tier.
    plan: Vec<(EventSpec, u32)>,
    tracker: VcpuTracker,
    threads: BTreeMap<u32, ThreadEvents>,
    /// BPF counters at the last read (they only grow while the slot is held).
    last: [PmuCount; MAX_TIERS as usize],
}

/// Distinct problems remembered as logged before the memory starts over.
const MAX_LOGGED: usize = 4096;

/// The running source.
pub struct PmuSource {
    progs: PmuPrograms,
    events: Vec<EventEntry>,
    opts: OpenOptions,
    /// Whether the KVM_RUN watch attached (at least one tracepoint).
    watch: bool,
    vms: BTreeMap<String, VmPmu>,
    free: BTreeSet<u32>,
    /// Problems already logged (each once).
    logged: BTreeSet<String>,
}

impl std::fmt::Debug for PmuSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PmuSource")
            .field("events", &self.events.len())
            .field("vms", &self.vms.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// How entries are opened by the daemon.
fn daemon_options() -> OpenOptions {
    OpenOptions {
        guest_only: true,
        sample_period: super::events::DEFAULT_PERIOD,
        sample_addr: false,
        enabled: false,
    }
}

impl PmuSource {
    /// Keeps the entries of `table` for `cpu` that open here, loads the BPF
    /// programs and attaches the KVM_RUN watch. Returns the source and one
    /// line per problem that did not stop it (an event that does not open,
    /// a watch tracepoint that does not attach).
    pub fn start(
        cpu: &CpuId,
        table: &EventTable,
    ) -> Result<(PmuSource, Vec<String>), PmuUnavailable> {
        let selected = table.select(cpu, false);
        if selected.is_empty() {
            return Err(PmuUnavailable::NoEvents {
                cpu: cpu.to_string(),
            });
        }
        let opts = daemon_options();
        let mut events = Vec::new();
        let mut notes = Vec::new();
        for e in selected {
            match loader::open_event(0, &EventSpec::from(e), &opts) {
                Ok(_) => events.push(e.clone()),
                Err(err) => notes.push(format!(
                    "event {} ({}) unavailable: {}",
                    e.name,
                    e.tier.short_name(),
                    super::open_failure(&err)
                )),
            }
        }
        if events.is_empty() {
            return Err(PmuUnavailable::NoneOpens {
                cpu: cpu.to_string(),
                details: notes.join("; "),
            });
        }
        let mut progs = PmuPrograms::load().map_err(|e| PmuUnavailable::Bpf(e.to_string()))?;
        let mut watch = false;
        for (tp, r) in progs.watch_kvm_run() {
            match r {
                Ok(()) => watch = true,
                Err(e) => notes.push(format!(
                    "KVM_RUN watch: {tp}: {e} (VMMs must name vCPU threads vcpuN)"
                )),
            }
        }
        Ok((
            PmuSource {
                progs,
                events,
                opts,
                watch,
                vms: BTreeMap::new(),
                free: (0..MAX_VMS).collect(),
                logged: BTreeSet::new(),
            },
            notes,
        ))
    }

    /// The table entries in use.
    pub fn events(&self) -> &[EventEntry] {
        &self.events
    }

    /// Counts of the interval that ends now for each VM of `vms` (VMs
    /// without a process are skipped); VMs no longer listed are dropped.
    pub fn sample(&mut self, vms: &[&Vm]) -> PmuReadings {
        let started = Instant::now();
        let mut problems: Vec<String> = Vec::new();
        let live: BTreeSet<&str> = vms.iter().map(|v| v.id.as_str()).collect();
        let gone: Vec<String> = self
            .vms
            .keys()
            .filter(|id| !live.contains(id.as_str()))
            .cloned()
            .collect();
        for id in gone {
            self.drop_vm(&id);
        }
        let seen = if self.watch {
            match self.progs.kvm_threads() {
                Ok(s) => Some(s),
                Err(e) => {
                    problems.push(format!("KVM_RUN watch: {e}"));
                    None
                }
            }
        } else {
            None
        };
        let mut per_vm = HashMap::new();
        let mut pids: HashMap<u32, &str> = HashMap::new();
        let mut samples = 0u64;
        for vm in vms {
            if vm.vmm_pid == 0 {
                continue;
            }
            if let Some(other) = pids.insert(vm.vmm_pid, &vm.id) {
                pids.insert(vm.vmm_pid, other);
                problems.push(format!(
                    "{}: process {} already counted for {other} (one VM per process)",
                    vm.id, vm.vmm_pid
                ));
                continue;
            }
            match self.sample_vm(vm, seen.as_deref(), &mut problems) {
                Ok(Some(counts)) => {
                    samples += counts.iter().map(|c| c.samples).sum::<u64>();
                    per_vm.insert(vm.id.clone(), counts);
                }
                // Its process just exited: the registry drops it next.
                Ok(None) => {}
                Err(e) => problems.push(format!("{}: {e}", vm.id)),
            }
        }
        // A bound on what is remembered, whatever the problems say.
        if self.logged.len() > MAX_LOGGED {
            self.logged.clear();
        }
        for p in &problems {
            if self.logged.insert(p.clone()) {
                tracing::warn!(problem = %p, "pmu source");
            }
        }
        PmuReadings {
            per_vm,
            health: SamplerHealth {
                backend: Backend::Pmu as i32,
                active: true,
                error: problems.join("; "),
                events: samples,
                lost: 0,
                scan_cost_ns: u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX),
            },
        }
    }

    /// Follows the VM's threads and returns its counts since the last
    /// call; `None` if its process is gone.
    fn sample_vm(
        &mut self,
        vm: &Vm,
        seen: Option<&[KvmRunThread]>,
        problems: &mut Vec<String>,
    ) -> Result<Option<Vec<PmuCount>>, String> {
        let kinds: Vec<TierKind> = vm.tiers.iter().map(|t| t.kind()).collect();
        let stale_state = self
            .vms
            .get(&vm.id)
            .is_some_and(|s| s.pid != vm.vmm_pid || s.kinds != kinds);
        if stale_state {
            // Another process under the same id, or a new tier map.
            self.drop_vm(&vm.id);
        }
        if !self.vms.contains_key(&vm.id) {
            let state = self.new_vm(vm, kinds, problems)?;
            self.vms.insert(vm.id.clone(), state);
        }
        let Some(state) = self.vms.get_mut(&vm.id) else {
            return Err("internal: VM state missing".into());
        };
        let changes = match state.tracker.poll_with(seen) {
            Ok(c) => c,
            Err(VcpuError::ProcessGone { .. }) => return Ok(None),
            Err(e) => return Err(format!("vCPU threads: {e}")),
        };
        for tid in &changes.stale {
            if let Err(e) = self.progs.forget_kvm_thread(*tid) {
                problems.push(format!("KVM_RUN watch: {e}"));
            }
        }
        for t in &changes.removed {
            state.threads.remove(&t.tid);
            if let Err(e) = self.progs.clear_vcpu(t.tid) {
                problems.push(format!("{}: {e}", vm.id));
            }
        }
        for t in &changes.added {
            if let Err(e) = self.progs.set_vcpu(t.tid, state.slot) {
                problems.push(format!("{}: vCPU {} (tid {}): {e}", vm.id, t.index, t.tid));
                continue;
            }
            let ev = self.progs.attach_thread(t.tid, &state.plan, &self.opts);
            for e in &ev.failed {
                problems.push(format!("{}: vCPU {}: {e}", vm.id, t.index));
            }
            state.threads.insert(t.tid, ev);
        }
        if !changes.is_empty() {
            tracing::info!(
                vm = %vm.id,
                vcpus = state.threads.len(),
                found = ?state.tracker.found(),
                "pmu: counting on vCPU threads"
            );
        }
        if state.tracker.found() == Found::Nothing {
            problems.push(format!(
                "{}: no vCPU thread found (none named vcpuN{})",
                vm.id,
                if self.watch {
                    ", none seen in KVM_RUN yet"
                } else {
                    "; the KVM_RUN watch is not attached"
                }
            ));
        }
        let now = self
            .progs
            .vm_counts(state.slot)
            .map_err(|e| e.to_string())?;
        let delta: Vec<PmuCount> = now
            .iter()
            .zip(&state.last)
            .take(vm.tiers.len())
            .map(|(n, l)| PmuCount {
                samples: n.samples.saturating_sub(l.samples),
                period: n.period.saturating_sub(l.period),
            })
            .collect();
        state.last = now;
        Ok(Some(delta))
    }

    /// A slot and an event plan for a new VM.
    fn new_vm(
        &mut self,
        vm: &Vm,
        kinds: Vec<TierKind>,
        problems: &mut Vec<String>,
    ) -> Result<VmPmu, String> {
        let slot = *self
            .free
            .first()
            .ok_or_else(|| format!("more than {MAX_VMS} VMs: not counted"))?;
        self.progs.reset_vm(slot).map_err(|e| e.to_string())?;
        self.progs
            .set_kind_tiers(slot, &kinds)
            .map_err(|e| e.to_string())?;
        self.free.remove(&slot);
        let mut plan = Vec::new();
        for e in &self.events {
            let tier = kinds
                .iter()
                .take(MAX_TIERS as usize)
                .position(|k| *k == e.tier && *k != TierKind::Unknown)
                .map(|i| i as u32);
            match (tier, e.data_src) {
                (Some(t), _) => plan.push((EventSpec::from(e), t)),
                (None, true) => plan.push((EventSpec::from(e), NO_TIER)),
                (None, false) => problems.push(format!(
                    "{}: no {} tier: event {} not counted",
                    vm.id,
                    e.tier.short_name(),
                    e.name
                )),
            }
        }
        Ok(VmPmu {
            pid: vm.vmm_pid,
            slot,
            kinds,
            plan,
            tracker: VcpuTracker::new(vm.vmm_pid),
            threads: BTreeMap::new(),
            last: [PmuCount::default(); MAX_TIERS as usize],
        })
    }

    /// Detaches a VM's events and frees its slot.
    fn drop_vm(&mut self, id: &str) {
        let Some(state) = self.vms.remove(id) else {
            return;
        };
        for tid in state.threads.keys() {
            if let Err(e) = self.progs.clear_vcpu(*tid) {
                tracing::warn!(vm = %id, error = %e, "pmu: clearing a vCPU thread");
            }
        }
        drop(state.threads);
        self.free.insert(state.slot);
        // Its problems go with it: the set stays bounded as VMs come and go,
        // and a new VM that reuses the id gets its problems logged again.
        let prefix = format!("{id}: ");
        self.logged.retain(|p| !p.starts_with(&prefix));
    }
}

/// Adds `readings` to `update`: a [`SourceCount`] per tier of each VM
/// counted, and the source's health.
pub fn annotate(update: &mut StatsUpdate, readings: &PmuReadings) {
    for stats in &mut update.stats {
        let Some(counts) = readings.per_vm.get(&stats.vm_id) else {
            continue;
        };
        for (tier, c) in stats.tiers.iter_mut().zip(counts) {
            tier.sources.push(SourceCount {
                source: Backend::Pmu as i32,
                events: c.period,
                samples: c.samples,
            });
        }
    }
    update.health.push(readings.health.clone());
}

/// The pmu source in the daemon: running, off, or not running and why.
#[derive(Debug)]
pub enum PmuState {
    Off,
    Running(Box<PmuSource>),
    /// Not running. `report`: put the reason in every update's health
    /// (`pmu = "on"`).
    Unavailable {
        reason: String,
        report: bool,
    },
}

impl PmuState {
    /// Starts the source per `mode` with the built-in table and `files`,
    /// logging the outcome: running (info, plus a warning per event that
    /// does not open), or unavailable (warning; an error with `On`).
    pub fn start(mode: PmuMode, files: &[PathBuf]) -> PmuState {
        if mode == PmuMode::Off {
            tracing::info!("pmu source off (pmu = \"off\")");
            return PmuState::Off;
        }
        let attempt = || -> Result<(PmuSource, Vec<String>), PmuUnavailable> {
            let paths: Vec<&std::path::Path> = files.iter().map(|p| p.as_path()).collect();
            let table = EventTable::builtin_and(&paths)
                .map_err(|e| PmuUnavailable::Table(e.to_string()))?;
            let cpu = CpuId::current().map_err(|e| PmuUnavailable::Table(e.to_string()))?;
            PmuSource::start(&cpu, &table)
        };
        match attempt() {
            Ok((source, notes)) => {
                for n in &notes {
                    tracing::warn!(problem = %n, "pmu source");
                }
                let events: Vec<String> = source
                    .events()
                    .iter()
                    .map(|e| {
                        let kind = if e.data_src {
                            "data_src".to_string()
                        } else {
                            e.tier.short_name().to_string()
                        };
                        let guest = if e.event_type == EventType::Software {
                            "host+guest"
                        } else {
                            "guest-only"
                        };
                        format!("{} ({kind}, {guest}, period {})", e.name, e.period)
                    })
                    .collect();
                tracing::info!(events = %events.join(", "), "pmu source running");
                PmuState::Running(Box::new(source))
            }
            Err(e) => {
                let reason = e.to_string();
                if mode == PmuMode::On {
                    tracing::error!(reason = %reason, "pmu source unavailable (pmu = \"on\"); running without it");
                } else {
                    tracing::warn!(reason = %reason, "pmu source unavailable; running without it");
                }
                PmuState::Unavailable {
                    reason,
                    report: mode == PmuMode::On,
                }
            }
        }
    }

    pub fn is_running(&self) -> bool {
        matches!(self, PmuState::Running(_))
    }

    /// Counts of the interval that ends now, if running.
    pub fn sample(&mut self, vms: &[&Vm]) -> Option<PmuReadings> {
        match self {
            PmuState::Running(s) => Some(s.sample(vms)),
            _ => None,
        }
    }

    /// Puts `readings` (from [`PmuState::sample`]) into `update`; without
    /// readings and with `pmu = "on"`, the reason as an inactive health
    /// entry.
    pub fn annotate(&self, update: &mut StatsUpdate, readings: Option<&PmuReadings>) {
        match (readings, self) {
            (Some(r), _) => annotate(update, r),
            (
                None,
                PmuState::Unavailable {
                    reason,
                    report: true,
                },
            ) => {
                update.health.push(SamplerHealth {
                    backend: Backend::Pmu as i32,
                    active: false,
                    error: reason.clone(),
                    ..Default::default()
                });
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use tier_proto::v1::{TierSample, VmStats};

    #[test]
    fn modes_parse() {
        assert_eq!(PmuMode::parse("auto"), Some(PmuMode::Auto));
        assert_eq!(PmuMode::parse("on"), Some(PmuMode::On));
        assert_eq!(PmuMode::parse("off"), Some(PmuMode::Off));
        assert_eq!(PmuMode::parse("yes"), None);
    }

    fn update() -> StatsUpdate {
        let tier = |name: &str| TierSample {
            tier: name.into(),
            ..Default::default()
        };
        StatsUpdate {
            stats: vec![
                VmStats {
                    vm_id: "a".into(),
                    tiers: vec![tier("dram"), tier("slow")],
                    ..Default::default()
                },
                VmStats {
                    vm_id: "b".into(),
                    tiers: vec![tier("dram")],
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn annotate_adds_one_source_count_per_tier_and_the_health() {
        let mut u = update();
        let readings = PmuReadings {
            per_vm: HashMap::from([(
                "a".to_string(),
                vec![
                    PmuCount {
                        samples: 3,
                        period: 30_021,
                    },
                    PmuCount {
                        samples: 1,
                        period: 10_007,
                    },
                ],
            )]),
            health: SamplerHealth {
                backend: Backend::Pmu as i32,
                active: true,
                events: 4,
                ..Default::default()
            },
        };
        annotate(&mut u, &readings);
        let got: Vec<(u64, u64)> = u.stats[0]
            .tiers
            .iter()
            .flat_map(|t| &t.sources)
            .map(|s| (s.events, s.samples))
            .collect();
        assert_eq!(got, [(30_021, 3), (10_007, 1)]);
        assert!(
            u.stats[0].tiers[0].sources[0].source == Backend::Pmu as i32
                && u.stats[1].tiers[0].sources.is_empty()
        );
        assert_eq!(u.health, std::slice::from_ref(&readings.health));
    }

    #[test]
    fn unavailable_is_reported_only_when_asked_for() {
        let on = PmuState::Unavailable {
            reason: "no hardware PMU".into(),
            report: true,
        };
        let mut u = update();
        on.annotate(&mut u, None);
        assert_eq!(u.health.len(), 1);
        assert!(!u.health[0].active && u.health[0].error == "no hardware PMU");
        let auto = PmuState::Unavailable {
            reason: "x".into(),
            report: false,
        };
        let mut u = update();
        auto.annotate(&mut u, None);
        PmuState::Off.annotate(&mut u, None);
        assert!(u.health.is_empty());
    }

    #[test]
    fn a_table_with_nothing_for_this_cpu_is_unavailable() {
        let cpu = CpuId {
            vendor: "GenuineIntel".into(),
            family: 6,
            model: 0x01,
        };
        let e = PmuSource::start(&cpu, &EventTable::builtin().unwrap()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no event in the table for GenuineIntel family 0x6 model 0x1"
        );
    }
}
