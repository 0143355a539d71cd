//! The Linux bed as a fidelity source (docs/linux-bed.md): Debian's 6.12 cloud
//! kernel under QEMU TCG with two NUMA nodes, real Debian programs as
//! workloads, exact truth from the tier_truth plugin. The bench samples
//! QEMU with tierd's hostpte backend (TCG reaches guest RAM through
//! QEMU's own mappings of the backend files, so their host page-table
//! accessed bits see guest accesses).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tier_linux_bed::truth::Truth;
use tier_linux_bed::{Bed, Kernel};

use super::WorkloadError;
use super::linux_map::{Backend, QemuVm, tiers};

/// The guest's vCPUs: one, so that one host core of two stays free for
/// the sampler (TCG runs a thread per vCPU).
pub const VCPUS: u32 = 1;

/// A guest workload: shell lines that start it in the background.
#[derive(Debug, Clone)]
pub struct LinuxWorkload {
    pub name: &'static str,
    /// What runs, for the report.
    pub what: String,
    /// How its memory spans both nodes.
    pub placement: &'static str,
    pub start: String,
}

/// Host programs the workloads need, copied into the initramfs.
pub const PROGRAMS: [&str; 5] = [
    "redis-server",
    "redis-benchmark",
    "stress-ng",
    "sysbench",
    "numactl",
];

/// The four workloads; `kv` is the guest path's file name of kv_zipf.
pub fn workloads() -> Vec<LinuxWorkload> {
    let bg = |cmd: &str, log: &str| {
        format!("{cmd} </dev/null >/tmp/{log}.log 2>&1 &\necho $! >>/tmp/wl.pids\n")
    };
    vec![
        LinuxWorkload {
            name: "redis",
            what: "redis-server (no persistence, unix socket) + redis-benchmark SET/GET loop, 100k random keys, 256 B values, pipeline 8".into(),
            placement: "redis-server under numactl --interleave=0,1; the client local (node 0)",
            start: format!(
                "numactl --interleave=0,1 redis-server --save '' --appendonly no --daemonize yes --port 0 --unixsocket /tmp/redis.sock --dir /tmp --logfile /tmp/redis.log --pidfile /tmp/redis.pid\n\
                 sleep 2\ncat /tmp/redis.pid >>/tmp/wl.pids\n{}",
                bg(
                    "redis-benchmark -s /tmp/redis.sock -q -r 100000 -d 256 -n 100000000 -P 8 -c 4 -t set,get -l",
                    "redis-benchmark"
                )
            ),
        },
        LinuxWorkload {
            name: "stress-ng-vm",
            what: "stress-ng --vm, two workers of method rand-sum: 16 MiB bound to node 0, 48 MiB to node 1".into(),
            placement: "numactl --membind=0 and --membind=1, one worker each",
            start: format!(
                "{}{}",
                bg(
                    "numactl --membind=0 stress-ng --vm 1 --vm-bytes 16M --vm-keep --vm-method rand-sum --temp-path /tmp -t 0",
                    "stress0"
                ),
                bg(
                    "numactl --membind=1 stress-ng --vm 1 --vm-bytes 48M --vm-keep --vm-method rand-sum --temp-path /tmp -t 0",
                    "stress1"
                )
            ),
        },
        LinuxWorkload {
            name: "sysbench-mem",
            what: "sysbench memory, random writes over one 64 MiB block, one thread".into(),
            placement: "numactl --interleave=0,1",
            start: bg(
                "numactl --interleave=0,1 sysbench memory --threads=1 --memory-block-size=64M --memory-total-size=1000T --memory-access-mode=rnd --time=100000 run",
                "sysbench",
            ),
        },
        LinuxWorkload {
            name: "kv-zipf",
            what: "kv_zipf: 200k keys, 128 B values, Zipf 0.99 GET/SET 9:1 (vmm-patch/harness/linux-bed/guest/kv_zipf.c)".into(),
            placement: "numactl --interleave=0,1",
            start: bg(
                "numactl --interleave=0,1 kv_zipf 200000 0.99 100000 128",
                "kv",
            ),
        },
    ]
}

/// The fixed work timed with and without the plugin (its cost).
pub const COST_WORK: &str = "sysbench memory --threads=1 --memory-block-size=1M --memory-total-size=2G --memory-access-mode=seq run >/dev/null";

/// `name` on the host's PATH.
pub fn which(name: &str) -> Result<PathBuf, WorkloadError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            WorkloadError::Linux(format!(
                "{name} not on PATH (cargo xtask deps installs redis-server redis-tools stress-ng sysbench numactl)"
            ))
        })
}

/// The 6.12 kernel among `TIERD_BED_KERNELS` (6.12 puts the nodes in two
/// memory tiers from HMAT; 6.1 keeps one).
pub fn kernel() -> Result<Kernel, WorkloadError> {
    let list = std::env::var("TIERD_BED_KERNELS").map_err(|_| {
        WorkloadError::Linux(
            "TIERD_BED_KERNELS unset: run `cargo xtask bench fidelity -- --source linux`".into(),
        )
    })?;
    list.split(':')
        .filter(|p| !p.is_empty())
        .filter_map(|p| Kernel::unpacked(Path::new(p)).ok())
        .find(|k| k.series() == "6.12")
        .ok_or_else(|| WorkloadError::Linux(format!("no 6.12 kernel in TIERD_BED_KERNELS={list}")))
}

/// A path from the environment variable `var`.
pub fn env_path(var: &str) -> Result<PathBuf, WorkloadError> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| {
            WorkloadError::Linux(format!(
                "{var} unset: run `cargo xtask bench fidelity -- --source linux`"
            ))
        })
}

