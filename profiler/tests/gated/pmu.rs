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

use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::time::{Duration, Instant};

use libtest_mimic::{Completion, Failed, Trial};
use tier_profiler::demo_vm::{DemoVm, DemoVmConfig};
use tier_profiler::sampler::pmu::counting::TierReading;
use tier_profiler::sampler::pmu::data_src::{self, MemSource};
use tier_profiler::sampler::pmu::events::{CpuId, EventTable, EventType, TierKind};
use tier_profiler::sampler::pmu::loader::{
    EventSpec, MAX_TIERS, NO_TIER, OpenOptions, PmuCount, PmuError, PmuPrograms, ThreadEvents,
    cookie, open_event,
};
use tier_profiler::sampler::pmu::source::PmuSource;
use tier_profiler::sampler::pmu::vcpus::{Found, VcpuThread, VcpuTracker};
use tier_profiler::sampler::pmu::{events_status, vcpus};
use tier_proto::v1::{Tier, Vm};

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
        "[[event]]\nname = \"sw.page_faults\"\n{head}config = 2\nperiod = 1\ntier = \"dram\"\nsource = \"PERF_COUNT_SW_PAGE_FAULTS (test stand-in)\"\n\n\
         [[event]]\nname = \"sw.context_switches\"\n{head}config = 3\nperiod = 1\ntier = \"cxl\"\nsource = \"PERF_COUNT_SW_CONTEXT_SWITCHES (test stand-in)\"\n"
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
    let _one = threads_lock();
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
    let cycles = EventSpec::new("cycles", EventType::Hardware, 0);
    if let Err(e) = open_event(0, &cycles, &OpenOptions::default()) {
        println!("  cycles, exclude_host: {e}");
        for (event, s) in &status {
            let err = s.as_ref().expect_err(event);
            assert!(err.contains("perf_event_open"), "{err}");
        }
    }
}

/// The C decoder of `bpf/pmu_data_src.h`, run in the kernel through
/// BPF_PROG_TEST_RUN (`pmu_account_test`), against `data_src::decode` over
/// every mem_lvl_num x remote x hops, mem_lvl none / one bit / HIT with one
/// or two bits, and noise in the fields neither reads.
fn bpf_data_src_decoding_matches_rust() {
    let progs = PmuPrograms::load_with_test_program().unwrap();
    match progs.test_run_sample() {
        Ok(r) => println!("  note: this kernel test-runs perf_event programs (returned {r})"),
        Err(e) => println!("  pmu_sample (perf_event) cannot be test-run here: {e}"),
    }
    let mut lvls = vec![0u64];
    for i in 0..data_src::LVL_BITS {
        lvls.push(1 << i);
        lvls.push(data_src::LVL_HIT | 1 << i);
        for j in i + 1..data_src::LVL_BITS {
            lvls.push(data_src::LVL_HIT | 1 << i | 1 << j);
        }
    }
    lvls.sort_unstable();
    lvls.dedup();
    // op, snoop, lock, dtlb, snoopx, blk: ignored by both decoders.
    let noise = |n: u64| {
        let x = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (x & 0x1f)
            | (x >> 5 & 0x1f) << data_src::SNOOP_SHIFT
            | (x >> 10 & 0x3) << data_src::LOCK_SHIFT
            | (x >> 12 & 0x7f) << data_src::DTLB_SHIFT
            | (x >> 19 & 0x3) << data_src::SNOOPX_SHIFT
            | (x >> 21 & 0x7) << data_src::BLK_SHIFT
    };
    let mut runs = 0u64;
    let mut by_source = [0u64; 8];
    for lvl_num in 0..16u64 {
        for remote in 0..2u64 {
            for hops in 0..8u64 {
                for &lvl in &lvls {
                    let v = lvl << data_src::LVL_SHIFT
                        | lvl_num << data_src::LVLNUM_SHIFT
                        | remote << data_src::REMOTE_SHIFT
                        | hops << data_src::HOPS_SHIFT
                        | noise(runs);
                    let want = data_src::decode(v).bpf_code();
                    let got = progs.test_account(0, 0, true, v, 1).unwrap();
                    assert_eq!(got, want, "data_src {v:#x}");
                    by_source[got as usize] += 1;
                    runs += 1;
                }
            }
        }
    }
    println!("  {runs} encodings agree; by source (PMU_SRC_*): {by_source:?}");
    assert!(
        by_source.iter().all(|n| *n > 0),
        "every source was produced"
    );
    // tid 0 is nobody's vCPU: every run counted as unattributed.
    assert_eq!(
        progs.unattributed().unwrap(),
        PmuCount {
            samples: runs,
            period: runs
        }
    );
}

