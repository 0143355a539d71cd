//! hostpte's working-set ages against a real KVM VM whose guest touches a
//! known set of pages in each tier every ~0.7 ms: the working set within
//! one interval, read by the long pass, covers the exact pages touched and
//! is within 5 % of them; horizons beyond it say why they are not measured.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::time::{Duration, Instant};

use tier_profiler::ages::AgesConfig;
use tier_profiler::aggregate::{Aggregator, pass_ends};
use tier_profiler::demo_vm::tracked::DemoTracked;
use tier_profiler::demo_vm::{DemoVm, DemoVmConfig, Phase};
use tier_profiler::registry::Registry;
use tier_profiler::sampler::Sampler;
use tier_profiler::sampler::hostpte::HostPte;
use tier_proto::v1::{StatsUpdate, TierKind};

const INTERVAL: Duration = Duration::from_millis(400);

fn interval(agg: &mut Aggregator, reg: &mut Registry, s: &mut HostPte) -> StatsUpdate {
    let start = Instant::now();
    let ends = pass_ends(INTERVAL, 4);
    let (last, passes) = ends.split_last().unwrap();
    for end in passes {
        std::thread::sleep((start + *end).saturating_duration_since(Instant::now()));
        agg.pass(reg, Some(&mut *s));
    }
    std::thread::sleep((start + *last).saturating_duration_since(Instant::now()));
    agg.tick(reg, Some(&mut *s), INTERVAL.as_nanos() as u64)
}

/// hostpte re-arms a whole process, and both tests' demo VMs live in this
/// one: run side by side, one test's re-arm cleared the other's accessed
/// bits mid-pass (readings of a few pages, points 25 % low). One at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A demo VM running `phase`, in a registry of its own.
fn demo_vm(phase: Phase) -> (std::sync::Arc<DemoTracked>, Registry) {
    let cfg = DemoVmConfig {
        phase,
        ..DemoVmConfig::default()
    };
    let vm = std::sync::Arc::new(DemoTracked::new(DemoVm::start(cfg).unwrap(), TierKind::Cxl));
    let mut reg = Registry::default();
    reg.insert(Box::new(vm.clone()));
    (vm, reg)
}

/// (measured, skipped) intervals; panics on a measured one that misses.
fn check(u: &StatsUpdate, truth: [u64; 2], what: &str) -> (u32, u32) {
    let (mut measured, mut skipped) = (0, 0);
    for (t, pages) in u.stats[0].tiers.iter().zip(truth) {
        let a = t.ages.as_ref().expect("hostpte gives ages");
        let (short, long) = (&a.working_set[0], &a.working_set[1]);
        assert!(!long.not_measured.is_empty(), "{what}: {a:?}");
        assert!(a.cold_bytes.is_none() && a.promoted_bytes_per_s.is_none());
        if !short.not_measured.is_empty() {
            assert!(
                short.not_measured.contains("long pass") || short.not_measured.contains("watched"),
                "{what}: {a:?}"
            );
            skipped += 1;
            continue;
        }
        // The long pass's nested readings count the same touches again:
        // the estimate gets the long pass once, as one pass.
        assert_eq!(t.passes, 1, "{what}: {t:?}");
        let truth = (pages * 4096) as f64;
        assert!(
            short.bytes_low <= truth && truth <= short.bytes_high,
            "{what}: {} touched pages outside [{}, {}]",
            pages,
            short.bytes_low / 4096.0,
            short.bytes_high / 4096.0
        );
        assert!(short.bytes_low < short.bytes_high, "{what}: {short:?}");
        let err = (short.bytes - truth).abs() / truth;
        assert!(
            err <= 0.05,
            "{what}: {} vs {pages} pages",
            short.bytes / 4096.0
        );
        measured += 1;
    }
    (measured, skipped)
}

