//! The PMU sampler's BPF attribution, end to end on this kernel: this test
//! process plays the VMM. Its threads `vcpu0`, `vcpu1`, `vcpu2` (found by
//! the real discovery in /proc/self/task) and an unregistered `worker` each
//! touch a known number of fresh pages; a software page-fault event
//! (PERF_COUNT_SW_PAGE_FAULTS, sample_period 1, PERF_SAMPLE_ADDR) and a
//! context-switch event (the threads sleep between bursts, so it counts
//! something else) are opened per thread, from a test event table that
//! maps them to tiers `dram` and `cxl`, and the real `perf_event` program
//! of `bpf/pmu.bpf.c` is attached to each with the tier as cookie.
//!
//! Custom harness (libtest-mimic): not root, or BPF refused with
//! EPERM/EACCES, is reported as ignored with the reason; any other failure
//! fails.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::sync::{Arc, Barrier, mpsc};
use std::time::Duration;

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use tier_profiler::sampler::pmu::events::{CpuId, EventTable, EventType, TierKind};
use tier_profiler::sampler::pmu::loader::{
    EventSpec, MAX_TIERS, OpenOptions, PmuCount, PmuError, PmuPrograms, ThreadEvents, open_event,
};
use tier_profiler::sampler::pmu::{events_status, vcpus};

const PAGE: usize = 4096;
/// Faults per burst, then a pause of more than one tick: keeps each event
/// far below perf's per-tick sample limit (perf_event_max_sample_rate /
/// HZ), so no sample is throttled away.
const BURST: usize = 25;
const PAUSE: Duration = Duration::from_millis(5);
/// Faults a thread may take besides its own page touches (none expected;
/// documented tolerance, the exact number is printed).
const SLACK: u64 = 16;

/// Tier indices of the test VMs: tier 0 is made of dram, tier 1 of cxl.
fn tier_index(kind: TierKind) -> u32 {
    match kind {
        TierKind::Dram => 0,
        TierKind::Cxl => 1,
        other => panic!("test VMs have no {} tier", other.short_name()),
    }
}

const VM_A: u32 = 0;
const VM_B: u32 = 1;

/// The test event table: software events standing in for memory-source
/// events, selected for this CPU like a real table.
fn test_table(cpu: &CpuId) -> String {
    let head = format!(
        "vendor = {:?}\nfamily = {}\nmodels = [{}]\ntype = \"software\"\n",
        cpu.vendor, cpu.family, cpu.model
    );
    format!(
        "[[event]]\nname = \"sw.page_faults\"\n{head}config = 2\ntier = \"dram\"\nsource = \"PERF_COUNT_SW_PAGE_FAULTS (test stand-in)\"\n\n\
         [[event]]\nname = \"sw.context_switches\"\n{head}config = 3\ntier = \"cxl\"\nsource = \"PERF_COUNT_SW_CONTEXT_SWITCHES (test stand-in)\"\n"
    )
}

fn capability() -> Result<(), String> {
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err("needs root (BPF perf_event programs)".into());
    }
    match PmuPrograms::load() {
        Ok(_) => Ok(()),
        Err(
            e @ PmuError::Load {
                errno: Some(libc::EPERM | libc::EACCES),
                ..
            },
        ) => Err(format!("BPF refused: {e}")),
        Err(e) => panic!("pmu.bpf.o does not load: {e}"),
    }
}

/// A thread that maps `pages` fresh 4 KiB pages, reports its tid, waits
/// for `go`, writes one byte per page (one page fault each), reports done
/// and waits for `exit`.
struct Toucher {
    name: &'static str,
    pages: usize,
    tid: u32,
    handle: std::thread::JoinHandle<()>,
}