/// The attribution of a precise sample, through BPF_PROG_TEST_RUN: with the
/// data_src flag and a data_src, the VM's tier of the decoded kind (or no
/// tier); without a data_src, the cookie's tier; without the flag (a
/// counting event), always the cookie's tier. What the kernel does with a
/// real PEBS/IBS sample (filling data_src and PERF_SAMPLE_DATA_SRC in
/// sample_flags) cannot be checked on this machine.
fn data_src_samples_count_in_the_tier_of_their_kind() {
    let progs = PmuPrograms::load_with_test_program().unwrap();
    const TID: u32 = 4_000_001; // never a real thread here (pid_max is smaller)
    const SLOT: u32 = 5;
    progs.set_vcpu(TID, SLOT).unwrap();
    // Tiers: 0 dram, 1 cxl, 2 remote, 3 dram again (the first one wins).
    progs
        .set_kind_tiers(
            SLOT,
            &[
                TierKind::Dram,
                TierKind::Cxl,
                TierKind::Remote,
                TierKind::Dram,
            ],
        )
        .unwrap();
    let lvlnum = |n: u64| n << data_src::LVLNUM_SHIFT | 0x42;
    let ram = lvlnum(data_src::LVLNUM_RAM);
    let far = ram | 1 << data_src::REMOTE_SHIFT;
    let cxl = lvlnum(data_src::LVLNUM_CXL);
    let pmem = lvlnum(data_src::LVLNUM_PMEM);
    let l1 = lvlnum(data_src::LVLNUM_L1);
    let precise = |tier| cookie(tier, true);
    // (cookie, has data_src, data_src, period): periods are distinct powers
    // of two so each sum says which cases went where.
    let cases = [
        (precise(NO_TIER), true, ram, 1u64), // -> tier 0
        (precise(NO_TIER), true, cxl, 2),    // -> tier 1
        (precise(NO_TIER), true, far, 4),    // -> tier 2
        (precise(1), true, ram, 8),          // data_src beats the cookie -> tier 0
        (precise(NO_TIER), true, pmem, 16),  // no pmem tier -> no tier, source pmem
        (precise(NO_TIER), true, l1, 32),    // cache -> no tier, source cache
        (precise(2), false, 0, 64),          // no data_src -> cookie tier 2
        (precise(NO_TIER), false, 0, 128),   // no data_src, no tier -> no tier, unknown
        (cookie(1, false), true, ram, 256),  // counting event: cookie tier 1
    ];
    for (c, has, ds, period) in cases {
        progs.test_account(TID, c, has, ds, period).unwrap();
    }
    let counts = progs.vm_counts(SLOT).unwrap();
    let no_tier = progs.no_tier(SLOT).unwrap();
    println!("  tiers: {:?}", &counts[..4]);
    println!("  no tier, by source: {no_tier:?}");
    let pc = |samples, period| PmuCount { samples, period };
    assert_eq!(counts[0], pc(2, 1 + 8));
    assert_eq!(counts[1], pc(2, 2 + 256));
    assert_eq!(counts[2], pc(2, 4 + 64));
    assert_eq!(counts[3], PmuCount::default());
    assert_eq!(
        no_tier[MemSource::Memory(TierKind::Pmem).bpf_code() as usize],
        pc(1, 16)
    );
    assert_eq!(no_tier[MemSource::Cache.bpf_code() as usize], pc(1, 32));
    assert_eq!(no_tier[MemSource::Unknown.bpf_code() as usize], pc(1, 128));
    assert_eq!(no_tier.iter().map(|c| c.samples).sum::<u64>(), 3);
    assert_eq!(progs.unattributed().unwrap(), PmuCount::default());
    // reset_vm forgets counts and kinds: a RAM sample now finds no tier.
    progs.reset_vm(SLOT).unwrap();
    assert_eq!(
        progs.vm_counts(SLOT).unwrap(),
        [PmuCount::default(); MAX_TIERS as usize]
    );
    progs
        .test_account(TID, precise(NO_TIER), true, ram, 1)
        .unwrap();
    assert_eq!(progs.no_tier(SLOT).unwrap()[1], pc(1, 1));
}

