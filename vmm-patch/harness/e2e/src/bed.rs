//! One Linux guest of the QEMU loop and the value bench: Debian's 6.12 under QEMU TCG on the
//! Linux bed with the truth plugin, its own tiering on, a workload from
//! tier-bed-agent, and what it did each interval by the plugin's counts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use tier_linux_bed::truth::{Snapshot, Truth};
use tier_linux_bed::{Bed, Kernel, Machine, VirtioMem};
use tier_proto::v1::*;

pub const MIB: u64 = 1 << 20;
/// Each guest's DRAM node: 128 MiB of boot memory and a virtio-mem device
/// of up to 256 MiB plugging 64 at first; its slow node the same.
pub const BOOT_MIB: u64 = 128;
pub const PLUGGED_MIB: u64 = 64;
pub const REGION_MIB: u64 = 256;
/// What a guest keeps touching while it idles.
pub const IDLE_MIB: u64 = 16;
/// The hot set is the working set within this many seconds.
pub const HOT_HORIZON_S: f64 = 5.0;

const CMD: Duration = Duration::from_secs(60);

/// The guest's /proc/vmstat counters of its own tiering.
pub const TIERING: &[&str] = &[
    "pgpromote_success",
    "pgdemote_kswapd",
    "pgdemote_direct",
    "numa_hint_faults",
    "oom_kill",
];

/// One interval of a guest by exact counts.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Split {
    /// Share of memory accesses that touched DRAM (node 0 pages).
    pub touch: Option<f64>,
    /// Share of LLC misses served by DRAM.
    pub miss: Option<f64>,
    pub touches: u64,
    /// Distinct pages touched in the last [`WS_SECS`] seconds (the truth
    /// of the hot set at the controller's horizon), bytes.
    pub ws_bytes: u64,
    /// Instructions the guest executed in the interval.
    pub instructions: u64,
    /// LLC misses to node 0 (DRAM) and node 1 (slow) pages.
    pub misses: [u64; 2],
    /// Distinct pages touched on node 0 and node 1.
    pub pages_touched: [u64; 2],
}

/// The hot horizon the truth's working set is taken over.
pub const WS_SECS: f64 = 5.0;

#[derive(Debug)]
pub struct Guest {
    pub name: String,
    pub bed: Bed,
    pub machine: Machine,
    truth: Truth,
    truth_file: PathBuf,
    last: Snapshot,
    /// Recent snapshots and when they were taken, oldest first.
    history: std::collections::VecDeque<(std::time::Instant, Snapshot)>,
    /// The counts of the last [`WS_SECS`] seconds, as of the last interval.
    window: Option<Snapshot>,
}

/// Guests "a" and "b" as the closed loop and the value bench run them:
/// each node `BOOT_MIB` of boot memory and a virtio-mem device plugging
/// `PLUGGED_MIB` of `REGION_MIB`, a QMP socket for tierd in `work/qmp`.
/// Both boot at once: TCG boots take 20 s each here.
pub fn boot_pair(
    kernel: &Kernel,
    agent: &Path,
    plugin: &Path,
    work: &Path,
) -> anyhow::Result<Vec<Guest>> {
    let qmp_dir = work.join("qmp");
    std::fs::create_dir_all(&qmp_dir).context("creating the QMP directory")?;
    let boot = |name: &'static str| {
        let qmp = qmp_dir.join(format!("{name}.qmp"));
        Guest::boot(name, kernel, agent, plugin, &work.join(name), |m| {
            for node in &mut m.nodes {
                node.mib = BOOT_MIB;
                node.vmem_max_mib = REGION_MIB;
                node.vmem_mib = PLUGGED_MIB;
            }
            // tierd's own QMP socket (the bed keeps its own connection).
            m.extra_args = vec![
                "-qmp".into(),
                format!("unix:{},server=on,wait=off", qmp.display()),
            ];
        })
    };
    let (a, b) = std::thread::scope(|s| {
        let b = s.spawn(|| boot("b"));
        let a = boot("a");
        (
            a,
            b.join().map_err(|_| anyhow::anyhow!("booting b panicked")),
        )
    });
    Ok(vec![a?, b??])
}

