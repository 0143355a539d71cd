//! The `pmu` source as the daemon runs it, next to the page-sampling
//! backend: per interval, per VM, per tier, the memory-source events
//! counted guest-only on the VM's vCPU threads, into `TierSample.sources`.
//!
//! Startup keeps the table entries for this CPU that open here (each
//! failure is logged) and loads the BPF KVM_RUN watch (optional: without
//! it only vCPU threads named vcpuN are found); if no event opens the
//! source is unavailable, which is logged (`pmu = "on"`: as an error) and
//! the daemon runs without it. Each interval, for each VM: its vCPU
//! threads are followed ([`VcpuTracker`]), every entry is opened on each
//! new thread as a counting event, and each counter's change is scaled
//! for multiplexing ([`counting`]) and added to the tier its kind and the
//! vCPU's node give ([`placement`]). A tier no event can count, or whose
//! counts cannot be trusted this interval, is reported as not measured
//! with the reason, never as 0.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::Instant;

use perf_event_open::count::Counter;
use tier_proto::v1::{Backend, SamplerHealth, SourceCount, StatsUpdate, Vm};

use super::counting::{self, Tally, TierReading};
use super::events::{CpuId, EventEntry, EventTable, EventType, TierKind};
use super::loader::{self, EventSpec, OpenOptions, PmuPrograms, Reading};
use super::placement::{self, Placement, TierPlace, Topology, dram_backed, is_dram_event};
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
}

/// Per interval: what the source says of each VM's tiers, and its health.
#[derive(Debug, Clone, Default)]
pub struct PmuReadings {
    /// VM id -> one reading per tier, in `Vm.tiers` order.
    pub per_vm: HashMap<String, Vec<TierReading>>,
    /// VM id -> whether each tier is fast (DRAM-like, `TierKind::is_fast`),
    /// in `Vm.tiers` order: the update may not carry the VMs again.
    pub fast: HashMap<String, Vec<bool>>,
    pub health: SamplerHealth,
}

/// One counting event on one vCPU thread.
struct Counted {
    name: String,
    kind: TierKind,
    counter: Counter,
    last: Reading,
    /// Opened since the last read: its first change covers part of an
    /// interval only, so it starts counting at the next read.
    fresh: bool,
}

impl std::fmt::Debug for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counted")
            .field("name", &self.name)
            .field("last", &self.last)
            .finish_non_exhaustive()
    }
}

/// The counters of one vCPU thread; dropping it closes them.
#[derive(Debug)]
struct VcpuCounters {
    index: u32,
    counters: Vec<Counted>,
    /// Node it was on at the last read.
    last_node: Option<u32>,
}

/// One VM the source counts for.
#[derive(Debug)]
struct VmPmu {
    pid: u32,
    tiers: Vec<TierPlace>,
    /// Entries opened on each of its vCPU threads.
    plan: Vec<EventEntry>,
    /// Tiers no entry of the plan can count, and why.
    unmeasurable: BTreeMap<usize, String>,
    tracker: VcpuTracker,
    threads: BTreeMap<u32, VcpuCounters>,
    /// Threads gone since the last read: read once more, then closed.
    leaving: Vec<VcpuCounters>,
    /// When the counters were last read (the start of the next span).
    last_read: Option<Instant>,
}

/// Distinct problems remembered as logged before the memory starts over.
const MAX_LOGGED: usize = 4096;