/// The daemon's source without the daemon: a VM played by this process
/// (a spinning `vcpu0` thread, task-clock standing in for a DRAM event),
/// another by a child process with no vCPU thread and no DRAM tier.
fn pmu_source_follows_threads_and_vms() {
    let _one = threads_lock();
    const PERIOD: u64 = 1_000_000;
    let cpu = CpuId::current().unwrap();
    let table = EventTable::from_toml(
        &format!(
            "[[event]]\nname = \"sw.task_clock\"\nvendor = {:?}\nfamily = {}\nmodels = [{}]\ntype = \"software\"\nconfig = 1\nperiod = {PERIOD}\ntier = \"dram\"\nsource = \"PERF_COUNT_SW_TASK_CLOCK (test stand-in)\"\n",
            cpu.vendor, cpu.family, cpu.model
        ),
        "test-table",
    )
    .unwrap();
    let (mut src, notes) = PmuSource::start(&cpu, &table).unwrap();
    assert!(notes.is_empty(), "{notes:?}");

    let vcpu = Vcpu0::spin(None);
    let tier = |name: &str, kind: TierKind| Tier {
        name: name.into(),
        kind: kind as i32,
        ..Default::default()
    };
    let me = Vm {
        id: "test:me".into(),
        vmm_pid: std::process::id(),
        tiers: vec![tier("dram", TierKind::Dram), tier("slow", TierKind::Cxl)],
        ..Default::default()
    };
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let other = Vm {
        id: "test:other".into(),
        vmm_pid: child.id(),
        tiers: vec![tier("slow", TierKind::Cxl)],
        ..Default::default()
    };

    let first = src.sample(&[&me, &other]);
    println!(
        "  first: {:?}; health error: {}",
        first.per_vm, first.health.error
    );
    assert!(first.health.active);
    // An event the VM has no tier for is a logged note, not a health error.
    assert!(
        !first
            .health
            .error
            .contains("event sw.task_clock not counted")
    );
    // Counters opened in this interval count from the next one: not a 0.
    assert!(
        matches!(&first.per_vm["test:me"][0], TierReading::NotMeasured(w) if w.contains("opened in this interval")),
        "{:?}",
        first.per_vm
    );
    assert!(
        first
            .health
            .error
            .contains("test:other: no vCPU thread found")
    );
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(200));
    let second = src.sample(&[&me, &other]);
    let wall_ns = t0.elapsed().as_nanos() as u64;
    let c = &second.per_vm["test:me"];
    println!("  after 200 ms: {c:?}");
    assert_eq!(c.len(), 2);
    // Counting: task-clock counts the ns the spinning thread ran, never
    // more than the wall time; software counters are never multiplexed,
    // so nothing is scaled.
    let TierReading::Counted(dram) = &c[0] else {
        panic!("dram counted: {c:?}")
    };
    assert!(
        dram.raw > 10_000_000 && dram.raw <= wall_ns + 5_000_000,
        "{} ns of {wall_ns}",
        dram.raw
    );
    assert_eq!(dram.scaled, dram.raw as f64);
    assert_eq!(dram.running_ratio(), 1.0);
    assert!(
        matches!(&c[1], TierReading::NotMeasured(w) if w.contains("counts cxl memory")),
        "no event counts cxl: {c:?}"
    );
    assert!(matches!(
        &second.per_vm["test:other"][..],
        [TierReading::NotMeasured(w)] if w.contains("counts cxl memory")
    ));
    assert_eq!(second.health.events, dram.raw);
    assert!(
        !second.health.error.contains("test:me"),
        "{}",
        second.health.error
    );

    // The thread exits: dropped; with no counter left, dram is not
    // measured rather than 0.
    vcpu.stop();
    let _ = src.sample(&[&me]);
    let after = src.sample(&[&me]);
    assert!(
        matches!(&after.per_vm["test:me"][0], TierReading::NotMeasured(w) if w.contains("no counter was read")),
        "{:?}",
        after.per_vm
    );
    assert!(
        after.health.error.contains("test:me: no vCPU thread found"),
        "{}",
        after.health.error
    );
    // The other VM left: its process is not looked at any more.
    child.kill().unwrap();
    child.wait().unwrap();
    let gone = src.sample(&[&me]);
    assert!(!gone.per_vm.contains_key("test:other"));
    assert!(
        !gone.health.error.contains("test:other"),
        "{}",
        gone.health.error
    );
}

