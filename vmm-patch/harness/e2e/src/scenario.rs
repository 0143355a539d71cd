//! The closed-loop scenario: two guests whose DRAM needs swap at a phase
//! change, tierd sampling them and its controller moving DRAM between
//! their per-tier balloons within a fixed host DRAM budget.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use tier_proto::v1::{
    Decision, DecisionOutcome, Policy, PolicyMode, ReclaimMode, SetPolicyRequest, StatsUpdate,
    TierLimits, VmPolicy, VmStats, WatchDecisionsRequest, WatchStatsRequest,
};
use tokio_stream::StreamExt;

use tier_e2e::tierd;
use tier_e2e::vmm::{ChVm, Hotplug, VmSpec};

const MIB: u64 = 1 << 20;
/// The hot horizon, seconds: the guests touch a hot page about once a
/// second, so one 1 s pass sees some 60 % of a hot set, and 5 s all of it.
pub const HOT_HORIZON_S: f64 = 5.0;
/// Each guest's DRAM floor, MiB (`Plan::policy`).
pub const DRAM_FLOOR_MIB: u64 = 4;

/// Everything the run needs from outside.
#[derive(Debug, Clone)]
pub struct Paths {
    pub ch_bin: PathBuf,
    pub tierd: PathBuf,
    pub guest: PathBuf,
    pub work: PathBuf,
}

/// What the controller keeps the guests at (`--mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Mode {
    /// DRAM-hit ratio at the target (today's e2e).
    #[default]
    Ratio,
    /// Hot working set in DRAM (docs/working-set.md): needs tierd to fill the
    /// per-tier ages.
    WorkingSet,
}

/// The scenario's knobs.
#[derive(Debug, Clone)]
pub struct Plan {
    pub dram_mib: u64,
    pub slow_mib: u64,
    /// DRAM balloon of each VM before tierd starts.
    pub initial_dram_balloon_mib: u64,
    /// Hot set of tier 0 (pages); the phase decides how much of it is used.
    pub hot_pages: u32,
    /// Active DRAM hot pages of the VM that needs little.
    pub small_pages: u32,
    pub phase_secs: u64,
    /// How long to watch after the later guest's phase change.
    pub after_secs: u64,
    pub target: f64,
    pub epsilon: f64,
    pub max_step_mib: u64,
    pub interval_ms: u64,
    /// Ageing passes per interval. hostpte bounds a reading's edges (its
    /// re-arm and walk) by the young pages of the shortest pass: 50 ms
    /// passes keep the working set's interval about 1 MiB wide each way
    /// on these guests, one 1 s pass made it 25 MiB wide. No decision
    /// reads one pass's young pages as idle any more (docs/controller.md,
    /// "One standard of evidence").
    pub passes: u32,
    pub backend: String,
    /// What the controller drives: the per-tier balloon, or the dram
    /// zone's virtio-mem part through `vm.resize-zone` (docs/virtio-mem.md).
    pub actuator: Actuator,
    /// Of the dram zone, with `Actuator::ResizeZone`: its boot size (never
    /// moves) and hot-pluggable part (a multiple of 128 MiB in
    /// cloud-hypervisor v53.0, docs/virtio-mem.md). The zone starts at
    /// `dram_mib - initial_dram_balloon_mib` in all, the DRAM a guest holds
    /// in the balloon run.
    pub boot_mib: u64,
    pub hotplug_mib: u64,
    /// The VMM has none of our series (upstream v53.0): no plugged size or
    /// region in vm.info, so tierd cannot attribute plugged memory.
    pub upstream: bool,
    /// Guest "b"'s virtio-mem driver misbehaves: `mute` (never answers) or
    /// `error` (only requests the device refuses). The run then checks that
    /// the controller stays stable and keeps serving "a".
    pub stall: Option<String>,
    pub mode: Mode,
    pub guests: Guests,
}

/// `--guests`: who shares the host's DRAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Guests {
    /// a and b: a's hot set outgrows its DRAM while b's shrinks, then
    /// they swap.
    #[default]
    Swap,
    /// i goes idle, g grows, s shrinks (s needs DRAM first, g after).
    Three,
}

/// `--actuator`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Actuator {
    #[default]
    Balloon,
    ResizeZone,
}

impl Actuator {
    pub fn name(self) -> &'static str {
        match self {
            Actuator::Balloon => "balloon",
            Actuator::ResizeZone => "resize-zone",
        }
    }
}

