//! One policy's run on the cloud-hypervisor test guests: three PVH guests
//! under the patched VMM, booted, read and stopped through `tier_e2e`'s
//! library as the closed loop does (DRAM and slow zones, per-tier
//! balloon), the schedule of `value::ch::Schedule`, the policy acting on
//! their DRAM balloons, and each guest's exact per-tier access counts every
//! interval (its `tg tick` lines).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use tier_benches::value::ch::{self as vch, Schedule};
use tier_benches::value::oracle_split;
use tier_controller::actuate::Vmm as _;
use tier_e2e::tierd;
use tier_e2e::vmm::{ChVm, VmSpec};
use tier_proto::v1::{
    Policy as TierPolicy, PolicyMode, ReclaimMode, SetPolicyRequest, TierLimits, VmPolicy,
};

use crate::run::{Policy, RunOut, Tick};

const MIB: u64 = 1 << 20;
/// Guest names, in sample order (`Schedule::guests`).
pub const GUESTS: [&str; 3] = ["a", "b", "c"];
/// Each guest's DRAM zone (one guest NUMA node) and slow zone, MiB: the
/// DRAM zone holds the large hot set whole (all-dram), the slow one
/// whatever the balloon pushes out.
pub const DRAM_MIB: u64 = 32;
pub const SLOW_MIB: u64 = 64;
/// DRAM each guest holds at the start and under the static split, MiB.
pub const SHARE_MIB: u64 = 10;
/// The host DRAM budget: below the guests' combined demand (their own
/// pages plus 6000 + 1500 + 64 hot pages, about 34 MiB).
pub const BUDGET: u64 = GUESTS.len() as u64 * SHARE_MIB * MIB;
/// Each guest's DRAM floor, as the closed loop sets it (the guest's own
/// 1.5 MiB in the zone are not balloonable).
pub const FLOOR_MIB: u64 = 4;
/// The oracle's window, its block and its hysteresis.
const ORACLE_WINDOW_S: f64 = 5.0;
const ORACLE_BLOCK: u64 = MIB;

/// What the run needs.
#[derive(Debug)]
pub struct Env {
    pub ch_bin: PathBuf,
    pub tierd: PathBuf,
    pub guest: PathBuf,
}

impl Env {
    /// `--ch-bin PATH`, else `TIERD_CH_BIN` (`cargo xtask bench value --
    /// --source ch` sets it to the cached patched VMM); tierd beside this
    /// binary (the xtask builds it in release).
    pub fn from_env(ch_bin: Option<&str>) -> anyhow::Result<Env> {
        let ch_bin = ch_bin
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("TIERD_CH_BIN")
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from)
            })
            .context(
                "no patched cloud-hypervisor: --ch-bin PATH or TIERD_CH_BIN (run `cargo xtask bench value -- --source ch`)",
            )?;
        let tierd = std::env::current_exe()
            .context("current_exe")?
            .parent()
            .context("bench dir")?
            .join("tierd");
        tier_e2e::run::require_files(&[
            ("--ch-bin", ch_bin.as_path()),
            ("tierd (cargo xtask bench builds it)", tierd.as_path()),
        ])?;
        Ok(Env {
            ch_bin,
            tierd,
            guest: tier_testguest::elf_path().into(),
        })
    }
}

/// The policy tierd's controller gets, as the closed loop sets it
/// (`vmm-patch/harness/e2e/src/scenario.rs`, `Plan::policy`): target 0.85 +- 0.05,
/// 8 MiB steps, idle DRAM above 0.3 reclaimed first, a 4 MiB DRAM floor,
/// hot horizon 5 s; reclaim as given (tierd's default is eager).
fn tierd_policy(mode: PolicyMode, reclaim: ReclaimMode) -> TierPolicy {
    TierPolicy {
        enabled: true,
        dry_run: false,
        default_target: 0.85,
        epsilon: 0.05,
        host_dram_budget_bytes: BUDGET,
        max_step_bytes: 8 * MIB,
        cooldown_intervals: 1,
        idle_threshold: 0.3,
        vms: GUESTS
            .iter()
            .map(|g| VmPolicy {
                vm: (*g).into(),
                limits: vec![TierLimits {
                    tier: "dram".into(),
                    floor_bytes: FLOOR_MIB * MIB,
                    ceiling_bytes: 0,
                }],
                ..Default::default()
            })
            .collect(),
        mode: mode as i32,
        hot_horizon_seconds: 5.0,
        promotion_slo: 0.0,
        reclaim: reclaim as i32,
    }
}

