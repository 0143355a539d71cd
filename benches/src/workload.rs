//! Guests whose per-tier accesses a bench controls and counts exactly.
//!
//! A [`WorkloadSource`] runs a guest with two tiers (`dram` fast, `slow`),
//! switches its per-round work ([`Shape`]) at round boundaries, reports the
//! exact accesses it made (ground truth) and hands tierd a registry entry
//! whose `guest_reported_accesses` is the guest-reported source. The raw-KVM
//! demo VM ([`DemoSource`]) is the one here; the PVH test guest under the
//! patched VMM (stats queue as the guest-reported source) plugs in beside it.

use std::sync::Arc;

use tier_profiler::demo_vm::tracked::DemoTracked;
use tier_profiler::demo_vm::{DRAM_WORK_GPA, DemoVm, DemoVmConfig, DemoVmError, PAGE_SIZE, Phase};
use tier_profiler::registry::TrackedVm;
use tier_proto::v1::{TierKind, Vm};

/// Work per round: `pages` distinct 4 KiB pages per tier, each
/// read-modify-written `repeat` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub dram_pages: u32,
    pub dram_repeat: u32,
    pub slow_pages: u32,
    pub slow_repeat: u32,
}

impl Shape {
    /// Every page of both tiers once per round.
    pub const fn pages(dram_pages: u32, slow_pages: u32) -> Shape {
        Shape {
            dram_pages,
            dram_repeat: 1,
            slow_pages,
            slow_repeat: 1,
        }
    }

    /// Accesses per round [dram, slow].
    pub fn accesses_per_round(&self) -> [u64; 2] {
        [
            u64::from(self.dram_pages) * u64::from(self.dram_repeat),
            u64::from(self.slow_pages) * u64::from(self.slow_repeat),
        ]
    }

    /// Short form, `dram pages x repeat | slow pages x repeat`.
    pub fn label(&self) -> String {
        format!(
            "{}x{}|{}x{}",
            self.dram_pages, self.dram_repeat, self.slow_pages, self.slow_repeat
        )
    }
}

/// Exact cumulative counts from the guest side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Truth {
    pub rounds: u64,
    /// Accesses [dram, slow].
    pub accesses: [u64; 2],
}

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("demo VM: {0}")]
    Demo(#[from] DemoVmError),
    #[error("shape {shape} does not fit: {why}")]
    Shape { shape: String, why: String },
}

/// A guest with a `dram` and a `slow` tier whose work the bench sets.
pub trait WorkloadSource: Send + Sync {
    /// What runs the guest, for the report.
    fn describe(&self) -> String;
    /// Where the guest-reported numbers come from, for the report.
    fn guest_reported_kind(&self) -> String;
    /// Work pages available per round [dram, slow].
    fn capacity(&self) -> [u32; 2];
    /// Switches to `shape` at the guest's next round boundary.
    fn apply(&self, shape: Shape) -> Result<(), WorkloadError>;
    /// The shape the guest is running now.
    fn shape(&self) -> Shape;
    /// Ground truth so far.
    fn truth(&self) -> Truth;
    /// The VM as tierd's registry tracks it.
    fn tracked(&self) -> Box<dyn TrackedVm>;
    /// Process holding the guest memory, and the vCPU thread ids in it.
    fn vcpu_threads(&self) -> (u32, Vec<i32>);
    /// Distinct pages per round [dram, slow] the guest touches that are not
    /// work pages (code, parameters): visible to the host, not in the truth.
    fn overhead_pages(&self) -> [u32; 2];
    /// Err once the guest has stopped.
    fn check(&self) -> Result<(), WorkloadError>;
}

/// The raw-KVM demo VM of `tier_profiler::demo_vm`, in this process.
#[derive(Debug)]
pub struct DemoSource {
    vm: Arc<DemoTracked>,
    capacity: [u32; 2],
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
         so it differs from the truth only by read timing; the stats-queue \
         source comes with the PVH test guest"
            .to_string()
    }

    fn capacity(&self) -> [u32; 2] {
        self.capacity
    }

    fn apply(&self, shape: Shape) -> Result<(), WorkloadError> {
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

    fn shape(&self) -> Shape {
        let p = self.demo().phase();
        Shape {
            dram_pages: p.dram_pages,
            dram_repeat: p.dram_repeat,
            slow_pages: p.slow_pages,
            slow_repeat: p.slow_repeat,
        }
    }

    fn truth(&self) -> Truth {
        let c = self.demo().counters();
        Truth {
            rounds: c.rounds,
            accesses: c.accesses,
        }
    }

    fn tracked(&self) -> Box<dyn TrackedVm> {
        Box::new(Shared(Arc::clone(&self.vm)))
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

    fn check(&self) -> Result<(), WorkloadError> {
        if self.demo().is_running() {
            return Ok(());
        }
        let why = self.demo().last_error().unwrap_or_else(|| "stopped".into());
        Err(DemoVmError::NotRunning(why).into())
    }
}

/// Lets the registry own an entry while the source keeps the VM.
struct Shared(Arc<DemoTracked>);

impl TrackedVm for Shared {
    fn vm(&self) -> &Vm {
        self.0.vm()
    }
    fn alive(&self) -> bool {
        self.0.alive()
    }
    fn resident_bytes(&self) -> Vec<u64> {
        self.0.resident_bytes()
    }
    fn guest_reported_accesses(&self) -> Option<Vec<u64>> {
        self.0.guest_reported_accesses()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_accesses_and_label() {
        let s = Shape {
            dram_pages: 48,
            dram_repeat: 4,
            slow_pages: 96,
            slow_repeat: 1,
        };
        assert_eq!(s.accesses_per_round(), [192, 96]);
        assert_eq!(s.label(), "48x4|96x1");
        assert_eq!(Shape::pages(3, 5).accesses_per_round(), [3, 5]);
    }
}