#[test]
#[cfg_attr(not(has_kvm), ignore = "needs a usable /dev/kvm")]
fn the_long_pass_reads_the_working_set_of_one_interval() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let a = Phase {
        dram_pages: 200,
        dram_repeat: 1,
        slow_pages: 50,
        slow_repeat: 1,
    };
    let b = Phase {
        dram_pages: 20,
        dram_repeat: 2,
        slow_pages: 300,
        slow_repeat: 1,
    };
    let (vm, mut reg) = demo_vm(a);
    let mut s = HostPte::new();
    s.set_ages(&AgesConfig {
        horizons: vec![0.4, 10.0],
        long_pass_every: 1,
        sweep_s: 0.0,
        ..AgesConfig::default()
    });
    let mut agg = Aggregator::default();
    agg.pass(&mut reg, Some(&mut s)); // arms
    // Code and parameter pages are touched too: dram + 2.
    for (phase, what) in [(a, "phase a"), (b, "phase b")] {
        vm.demo().set_phase(phase).unwrap();
        // The change's interval and the next long pass may hold both.
        for _ in 0..3 {
            interval(&mut agg, &mut reg, &mut s);
        }
        let truth = [u64::from(phase.dram_pages) + 2, u64::from(phase.slow_pages)];
        let (mut measured, mut skipped) = (0, 0);
        for _ in 0..6 {
            let (m, k) = check(&interval(&mut agg, &mut reg, &mut s), truth, what);
            measured += m;
            skipped += k;
        }
        // Every other interval is a long pass: both tiers measured there.
        assert!(
            measured >= 4 && skipped >= 4,
            "{what}: {measured} {skipped}"
        );
    }
}

/// A sweep: one pass of 5 intervals read at every interval's end without
/// re-arming. Its readings give the 2 s horizon (beyond any interval) within
/// 5 % of the exact pages, inside its interval; the intervals inside it give
/// the ratio estimate no pass and say why; passes resume after it.
#[test]
#[cfg_attr(not(has_kvm), ignore = "needs a usable /dev/kvm")]
fn a_sweep_reads_horizons_beyond_one_interval() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let a = Phase {
        dram_pages: 150,
        dram_repeat: 1,
        slow_pages: 60,
        slow_repeat: 1,
    };
    let (_vm, mut reg) = demo_vm(a);
    let mut s = HostPte::new();
    s.set_ages(&AgesConfig {
        horizons: vec![2.0, 30.0],
        long_pass_every: 0,
        sweep_s: 2.0,
        sweep_every_s: 4.0,
        interval_s: INTERVAL.as_secs_f64(),
    });
    let mut agg = Aggregator::default();
    agg.pass(&mut reg, Some(&mut s)); // arms
    // Code and parameter pages are touched too: dram + 2.
    let truth = [u64::from(a.dram_pages) + 2, u64::from(a.slow_pages)];
    let (mut quiet, mut measured, mut resumed) = (0, 0, 0);
    let mut after_quiet = false;
    // Sweeps start every 10 intervals, the first after at least 5.
    for i in 0..30 {
        let u = interval(&mut agg, &mut reg, &mut s);
        let st = &u.stats[0];
        let passes: u32 = st.tiers.iter().map(|t| t.passes).sum();
        if passes == 0 {
            assert!(
                st.not_measured.contains("hostpte sweep"),
                "interval {i}: no pass and no reason: {st:?}"
            );
            quiet += 1;
            after_quiet = true;
        } else if after_quiet {
            resumed += 1;
            after_quiet = false;
        }
        for (t, pages) in st.tiers.iter().zip(truth) {
            let a = t.ages.as_ref().expect("hostpte gives ages");
            let (w, long) = (&a.working_set[0], &a.working_set[1]);
            assert!(
                long.not_measured.contains("beyond") || long.not_measured.contains("watched"),
                "{a:?}"
            );
            if !w.not_measured.is_empty() {
                assert!(
                    w.not_measured.contains("sweep") || w.not_measured.contains("watched"),
                    "interval {i}: {a:?}"
                );
                continue;
            }
            assert_eq!(t.passes, 0, "2 s is measured inside a sweep only: {t:?}");
            let truth = (pages * 4096) as f64;
            assert!(
                w.bytes_low <= truth && truth <= w.bytes_high,
                "interval {i}: {pages} touched pages outside [{}, {}]",
                w.bytes_low / 4096.0,
                w.bytes_high / 4096.0
            );
            let err = (w.bytes - truth).abs() / truth;
            assert!(err <= 0.05, "interval {i}: {} vs {pages}", w.bytes / 4096.0);
            measured += 1;
        }
    }
    eprintln!("{quiet} quiet intervals, {measured} measured points of 2 s, {resumed} resumed");
    // Two sweeps of 5 intervals in 30 (the first after 5 to 14).
    assert!(quiet >= 8, "{quiet} quiet intervals");
    assert!(measured >= 4, "{measured} measured points of 2 s");
    assert!(resumed >= 1, "passes never resumed after a sweep");
}