fn spawn_toucher(
    name: &'static str,
    pages: usize,
    go: Arc<Barrier>,
    done: mpsc::Sender<()>,
    exit: Arc<Barrier>,
) -> Toucher {
    let (tid_tx, tid_rx) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let len = pages * PAGE;
            // SAFETY: a fresh private anonymous mapping; nothing else uses it.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            // One fault per 4 KiB page: no transparent huge pages here.
            // SAFETY: p..p+len is our mapping.
            assert_eq!(unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) }, 0);
            // SAFETY: gettid has no arguments and cannot fail.
            let tid = unsafe { libc::gettid() } as u32;
            tid_tx.send(tid).unwrap();
            go.wait();
            let base = p.cast::<u8>();
            for i in 0..pages {
                if i > 0 && i % BURST == 0 {
                    std::thread::sleep(PAUSE);
                }
                // SAFETY: i * PAGE < len, inside the mapping.
                unsafe { base.add(i * PAGE).write_volatile(1) };
            }
            done.send(()).unwrap();
            exit.wait();
            // SAFETY: unmapping our own mapping, not used afterwards.
            unsafe { libc::munmap(p, len) };
        })
        .unwrap();
    let tid = tid_rx.recv().unwrap();
    Toucher {
        name,
        pages,
        tid,
        handle,
    }
}

fn counters(ev: &ThreadEvents) -> Vec<(String, u32, u64)> {
    ev.attached
        .iter()
        .map(|a| (a.name.clone(), a.tier, a.count().unwrap()))
        .collect()
}

fn vcpu_threads_attributed_per_vm_and_tier() {
    let cpu = CpuId::current().unwrap();
    let table = EventTable::from_toml(&test_table(&cpu), "test-table").unwrap();
    let selected = table.select(&cpu, false);
    assert_eq!(selected.len(), 2);
    let events: Vec<(EventSpec, u32)> = selected
        .iter()
        .map(|e| (EventSpec::from(*e), tier_index(e.tier)))
        .collect();

    let progs = PmuPrograms::load().unwrap();
    let plan = [
        ("vcpu0", 300),
        ("vcpu1", 500),
        ("vcpu2", 200),
        ("worker", 400),
    ];
    let go = Arc::new(Barrier::new(plan.len() + 1));
    let exit = Arc::new(Barrier::new(plan.len() + 1));
    let (done_tx, done_rx) = mpsc::channel();
    let threads: Vec<Toucher> = plan
        .iter()
        .map(|&(name, pages)| spawn_toucher(name, pages, go.clone(), done_tx.clone(), exit.clone()))
        .collect();

    // The real discovery finds the three vCPU threads, not the worker.
    let found = vcpus::discover(std::process::id()).unwrap();
    let want: Vec<(u32, u32)> = threads[..3]
        .iter()
        .enumerate()
        .map(|(i, t)| (t.tid, i as u32))
        .collect();
    assert_eq!(
        found.iter().map(|v| (v.tid, v.index)).collect::<Vec<_>>(),
        want
    );
    // VM A: vcpu0 and vcpu1; VM B: vcpu2 (the same process plays both
    // VMMs); the worker is registered nowhere.
    for v in &found {
        progs
            .set_vcpu(v.tid, if v.index < 2 { VM_A } else { VM_B })
            .unwrap();
    }
    let opts = OpenOptions {
        guest_only: false, // software events: there is no guest here
        sample_period: 1,
        sample_addr: true,
        enabled: false,
    };
    let attached: Vec<ThreadEvents> = threads
        .iter()
        .map(|t| {
            let ev = progs.attach_thread(t.tid, &events, &opts);
            assert!(ev.failed.is_empty(), "{}: {:?}", t.name, ev.failed);
            assert_eq!(ev.attached.len(), 2);
            ev
        })
        .collect();

    go.wait();
    for _ in &threads {
        done_rx.recv_timeout(Duration::from_secs(60)).unwrap();
    }

    let per_thread: Vec<Vec<(String, u32, u64)>> = attached.iter().map(counters).collect();
    let a = progs.vm_counts(VM_A).unwrap();
    let b = progs.vm_counts(VM_B).unwrap();
    let un = progs.unattributed().unwrap();
    for (t, c) in threads.iter().zip(&per_thread) {
        assert_eq!(
            c.iter()
                .map(|(n, tier, _)| (n.as_str(), *tier))
                .collect::<Vec<_>>(),
            [("sw.page_faults", 0), ("sw.context_switches", 1)]
        );
        println!(
            "  {} (tid {}): {} pages touched, counters {c:?}",
            t.name, t.tid, t.pages
        );
    }
    println!("  VM A: dram {:?}, cxl {:?}", a[0], a[1]);
    println!("  VM B: dram {:?}, cxl {:?}", b[0], b[1]);
    println!("  unattributed: {un:?}");

    // The fault counter saw the thread's own faults (plus at most SLACK
    // others); the context-switch counter at least one switch per pause.
    for (t, c) in threads.iter().zip(&per_thread) {
        let (faults, switches) = (c[0].2, c[1].2);
        assert!(
            (t.pages as u64..=t.pages as u64 + SLACK).contains(&faults),
            "{}: {faults} faults for {} pages",
            t.name,
            t.pages
        );
        let pauses = ((t.pages - 1) / BURST) as u64;
        assert!(
            switches >= pauses,
            "{}: {switches} switches, {pauses} pauses",
            t.name
        );
    }
    // The BPF counts equal the counters' own values exactly: every fault
    // on a vCPU thread went to its VM and to the tier of its event.
    let sum = |idx: &[usize], tier: u32| -> u64 {
        idx.iter()
            .flat_map(|&i| per_thread[i].iter())
            .filter(|(_, t, _)| *t == tier)
            .map(|(_, _, n)| n)
            .sum()
    };
    let dram = tier_index(TierKind::Dram);
    let cxl = tier_index(TierKind::Cxl);
    let count = |n: u64| PmuCount {
        samples: n,
        period: n,
    };
    assert_eq!(a[dram as usize], count(sum(&[0, 1], dram)), "VM A dram");
    assert_eq!(a[cxl as usize], count(sum(&[0, 1], cxl)), "VM A cxl");
    assert_eq!(b[dram as usize], count(sum(&[2], dram)), "VM B dram");
    assert_eq!(b[cxl as usize], count(sum(&[2], cxl)), "VM B cxl");
    for tier in 2..MAX_TIERS as usize {
        assert_eq!((a[tier], b[tier]), Default::default(), "tier {tier}");
    }
    assert_eq!(
        progs.vm_counts(2).unwrap(),
        [PmuCount::default(); MAX_TIERS as usize]
    );
    // The worker's faults reached the program but no VM.
    assert_eq!(un, count(sum(&[3], dram) + sum(&[3], cxl)));

    // Teardown as for a vCPU thread that went away: owner entry cleared,
    // events detached and closed.
    progs.clear_vcpu(threads[0].tid).unwrap();
    drop(attached);
    exit.wait();
    for t in threads {
        t.handle.join().unwrap();
    }
}