impl Guest {
    /// Boots `kernel` with tier-bed-agent and the truth plugin; `machine`
    /// edits the bed's default machine first.
    pub fn boot(
        name: &str,
        kernel: &Kernel,
        agent: &Path,
        plugin: &Path,
        work: &Path,
        machine: impl FnOnce(&mut Machine),
    ) -> anyhow::Result<Guest> {
        let (mut m, log) = tier_linux_bed::prepare(kernel, &[agent.to_path_buf()], work)
            .with_context(|| format!("guest {name}: preparing"))?;
        machine(&mut m);
        let truth_file = m.backends.with_extension("truth");
        m.plugin = Some(m.truth_plugin(plugin, &truth_file));
        let bed = Bed::start(&m, &log, tier_linux_bed::BOOT_TIMEOUT)
            .with_context(|| format!("guest {name}: booting"))?;
        let truth = Truth::open(&truth_file).with_context(|| format!("guest {name}: truth"))?;
        let last = truth.snapshot();
        Ok(Guest {
            name: name.into(),
            bed,
            machine: m,
            truth,
            truth_file,
            last,
            history: std::collections::VecDeque::new(),
            window: None,
        })
    }

    /// The guest's own tiering: demotion to node 1 and NUMA-balancing
    /// promotion of hot node-1 pages into free node-0 memory.
    pub fn enable_tiering(&mut self) -> anyhow::Result<()> {
        self.bed
            .sh(
                "echo 1 > /sys/kernel/mm/numa/demotion_enabled && \
                 echo 2 > /proc/sys/kernel/numa_balancing",
                CMD,
            )
            .map(drop)
            .context("enabling the guest's tiering")
    }

    /// Starts touching `mib` MiB in the background; with `grow`, only
    /// `grow.0` MiB of it until `grow.1` seconds from now.
    pub fn touch(&mut self, mib: u64, grow: Option<(u64, u64)>) -> anyhow::Result<()> {
        self.touch_stride(mib, grow, None)
    }

    /// [`Guest::touch`] writing every `stride` bytes of a pass (default: a
    /// page).
    pub fn touch_stride(
        &mut self,
        mib: u64,
        grow: Option<(u64, u64)>,
        stride: Option<u64>,
    ) -> anyhow::Result<()> {
        let g = grow.map_or(String::new(), |(h, s)| {
            format!(" --hot-mib {h} --grow-after-s {s}")
        });
        let st = stride.map_or(String::new(), |s| format!(" --stride {s}"));
        self.bed
            .sh(
                &format!("tier-bed-agent touch --mib {mib}{g}{st} > /tmp/touch-{mib}.log 2>&1 &"),
                CMD,
            )
            .map(drop)
            .context("starting the workload")
    }

    /// Whether a workload instance still runs (none was OOM-killed).
    pub fn workload_alive(&mut self) -> anyhow::Result<bool> {
        let (rc, _) = self.bed.sh_rc("pidof tier-bed-agent", CMD)?;
        Ok(rc == 0)
    }

    /// Bytes of guest-physical memory of each backend id (layout).
    fn ranges(&self, prefix: &str) -> Vec<(u64, u64)> {
        self.machine
            .layout()
            .into_iter()
            .filter(|(id, _, _)| id.ends_with(prefix))
            .map(|(_, gpa, len)| (gpa, len))
            .collect()
    }

    /// What the guest did since the previous call, by exact counts.
    pub fn interval(&mut self) -> anyhow::Result<Split> {
        let now = self.truth.snapshot();
        let d = now.since(&self.last).context("truth snapshot")?;
        let at = std::time::Instant::now();
        while self
            .history
            .get(1)
            .is_some_and(|(t, _)| at.duration_since(*t).as_secs_f64() >= WS_SECS)
        {
            self.history.pop_front();
        }
        self.window = match self.history.front() {
            Some((_, old)) => Some(now.since(old).context("truth snapshot")?),
            None => None,
        };
        let ws_bytes = self
            .window
            .as_ref()
            .map_or(0, |w| w.total().pages_touched * tier_linux_bed::truth::PAGE);
        self.history.push_back((at, now.clone()));
        self.last = now;
        let sum = |node: &str| {
            self.ranges(node)
                .into_iter()
                .map(|(g, l)| d.sum_in(g, l))
                .fold((0u64, 0u64, 0u64), |a, s| {
                    (a.0 + s.touches, a.1 + s.misses, a.2 + s.pages_touched)
                })
        };
        let (dt, dm, dp) = sum("0");
        let (st, sm, sp) = sum("1");
        let share = |a: u64, b: u64| (a + b > 0).then(|| a as f64 / (a + b) as f64);
        Ok(Split {
            touch: share(dt, st),
            miss: share(dm, sm),
            touches: dt + st,
            ws_bytes,
            instructions: d.counters.instructions,
            misses: [dm, sm],
            pages_touched: [dp, sp],
        })
    }