pub fn what(p: Policy) -> &'static str {
    match p {
        Policy::AllDram => "budget lifted: every DRAM balloon at 0 (32 MiB DRAM each)",
        Policy::Static => {
            "equal static split (10 MiB DRAM each; the guests are the same size, so also the proportional one)"
        }
        Policy::GuestTiering => "n/a (the test guest has no tiering of its own)",
        Policy::Ratio => {
            "tierd's controller, ratio mode (target 0.85), reclaim on demand, as the e2e runs it"
        }
        Policy::WorkingSet => {
            "tierd's controller, working_set mode (hot horizon 5 s), reclaim on demand, as the e2e runs it"
        }
        Policy::RatioEager => "as ratio, with reclaim eager",
        Policy::WorkingSetEager => "as working-set, with reclaim eager",
        Policy::Oracle => {
            "greedy split of the budget by the last 5 s's exact accesses over the known hot sets, every 1 s, through the DRAM balloons"
        }
    }
}

/// The latest `tg tick` of a guest: seconds, phase, per-tier cumulative
/// accesses and resident workload pages.
#[derive(Debug, Clone, Default)]
struct Tg {
    s: u64,
    phase: u64,
    acc: Vec<u64>,
    res: Vec<u64>,
}

fn last_tick(vm: &ChVm) -> Option<Tg> {
    vm.lines().iter().rev().find_map(|l| {
        let t = l.tick()?;
        Some(Tg {
            s: t.s?,
            phase: l.u64("phase")?,
            acc: t.acc,
            res: t.res,
        })
    })
}

/// The guest's own pages in zone 0 (its `tg zone i=0` line: span minus
/// the pages it manages), bytes.
fn overhead(vm: &ChVm) -> u64 {
    vm.lines()
        .iter()
        .find(|l| l.kind == "zone" && l.u64("i") == Some(0))
        .and_then(|l| Some(l.u64("span")?.saturating_sub(l.u64("total")?)))
        .map_or(0, |p| p * tier_benches::value::PAGE)
}

/// The DRAM zone's balloon: (target, host-ballooned) bytes.
async fn dram_balloon(vm: &ChVm) -> anyhow::Result<(u64, u64)> {
    let z = vm.zones().await?;
    let d = z
        .iter()
        .find(|z| z.id == "dram")
        .with_context(|| format!("{}: no dram balloon zone in vm.info", vm.name))?;
    Ok((d.target, d.host_ballooned))
}

