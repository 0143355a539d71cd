//! tierd's CPU per GiB scanned by hostpte on a VM whose memory is all
//! resident (the smaps walk and the re-arm cost grow with resident pages).

use std::time::Duration;

use anyhow::Context;
use tier_benches::workload::{DemoSource, Shape, WorkloadSource};
use tier_profiler::demo_vm::{PAGE_SIZE, SLOW_GPA};

use crate::attach::{HostpteThread, PassStats};

const DRAM: u64 = 256 << 20;
const SLOW: u64 = 1 << 30;
const RUN: Duration = Duration::from_secs(3);

/// Starts a 256 MiB + 1 GiB demo VM, faults every page in (a read of a
/// shared memfd page allocates it), and runs hostpte passes for a while.
pub fn resident_vm(interval: Duration, passes: u32) -> anyhow::Result<PassStats> {
    let src = DemoSource::start(DRAM, SLOW, Shape::pages(2048, 2048))
        .context("starting the 1.25 GiB demo VM")?;
    for (base, size) in [(0, DRAM), (SLOW_GPA, SLOW)] {
        for off in (0..size).step_by(PAGE_SIZE as usize) {
            src.demo()
                .read_u32(base + off)
                .context("reading guest memory")?;
        }
    }
    let t = HostpteThread::start(src.tracked(), interval, passes)?;
    std::thread::sleep(RUN);
    let stats = t.stop()?;
    src.check()?;
    Ok(stats)
}
