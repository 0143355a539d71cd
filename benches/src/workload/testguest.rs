//! The PVH test guest under the patched cloud-hypervisor as a workload
//! source: one VM per row (booted by `tier_e2e::vmm`, the e2e's launcher)
//! with a `sys` zone for the guest's own memory and a `dram` and a `slow`
//! zone for its work pages, its phases fixed at boot and timed in RTC
//! seconds (`guest_plan`). tierd's own cloud-hypervisor discovery
//! (`tier_profiler::ch::ChDiscovery`, slow zone overridden to CXL as the
//! e2e's tierd does) puts it in the registry and refreshes it each
//! interval, so its guest-reported numbers come from the balloon stats
//! queue exactly as in tierd. The truth is the guest's own counters, read
//! from its memory at each instant asked (`guest_truth`), and for the
//! working set its page stamps (`guest_ws`); the guest paces
//! its accesses evenly to [`RATE`] and prints nothing while it runs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tier_e2e::vmm::{ChVm, VmSpec};
use tier_profiler::ch::{ChConfig, ChDiscovery, Fleet};
use tier_profiler::discovery::{self, KvmFd};
use tier_profiler::registry::Registry;
use tier_proto::v1::TierKind;

use super::guest_plan::{self, GuestPlan, WORK};
use super::guest_truth::{TruthReader, WATCH, Watcher};
use super::guest_ws::touched_band;
use super::serial::Follower;
use super::{RowStart, Schedule, Shape, Truth, WorkloadError, WorkloadSource};

/// Work zone sizes [dram, slow]: room for 4096-page hot sets.
pub const ZONE_MIB: [u64; 2] = [32, 32];
/// The first zone, where the guest is loaded and keeps its own memory
/// (image, page tables, stack, rings, bitmaps, hot-set arrays).
pub const SYS_MIB: u64 = 8;
/// Accesses per second of every row, paced. Each re-arm makes the guest
/// fault on every page it touches again, a few hundred microseconds each
/// under this nested KVM, so rows with thousands of hot pages fall short
/// (4-6 k/s, slowest right after a re-arm). 3 k/s was tried too: the large
/// rows still fell short (2-2.5 k/s), and the 64-page rows left the
/// saturated regime for the noisy edge of it (p95 4.5 pp against 3.5).
pub const RATE: u64 = 10_000;
const READY_TIMEOUT: Duration = Duration::from_secs(20);
const ADOPT_TIMEOUT: Duration = Duration::from_secs(5);

/// One row's VM.
#[derive(Debug)]
struct Row {
    vm: ChVm,
    follower: Follower,
    truth: Arc<TruthReader>,
    watcher: Watcher,
    vm_id: String,
    plan: GuestPlan,
    b1: SystemTime,
    steps: usize,
    /// The work zones' page stamps as read at an instant ([`Self::mark`]).
    marked: Option<(Instant, [Vec<u64>; 2])>,
}

impl Row {
    /// The work zones' page stamps, read now.
    fn stamps(&self) -> Option<[Vec<u64>; 2]> {
        let t = self.truth.read().ok()?;
        let read = |z: usize| {
            let zone = t.stamps.get(z).filter(|s| s.pages > 0)?;
            self.truth.stamps(zone).ok()
        };
        Some([read(WORK[0])?, read(WORK[1])?])
    }
}

#[derive(Debug)]
struct State {
    rows: usize,
    discovery: ChDiscovery,
    kvm: Vec<KvmFd>,
    row: Option<Row>,
}

/// Test guests booted here, one per row, stopped by PID.
#[derive(Debug)]
pub struct TestGuestSource {
    // Dropped in this order: a running VM stops before its directory goes.
    state: Mutex<State>,
    rt: tokio::runtime::Runtime,
    dir: tempfile::TempDir,
    ch_bin: PathBuf,
    guest: PathBuf,
}

