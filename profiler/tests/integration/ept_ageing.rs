//! The EPT backends end to end where the host has page_idle: the demo VM's
//! pages aged through the bitmap, young pages counted in BPF per tier.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::time::Duration;

use tier_profiler::demo_vm::tracked::DemoTracked;
use tier_profiler::demo_vm::{DemoVm, DemoVmConfig};
use tier_profiler::registry::TrackedVm;
use tier_profiler::sampler::Sampler;
use tier_profiler::sampler::ept_ageing::EptAgeing;
use tier_proto::v1::{Backend, TierKind};

#[test]
#[cfg_attr(
    not(all(has_page_idle, has_kvm)),
    ignore = "needs /dev/kvm and CONFIG_IDLE_PAGE_TRACKING (/sys/kernel/mm/page_idle/bitmap)"
)]
fn ept_backends_count_the_demo_guests_pages() {
    let report = tier_profiler::probe::run();
    let backend = [Backend::EptFexit, Backend::EptTracepoint]
        .into_iter()
        .find(|b| report.get(b.short_name()).is_some_and(|c| c.available))
        .unwrap_or_else(|| {
            panic!(
                "page_idle is here but no EPT hook works:\n{}",
                report.render()
            )
        });
    let tracked = DemoTracked::new(
        DemoVm::start(DemoVmConfig::default()).unwrap(),
        TierKind::Cxl,
    );
    let mut s = EptAgeing::new(backend, 1, Duration::from_millis(100)).unwrap();
    s.sample(&[tracked.vm()]).pop().unwrap().unwrap();
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(200));
        let r = s.sample(&[tracked.vm()]).pop().unwrap().unwrap();
        for (t, truth) in r.iter().zip(tracked.demo().touched_pages()) {
            let err = (t.young_pages as f64 - truth as f64).abs() / truth as f64;
            assert!(
                err <= 0.02,
                "{backend:?}: young {} vs truth {truth}",
                t.young_pages
            );
        }
    }
}

#[test]
#[cfg_attr(
    has_page_idle,
    ignore = "this host has page_idle: the backend can start here"
)]
fn forcing_an_ept_backend_without_page_idle_fails_with_the_reason() {
    let out = crate::tierd()
        .args(["--backend", "ept-tracepoint"])
        .output();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ept-tracepoint") && err.contains("unavailable here"),
        "{err}"
    );
}