/// The running source.
pub struct PmuSource {
    /// The KVM_RUN watch, where the BPF object loads.
    progs: Option<PmuPrograms>,
    events: Vec<EventEntry>,
    cpu: String,
    topology: Topology,
    /// Whether the KVM_RUN watch attached (at least one tracepoint).
    watch: bool,
    vms: BTreeMap<String, VmPmu>,
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

/// Counting, guest-only, enabled at once: no overflow, no BPF program, no
/// NMI per period; one read per counter per interval.
fn counting_options() -> OpenOptions {
    OpenOptions {
        guest_only: true,
        sample_period: 0,
        sample_addr: false,
        enabled: true,
    }
}

/// An entry as a counting event (its `period` is for sampling only).
fn counting_spec(e: &EventEntry) -> EventSpec {
    EventSpec {
        period: None,
        ..EventSpec::from(e)
    }
}

/// The entries worth opening for a VM with `tiers`, the tiers none of them
/// can count (with why), and a note per entry left out.
fn plan_for(
    events: &[EventEntry],
    tiers: &[TierPlace],
    cpu_nodes: usize,
    cpu: &str,
) -> (Vec<EventEntry>, BTreeMap<usize, String>, Vec<String>) {
    let mut plan = Vec::new();
    let mut notes = Vec::new();
    for e in events {
        let lands = if is_dram_event(e.tier) {
            tiers.iter().any(dram_backed)
        } else {
            tiers.iter().any(|t| t.kind == e.tier)
        };
        if lands {
            plan.push(e.clone());
        } else {
            notes.push(format!(
                "no {} tier: event {} not counted",
                if is_dram_event(e.tier) {
                    "DRAM"
                } else {
                    e.tier.short_name()
                },
                e.name
            ));
        }
    }
    let has = |k: TierKind| plan.iter().any(|e| e.tier == k);
    let mut unmeasurable = BTreeMap::new();
    for (i, t) in tiers.iter().enumerate() {
        let why = if t.kind == TierKind::Unknown {
            Some("the tier's kind is unknown, so no event maps to it".to_string())
        } else if dram_backed(t) {
            match (has(TierKind::Dram), has(TierKind::Remote)) {
                (false, false) => Some(format!("no event on {cpu} counts DRAM accesses")),
                (true, false) if cpu_nodes > 1 => Some(format!(
                    "no remote-DRAM event on {cpu}: accesses from vCPUs on other nodes are missed"
                )),
                (false, true) => Some(format!(
                    "no local-DRAM event on {cpu}: accesses from vCPUs on the tier's node are missed"
                )),
                _ => None,
            }
        } else if !has(t.kind) {
            Some(format!(
                "no event on {cpu} counts {} memory",
                t.kind.short_name()
            ))
        } else if tiers.iter().position(|o| o.kind == t.kind) != Some(i) {
            Some(format!(
                "the events cannot tell {} tiers apart: the VM's first {} tier gets them all",
                t.kind.short_name(),
                t.kind.short_name()
            ))
        } else {
            None
        };
        if let Some(w) = why {
            unmeasurable.insert(i, w);
        }
    }
    (plan, unmeasurable, notes)
}

impl PmuSource {
    /// Keeps the entries of `table` for `cpu` that open here as guest-only
    /// counters, and loads the KVM_RUN watch. Returns the source and one
    /// line per problem that did not stop it (an event that does not open,
    /// the watch, sub-NUMA clustering).
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
        let opts = counting_options();
        let mut events = Vec::new();
        let mut notes = Vec::new();
        for e in selected {
            match loader::open_event(0, &counting_spec(e), &opts) {
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
        let topology = Topology::read();
        notes.extend(topology.sub_numa_clustering());
        notes.extend(raise_fd_limit());
        let mut watch = false;
        let progs = match PmuPrograms::load() {
            Ok(mut p) => {
                for (tp, r) in p.watch_kvm_run() {
                    match r {
                        Ok(()) => watch = true,
                        Err(e) => notes.push(format!(
                            "KVM_RUN watch: {tp}: {e} (VMMs must name vCPU threads vcpuN)"
                        )),
                    }
                }
                Some(p)
            }
            Err(e) => {
                notes.push(format!(
                    "KVM_RUN watch unavailable: {e} (only vCPU threads named vcpuN are found)"
                ));
                None
            }
        };
        Ok((
            PmuSource {
                progs,
                events,
                cpu: cpu.to_string(),
                topology,
                watch,
                vms: BTreeMap::new(),
                logged: BTreeSet::new(),
            },
            notes,
        ))
    }

    /// The table entries in use.
    pub fn events(&self) -> &[EventEntry] {
        &self.events
    }

    /// Readings of the interval that ends now for each VM of `vms` (VMs
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
        let seen = match (&self.progs, self.watch) {
            (Some(p), true) => match p.kvm_threads() {
                Ok(s) => Some(s),
                Err(e) => {
                    problems.push(format!("KVM_RUN watch: {e}"));
                    None
                }
            },
            _ => None,
        };
        let mut per_vm = HashMap::new();
        let mut fast = HashMap::new();
        let mut pids: HashMap<u32, &str> = HashMap::new();
        let mut events = 0u64;
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
                Ok(Some(readings)) => {
                    for (t, r) in vm.tiers.iter().zip(&readings) {
                        if let TierReading::Counted(c) = r {
                            events = events.saturating_add(c.raw);
                            let ratio = c.running_ratio();
                            if ratio > 0.0 && ratio < counting::MULTIPLEXED_BELOW {
                                // Not an error: the stream's running_ratio
                                // says it per interval; the log says it once.
                                self.note(format!(
                                    "{}: tier {}: counters multiplexed (another perf user, or more events than counters); counts scaled, see running_ratio",
                                    vm.id, t.name
                                ));
                            }
                        }
                    }
                    per_vm.insert(vm.id.clone(), readings);
                    fast.insert(
                        vm.id.clone(),
                        vm.tiers.iter().map(|t| t.kind().is_fast()).collect(),
                    );
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
            fast,
            health: SamplerHealth {
                backend: Backend::Pmu as i32,
                active: true,
                error: problems.join("; "),
                events,
                lost: 0,
                scan_cost_ns: u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX),
                ..Default::default()
            },
        }
    }