pub async fn run(
    env: &Env,
    s: Schedule,
    insns_per_miss: f64,
    policy: Policy,
    work: &Path,
) -> anyhow::Result<RunOut> {
    anyhow::ensure!(
        policy != Policy::GuestTiering,
        "guest-tiering: {}",
        what(policy)
    );
    let ch_dir = work.join("ch");
    std::fs::create_dir_all(&ch_dir).context("creating the API socket directory")?;
    let mut vms = Vec::new();
    for (i, g) in s.guests().iter().enumerate() {
        let spec = VmSpec {
            name: g.name.into(),
            zones: vec![("dram".into(), DRAM_MIB), ("slow".into(), SLOW_MIB)],
            cmdline: s.cmdline(i).context("schedule")?,
            vhost_user: None,
            hotplug: None,
        };
        vms.push(ChVm::boot(&spec, &env.ch_bin, &env.guest, &ch_dir, work)?);
    }
    for vm in &mut vms {
        vm.wait_ready(Duration::from_secs(30)).await?;
    }
    // The guests' clocks (and their phases) start at `ready`.
    let ready = Instant::now();
    let zone = DRAM_MIB * MIB;
    let start_balloon = match policy {
        Policy::AllDram => 0,
        _ => zone - SHARE_MIB * MIB,
    };
    // All at once (each guest moves its pages out on its own), then waited.
    let target = [("dram".to_string(), start_balloon)];
    for vm in &vms {
        vm.api
            .set_tier_targets(&target)
            .await
            .with_context(|| format!("{}: vm.resize", vm.name))?;
    }
    for vm in &vms {
        vm.balloon_to(&target, Duration::from_secs(90)).await?;
    }
    let overheads: Vec<u64> = vms.iter().map(overhead).collect();
    let settled = ready.elapsed().as_secs_f64();
    println!(
        "  guests ready, DRAM balloons at {} MiB after {settled:.1} s (settle window {} s{}); guests' own pages in DRAM {:?} KiB",
        start_balloon / MIB,
        s.settle_s,
        if settled > s.settle_s as f64 {
            ": exceeded, the first intervals include the settling"
        } else {
            ""
        },
        overheads.iter().map(|o| o >> 10).collect::<Vec<_>>()
    );
    let mut daemon = match policy {
        p if p.tierd() => {
            let mode = if matches!(p, Policy::Ratio | Policy::RatioEager) {
                PolicyMode::Ratio
            } else {
                PolicyMode::WorkingSet
            };
            let reclaim = if matches!(p, Policy::RatioEager | Policy::WorkingSetEager) {
                ReclaimMode::Eager
            } else {
                ReclaimMode::OnDemand
            };
            let mut t = tierd::start(
                &env.tierd,
                work,
                &ch_dir,
                "hostpte",
                1000,
                20,
                "actuator = \"balloon\"",
            )?;
            let mut client = t.try_client(Duration::from_secs(30)).await?;
            client
                .set_policy(SetPolicyRequest {
                    policy: Some(tierd_policy(mode, reclaim)),
                })
                .await
                .context("SetPolicy")?;
            println!("  tierd pid {}, log {}", t.pid(), t.log_path().display());
            Some(t)
        }
        _ => None,
    };
    // The guests' clocks count the RTC seconds they see: held up (by
    // tierd's sampling under this host's emulating KVM, about 2x), they
    // run behind the wall clock. Cut off at three times the schedule.
    let deadline = 3.0 * s.end_s() as f64 + 60.0;
    let n = vms.len();
    let mut last: Vec<Option<Tg>> = vms.iter().map(last_tick).collect();
    let mut window: Vec<VecDeque<(f64, u64)>> = vec![VecDeque::new(); n];
    let mut ticks = Vec::new();
    let mut prev_held: Vec<Option<u64>> = vec![None; n];
    let (mut moved, mut resizes) = (0u64, 0usize);
    let mut changed_at: Vec<Option<f64>> = vec![None; n];
    // The balloon targets this bench set (all but tierd's runs): another
    // tierd on the host that finds these VMs by their command line could
    // move them; such a change is reported and undone.
    let owned = !policy.tierd();
    let mut want: Vec<u64> = vec![start_balloon; n];
    let mut foreign = 0usize;
    let mut next = Instant::now();
    let mut done = false;
    while !done && ready.elapsed().as_secs_f64() < deadline {
        next += Duration::from_secs(1);
        tokio::time::sleep_until(next.into()).await;
        let t = ready.elapsed().as_secs_f64();
        let mut row = format!("  {t:6.1}");
        let mut held = Vec::with_capacity(n);
        let mut phases = Vec::with_capacity(n);
        done = true;
        for (i, vm) in vms.iter_mut().enumerate() {
            if let Some(st) = vm.exited() {
                anyhow::bail!("{}: the VMM exited ({st})", vm.name);
            }
            let (target, ballooned) = dram_balloon(vm).await?;
            if owned && target != want[i] {
                foreign += 1;
                println!(
                    "  {}: DRAM balloon target {} KiB set by someone else (this bench set {} KiB): set back",
                    vm.name,
                    target >> 10,
                    want[i] >> 10
                );
                vm.api
                    .set_tier_targets(&[("dram".into(), want[i])])
                    .await
                    .with_context(|| format!("{}: vm.resize", vm.name))?;
            }
            let h = zone.saturating_sub(ballooned);
            if let Some(p) = prev_held[i] {
                moved += p.abs_diff(h);
            }
            prev_held[i] = Some(h);
            held.push(h);
            let now = last_tick(vm);
            let phase = now.as_ref().map_or(0, |x| x.phase);
            phases.push(phase);
            if phase > 0 && changed_at[i].is_none() {
                changed_at[i] = Some(t);
            }
            done &= now.as_ref().is_some_and(|x| x.s >= s.end_s());
            if let (Some(now), Some(before)) = (&now, &last[i])
                && now.s > before.s
                && s.recorded(now.s)
            {
                let acc = vch::delta(&now.acc, &before.acc);
                let res = [0, 1].map(|k| now.res.get(k).copied().unwrap_or(0));
                // On the guest's clock, so that policies line up.
                ticks.push(Tick {
                    t: now.s as f64,
                    sample: vch::sample(i, acc, res, insns_per_miss, h),
                });
                row += &format!(
                    "  {}: ph {} dram {:4.1} MiB hit {:5.1}% res {:>4}/{:<4}",
                    vm.name,
                    phase,
                    h as f64 / MIB as f64,
                    100.0 * acc[0] as f64 / (acc[0] + acc[1]).max(1) as f64,
                    res[0],
                    res[1]
                );
            } else {
                row += &format!("  {}: -", vm.name);
            }
            if let Some(now) = &now {
                let w = &mut window[i];
                w.push_back((t, now.acc.iter().sum()));
                while w.front().is_some_and(|f| t - f.0 > ORACLE_WINDOW_S) {
                    w.pop_front();
                }
                last[i] = Some(now.clone());
            }
        }
        println!("{row}");
        if policy == Policy::Oracle {
            resizes +=
                oracle_step(&vms, &s, &phases, &window, &overheads, &held, &mut want).await?;
        }
    }
    if foreign > 0 {
        println!("  balloon targets changed by someone else and set back: {foreign}");
    }
    if !done {
        println!(
            "  cut off at {deadline:.0} s of wall time, the guests' clocks short of {} s",
            s.end_s()
        );
    }
    let mut alive = true;
    for vm in &mut vms {
        alive &= vm.exited().is_none() && !vm.lines().iter().any(|l| l.kind == "error");
    }
    if let Some(t) = daemon.as_mut() {
        t.stop();
    }
    for vm in &mut vms {
        vm.stop();
    }
    println!(
        "  phase changes seen at t = {:?} s",
        changed_at
            .iter()
            .map(|c| c.map_or("-".into(), |t| format!("{t:.0}")))
            .collect::<Vec<_>>()
    );
    if policy.tierd() {
        resizes = crate::run::count_requests(&ticks);
    }
    Ok(RunOut {
        policy,
        ticks,
        moved,
        resizes,
        alive: Some(alive),
        vmstat: Vec::new(),
        repeat: 0,
    })
}

