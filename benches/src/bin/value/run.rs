//! One policy's run on the Linux bed: two 6.12 guests under QEMU TCG with
//! the truth plugin, the schedule, the policy acting on their DRAM nodes'
//! virtio-mem devices, exact counts every interval.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use tier_benches::value::{Demand, Sample, oracle_split};
use tier_e2e::bed::{self, BOOT_MIB, Guest, IDLE_MIB, MIB, PLUGGED_MIB, REGION_MIB};
use tier_e2e::tierd;
use tier_linux_bed::Kernel;
use tier_proto::v1::SetPolicyRequest;

/// Guest names, in sample order.
pub const GUESTS: [&str; 2] = ["a", "b"];
/// The host DRAM budget: what both DRAM nodes hold at the start.
pub const BUDGET: u64 = 2 * (BOOT_MIB + PLUGGED_MIB) * MIB;
/// The oracle resizes only when its target is this far from the request
/// (block-sized jitter of the window's counts would otherwise churn).
const ORACLE_HYSTERESIS: u64 = 8 * MIB;
/// The workloads' stride: a cache line.
const LINE: u64 = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    AllDram,
    Static,
    GuestTiering,
    Ratio,
    WorkingSet,
    Oracle,
    /// tierd's modes with `reclaim = EAGER`, tierd's own default
    /// (docs/controller.md, "Reclaim on demand"); `Ratio` and `WorkingSet`
    /// here reclaim on demand. Run on request, for the comparison.
    RatioEager,
    WorkingSetEager,
}

impl Policy {
    /// What runs when `--policies` is not given.
    pub const DEFAULT: [Policy; 6] = [
        Policy::AllDram,
        Policy::Static,
        Policy::GuestTiering,
        Policy::Ratio,
        Policy::WorkingSet,
        Policy::Oracle,
    ];
    pub const ALL: [Policy; 8] = [
        Policy::AllDram,
        Policy::Static,
        Policy::GuestTiering,
        Policy::Ratio,
        Policy::WorkingSet,
        Policy::Oracle,
        Policy::RatioEager,
        Policy::WorkingSetEager,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::AllDram => "all-dram",
            Policy::Static => "static",
            Policy::GuestTiering => "guest-tiering",
            Policy::Ratio => "ratio",
            Policy::WorkingSet => "working-set",
            Policy::Oracle => "oracle",
            Policy::RatioEager => "ratio-eager",
            Policy::WorkingSetEager => "working-set-eager",
        }
    }

    pub fn parse(s: &str) -> anyhow::Result<Policy> {
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .with_context(|| format!("no policy {s:?}"))
    }

    /// Whether tierd's controller drives the run.
    pub fn tierd(self) -> bool {
        matches!(
            self,
            Policy::Ratio | Policy::WorkingSet | Policy::RatioEager | Policy::WorkingSetEager
        )
    }

    /// Whether the guests' own tiering (demotion, NUMA-balancing
    /// promotion) is on.
    fn guest_tiering(self) -> bool {
        !matches!(self, Policy::AllDram | Policy::Static)
    }

    pub fn what(self) -> &'static str {
        match self {
            Policy::AllDram => {
                "budget lifted: each DRAM node plugged to its 384 MiB, guest tiering off"
            }
            Policy::Static => "equal static split (192 MiB DRAM each), guest tiering off",
            Policy::GuestTiering => {
                "equal static split, guest tiering on (demotion_enabled=1, numa_balancing=2)"
            }
            Policy::Ratio => {
                "tierd's controller, ratio mode (target 0.9), reclaim on demand, guest tiering on"
            }
            Policy::WorkingSet => {
                "tierd's controller, working_set mode (hot horizon 5 s), reclaim on demand, guest tiering on"
            }
            Policy::RatioEager => "as ratio, with reclaim eager",
            Policy::WorkingSetEager => "as working-set, with reclaim eager",
            Policy::Oracle => {
                "greedy split of the budget by the last 5 s's exact per-page LLC misses, every 1 s, through QMP; guest tiering on"
            }
        }
    }
}

/// What the bed needs.
#[derive(Debug)]
pub struct Env {
    pub kernel: Kernel,
    pub agent: PathBuf,
    pub plugin: PathBuf,
    pub tierd: PathBuf,
}