/// Every event the built-in table selects for this CPU is tried, guest-only,
/// and reported one by one; with no hardware PMU each fails with the
/// kernel's errno.
fn events_status_reports_each_selected_event() {
    let cpu = CpuId::current().unwrap();
    let table = EventTable::builtin().unwrap();
    let selected = table.select(&cpu, true);
    let status = events_status(&cpu, &table, true);
    println!("  cpu: {cpu}");
    for (event, s) in &status {
        println!(
            "  {event}: {}",
            match s {
                Ok(()) => "opens".to_string(),
                Err(e) => e.clone(),
            }
        );
    }
    assert_eq!(status.len(), selected.len());
    for ((label, _), e) in status.iter().zip(&selected) {
        assert!(label.starts_with(&e.name), "{label}");
    }
    // Cross-check with the least any PMU has: guest-only cycles.
    let cycles = EventSpec {
        name: "cycles".into(),
        event_type: EventType::Hardware,
        config: 0,
    };
    if let Err(e) = open_event(0, &cycles, &OpenOptions::default()) {
        println!("  cycles, exclude_host: {e}");
        for (event, s) in &status {
            let err = s.as_ref().expect_err(event);
            assert!(err.contains("perf_event_open"), "{err}");
        }
    }
}

fn main() {
    let args = Arguments::from_args();
    tier_profiler::bpf::route_libbpf_logs();
    let ready = capability();
    let needs_bpf = |name: &'static str, f: fn()| {
        let ready = ready.clone();
        Trial::ignorable_test(name, move || -> Result<Completion, Failed> {
            match ready {
                Err(reason) => Ok(Completion::ignored_with(reason)),
                Ok(()) => {
                    f();
                    Ok(Completion::Completed)
                }
            }
        })
    };
    let tests = vec![
        needs_bpf(
            "vcpu_threads_attributed_per_vm_and_tier",
            vcpu_threads_attributed_per_vm_and_tier,
        ),
        Trial::test("events_status_reports_each_selected_event", || {
            events_status_reports_each_selected_event();
            Ok(())
        }),
    ];
    libtest_mimic::run(&args, tests).exit();
}