/// The oracle's interval: split the budget over the known hot sets of the
/// current phases by the last window's exact accesses, and set the DRAM
/// balloons to it (those giving DRAM up first). Returns the balloon
/// targets set.
async fn oracle_step(
    vms: &[ChVm],
    s: &Schedule,
    phases: &[u64],
    window: &[VecDeque<(f64, u64)>],
    overheads: &[u64],
    held: &[u64],
    want: &mut [u64],
) -> anyhow::Result<usize> {
    let zone = DRAM_MIB * MIB;
    let mut demands = Vec::new();
    for i in 0..vms.len() {
        let w = &window[i];
        let (Some(first), Some(last)) = (w.front(), w.back()) else {
            return Ok(0);
        };
        let active = s.active(i, phases[i]).context("schedule")?;
        demands.push(vch::demand(
            active,
            last.1.saturating_sub(first.1),
            overheads[i],
            FLOOR_MIB * MIB,
            zone,
        ));
    }
    let split = oracle_split(&demands, BUDGET, ORACLE_BLOCK)?;
    let targets = want.to_vec();
    let plan = vch::balloon_plan(&split, held, zone);
    // Only when some target moves by a block or more.
    if !plan
        .iter()
        .any(|&(g, b)| b.abs_diff(targets[g]) >= ORACLE_BLOCK)
    {
        return Ok(0);
    }
    let mut n = 0;
    for (g, balloon) in plan {
        if balloon != targets[g] {
            vms[g]
                .api
                .set_tier_targets(&[("dram".into(), balloon)])
                .await
                .with_context(|| format!("{}: vm.resize", vms[g].name))?;
            want[g] = balloon;
            n += 1;
        }
    }
    Ok(n)
}