    /// Follows the VM's threads and returns its tiers' readings since the
    /// last call; `None` if its process is gone.
    fn sample_vm(
        &mut self,
        vm: &Vm,
        seen: Option<&[KvmRunThread]>,
        problems: &mut Vec<String>,
    ) -> Result<Option<Vec<TierReading>>, String> {
        let tiers: Vec<TierPlace> = vm
            .tiers
            .iter()
            .map(|t| TierPlace {
                kind: t.kind(),
                nodes: t.host_numa_nodes.clone(),
            })
            .collect();
        let stale_state = self
            .vms
            .get(&vm.id)
            .is_some_and(|s| s.pid != vm.vmm_pid || s.tiers != tiers);
        if stale_state {
            // Another process under the same id, or a new tier map.
            self.drop_vm(&vm.id);
        }
        if !self.vms.contains_key(&vm.id) {
            let (plan, unmeasurable, notes) =
                plan_for(&self.events, &tiers, self.topology.cpu_nodes(), &self.cpu);
            for n in notes {
                self.note(format!("{}: {n}", vm.id));
            }
            self.vms.insert(
                vm.id.clone(),
                VmPmu {
                    pid: vm.vmm_pid,
                    tiers,
                    plan,
                    unmeasurable,
                    tracker: VcpuTracker::new(vm.vmm_pid),
                    threads: BTreeMap::new(),
                    leaving: Vec::new(),
                    last_read: None,
                },
            );
        }
        let Some(state) = self.vms.get_mut(&vm.id) else {
            return Err("internal: VM state missing".into());
        };
        let changes = match state.tracker.poll_with(seen) {
            Ok(c) => c,
            Err(VcpuError::ProcessGone { .. }) => return Ok(None),
            Err(e) => return Err(format!("vCPU threads: {e}")),
        };
        if let Some(progs) = &self.progs {
            for tid in &changes.stale {
                if let Err(e) = progs.forget_kvm_thread(*tid) {
                    problems.push(format!("KVM_RUN watch: {e}"));
                }
            }
        }
        for t in &changes.removed {
            // Its counters still hold its last span: read them once more.
            if let Some(gone) = state.threads.remove(&t.tid) {
                state.leaving.push(gone);
            }
        }
        for t in &changes.added {
            let counters = open_counters(t.tid, &state.plan, |e| {
                problems.push(format!("{}: vCPU {}: {e}", vm.id, t.index));
            });
            // Where it is now: the start of its first interval.
            let last_node =
                placement::last_cpu(state.pid, t.tid).and_then(|c| self.topology.node_of(c));
            state.threads.insert(
                t.tid,
                VcpuCounters {
                    index: t.index,
                    counters,
                    last_node,
                },
            );
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
        Ok(Some(read_vm(state, &self.topology, &vm.id, problems)))
    }

    /// Logs an informational note once (not a health error).
    fn note(&mut self, text: String) {
        if self.logged.insert(text.clone()) {
            tracing::info!(note = %text, "pmu source");
        }
    }

    /// Closes a VM's counters.
    fn drop_vm(&mut self, id: &str) {
        if self.vms.remove(id).is_none() {
            return;
        }
        // Its problems go with it: the set stays bounded as VMs come and go,
        // and a new VM that reuses the id gets its problems logged again.
        let prefix = format!("{id}: ");
        self.logged.retain(|p| !p.starts_with(&prefix));
    }
}

/// One fd per (vCPU thread, event): raise the soft open-file limit to the
/// hard one (1024 is 256 vCPUs of 4 events). Returns a note if it cannot.
fn raise_fd_limit() -> Option<String> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `lim`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Some(format!(
            "RLIMIT_NOFILE: {}",
            std::io::Error::last_os_error()
        ));
    }
    if lim.rlim_cur >= lim.rlim_max {
        return None;
    }
    let raised = libc::rlimit {
        rlim_cur: lim.rlim_max,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: setrlimit reads one valid rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Some(format!(
            "RLIMIT_NOFILE stays {}: {} (one fd per vCPU thread and event)",
            lim.rlim_cur,
            std::io::Error::last_os_error()
        ));
    }
    None
}