    /// LLC misses per guest page over the last [`WS_SECS`] seconds, as of
    /// the last [`Guest::interval`] (empty before a window has passed).
    pub fn window_page_misses(&self) -> Vec<u64> {
        self.window
            .as_ref()
            .map_or(Vec::new(), |w| w.misses.clone())
    }

    /// Turns the guest's own tiering off: no demotion, no NUMA balancing
    /// (pages stay on the node the kernel first gave them).
    pub fn disable_tiering(&mut self) -> anyhow::Result<()> {
        self.bed
            .sh(
                "echo 0 > /sys/kernel/mm/numa/demotion_enabled && \
                 echo 0 > /proc/sys/kernel/numa_balancing",
                CMD,
            )
            .map(drop)
            .context("disabling the guest's tiering")
    }

    /// Bytes in use on guest node `node` (its meminfo's MemUsed).
    pub fn node_used(&mut self, node: u32) -> anyhow::Result<u64> {
        let out = self.bed.sh(
            &format!("cat /sys/devices/system/node/node{node}/meminfo"),
            CMD,
        )?;
        out.lines()
            .find_map(|l| {
                let rest = l.split_once("MemUsed:")?.1;
                rest.split_whitespace().next()?.parse::<u64>().ok()
            })
            .map(|kib| kib * 1024)
            .with_context(|| format!("no MemUsed in node{node}'s meminfo: {out}"))
    }

    /// The virtio-mem devices as QEMU reports them.
    pub fn devices(&mut self) -> anyhow::Result<Vec<VirtioMem>> {
        Ok(self.bed.qmp().virtio_mem()?)
    }

    /// The guest's tiering counters ([`TIERING`]).
    pub fn vmstat(&mut self) -> anyhow::Result<BTreeMap<String, u64>> {
        let out = self.bed.sh("cat /proc/vmstat", CMD)?;
        Ok(out
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(k, _)| TIERING.contains(k))
            .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
            .collect())
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.truth_file);
    }
}

/// tierd's config: hostpte on the QEMU processes found through the QMP
/// sockets in `qmp_dir` only (no other VMM of this host), node 0 DRAM and
/// node 1 CXL, the controller on.
pub fn tierd_config(work: &Path, qmp_dir: &Path) -> String {
    format!(
        "socket = {socket:?}\n\
         socket_mode = \"0600\"\n\
         interval_ms = 1000\n\
         backend = \"hostpte\"\n\
         [sampler]\n\
         cpu_budget_pct = 0\n\
         ws_horizons_s = [1, 5]\n\
         ws_sweep_s = 5\n\
         ws_sweep_every_s = 10\n\
         [tier_kinds]\n\
         node0 = \"dram\"\n\
         node1 = \"cxl\"\n\
         [metrics]\n\
         listen = \"\"\n\
         [discovery]\n\
         ch_api_dir = \"\"\n\
         ch_cmdline = false\n\
         kvm_fd = false\n\
         qemu_qmp = [{glob:?}]\n\
         [controller]\n\
         enabled = true\n",
        socket = work.join("tierd.sock").display().to_string(),
        glob = qmp_dir.join("*.qmp").display().to_string(),
    )
}

/// The controller's policy in `mode` (`ratio`, `working-set`) for `vms`
/// under a host DRAM `budget`; no guest's DRAM goes below its boot memory.
pub fn policy(mode: &str, vms: &[&str], budget: u64) -> anyhow::Result<Policy> {
    let mode = match mode {
        "ratio" => PolicyMode::Ratio,
        "working-set" => PolicyMode::WorkingSet,
        m => anyhow::bail!("--mode {m:?}: give ratio or working-set"),
    };
    Ok(Policy {
        enabled: true,
        dry_run: false,
        default_target: 0.9,
        epsilon: 0.05,
        host_dram_budget_bytes: budget,
        max_step_bytes: 128 * MIB,
        cooldown_intervals: 1,
        idle_threshold: 0.3,
        vms: vms
            .iter()
            .map(|v| VmPolicy {
                vm: (*v).into(),
                limits: vec![TierLimits {
                    tier: "node0".into(),
                    floor_bytes: BOOT_MIB * MIB,
                    ceiling_bytes: 0,
                }],
                ..Default::default()
            })
            .collect(),
        mode: mode as i32,
        hot_horizon_seconds: HOT_HORIZON_S,
        promotion_slo: 0.0,
        // tierd's default (docs/controller.md, "Reclaim on demand"); the
        // value bench sets it per policy.
        reclaim: ReclaimMode::Eager as i32,
    })
}