fn bed_err(e: tier_linux_bed::BedError) -> WorkloadError {
    WorkloadError::Linux(e.to_string())
}

/// A booted bed guest, its truth file (with the plugin) and its backends.
#[derive(Debug)]
pub struct LinuxBed {
    // Dropped first: QEMU ends before its files go.
    bed: Bed,
    truth: Option<Truth>,
    truth_path: PathBuf,
    backends: Vec<Backend>,
    _work: tempfile::TempDir,
}

impl LinuxBed {
    /// Boots `kernel` with `programs` in /opt/bin, with the truth plugin
    /// `plugin` if given.
    pub fn boot(
        kernel: &Kernel,
        programs: &[PathBuf],
        plugin: Option<&Path>,
    ) -> Result<LinuxBed, WorkloadError> {
        let work = tempfile::Builder::new()
            .prefix("tier-fidelity-linux-")
            .tempdir()
            .map_err(|e| WorkloadError::Linux(format!("work directory: {e}")))?;
        let (mut machine, log) =
            tier_linux_bed::prepare(kernel, programs, work.path()).map_err(bed_err)?;
        machine.cpus = VCPUS;
        let truth_path = machine.backends.with_extension("truth");
        if let Some(so) = plugin {
            machine.plugin = Some(machine.truth_plugin(so, &truth_path));
        }
        let bed = Bed::start(&machine, &log, tier_linux_bed::BOOT_TIMEOUT).map_err(bed_err)?;
        let truth = match plugin {
            Some(_) => Some(
                Truth::open(&truth_path)
                    .map_err(|e| WorkloadError::Linux(format!("truth file: {e}")))?,
            ),
            None => None,
        };
        let backends = machine
            .layout()
            .into_iter()
            .map(|(id, gpa, len)| Backend {
                file: machine.backend(&id),
                id,
                gpa,
                len,
            })
            .collect();
        Ok(LinuxBed {
            bed,
            truth,
            truth_path,
            backends,
            _work: work,
        })
    }

    pub fn pid(&self) -> u32 {
        self.bed.pid()
    }

    pub fn boot_time(&self) -> Duration {
        self.bed.boot_time()
    }

    pub fn truth(&self) -> Option<&Truth> {
        self.truth.as_ref()
    }

    /// QEMU as tierd's registry is to see it, its tiers from its maps.
    pub fn tracked(&self) -> Result<QemuVm, WorkloadError> {
        let pid = self.pid();
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .map_err(|e| WorkloadError::Linux(format!("/proc/{pid}/maps: {e}")))?;
        Ok(QemuVm::new(pid, tiers(&maps, &self.backends)?, VCPUS))
    }

    /// Guest-physical ranges [(start, len)] of node 0 and node 1.
    pub fn node_ranges(&self) -> [Vec<(u64, u64)>; 2] {
        [0, 1].map(|n| {
            self.backends
                .iter()
                .filter(|b| b.node() == Some(n))
                .map(|b| (b.gpa, b.len))
                .collect()
        })
    }

    /// Runs `cmd` in the guest; a non-zero exit is an error.
    pub fn sh(&mut self, cmd: &str, timeout: Duration) -> Result<String, WorkloadError> {
        self.bed.sh(cmd, timeout).map_err(bed_err)
    }

    /// Starts `w` in the background; Err if it died within a second.
    pub fn start(&mut self, w: &LinuxWorkload) -> Result<(), WorkloadError> {
        self.sh("rm -f /tmp/wl.pids", Duration::from_secs(30))?;
        // Through a script file: the console takes lines under 4096 bytes.
        let script = format!("cat >/tmp/wl.sh <<'EOF'\n{}EOF\nsh /tmp/wl.sh", w.start);
        self.sh(&script, Duration::from_secs(120))?;
        let alive = self.sh(
            "sleep 1; for p in $(cat /tmp/wl.pids); do kill -0 $p 2>/dev/null || echo dead $p; done",
            Duration::from_secs(60),
        )?;
        if alive.contains("dead") {
            let logs = self.sh("tail -n 5 /tmp/*.log", Duration::from_secs(30))?;
            return Err(WorkloadError::Linux(format!(
                "workload {} stopped at once: {alive}\n{logs}",
                w.name
            )));
        }
        Ok(())
    }

    /// Stops the running workload (everything it started, by PID, then by
    /// name in the guest, a throwaway VM) and returns its logs' last lines.
    pub fn stop(&mut self) -> Result<String, WorkloadError> {
        let out = self.sh(
            "for p in $(cat /tmp/wl.pids 2>/dev/null); do kill $p 2>/dev/null; done; \
             killall -q redis-benchmark redis-server stress-ng sysbench kv_zipf; sleep 2; \
             killall -q -9 redis-benchmark redis-server stress-ng sysbench kv_zipf; \
             tail -n 3 /tmp/*.log 2>/dev/null; rm -f /tmp/*.log; true",
            Duration::from_secs(120),
        )?;
        Ok(out)
    }

    /// Host wall time of `cmd` run to its end in the guest.
    pub fn time(&mut self, cmd: &str, timeout: Duration) -> Result<Duration, WorkloadError> {
        let t0 = std::time::Instant::now();
        self.sh(cmd, timeout)?;
        Ok(t0.elapsed())
    }
}

impl Drop for LinuxBed {
    fn drop(&mut self) {
        // QEMU (ended by the Bed, by PID) keeps its mapping; the name goes.
        let _ = std::fs::remove_file(&self.truth_path);
    }
}