/// Opens each entry of `plan` on `tid` as a counting event; failures go
/// to `failed` and the others count.
fn open_counters(tid: u32, plan: &[EventEntry], mut failed: impl FnMut(String)) -> Vec<Counted> {
    let opts = counting_options();
    let mut out = Vec::new();
    for e in plan {
        let opened = loader::open_event(tid, &counting_spec(e), &opts).and_then(|counter| {
            let last = loader::read_counter(&counter, &e.name)?;
            Ok(Counted {
                name: e.name.clone(),
                kind: e.tier,
                counter,
                last,
                fresh: true,
            })
        });
        match opened {
            Ok(c) => out.push(c),
            Err(err) => failed(err.to_string()),
        }
    }
    out
}

/// Reads every counter of the VM and sums the changes into its tiers.
fn read_vm(
    state: &mut VmPmu,
    topology: &Topology,
    vm: &str,
    problems: &mut Vec<String>,
) -> Vec<TierReading> {
    let mut tallies = vec![Tally::default(); state.tiers.len()];
    let mut blocked: BTreeMap<usize, String> = BTreeMap::new();
    let now = Instant::now();
    let span = state.last_read.map(|t| now.duration_since(t).as_secs_f64());
    state.last_read = Some(now);
    // Placement only matters with DRAM tiers on more than one node.
    let needs_place = state.tiers.iter().filter(|t| dram_backed(t)).count() > 1;
    let planned = state.plan.len();
    let live = state.threads.iter_mut().map(|(tid, t)| (Some(*tid), t));
    let mut gone = std::mem::take(&mut state.leaving);
    let gone_iter = gone.iter_mut().map(|t| (None, t));
    for (tid, thread) in live.chain(gone_iter) {
        let place = match (needs_place, tid) {
            (false, _) => Placement::Unknown("not needed".into()),
            (true, Some(tid)) => {
                let nodes = placement::affinity(tid)
                    .map(|cpus| topology.nodes_of(&cpus))
                    .unwrap_or_default();
                let node = placement::last_cpu(state.pid, tid).and_then(|c| topology.node_of(c));
                let place = placement::place(&nodes, thread.last_node, node);
                thread.last_node = node;
                place
            }
            // Exited: where it was last seen.
            (true, None) => placement::place(&BTreeSet::new(), thread.last_node, thread.last_node),
        };
        // A vCPU some of whose events did not open leaves a hole in
        // every tier those events count: say so on every tier.
        let missing = planned.saturating_sub(thread.counters.len());
        for c in &mut thread.counters {
            let reading = match loader::read_counter(&c.counter, &c.name) {
                Ok(r) => r,
                Err(e) => {
                    problems.push(format!("{vm}: vCPU {}: {e}", thread.index));
                    for t in &mut tallies {
                        t.notes.insert(format!(
                            "vCPU {}: event {} could not be read: its accesses are missing",
                            thread.index, c.name
                        ));
                    }
                    continue;
                }
            };
            let delta = reading.since(&c.last);
            c.last = reading;
            let fresh = std::mem::replace(&mut c.fresh, false);
            match placement::tier_for(c.kind, &place, &state.tiers) {
                Ok((i, note)) => {
                    if let Some(t) = tallies.get_mut(i) {
                        if fresh {
                            t.opened += 1;
                            continue;
                        }
                        t.add(delta);
                        if let Some(n) = note {
                            t.notes.insert(format!("vCPU {}: {n}", thread.index));
                        }
                    }
                }
                Err(why) => {
                    // Only placement or an ambiguous tier map can fail
                    // here (the plan holds only events that land): every
                    // DRAM tier is then unknown.
                    for (i, t) in state.tiers.iter().enumerate() {
                        if dram_backed(t) {
                            blocked
                                .entry(i)
                                .or_insert_with(|| format!("vCPU {}: {why}", thread.index));
                        }
                    }
                }
            }
        }
        if missing > 0 {
            for t in &mut tallies {
                t.notes.insert(format!(
                    "vCPU {}: {missing} of {planned} events did not open on it: its accesses of those are missing",
                    thread.index
                ));
            }
        }
    }
    drop(gone);
    tallies
        .into_iter()
        .enumerate()
        .map(|(i, mut t)| {
            t.seconds = span.unwrap_or(0.0);
            if let Some(w) = state.unmeasurable.get(&i).or(blocked.get(&i)) {
                TierReading::NotMeasured(w.clone())
            } else {
                TierReading::from_tally(t)
            }
        })
        .collect()
}