impl TestGuestSource {
    /// Checks the binaries and prepares a work directory; no VM yet.
    pub fn new(ch_bin: &Path, guest: &Path) -> Result<TestGuestSource, WorkloadError> {
        for (what, p) in [("cloud-hypervisor", ch_bin), ("test guest ELF", guest)] {
            if !p.is_file() {
                return Err(WorkloadError::Guest(format!(
                    "{what} {}: no such file",
                    p.display()
                )));
            }
        }
        let io = |e: std::io::Error| WorkloadError::Guest(format!("work directory: {e}"));
        let dir = tempfile::Builder::new()
            .prefix("tier-fidelity-")
            .tempdir()
            .map_err(io)?;
        std::fs::create_dir(dir.path().join("api")).map_err(io)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| WorkloadError::Guest(format!("tokio runtime: {e}")))?;
        // The guest's own memory is DRAM; its own tier keeps it out of
        // the `dram` tier, whose pages are then exactly the work pages.
        let overrides = HashMap::from([
            ("sys".to_string(), TierKind::Dram),
            ("slow".to_string(), TierKind::Cxl),
        ]);
        let discovery = ChDiscovery::new(
            ChConfig {
                api_dir: Some(dir.path().join("api")),
                cmdline: false,
                timeout: Duration::from_secs(1),
                memtier_root: tier_profiler::memtier::SYSFS.into(),
            },
            Path::new("/proc"),
            overrides,
            Fleet::default(),
        );
        Ok(TestGuestSource {
            ch_bin: ch_bin.to_path_buf(),
            guest: guest.to_path_buf(),
            dir,
            rt,
            state: Mutex::new(State {
                rows: 0,
                discovery,
                kvm: Vec::new(),
                row: None,
            }),
        })
    }

    fn state(&self) -> Result<std::sync::MutexGuard<'_, State>, WorkloadError> {
        self.state
            .lock()
            .map_err(|_| WorkloadError::Guest("state lock poisoned".into()))
    }

    /// Every guest line of the current row so far.
    pub fn lines(&self) -> Vec<super::serial::Seen> {
        self.state()
            .ok()
            .and_then(|s| s.row.as_ref().map(|r| r.follower.lines()))
            .unwrap_or_default()
    }

    /// Boots, waits for the driver, adopts the VM into `reg` and for the
    /// guest's first RTC second change.
    fn boot(
        &self,
        st: &mut State,
        plan: GuestPlan,
        steps: usize,
        reg: &mut Registry,
    ) -> Result<Row, WorkloadError> {
        let name = format!("row{}", st.rows);
        let spec = VmSpec {
            name: name.clone(),
            zones: vec![
                ("sys".into(), SYS_MIB),
                ("dram".into(), ZONE_MIB[0]),
                ("slow".into(), ZONE_MIB[1]),
            ],
            cmdline: plan.params.to_cmdline(),
            vhost_user: None,
            hotplug: None,
        };
        let gerr = |e: anyhow::Error| WorkloadError::Guest(format!("{name}: {e:#}"));
        let mut vm = ChVm::boot(
            &spec,
            &self.ch_bin,
            &self.guest,
            &self.dir.path().join("api"),
            self.dir.path(),
        )
        .map_err(gerr)?;
        let follower = Follower::start(vm.serial.clone());
        self.rt
            .block_on(vm.wait_ready(READY_TIMEOUT))
            .map_err(gerr)?;
        st.kvm = discovery::scan(Path::new("/proc"))
            .into_iter()
            .filter(|k| k.pid == vm.pid())
            .collect();
        let Some(&key) = st.kvm.first() else {
            return Err(WorkloadError::Guest(format!(
                "{name}: process {} holds no kvm-vm fd",
                vm.pid()
            )));
        };
        let vm_id = format!("ch:{}:{}", key.pid, key.fd);
        let start = Instant::now();
        while !reg.contains(&vm_id) {
            {
                let _rt = self.rt.enter();
                st.discovery.run(reg, &st.kvm);
            }
            if start.elapsed() > ADOPT_TIMEOUT {
                return Err(WorkloadError::Guest(format!(
                    "{name}: tierd's cloud-hypervisor discovery did not adopt {vm_id} in {ADOPT_TIMEOUT:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let vm_desc = reg
            .iter()
            .find(|t| t.vm().id == vm_id)
            .map(|t| t.vm().clone())
            .ok_or_else(|| WorkloadError::Guest(format!("{name}: {vm_id} left the registry")))?;
        let gpa = follower
            .find(|s| s.line.kind == "ready")
            .and_then(|s| s.line.u64("truth"))
            .ok_or_else(|| WorkloadError::Guest(format!("{name}: no truth= on the ready line")))?;
        let truth = Arc::new(
            TruthReader::open(&vm_desc, gpa)
                .map_err(|e| WorkloadError::Guest(format!("{name}: {e}")))?,
        );
        let watcher = Watcher::start(Arc::clone(&truth));
        let start = Instant::now();
        let b1 = loop {
            if let Some(c) = watcher.find(|c| c.seconds >= 1) {
                break guest_plan::first_change(c.wall, c.seconds);
            }
            if let Some(e) = follower.find(|s| s.line.kind == "error") {
                return Err(WorkloadError::Guest(format!("{name}: {:?}", e.line)));
            }
            if let Some(e) = watcher.error() {
                return Err(WorkloadError::Guest(format!("{name}: {e}")));
            }
            if start.elapsed() > Duration::from_secs(3) {
                return Err(WorkloadError::Guest(format!(
                    "{name}: the guest counted no RTC second within 3 s of ready"
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        Ok(Row {
            vm,
            follower,
            truth,
            watcher,
            vm_id,
            plan,
            b1,
            steps,
            marked: None,
        })
    }
}

/// The instant of wall-clock time `wall` (this process's clocks).
fn instant_of(wall: SystemTime) -> Instant {
    let (now, now_wall) = (Instant::now(), SystemTime::now());
    match wall.duration_since(now_wall) {
        Ok(ahead) => now + ahead,
        Err(e) => now.checked_sub(e.duration()).unwrap_or(now),
    }
}

fn signed_secs(a: SystemTime, b: SystemTime) -> f64 {
    match a.duration_since(b) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

impl WorkloadSource for TestGuestSource {
    fn describe(&self) -> String {
        format!(
            "PVH test guest ({}) under {} (1 vCPU, zones sys {} MiB (the guest's own memory, its own tier, not scored) + dram {} MiB + slow {} MiB, shared=on,prefault=on, one NUMA node each, --balloon tiers=on,stats=on), one VM per workload, phases in RTC seconds",
            self.guest.display(),
            self.ch_bin.display(),
            SYS_MIB,
            ZONE_MIB[0],
            ZONE_MIB[1]
        )
    }

    fn guest_reported_kind(&self) -> String {
        "the balloon stats queue (per-tier TIER_ACCESSES, returned by the device every 1 s) \
         through vm.counters, as tierd's cloud-hypervisor discovery reads it once per interval \
         (TrackedVm::guest_reported_accesses of profiler::ch::tracked::ChVm)"
            .to_string()
    }

    fn capacity(&self) -> [u32; 2] {
        // The guest allocates nothing of its own in the work zones.
        ZONE_MIB.map(|mib| u32::try_from(mib * 256).unwrap_or(u32::MAX))
    }

    fn begin_row(
        &self,
        steps: &[Shape],
        schedule: &Schedule,
        reg: &mut Registry,
    ) -> Result<RowStart, WorkloadError> {
        let cap = self.capacity();
        for s in steps {
            if s.dram_pages > cap[0] || s.slow_pages > cap[1] {
                return Err(WorkloadError::Shape {
                    shape: s.label(),
                    why: format!("the zones hold {} + {} work pages", cap[0], cap[1]),
                });
            }
        }
        let mut st = self.state()?;
        st.rows += 1;
        let plan = guest_plan::plan(steps, schedule, RATE, st.rows as u64)?;
        let row = self.boot(&mut st, plan, steps.len(), reg)?;
        let t0 = row.b1 + row.plan.start_after_b1;
        let start = RowStart {
            t0: instant_of(t0),
            vm_id: row.vm_id.clone(),
        };
        st.row = Some(row);
        Ok(start)
    }

    fn change(&self, _step: usize) -> Result<(), WorkloadError> {
        Ok(())
    }

    fn discover(&self, reg: &mut Registry) {
        let Ok(mut st) = self.state() else {
            return;
        };
        let st = &mut *st;
        let _rt = self.rt.enter();
        st.discovery.run(reg, &st.kvm);
    }

    /// The counters now: called right after the tick, microseconds after
    /// `at`.
    fn truth_at(&self, _at: Instant) -> Result<Truth, WorkloadError> {
        let st = self.state()?;
        let row = st
            .row
            .as_ref()
            .ok_or_else(|| WorkloadError::Guest("no row running".into()))?;
        let t = row
            .truth
            .read()
            .map_err(|e| WorkloadError::Guest(format!("{}: {e}", row.vm_id)))?;
        Ok(Truth {
            rounds: 0,
            accesses: [t.acc[WORK[0]], t.acc[WORK[1]]],
        })
    }

    fn end_row(&self, reg: &mut Registry) -> Result<Vec<f64>, WorkloadError> {
        let mut st = self.state()?;
        let Some(mut row) = st.row.take() else {
            return Ok(Vec::new());
        };
        let mut offsets = Vec::new();
        for step in 1..row.steps {
            let n = step as u64;
            match row.watcher.find(|c| c.phase == n) {
                Some(c) => offsets.push(signed_secs(c.wall, row.plan.change_wall(row.b1, step))),
                None => {
                    return Err(WorkloadError::Guest(format!(
                        "{}: the guest never reached phase {n}",
                        row.vm_id
                    )));
                }
            }
        }
        let id = row.vm_id.clone();
        reg.retire(|v| v.vm().id == id);
        row.vm.stop();
        let _ = std::fs::remove_file(&row.vm.socket);
        Ok(offsets)
    }

    fn vcpu_threads(&self) -> (u32, Vec<i32>) {
        let pid = self
            .state()
            .ok()
            .and_then(|s| s.row.as_ref().map(|r| r.vm.pid()))
            .unwrap_or(0);
        (pid, Vec::new())
    }

    fn overhead_pages(&self) -> [u32; 2] {
        // All of it is in the sys zone.
        [0, 0]
    }

    /// The stamps at `at`: every touch after it is one more page of the
    /// truth's band that may or may not have been touched inside a window,
    /// and the hottest pages are touched every few milliseconds.
    fn mark(&self, at: Instant) {
        let Ok(mut st) = self.state() else {
            return;
        };
        if let Some(row) = st.row.as_mut() {
            row.marked = row.stamps().map(|s| (at, s));
        }
    }

    /// From the guest's page stamps of the two work zones, as marked at
    /// `at` (else read now), and its access count logged every
    /// millisecond: a band a few pages wide (`guest_ws`). None before the
    /// log reaches `at - horizon`.
    fn touched_within(&self, at: Instant, horizon: Duration) -> Option<[(u64, u64); 2]> {
        let st = self.state().ok()?;
        let row = st.row.as_ref()?;
        let since = row.watcher.count_at(at.checked_sub(horizon)?)?;
        // `at` has just passed: the watcher's next read brackets it.
        let deadline = Instant::now() + Duration::from_millis(50);
        let until = loop {
            match row.watcher.count_at(at) {
                Some(c) => break c,
                None if Instant::now() < deadline => std::thread::sleep(WATCH),
                None => return None,
            }
        };
        let now;
        let stamps = match &row.marked {
            Some((m, s)) if *m == at => s,
            _ => {
                now = row.stamps()?;
                &now
            }
        };
        Some([0, 1].map(|t| touched_band(&stamps[t], since, until)))
    }

    fn check(&self) -> Result<(), WorkloadError> {
        let st = self.state()?;
        let Some(row) = st.row.as_ref() else {
            return Ok(());
        };
        if let Some(e) = row
            .follower
            .find(|s| matches!(s.line.kind.as_str(), "error" | "halted"))
        {
            return Err(WorkloadError::Guest(format!(
                "{}: {} {:?}",
                row.vm_id, e.line.kind, e.line.fields
            )));
        }
        if let Some(e) = row.watcher.error() {
            return Err(WorkloadError::Guest(format!("{}: {e}", row.vm_id)));
        }
        // A VMM that exited keeps its PID as a zombie until reaped; its
        // kvm-vm fd is gone at once.
        let alive = st
            .kvm
            .first()
            .is_some_and(|k| discovery::kvm_fd_alive(Path::new("/proc"), *k));
        if !alive {
            return Err(WorkloadError::Guest(format!(
                "{}: the VMM exited",
                row.vm_id
            )));
        }
        Ok(())
    }
}