impl Default for Plan {
    fn default() -> Plan {
        Plan {
            dram_mib: 32,
            slow_mib: 64,
            initial_dram_balloon_mib: 16,
            hot_pages: 6000,
            small_pages: 1500,
            phase_secs: 45,
            after_secs: 60,
            target: 0.85,
            epsilon: 0.05,
            max_step_mib: 8,
            interval_ms: 1000,
            passes: 20,
            backend: "hostpte".into(),
            actuator: Actuator::Balloon,
            boot_mib: 8,
            hotplug_mib: 128,
            upstream: false,
            stall: None,
            mode: Mode::Ratio,
            guests: Guests::Swap,
        }
    }
}

impl Plan {
    /// Each guest's name and DRAM-preferring hot pages in phase 0 and 1.
    pub fn guests(&self) -> Vec<(&'static str, u32, u32)> {
        let (big, small) = (self.hot_pages, self.small_pages);
        match self.guests {
            Guests::Swap => vec![("a", big, small), ("b", small, big)],
            // An idle guest still runs: its phase touches 64 pages.
            Guests::Three => vec![("i", small, 64), ("g", small, big), ("s", big, small)],
        }
    }

    /// The host DRAM budget: what the guests hold at the start.
    pub fn budget(&self) -> u64 {
        self.guests().len() as u64 * (self.dram_mib - self.initial_dram_balloon_mib) * MIB
    }

    /// The guests' VMs, by `guests`.
    pub fn specs(&self) -> Vec<VmSpec> {
        let resize = self.actuator == Actuator::ResizeZone;
        let stalled = self.guests().get(1).map(|g| g.0);
        let vmem = |name: &str| match (&self.stall, Some(name) == stalled) {
            (Some(mode), true) => format!(" virtio_mem={mode}"),
            _ => " virtio_mem=on".into(),
        };
        let spec = |name: &str, first: u32, second: u32| VmSpec {
            name: name.into(),
            zones: vec![
                (
                    "dram".into(),
                    if resize { self.boot_mib } else { self.dram_mib },
                ),
                ("slow".into(), self.slow_mib),
            ],
            cmdline: format!(
                "hot={hot},300 phases=95/5@{secs}s:{first}/300,95/5@0:{second}/300 report=1s{vmem}",
                hot = self.hot_pages,
                secs = self.phase_secs,
                vmem = if resize { vmem(name) } else { String::new() },
            ),
            vhost_user: None,
            // Plugged at boot as much as the run starts with.
            hotplug: resize.then_some(Hotplug {
                size_mib: self.hotplug_mib,
                plugged_mib: (self.dram_mib - self.initial_dram_balloon_mib)
                    .saturating_sub(self.boot_mib),
            }),
        };
        self.guests()
            .into_iter()
            .map(|(name, first, second)| spec(name, first, second))
            .collect()
    }

    /// The dram tier's balloon-style target at the start, bytes: the
    /// balloon's, or the zone's total minus what it holds.
    pub fn initial_dram_target(&self) -> u64 {
        match self.actuator {
            Actuator::Balloon => self.initial_dram_balloon_mib * MIB,
            Actuator::ResizeZone => {
                (self.boot_mib + self.hotplug_mib + self.initial_dram_balloon_mib - self.dram_mib)
                    * MIB
            }
        }
    }

    fn policy(&self) -> Policy {
        Policy {
            enabled: true,
            dry_run: false,
            default_target: self.target,
            epsilon: self.epsilon,
            host_dram_budget_bytes: self.budget(),
            max_step_bytes: self.max_step_mib * MIB,
            cooldown_intervals: 1,
            // Idle DRAM above a third of what a VM holds goes back first:
            // the VM whose working set shrank is the donor.
            idle_threshold: 0.3,
            // A DRAM floor for each guest, as an operator sets one above
            // what a guest cannot give up: the test guest keeps about
            // 1.5 MiB of its own memory in the zone, untouched for seconds
            // (cold to the ages) yet not balloonable, so below it a
            // balloon evicts the guest's hot pages instead (seen: the idle
            // guest of `--guests three` held at 2 MiB read 0.19).
            vms: self
                .guests()
                .iter()
                .map(|g| VmPolicy {
                    vm: g.0.into(),
                    limits: vec![TierLimits {
                        tier: "dram".into(),
                        floor_bytes: DRAM_FLOOR_MIB * MIB,
                        ceiling_bytes: 0,
                    }],
                    ..Default::default()
                })
                .collect(),
            // The hot set is the working set within 5 s (both modes read
            // it: working_set decides on it, ratio mode grows on it where
            // the ratio is not measured); no promotion SLO (the guests do
            // not churn).
            mode: match self.mode {
                Mode::Ratio => PolicyMode::Ratio,
                Mode::WorkingSet => PolicyMode::WorkingSet,
            } as i32,
            hot_horizon_seconds: HOT_HORIZON_S,
            promotion_slo: 0.0,
            // tierd's default (docs/controller.md, "Reclaim on demand").
            reclaim: ReclaimMode::Eager as i32,
        }
    }
}