/// One tier's reading as the stream carries it.
pub fn source_count(r: &TierReading) -> SourceCount {
    match r {
        TierReading::Counted(t) => SourceCount {
            source: Backend::Pmu as i32,
            events: t.scaled.round() as u64,
            samples: 0,
            not_measured: String::new(),
            running_ratio: t.running_ratio(),
            raw_events: t.raw,
            attribution: t.notes.iter().cloned().collect::<Vec<_>>().join("; "),
            seconds: t.seconds,
        },
        TierReading::NotMeasured(why) => SourceCount {
            source: Backend::Pmu as i32,
            not_measured: why.clone(),
            ..SourceCount::default()
        },
    }
}

/// Share of the counted events that hit fast tiers, when the PMU counted
/// every tier (none not measured) and counted something: exact, so the
/// controller acts on it (`VmStats.counted_dram_hit_ratio`). `None` when a
/// tier was not measured, the tier lists disagree, or nothing was counted.
pub fn counted_ratio(counts: &[TierReading], fast: &[bool]) -> Option<f64> {
    if counts.len() != fast.len() || counts.is_empty() {
        return None;
    }
    let (mut hit, mut all) = (0.0, 0.0);
    for (r, &f) in counts.iter().zip(fast) {
        let TierReading::Counted(t) = r else {
            return None;
        };
        all += t.scaled;
        if f {
            hit += t.scaled;
        }
    }
    (all > 0.0 && all.is_finite()).then(|| hit / all)
}