impl Env {
    pub fn from_env() -> anyhow::Result<Env> {
        let file = |k: &str| -> anyhow::Result<PathBuf> {
            let v = std::env::var(k)
                .with_context(|| format!("{k} unset: run `cargo xtask bench value`"))?;
            let p = PathBuf::from(v);
            anyhow::ensure!(p.is_file(), "{k}={} is no file", p.display());
            Ok(p)
        };
        Ok(Env {
            kernel: tier_linux_bed::kernel::from_env("6.12").map_err(anyhow::Error::msg)?,
            agent: file("TIERD_BED_AGENT")?,
            plugin: file("TIERD_TRUTH_PLUGIN")?,
            tierd: file("TIERD_BED_TIERD")?,
        })
    }
}

/// The schedule: a touches `IDLE_MIB` of its `grow_mib` until `phase_s`,
/// then all of it; b idles on `IDLE_MIB` throughout; both write every
/// cache line of their hot set each pass.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    pub phase_s: u64,
    pub after_s: u64,
    pub grow_mib: u64,
}

/// One interval of one guest, with when it ended.
#[derive(Debug, Clone, Copy)]
pub struct Tick {
    pub t: f64,
    pub sample: Sample,
}

#[derive(Debug)]
pub struct RunOut {
    pub policy: Policy,
    pub ticks: Vec<Tick>,
    /// DRAM plugged plus unplugged, bytes.
    pub moved: u64,
    pub resizes: usize,
    /// Whether both workloads ran to the end (None: re-read from a CSV).
    pub alive: Option<bool>,
    /// The guests' tiering counters at the end.
    pub vmstat: Vec<std::collections::BTreeMap<String, u64>>,
    /// Which round of `--repeats` (0-based).
    pub repeat: u32,
}

pub async fn run(env: &Env, s: Schedule, policy: Policy, work: &Path) -> anyhow::Result<RunOut> {
    let qmp_dir = work.join("qmp");
    let mut guests = bed::boot_pair(&env.kernel, &env.agent, &env.plugin, work)?;
    let mut overhead = Vec::new();
    for g in &mut guests {
        if policy.guest_tiering() {
            g.enable_tiering()?;
        } else {
            g.disable_tiering()?;
        }
        overhead.push(g.node_used(0)?);
    }
    if policy == Policy::AllDram {
        for g in &mut guests {
            let id = dram_device(g)?.id;
            g.bed.qmp().resize(&id, REGION_MIB * MIB)?;
        }
        wait_plugged(&mut guests, REGION_MIB * MIB)?;
    }
    // Every cache line of a pass: a hot set beyond the 32 MiB LLC misses.
    guests[0].touch_stride(s.grow_mib, Some((IDLE_MIB, s.phase_s)), Some(LINE))?;
    guests[1].touch_stride(IDLE_MIB, None, Some(LINE))?;
    let mut tierd = match policy {
        Policy::Ratio | Policy::WorkingSet | Policy::RatioEager | Policy::WorkingSetEager => {
            let mode = if matches!(policy, Policy::Ratio | Policy::RatioEager) {
                "ratio"
            } else {
                "working-set"
            };
            let mut p = bed::policy(mode, &GUESTS, BUDGET)?;
            p.reclaim = if matches!(policy, Policy::RatioEager | Policy::WorkingSetEager) {
                tier_proto::v1::ReclaimMode::Eager
            } else {
                tier_proto::v1::ReclaimMode::OnDemand
            } as i32;
            let mut t = tierd::with_config(&env.tierd, work, &bed::tierd_config(work, &qmp_dir))?;
            let mut client = t.try_client(Duration::from_secs(30)).await?;
            client
                .set_policy(SetPolicyRequest { policy: Some(p) })
                .await
                .context("SetPolicy")?;
            println!("  tierd pid {}, log {}", t.pid(), t.log_path().display());
            Some(t)
        }
        _ => None,
    };
    for g in &mut guests {
        g.interval()?;
    }
    let start = Instant::now();
    let end = (s.phase_s + s.after_s) as f64;
    let mut ticks = Vec::new();
    let mut last_size: Vec<Option<u64>> = vec![None; guests.len()];
    let (mut moved, mut resizes) = (0u64, 0usize);
    let mut next = start;
    while start.elapsed().as_secs_f64() < end {
        next += Duration::from_secs(1);
        tokio::time::sleep_until(next.into()).await;
        let t = start.elapsed().as_secs_f64();
        let mut row = format!("  {t:6.1}");
        let mut devices = Vec::new();
        for (i, g) in guests.iter_mut().enumerate() {
            let split = g.interval()?;
            let dev = dram_device(g)?;
            if let Some(prev) = last_size[i] {
                moved += prev.abs_diff(dev.size);
            }
            last_size[i] = Some(dev.size);
            let sample = Sample {
                guest: i,
                instructions: split.instructions,
                misses: split.misses,
                pages: split.pages_touched,
                dram_bytes: BOOT_MIB * MIB + dev.size,
            };
            row += &format!(
                "  {}: dram {:3}/{:3} MiB miss-dram {:>5} insn {:>6.1}M",
                g.name,
                dev.requested / MIB,
                dev.size / MIB,
                split.miss.map_or("-".into(), |m| format!("{:.2}", m)),
                split.instructions as f64 / 1e6
            );
            ticks.push(Tick { t, sample });
            devices.push(dev);
        }
        println!("{row}");
        if policy == Policy::Oracle {
            resizes += oracle_step(&mut guests, &devices, &overhead)?;
        }
    }
    let mut alive = true;
    let mut vmstat = Vec::new();
    for g in &mut guests {
        alive &= g.workload_alive()?;
        vmstat.push(g.vmstat()?);
    }
    if let Some(t) = tierd.as_mut() {
        t.stop();
    }
    if policy.tierd() {
        // Requests tierd made, as the device's requested size changed.
        resizes = count_requests(&ticks);
    }
    Ok(RunOut {
        policy,
        ticks,
        moved,
        resizes,
        alive: Some(alive),
        vmstat,
        repeat: 0,
    })
}