/// The hot set of a VM as tierd's stream has it: the working set within
/// the hot horizon, both tiers, (low, high) bytes; `None` where a tier has
/// not measured it this interval.
pub fn hot_set(s: &VmStats) -> Option<(f64, f64)> {
    let mut sum = (0.0, 0.0);
    for t in &s.tiers {
        let a = t.ages.as_ref().filter(|a| a.not_measured.is_empty())?;
        let w = a
            .working_set
            .iter()
            .find(|w| (w.horizon_seconds - HOT_HORIZON_S).abs() < 1e-9)
            .filter(|w| w.not_measured.is_empty())?;
        sum = (sum.0 + w.bytes_low, sum.1 + w.bytes_high);
    }
    (!s.tiers.is_empty()).then_some(sum)
}

/// One VM in one interval.
#[derive(Debug, Clone, Default)]
pub struct VmRow {
    /// The guest's workload phase (from its serial log).
    pub phase: Option<u64>,
    /// tierd's DRAM-hit estimate and its error bound.
    pub host: Option<(f64, f64)>,
    /// The guest's exact split over the last poll (stats queue).
    pub truth: Option<f64>,
    /// (target, host_ballooned) per zone, bytes.
    pub balloon: BTreeMap<String, (u64, u64)>,
    /// Host resident bytes per zone.
    pub rss: BTreeMap<String, u64>,
    /// The DRAM balloon (target, actual) as tierd's stream reports it.
    pub tierd_dram: Option<(u64, u64)>,
    /// Decisions APPLIED for this VM since the previous row.
    pub applied: u32,
    /// Zone resize: the plugged size came from the guest's serial line
    /// (the VMM does not report it).
    pub plugged_from_serial: bool,
    /// tierd's actuator for the VM and its detail (`VmStats.actuator*`).
    pub actuator: Option<(i32, String)>,
    /// tierd's hot set of the VM (`hot_set`), bytes (low, high).
    pub hot: Option<(f64, f64)>,
}

/// One interval of the run.
#[derive(Debug, Clone)]
pub struct Row {
    pub t: f64,
    pub seq: u64,
    /// One per guest, in `Plan::guests` order.
    pub vms: Vec<VmRow>,
}

/// What the run saw.
#[derive(Debug)]
pub struct Outcome {
    pub rows: Vec<Row>,
    /// Row index at which each guest started phase 1.
    pub phase_change: Vec<Option<usize>>,
    pub decisions: Vec<Decision>,
    pub initial_rss: Vec<BTreeMap<String, u64>>,
    pub plan: Plan,
    /// tierd's tier map of each VM's dram tier: `Tier.hotplug`.
    pub dram_hotplug: Vec<Option<tier_proto::v1::TierHotplug>>,
    /// Each VM's id in tierd's stream.
    pub vm_ids: Vec<Option<String>>,
}