/// Adds `readings` to `update`: a [`SourceCount`] per tier of each VM
/// counted, the counted DRAM-hit ratio where every tier was counted, and
/// the source's health.
pub fn annotate(update: &mut StatsUpdate, readings: &PmuReadings) {
    for stats in &mut update.stats {
        let Some(counts) = readings.per_vm.get(&stats.vm_id) else {
            continue;
        };
        for (tier, r) in stats.tiers.iter_mut().zip(counts) {
            tier.sources.push(source_count(r));
        }
        // Readings are in `Vm.tiers` order, as are the stats' tiers.
        stats.counted_dram_hit_ratio = readings
            .fast
            .get(&stats.vm_id)
            .filter(|_| counts.len() == stats.tiers.len())
            .and_then(|fast| counted_ratio(counts, fast));
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
                        format!("{} ({kind}, {guest}, counted)", e.name)
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
        let mut counted = Tally::default();
        counted.add(Reading {
            count: 300,
            enabled_ns: 100,
            running_ns: 50,
        });
        counted.notes.insert("vCPU 1: assumed".into());
        counted.seconds = 0.25;
        let readings = PmuReadings {
            per_vm: HashMap::from([(
                "a".to_string(),
                vec![
                    TierReading::Counted(counted),
                    TierReading::NotMeasured("no event on X counts cxl memory".into()),
                ],
            )]),
            fast: HashMap::from([("a".to_string(), vec![true, false])]),
            health: SamplerHealth {
                backend: Backend::Pmu as i32,
                active: true,
                events: 300,
                ..Default::default()
            },
        };
        annotate(&mut u, &readings);
        let [dram, slow] = &u.stats[0].tiers[..] else {
            panic!("two tiers")
        };
        assert_eq!(
            dram.sources,
            [SourceCount {
                source: Backend::Pmu as i32,
                events: 600,
                samples: 0,
                not_measured: String::new(),
                running_ratio: 0.5,
                raw_events: 300,
                attribution: "vCPU 1: assumed".into(),
                seconds: 0.25,
            }]
        );
        assert_eq!(
            (
                slow.sources[0].events,
                slow.sources[0].not_measured.as_str()
            ),
            (0, "no event on X counts cxl memory")
        );
        assert!(u.stats[1].tiers[0].sources.is_empty());
        assert_eq!(u.health, std::slice::from_ref(&readings.health));
        // The slow tier was not measured: no counted ratio.
        assert_eq!(u.stats[0].counted_dram_hit_ratio, None);
    }

    fn counted(count: u64) -> TierReading {
        let mut t = Tally::default();
        t.add(Reading {
            count,
            enabled_ns: 100,
            running_ns: 100,
        });
        TierReading::Counted(t)
    }

    #[test]
    fn every_tier_counted_gives_the_counted_ratio() {
        let mut u = update();
        // Fast by the kinds the readings carry (here the second tier),
        // whatever the tiers are named.
        let readings = PmuReadings {
            per_vm: HashMap::from([
                ("a".to_string(), vec![counted(100), counted(300)]),
                ("b".to_string(), vec![counted(0)]),
            ]),
            fast: HashMap::from([
                ("a".to_string(), vec![false, true]),
                ("b".to_string(), vec![true]),
            ]),
            health: SamplerHealth::default(),
        };
        annotate(&mut u, &readings);
        assert_eq!(u.stats[0].counted_dram_hit_ratio, Some(0.75));
        // Nothing counted: no ratio (never a silent 0).
        assert_eq!(u.stats[1].counted_dram_hit_ratio, None);
        // Multiplexed counts are compared scaled.
        let mut half = Tally::default();
        half.add(Reading {
            count: 100,
            enabled_ns: 100,
            running_ns: 50,
        });
        let r = counted_ratio(&[TierReading::Counted(half), counted(200)], &[true, false]);
        assert_eq!(r, Some(0.5));
        // Tier lists that disagree, or a tier not measured: none.
        assert_eq!(counted_ratio(&[counted(1)], &[true, false]), None);
        assert_eq!(
            counted_ratio(
                &[counted(1), TierReading::NotMeasured("x".into())],
                &[true, false]
            ),
            None
        );
        // Only fast tiers: every access hits DRAM.
        assert_eq!(counted_ratio(&[counted(5)], &[true]), Some(1.0));
    }

    fn entry(name: &str, tier: TierKind) -> EventEntry {
        EventEntry {
            name: name.into(),
            vendor: "GenuineIntel".into(),
            family: 6,
            models: vec![(0x8F, 0x8F)],
            steppings: vec![],
            event_type: EventType::Raw,
            config: 0x01D3,
            config1: 0,
            period: 1,
            data_src: false,
            tier,
            source: "test".into(),
            verified: true,
            origin: "test".into(),
        }
    }

    fn place(kind: TierKind, nodes: &[u32]) -> TierPlace {
        TierPlace {
            kind,
            nodes: nodes.to_vec(),
        }
    }

    /// Sapphire Rapids-like table (local, remote DRAM; no CXL event) on a
    /// two-node host, a VM with dram, the other socket's DRAM, two cxl
    /// tiers and one of unknown kind.
    #[test]
    fn tiers_no_event_can_count_are_not_measured_with_why() {
        use TierKind::*;
        let events = [
            entry("LOCAL", Dram),
            entry("REMOTE", Remote),
            entry("PMM", Pmem),
        ];
        let tiers = [
            place(Dram, &[0]),
            place(Dram, &[1]),
            place(Cxl, &[2]),
            place(Cxl, &[3]),
            place(Unknown, &[]),
        ];
        let (plan, un, notes) = plan_for(&events, &tiers, 2, "SPR");
        let names: Vec<&str> = plan.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["LOCAL", "REMOTE"]);
        assert_eq!(notes, ["no pmem tier: event PMM not counted"]);
        assert_eq!(un.keys().copied().collect::<Vec<_>>(), [2, 3, 4]);
        assert_eq!(un[&2], "no event on SPR counts cxl memory");
        assert!(un[&4].contains("kind is unknown"), "{}", un[&4]);
        // With a CXL event, the second cxl tier is still not told apart.
        let events = [
            entry("LOCAL", Dram),
            entry("REMOTE", Remote),
            entry("CXL", Cxl),
        ];
        let (_, un, _) = plan_for(&events, &tiers, 2, "GNR");
        assert_eq!(un.keys().copied().collect::<Vec<_>>(), [3, 4]);
        assert!(un[&3].contains("cannot tell cxl tiers apart"), "{}", un[&3]);
        // Only a local-DRAM event: fine on one node, not on two.
        let events = [entry("LOCAL", Dram)];
        let one = [place(Dram, &[0])];
        assert!(plan_for(&events, &one, 1, "X").1.is_empty());
        let (_, un, _) = plan_for(&events, &one, 2, "X");
        assert!(un[&0].contains("no remote-DRAM event on X"), "{}", un[&0]);
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
            stepping: None,
        };
        let e = PmuSource::start(&cpu, &EventTable::builtin().unwrap()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no event in the table for GenuineIntel family 0x6 model 0x1"
        );
    }
}