/// Changes of DRAM held between consecutive ticks of a guest.
pub fn count_requests(ticks: &[Tick]) -> usize {
    let mut last = std::collections::BTreeMap::new();
    let mut n = 0;
    for t in ticks {
        if let Some(prev) = last.insert(t.sample.guest, t.sample.dram_bytes) {
            n += usize::from(prev != t.sample.dram_bytes);
        }
    }
    n
}

fn dram_device(g: &mut Guest) -> anyhow::Result<tier_linux_bed::VirtioMem> {
    g.devices()?
        .into_iter()
        .find(|d| d.node == 0)
        .with_context(|| format!("guest {}: no virtio-mem device on node 0", g.name))
}

fn wait_plugged(guests: &mut [Guest], bytes: u64) -> anyhow::Result<()> {
    let until = Instant::now() + Duration::from_secs(120);
    for g in guests {
        loop {
            let d = dram_device(g)?;
            if d.size >= bytes {
                break;
            }
            anyhow::ensure!(
                Instant::now() < until,
                "guest {}: plugged {} MiB of {} after 120 s",
                g.name,
                d.size / MIB,
                bytes / MIB
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    Ok(())
}

/// The oracle's interval: split the budget by the last window's exact
/// per-page misses and request each guest's share of its DRAM device.
fn oracle_step(
    guests: &mut [Guest],
    devices: &[tier_linux_bed::VirtioMem],
    overhead: &[u64],
) -> anyhow::Result<usize> {
    let demands: Vec<Demand> = guests
        .iter()
        .zip(overhead)
        .map(|(g, &o)| Demand {
            page_misses: g.window_page_misses(),
            overhead: o,
            floor: BOOT_MIB * MIB,
            ceiling: (BOOT_MIB + REGION_MIB) * MIB,
        })
        .collect();
    if demands.iter().any(|d| d.page_misses.is_empty()) {
        return Ok(0);
    }
    let block = devices
        .iter()
        .map(|d| d.block)
        .max()
        .unwrap_or(2 * MIB)
        .max(1);
    let split = oracle_split(&demands, BUDGET, block)?;
    let plugs: Vec<u64> = devices
        .iter()
        .zip(&split)
        .map(|(d, want)| (want.saturating_sub(BOOT_MIB * MIB) / block * block).min(d.max))
        .collect();
    // All or none, so that the requests never sum above the budget.
    if !plugs
        .iter()
        .zip(devices)
        .any(|(p, d)| p.abs_diff(d.requested) >= ORACLE_HYSTERESIS)
    {
        return Ok(0);
    }
    let mut n = 0;
    for ((g, d), plug) in guests.iter_mut().zip(devices).zip(plugs) {
        if plug != d.requested {
            g.bed.qmp().resize(&d.id, plug)?;
            n += 1;
        }
    }
    Ok(n)
}