/// Boots the guests, balloons them to the starting point, runs tierd and
/// records every interval until the watch after the phase change is over.
pub async fn run(plan: &Plan, paths: &Paths) -> anyhow::Result<Outcome> {
    let ch_dir = paths.work.join("ch");
    std::fs::create_dir_all(&ch_dir).context("creating the API socket directory")?;
    let specs = plan.specs();
    let mut vms = Vec::new();
    for s in &specs {
        vms.push(ChVm::boot(
            s,
            &paths.ch_bin,
            &paths.guest,
            &ch_dir,
            &paths.work,
        )?);
    }
    for vm in &mut vms {
        let took = vm.wait_ready(Duration::from_secs(30)).await?;
        println!(
            "{}: pid {} api {} guest ready in {took:.1?}",
            vm.name,
            vm.pid(),
            vm.socket.display()
        );
    }
    let initial = plan.initial_dram_balloon_mib * MIB;
    let n = vms.len();
    let mut initial_rss = vec![BTreeMap::new(); n];
    for (i, vm) in vms.iter().enumerate() {
        let took = match plan.actuator {
            Actuator::Balloon => {
                vm.balloon_to(&[("dram".into(), initial)], Duration::from_secs(60))
                    .await?
            }
            // The same DRAM held: the zone's total minus what a balloon
            // would take.
            // A stalled guest never plugs: not waited for.
            Actuator::ResizeZone if plan.stall.is_some() && i == 1 => Duration::ZERO,
            Actuator::ResizeZone => {
                vm.resize_to(
                    "dram",
                    (plan.dram_mib - plan.initial_dram_balloon_mib) * MIB,
                    Duration::from_secs(90),
                )
                .await?
            }
        };
        initial_rss[i] = vm.zone_rss().await?;
        println!(
            "{}: dram balloon at {} MiB in {took:.1?}; zone rss {:?} MiB",
            vm.name,
            plan.initial_dram_balloon_mib,
            initial_rss[i]
                .iter()
                .map(|(k, v)| (k, v / MIB))
                .collect::<Vec<_>>()
        );
    }

    let mut tierd = tierd::start(
        &paths.tierd,
        &paths.work,
        &ch_dir,
        &plan.backend,
        plan.interval_ms,
        plan.passes,
        &format!("actuator = {:?}", plan.actuator.name()),
    )?;
    let mut client = tierd.try_client(Duration::from_secs(30)).await?;
    println!(
        "tierd: pid {}, log {}",
        tierd.pid(),
        tierd.log_path().display()
    );
    client
        .set_policy(SetPolicyRequest {
            policy: Some(plan.policy()),
        })
        .await
        .context("SetPolicy")?;
    let mut decisions_stream = client
        .watch_decisions(WatchDecisionsRequest { vm_ids: vec![] })
        .await
        .context("WatchDecisions")?
        .into_inner();
    let mut stats = client
        .watch_stats(WatchStatsRequest { vm_ids: vec![] })
        .await
        .context("WatchStats")?
        .into_inner();

    let pids: Vec<u32> = vms.iter().map(ChVm::pid).collect();
    let mut ids: Vec<Option<String>> = vec![None; n];
    let mut last_acc: Vec<Vec<u64>> = vec![Vec::new(); n];
    let mut rows = Vec::new();
    let mut decisions = Vec::new();
    let mut phase_change = vec![None; n];
    let mut dram_hotplug = vec![None; n];
    let mut applied = vec![0u32; n];
    let start = Instant::now();
    let deadline = Duration::from_secs(plan.phase_secs * 2 + plan.after_secs + 120);
    let names: Vec<&str> = plan.guests().iter().map(|g| g.0).collect();
    print_header(&names);
    loop {
        let update: StatsUpdate = tokio::select! {
            u = stats.next() => match u {
                Some(u) => u.context("WatchStats stream")?,
                None => anyhow::bail!("tierd closed the stats stream"),
            },
            d = decisions_stream.next() => {
                if let Some(d) = d {
                    decisions.push(d.context("WatchDecisions stream")?);
                }
                continue;
            }
        };
        for v in &update.vms {
            if let Some(i) = pids.iter().position(|p| *p == v.vmm_pid) {
                ids[i] = Some(v.id.clone());
                dram_hotplug[i] = v
                    .tiers
                    .iter()
                    .find(|t| t.name == "dram")
                    .and_then(|t| t.hotplug);
            }
        }
        let mut row = Row {
            t: start.elapsed().as_secs_f64(),
            seq: update.sequence,
            vms: vec![VmRow::default(); n],
        };
        for (i, vm) in vms.iter().enumerate() {
            let r = &mut row.vms[i];
            r.phase = vm
                .lines()
                .iter()
                .rev()
                .find(|l| l.kind == "phase")
                .and_then(|l| l.u64("n"));
            if let Some(id) = &ids[i]
                && let Some(s) = update.stats.iter().find(|s| &s.vm_id == id)
                && s.has_accesses
            {
                r.host = Some((s.dram_hit_ratio, s.dram_hit_error));
            }
            if let Some(id) = &ids[i]
                && let Some(s) = update.stats.iter().find(|s| &s.vm_id == id)
            {
                r.actuator = Some((s.actuator, s.actuator_detail.clone()));
            }
            if let Some(id) = &ids[i]
                && let Some(s) = update.stats.iter().find(|s| &s.vm_id == id)
                && let Some(t) = s.tiers.iter().find(|t| t.tier == "dram")
            {
                r.tierd_dram = Some((t.balloon_target_bytes, t.balloon_actual_bytes));
            }
            if let Some(id) = &ids[i]
                && let Some(s) = update.stats.iter().find(|s| &s.vm_id == id)
            {
                r.hot = hot_set(s);
            }
            let acc = match plan.actuator {
                Actuator::Balloon => vm.guest_accesses().await.unwrap_or_default(),
                Actuator::ResizeZone => vm.serial_accesses(),
            };
            if acc.len() >= 2 && last_acc[i].len() == acc.len() {
                let d: Vec<u64> = acc
                    .iter()
                    .zip(&last_acc[i])
                    .map(|(a, b)| a.saturating_sub(*b))
                    .collect();
                let total: u64 = d.iter().sum();
                if total > 0 {
                    r.truth = Some(d[0] as f64 / total as f64);
                }
            }
            last_acc[i] = acc;
            match plan.actuator {
                Actuator::Balloon => {
                    for z in vm.zones().await.unwrap_or_default() {
                        r.balloon.insert(z.id.clone(), (z.target, z.host_ballooned));
                    }
                }
                // Balloon-style, so the checks read both paths alike:
                // target = not requested, actual = not plugged (the guest's
                // own serial report where vm.info does not say).
                Actuator::ResizeZone => {
                    if let Ok(z) = vm.zone_sizes("dram").await {
                        let unplugged =
                            z.plugged.map_or(u64::MAX, |p| z.hotplug - p.min(z.hotplug));
                        r.balloon
                            .insert("dram".into(), (z.hotplug - z.requested, unplugged));
                        r.plugged_from_serial = z.from_serial;
                    }
                }
            }
            r.rss = vm.zone_rss().await.unwrap_or_default();
            if let Some(id) = &ids[i] {
                let total = decisions
                    .iter()
                    .filter(|d| &d.vm_id == id && d.outcome == DecisionOutcome::Applied as i32)
                    .count() as u32;
                r.applied = total - applied[i].min(total);
                applied[i] = total;
            }
            if r.phase == Some(1) && phase_change[i].is_none() {
                phase_change[i] = Some(rows.len());
            }
        }
        print_row(&row);
        rows.push(row);
        let later = phase_change.iter().copied().collect::<Option<Vec<_>>>();
        if let Some(later) = later.and_then(|v| v.into_iter().max()) {
            let since = rows.len() - later;
            if since as u64 * plan.interval_ms >= plan.after_secs * 1000 {
                break;
            }
        }
        if start.elapsed() > deadline {
            println!("deadline of {deadline:?} reached");
            break;
        }
    }
    tierd.stop();
    for vm in &mut vms {
        vm.stop();
    }
    Ok(Outcome {
        rows,
        phase_change,
        decisions,
        initial_rss,
        plan: plan.clone(),
        dram_hotplug,
        vm_ids: ids,
    })
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:.0}", v * 100.0))
}