/// Local and remote DRAM events land in the tier on the vCPU's node and
/// the tier on another node, chosen by the tiers' nodes, not their kinds:
/// a VM with two DRAM tiers (the other socket's zone discovered as `dram`
/// too). Software stand-ins of very different sizes, so a swap shows:
/// task-clock (ns the thread ran) as the local-DRAM event, page faults
/// (next to none for a thread that spins) as the remote one. The vCPU
/// thread is pinned to one CPU, so its node is exact.
fn placement_puts_local_and_remote_dram_in_the_tiers_of_their_nodes() {
    let _one = threads_lock();
    let cpu = CpuId::current().unwrap();
    let head = format!(
        "vendor = {:?}\nfamily = {}\nmodels = [{}]\ntype = \"software\"\n",
        cpu.vendor, cpu.family, cpu.model
    );
    let table = EventTable::from_toml(
        &format!(
            "[[event]]\nname = \"sw.task_clock\"\n{head}config = 1\ntier = \"dram\"\nsource = \"stand-in for local DRAM\"\n\
             [[event]]\nname = \"sw.page_faults\"\n{head}config = 2\ntier = \"remote\"\nsource = \"stand-in for remote DRAM\"\n"
        ),
        "test-table",
    )
    .unwrap();
    let (mut src, _) = PmuSource::start(&cpu, &table).unwrap();
    let topo = tier_profiler::sampler::pmu::placement::Topology::read();
    // A CPU this process may run on (its cgroup may exclude CPU 0).
    let cpu0 = *tier_profiler::sampler::pmu::placement::affinity(0)
        .unwrap()
        .first()
        .unwrap();
    let vcpu = Vcpu0::spin(Some(cpu0));
    let node = topo.node_of(cpu0).unwrap();
    let other = node + 1;
    let dram = |name: &str, n: u32| Tier {
        name: name.into(),
        kind: TierKind::Dram as i32,
        host_numa_nodes: vec![n],
        ..Default::default()
    };
    // Tier order "far" first: the local count must still find `near`.
    let vm = Vm {
        id: "test:placed".into(),
        vmm_pid: std::process::id(),
        tiers: vec![dram("far", other), dram("near", node)],
        ..Default::default()
    };
    let _ = src.sample(&[&vm]);
    std::thread::sleep(Duration::from_millis(200));
    let r = src.sample(&[&vm]);
    vcpu.stop();
    let t = &r.per_vm["test:placed"];
    println!("  node {node}: {t:?}");
    let (TierReading::Counted(far), TierReading::Counted(near)) = (&t[0], &t[1]) else {
        panic!("both counted: {t:?}")
    };
    // Local (task-clock: the run time) in the tier on the vCPU's node,
    // remote (a handful of faults) in the other one.
    assert!(near.raw > 10_000_000, "{t:?}");
    assert!(far.raw < 1_000 && far.reads == 1, "{t:?}");
    assert!(
        near.notes.is_empty() && far.notes.is_empty(),
        "pinned: exact"
    );
}

