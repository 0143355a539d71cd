//! The raw-KVM demo VM as a workload source: it switches shapes when the
//! run loop says so, and its guest-reported numbers are its exact counters.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tier_profiler::demo_vm::tracked::DemoTracked;
use tier_profiler::demo_vm::{DRAM_WORK_GPA, DemoVm, DemoVmConfig, DemoVmError, PAGE_SIZE, Phase};
use tier_profiler::registry::{Registry, TrackedVm};
use tier_proto::v1::TierKind;

use super::{RowStart, Schedule, Shape, Skew, Truth, WorkloadError, WorkloadSource};

/// The raw-KVM demo VM of `tier_profiler::demo_vm`, in this process.
#[derive(Debug)]
pub struct DemoSource {
    vm: Arc<DemoTracked>,
    capacity: [u32; 2],
    /// The steps of the row being run.
    row: Mutex<Vec<Shape>>,
}

impl DemoSource {
    /// Starts a demo VM with `dram_bytes` / `slow_bytes` regions running `shape`.
    pub fn start(
        dram_bytes: u64,
        slow_bytes: u64,
        shape: Shape,
    ) -> Result<DemoSource, WorkloadError> {
        let demo = DemoVm::start(DemoVmConfig {
            dram_bytes,
            slow_bytes,
            phase: phase(shape),
        })?;
        let capacity = [
            pages_u32(dram_bytes.saturating_sub(DRAM_WORK_GPA)),
            pages_u32(slow_bytes),
        ];
        Ok(DemoSource {
            vm: Arc::new(DemoTracked::new(demo, TierKind::Cxl)),
            capacity,
            row: Mutex::new(Vec::new()),
        })
    }

    /// The default demo VM (16 MiB per region).
    pub fn start_default(shape: Shape) -> Result<DemoSource, WorkloadError> {
        let d = DemoVmConfig::default();
        DemoSource::start(d.dram_bytes, d.slow_bytes, shape)
    }

    pub fn demo(&self) -> &DemoVm {
        self.vm.demo()
    }

    /// Switches to `shape` at the guest's next round boundary.
    pub fn apply(&self, shape: Shape) -> Result<(), WorkloadError> {
        if shape.skew != Skew::Uniform {
            return Err(WorkloadError::Shape {
                shape: shape.label(),
                why: "the demo VM touches every page of a round alike (no skew)".into(),
            });
        }
        for (pages, cap, tier) in [
            (shape.dram_pages, self.capacity[0], "dram"),
            (shape.slow_pages, self.capacity[1], "slow"),
        ] {
            if pages > cap {
                return Err(WorkloadError::Shape {
                    shape: shape.label(),
                    why: format!("{tier} has {cap} work pages"),
                });
            }
        }
        Ok(self.demo().set_phase(phase(shape))?)
    }

    /// The shape the guest is running now.
    pub fn shape(&self) -> Shape {
        let p = self.demo().phase();
        Shape {
            dram_pages: p.dram_pages,
            dram_repeat: p.dram_repeat,
            slow_pages: p.slow_pages,
            slow_repeat: p.slow_repeat,
            skew: Skew::Uniform,
        }
    }

    /// Ground truth so far.
    pub fn truth(&self) -> Truth {
        let c = self.demo().counters();
        Truth {
            rounds: c.rounds,
            accesses: c.accesses,
        }
    }

    /// The VM as tierd's registry tracks it.
    pub fn tracked(&self) -> Box<dyn TrackedVm> {
        Box::new(Arc::clone(&self.vm))
    }
}

fn pages_u32(bytes: u64) -> u32 {
    u32::try_from(bytes / PAGE_SIZE).unwrap_or(u32::MAX)
}

fn phase(s: Shape) -> Phase {
    Phase {
        dram_pages: s.dram_pages,
        dram_repeat: s.dram_repeat,
        slow_pages: s.slow_pages,
        slow_repeat: s.slow_repeat,
    }
}

impl WorkloadSource for DemoSource {
    fn describe(&self) -> String {
        let r = self.demo().regions();
        format!(
            "raw-KVM demo VM in this process (vcpu0; dram {} MiB at GPA {:#x}, slow {} MiB at GPA {:#x}, memfd-backed)",
            r[0].size >> 20,
            r[0].gpa,
            r[1].size >> 20,
            r[1].gpa
        )
    }

    fn guest_reported_kind(&self) -> String {
        "the demo VM's exact counters as tierd's aggregator reads them \
         (TrackedVm::guest_reported_accesses) at its own tick: no stats queue, \
         so it differs from the truth only by read timing"
            .to_string()
    }

    fn capacity(&self) -> [u32; 2] {
        self.capacity
    }

    /// Applies step 0 now; the row starts at once. The same VM serves every
    /// row (registered once).
    fn begin_row(
        &self,
        steps: &[Shape],
        _schedule: &Schedule,
        reg: &mut Registry,
    ) -> Result<RowStart, WorkloadError> {
        let first = *steps.first().ok_or_else(|| WorkloadError::Shape {
            shape: "-".into(),
            why: "a row needs at least one step".into(),
        })?;
        self.apply(first)?;
        if let Ok(mut row) = self.row.lock() {
            *row = steps.to_vec();
        }
        let vm_id = self.vm.vm().id.clone();
        if !reg.contains(&vm_id) {
            reg.insert(self.tracked());
        }
        Ok(RowStart {
            t0: Instant::now(),
            vm_id,
        })
    }

    fn change(&self, step: usize) -> Result<(), WorkloadError> {
        let shape = self.row.lock().ok().and_then(|r| r.get(step).copied());
        match shape {
            Some(s) => self.apply(s),
            None => Err(WorkloadError::Shape {
                shape: format!("step {step}"),
                why: "the row has no such step".into(),
            }),
        }
    }

    fn discover(&self, _reg: &mut Registry) {}

    /// The counters now: called right after the tick, so a pass later than
    /// `at` (the demo guest never waits to be read).
    fn truth_at(&self, _at: Instant) -> Result<Truth, WorkloadError> {
        Ok(self.truth())
    }

    fn end_row(&self, _reg: &mut Registry) -> Result<Vec<f64>, WorkloadError> {
        Ok(Vec::new())
    }

    fn vcpu_threads(&self) -> (u32, Vec<i32>) {
        (
            std::process::id(),
            self.demo().vcpu_tid().into_iter().collect(),
        )
    }

    fn overhead_pages(&self) -> [u32; 2] {
        // Code page and parameter page, both in dram (demo_vm::guest).
        [2, 0]
    }

    /// The demo VM's own log of when each phase took effect: every page
    /// of a phase is touched every round (~0.7 ms).
    fn touched_within(&self, at: Instant, horizon: std::time::Duration) -> Option<[(u64, u64); 2]> {
        Some(self.demo().touched_within(at, horizon)?.map(|p| (p, p)))
    }

    fn check(&self) -> Result<(), WorkloadError> {
        if self.demo().is_running() {
            return Ok(());
        }
        let why = self.demo().last_error().unwrap_or_else(|| "stopped".into());
        Err(DemoVmError::NotRunning(why).into())
    }
}