fn mib(v: u64) -> String {
    format!("{:.0}", v as f64 / MIB as f64)
}

/// Header of the timeline table, a column group per guest.
pub fn print_header(names: &[&str]) {
    let mut line = format!("{:>5} {:>4}", "t_s", "seq");
    for n in names {
        line.push_str(&format!(
            " | {:>2} {:>7} {:>5} {:>5} {:>5} {:>9} {:>5} {:>3}",
            "ph",
            format!("{n}_host%"),
            "truth",
            "d_tgt",
            "d_bal",
            "tierd_t/a",
            "rss",
            "dec"
        ));
    }
    println!("{line}");
    println!(
        "      (host%: tierd's DRAM-hit estimate ± bound; truth: the guest's exact split; d_tgt/d_bal: dram balloon target and pages the device holds, MiB; tierd_t/a: the same as tierd's stream has them; rss: dram zone resident MiB; dec: decisions applied)"
    );
}

/// One line of the timeline (balloons and RSS in MiB).
pub fn print_row(row: &Row) {
    let mut line = format!("{:>5.1} {:>4}", row.t, row.seq);
    for v in &row.vms {
        let (tgt, bal) = v.balloon.get("dram").copied().unwrap_or_default();
        let host = v.host.map_or_else(
            || "-".into(),
            |(r, e)| format!("{}±{:.0}", pct(Some(r)), e * 100.0),
        );
        let td = v
            .tierd_dram
            .map_or_else(|| "-".into(), |(t, a)| format!("{}/{}", mib(t), mib(a)));
        line.push_str(&format!(
            " | {:>2} {:>7} {:>5} {:>5} {:>5} {:>9} {:>5} {:>3}",
            v.phase.map_or_else(|| "-".into(), |p| p.to_string()),
            host,
            pct(v.truth),
            mib(tgt),
            mib(bal),
            td,
            mib(v.rss.get("dram").copied().unwrap_or(0)),
            v.applied
        ));
    }
    println!("{line}");
}