/// A thread of this process named `vcpu0` that spins until stopped,
/// pinned to one CPU if asked; dropping it (also while a failed assertion
/// unwinds) stops it, so it cannot pose as a vCPU in the next trial.
struct Vcpu0 {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Vcpu0 {
    /// Returns once the thread is named (and pinned).
    fn spin(pin: Option<u32>) -> Vcpu0 {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("vcpu0".into())
            .spawn(move || {
                // std names the thread before running this closure.
                let rc = pin.map_or(0, |cpu| {
                    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET and
                    // sched_setaffinity(0) act on this thread only.
                    unsafe {
                        let mut set: libc::cpu_set_t = std::mem::zeroed();
                        libc::CPU_SET(cpu as usize, &mut set);
                        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
                    }
                });
                tx.send(rc).unwrap();
                while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
            .unwrap();
        assert_eq!(rx.recv().unwrap(), 0, "pinning vcpu0 to CPU {pin:?}");
        Vcpu0 {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the thread and waits until it has exited.
    fn stop(mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Vcpu0 {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Trials that look at this process's thread names run one at a time: the
/// attribution trial names threads vcpuN, the KVM_RUN trial needs none.
static THREADS: Mutex<()> = Mutex::new(());

fn threads_lock() -> std::sync::MutexGuard<'static, ()> {
    THREADS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The demo VM (a real KVM guest) in this process with its vCPU thread
/// named `guest-cpu`: no vcpuN thread anywhere, so only the KVM_RUN watch
/// can find it. Which of the two tracepoints fire on this host's KVM is
/// printed and checked for consistency (kvm_userspace_exit is generic KVM
/// code and must fire: the guest exits to userspace every round).
fn kvm_run_watch_finds_an_unnamed_vcpu_thread() {
    let _one = threads_lock();
    let pid = std::process::id();
    let mut progs = PmuPrograms::load().unwrap();
    for (tp, r) in progs.watch_kvm_run() {
        println!(
            "  raw_tp/{tp}: {}",
            match &r {
                Ok(()) => "attached".into(),
                Err(e) => e.to_string(),
            }
        );
        r.unwrap();
    }
    assert_eq!(
        vcpus::discover(pid),
        Err(vcpus::VcpuError::NoVcpuThreads { pid })
    );

    let vm = DemoVm::start_named(DemoVmConfig::default(), "guest-cpu").unwrap();
    let tid = vm.vcpu_tid().unwrap() as u32;
    let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).unwrap();
    assert_eq!(comm.trim_end(), "guest-cpu");
    let seen = tier_test_support::wait_until("KVM_RUN seen", Duration::from_secs(20), || {
        let all = progs.kvm_threads().unwrap();
        match all.iter().find(|t| t.tid == tid) {
            Some(t) if t.exits >= 10 => Ok(*t),
            _ => Err(format!("tid {tid}: {all:?}")),
        }
    });
    let rounds = vm.counters().rounds;
    println!(
        "  vCPU thread {tid}: kvm_entry {} hits, kvm_userspace_exit {} hits, vcpu_id {:?} ({rounds} guest rounds so far)",
        seen.entries, seen.exits, seen.vcpu_id
    );
    assert_eq!(seen.tgid, pid);
    assert!(seen.start_boottime_ns > 0);
    // Each kvm_entry hit read vcpu_id; without one the id stays unknown.
    assert_eq!(seen.vcpu_id.is_some(), seen.entries > 0, "{seen:?}");
    if seen.entries > 0 {
        assert_eq!(seen.vcpu_id, Some(0));
        // One entry at least per return to userspace.
        assert!(seen.entries >= seen.exits, "{seen:?}");
    }
    // No other thread of this process ran KVM_RUN.
    let mine: Vec<u32> = progs
        .kvm_threads()
        .unwrap()
        .iter()
        .filter(|t| t.tgid == pid)
        .map(|t| t.tid)
        .collect();
    assert_eq!(mine, [tid]);

    // The tracker: nothing by name, the vCPU by the watch, as vCPU 0.
    let mut tracker = VcpuTracker::new(pid);
    assert!(tracker.poll().unwrap().is_empty());
    let c = tracker
        .poll_with(Some(&progs.kvm_threads().unwrap()))
        .unwrap();
    assert_eq!(tracker.found(), Found::KvmRun);
    assert_eq!(c.added, [VcpuThread { tid, index: 0 }]);
    assert!(c.removed.is_empty() && c.stale.is_empty(), "{c:?}");
    assert!(
        tracker
            .poll_with(Some(&progs.kvm_threads().unwrap()))
            .unwrap()
            .is_empty()
    );

    // The thread exits: removed, and its watch entry reported stale.
    let counters = vm.stop().unwrap();
    println!(
        "  stopped after {} rounds, {} exits",
        counters.rounds, counters.exits
    );
    let c = tracker
        .poll_with(Some(&progs.kvm_threads().unwrap()))
        .unwrap();
    assert_eq!(c.removed, [VcpuThread { tid, index: 0 }]);
    assert_eq!(c.stale, [tid]);
    assert_eq!(tracker.found(), Found::Nothing);
    progs.forget_kvm_thread(tid).unwrap();
    assert!(progs.kvm_threads().unwrap().iter().all(|t| t.tid != tid));
}

/// This file's trials, named `pmu::NAME`.
pub fn trials() -> Vec<Trial> {
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
    let kvm = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map(drop)
        .map_err(|e| format!("needs a usable /dev/kvm for the demo VM: {e}"));
    let needs_bpf_and_kvm = |name: &'static str, f: fn()| {
        let ready = ready.clone().and(kvm.clone());
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
            "pmu::vcpu_threads_attributed_per_vm_and_tier",
            vcpu_threads_attributed_per_vm_and_tier,
        ),
        needs_bpf_and_kvm(
            "pmu::kvm_run_watch_finds_an_unnamed_vcpu_thread",
            kvm_run_watch_finds_an_unnamed_vcpu_thread,
        ),
        needs_bpf(
            "pmu::bpf_data_src_decoding_matches_rust",
            bpf_data_src_decoding_matches_rust,
        ),
        needs_bpf(
            "pmu::data_src_samples_count_in_the_tier_of_their_kind",
            data_src_samples_count_in_the_tier_of_their_kind,
        ),
        needs_bpf(
            "pmu::pmu_source_follows_threads_and_vms",
            pmu_source_follows_threads_and_vms,
        ),
        needs_bpf(
            "pmu::placement_puts_local_and_remote_dram_in_the_tiers_of_their_nodes",
            placement_puts_local_and_remote_dram_in_the_tiers_of_their_nodes,
        ),
        Trial::test("pmu::events_status_reports_each_selected_event", || {
            events_status_reports_each_selected_event();
            Ok(())
        }),
    ];
    tests
}
