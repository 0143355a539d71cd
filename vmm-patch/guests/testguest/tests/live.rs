//! The test guest under the real patched cloud-hypervisor: per-zone
//! balloon targets set through the HTTP API are followed by the guest's
//! driver (inflate and deflate), the serial log shows the workload phases,
//! and the guest's exact per-tier access counts arrive through the stats
//! queue in `vm.counters`.
//!
//! Custom harness (libtest-mimic): the VM trials run only when
//! `TIERD_CH_BIN` names the patched cloud-hypervisor and /dev/kvm opens;
//! the source check only when `TIERD_CH_SRC` names the patched checkout.
//! Otherwise they are reported as ignored with the reason, never as passed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

mod live_vm;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use live_vm::{MIB, PAGE, Vm, WAIT, vm_trial};
use tier_testguest::serial::{Line, Mode};

fn zone_lines(lines: &[Line]) -> Vec<&Line> {
    lines.iter().filter(|l| l.kind == "zone").collect()
}

fn balloon_follows_zone_targets(bin: &Path) {
    let t0 = Instant::now();
    let vm = Vm::boot(
        bin,
        &[("dram", "256M"), ("slow", "256M")],
        "hot=128,128 report=1s",
    );
    let api_up = vm.wait_api();
    let lines = vm.wait_line("tg ready", |l| l.kind == "ready");
    let ready = t0.elapsed();
    eprintln!("VMM API up after {api_up:?}, guest ready (driver OK) after {ready:?}");

    // The driver negotiated VERSION_1 + STATS_VQ + TIERS and sees two tiers.
    let b = lines
        .iter()
        .find(|l| l.kind == "balloon" && l.fields.contains_key("acked"))
        .unwrap();
    let acked = b.u64("acked").unwrap();
    assert_eq!(acked, (1 << 32) | (1 << 23) | (1 << 1), "{b:?}");
    assert_eq!(
        (b.u64("tiers"), b.u64("stats"), b.u64("queues")),
        (Some(2), Some(1), Some(7))
    );

    // Its zones are the VMM's memory zones.
    let info = vm.get("vm.info");
    assert_eq!(info["balloon"]["tiers_negotiated"], true);
    let zones = zone_lines(&lines);
    assert_eq!(zones.len(), 2);
    for (z, mz) in zones.iter().zip(info["memory_zones"].as_array().unwrap()) {
        let ranges = mz["ranges"].as_array().unwrap();
        assert_eq!(z.u64("start"), ranges[0]["start"].as_u64(), "{z:?} vs {mz}");
        assert_eq!(
            z.u64("span").unwrap() * PAGE,
            ranges[0]["size"].as_u64().unwrap()
        );
        assert_eq!(z.u64("node"), mz["guest_numa_node"].as_u64());
        assert!(z.u64("total").unwrap() <= z.u64("span").unwrap());
    }

    // Inflate both tiers.
    let up = [("dram", 64 * MIB), ("slow", 128 * MIB)];
    vm.set_targets(&up);
    let took = vm.wait_zones(&up);
    let mib = (64 + 128) as f64;
    eprintln!(
        "inflate dram 64M + slow 128M: {took:?} ({:.0} MiB/s, {:.0} pages/s)",
        mib / took.as_secs_f64(),
        mib * 256.0 / took.as_secs_f64()
    );
    let c = &vm.get("vm.counters")["__balloon"];
    assert_eq!(c["tier0_inflated_pfns"], 64 * MIB / PAGE);
    assert_eq!(c["tier1_inflated_pfns"], 128 * MIB / PAGE);
    assert_eq!(
        (
            c["tier0_rejected_pfns"].as_u64(),
            c["tier1_rejected_pfns"].as_u64()
        ),
        (Some(0), Some(0))
    );
    assert_eq!(c["tier0_actual_bytes"], 64 * MIB);

    // Deflate: dram down, slow to zero.
    let down = [("dram", 16 * MIB), ("slow", 0)];
    vm.set_targets(&down);
    let took = vm.wait_zones(&down);
    eprintln!(
        "deflate dram -48M, slow -128M: {took:?} ({:.0} MiB/s)",
        176.0 / took.as_secs_f64()
    );
    let c = &vm.get("vm.counters")["__balloon"];
    assert_eq!(c["tier0_deflated_pfns"], 48 * MIB / PAGE);
    assert_eq!(c["tier1_deflated_pfns"], 128 * MIB / PAGE);
    assert_eq!(
        (
            c["tier0_rejected_pfns"].as_u64(),
            c["tier1_rejected_pfns"].as_u64()
        ),
        (Some(0), Some(0))
    );
    let info = vm.get("vm.info");
    assert_eq!(info["memory_actual_size"], 512 * MIB - 16 * MIB);

    // The guest logged each target and reaching it.
    let lines = vm.wait_line("tg balloon tier=1 reached=0", |l| {
        l.kind == "balloon" && l.u64("tier") == Some(1) && l.u64("reached") == Some(0)
    });
    for (tier, pages) in [(0, 16384), (1, 32768), (0, 4096)] {
        assert!(
            lines.iter().any(|l| l.kind == "balloon"
                && l.u64("tier") == Some(tier)
                && l.u64("reached") == Some(pages)),
            "no 'tg balloon tier={tier} reached={pages}'"
        );
    }
    // The balloon's pages are not free to the guest: free + ballooned + hot = total.
    let tick = vm.wait_line("a tick after the deflate", |l| {
        l.kind == "tick" && l.list("bal") == Some(vec![4096, 0])
    });
    let tick = tick.iter().rev().find(|l| l.kind == "tick").unwrap();
    let (free, bal, res) = (
        tick.list("free").unwrap(),
        tick.list("bal").unwrap(),
        tick.list("res").unwrap(),
    );
    for (i, z) in zones.iter().enumerate() {
        assert_eq!(
            free[i] + bal[i] + res[i],
            z.u64("total").unwrap(),
            "tier {i}: {tick:?}"
        );
    }
    vm.stop();
}

fn phases_and_exact_stats(bin: &Path) {
    let cmdline = "hot=64,64 phases=75/25@20k,25/75@20k loop=0 accesses=60k report=10k seed=3";
    let vm = Vm::boot(bin, &[("dram", "64M"), ("slow", "64M")], cmdline);
    vm.wait_api();
    let start = Instant::now();
    let lines = vm.wait_line("tg done", |l| l.kind == "done");
    let took = start.elapsed();
    eprintln!(
        "60k accesses in {took:?} ({:.0} accesses/s emulated)",
        60_000.0 / took.as_secs_f64()
    );

    // One line per phase, at exact access counts.
    let phases: Vec<&Line> = lines.iter().filter(|l| l.kind == "phase").collect();
    assert_eq!(phases.len(), 3, "{phases:#?}");
    assert_eq!(
        (phases[0].u64("n"), phases[0].u64("at")),
        (Some(0), Some(0))
    );
    assert_eq!(phases[0].list("w"), Some(vec![75, 25]));
    assert_eq!(
        (phases[1].u64("n"), phases[1].u64("at")),
        (Some(1), Some(20_000))
    );
    assert_eq!(phases[1].list("w"), Some(vec![25, 75]));
    assert_eq!(phases[2].words, vec!["stays"]);
    assert_eq!(phases[2].u64("at"), Some(40_000));
    let a1 = phases[1].list("acc").unwrap();
    let a2 = phases[2].list("acc").unwrap();
    assert_eq!(a1.iter().sum::<u64>(), 20_000);
    assert_eq!(a2.iter().sum::<u64>(), 40_000);
    let share0 = a1[0] as f64 / 20_000.0;
    let share1 = (a2[0] - a1[0]) as f64 / 20_000.0;
    eprintln!("dram share: phase 0 {share0:.3} (weight 0.75), phase 1 {share1:.3} (weight 0.25)");
    assert!((share0 - 0.75).abs() < 0.02, "{share0}");
    assert!((share1 - 0.25).abs() < 0.02, "{share1}");

    let done = lines.iter().find(|l| l.kind == "done").unwrap();
    assert_eq!(done.u64("total"), Some(60_000));
    let acc = done.list("acc").unwrap();
    assert_eq!(acc.iter().sum::<u64>(), 60_000);

    // The stats queue delivers exactly the guest's counts (refreshed every second).
    let zones = zone_lines(&lines);
    let free = done.list("free").unwrap();
    let start = Instant::now();
    let c = loop {
        let c = vm.get("vm.counters")["__balloon"].clone();
        if c["tier0_guest_accesses"] == acc[0] && c["tier1_guest_accesses"] == acc[1] {
            break c;
        }
        assert!(
            start.elapsed() < WAIT,
            "stats never reported {acc:?}: {c:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("vm.counters after done: {c}");
    assert!(c["stats_updates"].as_u64().unwrap() >= 2);
    let mut total = 0;
    for (i, z) in zones.iter().enumerate() {
        let t = z.u64("total").unwrap() * PAGE;
        assert_eq!(c[format!("tier{i}_guest_total_bytes")], t);
        assert_eq!(c[format!("tier{i}_guest_free_bytes")], free[i] * PAGE);
        total += t;
    }
    assert_eq!(c["stat_total_memory"], total);
    assert_eq!(c["stat_free_memory"], (free[0] + free[1]) * PAGE);
    assert_eq!(c["stat_available_memory"], c["stat_free_memory"]);
    vm.stop();
}

/// Share of tier-0 accesses between two tick lines.
fn dram_share(a: &Line, b: &Line) -> f64 {
    let (x, y) = (a.list("acc").unwrap(), b.list("acc").unwrap());
    let d0 = y[0] - x[0];
    let d1 = y[1] - x[1];
    d0 as f64 / (d0 + d1) as f64
}

fn dram_balloon_moves_hot_set(bin: &Path) {
    let vm = Vm::boot(
        bin,
        &[("dram", "64M"), ("slow", "128M")],
        "hot=512,128 phases=90/10@0 report=1s",
    );
    vm.wait_api();
    let lines = vm.wait_line("two ticks", |l| l.kind == "tick" && l.u64("s") == Some(2));
    let ticks: Vec<&Line> = lines.iter().filter(|l| l.kind == "tick").collect();
    let before = dram_share(ticks[0], ticks[ticks.len() - 1]);
    let total0 = zone_lines(&lines)[0].u64("total").unwrap();

    // Balloon all but 64 pages of dram: 448 of the 512 hot dram pages must move.
    let target = (total0 - 64) * PAGE;
    vm.set_targets(&[("dram", target)]);
    let took = vm.wait_zones(&[("dram", target)]);
    let lines = vm.wait_line("tg balloon tier=0 reached", |l| {
        l.kind == "balloon" && l.u64("tier") == Some(0) && l.u64("reached") == Some(total0 - 64)
    });
    let reached = lines
        .iter()
        .rev()
        .find(|l| l.kind == "balloon" && l.fields.contains_key("reached"))
        .unwrap();
    eprintln!(
        "dram balloon to {} pages in {took:?}: {reached:?}",
        total0 - 64
    );
    assert_eq!(reached.u64("evicted"), Some(512 - 64));
    let n = lines.iter().filter(|l| l.kind == "tick").count();
    let lines = vm.wait_line("three more ticks", |l| {
        l.kind == "tick" && l.u64("s") >= Some(n as u64 + 3)
    });
    let ticks: Vec<&Line> = lines.iter().filter(|l| l.kind == "tick").collect();
    let last = ticks[ticks.len() - 1];
    assert_eq!(last.list("res"), Some(vec![64, 512 - 64 + 128]));
    let after = dram_share(ticks[n], last);
    eprintln!(
        "dram share of accesses: {before:.3} before, {after:.3} with 448 hot pages pushed to slow"
    );
    assert!(before > 0.85, "{before}");
    assert!(after < 0.25, "{after}");

    // Deflate: the balloon answers first, then the hot pages come back to
    // dram a descriptor's worth (256 pages) per poll.
    vm.set_targets(&[("dram", 0)]);
    vm.wait_zones(&[("dram", 0)]);
    vm.wait_line("tg balloon tier=0 reached=0", |l| {
        l.kind == "balloon" && l.u64("tier") == Some(0) && l.u64("reached") == Some(0)
    });
    // A tick after the deflate with every hot page back (the ticks before
    // the inflate had them all too), then two more: the share between them.
    let before_deflate = vm.lines().iter().rev().find_map(Line::tick).unwrap().s;
    let lines = vm.wait_line("all hot pages back in dram", |l| {
        l.tick()
            .is_some_and(|t| t.s > before_deflate && t.res == [512, 128])
    });
    let back = lines
        .iter()
        .filter_map(Line::tick)
        .find(|t| t.s > before_deflate && t.res == [512, 128])
        .unwrap()
        .s
        .unwrap();
    let lines = vm.wait_line("two more ticks", |l| {
        l.kind == "tick" && l.u64("s") >= Some(back + 2)
    });
    let ticks: Vec<&Line> = lines.iter().filter(|l| l.kind == "tick").collect();
    let from = ticks.iter().position(|t| t.u64("s") == Some(back)).unwrap();
    let last = ticks[ticks.len() - 1];
    assert_eq!(last.list("res"), Some(vec![512, 128]));
    let again = dram_share(ticks[from], last);
    eprintln!("dram share after deflate: {again:.3}");
    assert!(again > 0.85, "{again}: {:#?}", &ticks[from..]);
    vm.stop();
}

/// Index of the first line satisfying `pred`.
fn index_of(lines: &[Line], pred: impl Fn(&Line) -> bool) -> Option<usize> {
    lines.iter().position(pred)
}

fn mode_edge(l: &Line, mode: Mode, on: bool) -> bool {
    l.mode().is_some_and(|m| m.mode == mode && m.on == on)
}

/// `deaf=`: a target set inside the window is not read, not reached and no
/// stats buffer comes back until the window ends; the workload runs on.
fn deaf_window_holds_the_balloon(bin: &Path) {
    let vm = Vm::boot(
        bin,
        &[("dram", "64M"), ("slow", "64M")],
        "hot=64,64 report=1s deaf=3s+6s",
    );
    vm.wait_api();
    let lines = vm.wait_line("tg deaf on", |l| mode_edge(l, Mode::Deaf, true));
    let on = lines.iter().find_map(Line::mode).unwrap();
    assert_eq!(on.s, 3, "{on:?}");
    let stats0 = vm.get("vm.counters")["__balloon"]["stats_updates"]
        .as_u64()
        .unwrap();
    let target = 16 * MIB;
    vm.set_targets(&[("dram", target)]);
    let set_at = Instant::now();
    let mut checks = 0;
    loop {
        let info = vm.get("vm.info");
        let stats = vm.get("vm.counters")["__balloon"]["stats_updates"]
            .as_u64()
            .unwrap();
        let lines = vm.lines();
        if index_of(&lines, |l| mode_edge(l, Mode::Deaf, false)).is_some() {
            break;
        }
        // Both reads were made inside the window.
        let dram = info["balloon"]["zones"]
            .as_array()
            .unwrap()
            .iter()
            .find(|z| z["id"] == "dram")
            .unwrap()
            .clone();
        assert_eq!(dram["target"], target, "{dram}");
        assert_eq!(
            (dram["actual"].as_u64(), dram["host_ballooned"].as_u64()),
            (Some(0), Some(0)),
            "deaf guest moved its balloon: {dram}"
        );
        assert_eq!(stats, stats0, "deaf guest returned a stats buffer");
        assert!(
            !lines
                .iter()
                .any(|l| l.kind == "balloon" && l.fields.contains_key("target")),
            "deaf guest read a target"
        );
        checks += 1;
        assert!(set_at.elapsed() < WAIT, "no tg deaf off");
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "target held off for {:?} inside the window ({checks} checks)",
        set_at.elapsed()
    );
    assert!(checks >= 3, "only {checks} checks inside the window");
    let took = vm.wait_zones(&[("dram", target)]);
    eprintln!("reached {} MiB {took:?} after the window", target / MIB);
    let lines = vm.wait_line("tg balloon tier=0 reached", |l| {
        l.kind == "balloon" && l.u64("tier") == Some(0) && l.u64("reached") == Some(target / PAGE)
    });
    let off = index_of(&lines, |l| mode_edge(l, Mode::Deaf, false)).unwrap();
    assert_eq!(lines[off].mode().unwrap().s, 9);
    let read = index_of(&lines, |l| {
        l.kind == "balloon" && l.u64("tier") == Some(0) && l.u64("target") == Some(target / PAGE)
    })
    .unwrap();
    assert!(read > off, "target read before the window ended");
    // The workload kept running inside the window.
    let ticks: Vec<_> = lines[..off]
        .iter()
        .filter_map(Line::tick)
        .filter(|t| t.s.is_some_and(|s| (4..9).contains(&s)))
        .collect();
    assert!(ticks.len() >= 4, "{ticks:?}");
    assert!(
        ticks.windows(2).all(|w| w[1].total > w[0].total),
        "{ticks:?}"
    );
    // Stats flow again.
    let start = Instant::now();
    while vm.get("vm.counters")["__balloon"]["stats_updates"].as_u64() <= Some(stats0) {
        assert!(start.elapsed() < WAIT, "stats never resumed");
        std::thread::sleep(Duration::from_millis(200));
    }
    vm.stop();
}

/// `lie=`: inside the window the stats are the documented lie (access
/// counts swapped between the two tiers and x 1000, free memory 0); after
/// it, the truth again.
fn lie_window_falsifies_stats(bin: &Path) {
    let vm = Vm::boot(
        bin,
        &[("dram", "64M"), ("slow", "64M")],
        "hot=64,64 phases=90/10@0 report=1s lie=3s+6s",
    );
    vm.wait_api();
    // The tick of the edge's second comes right after the edge, with no
    // access between: its total is the count when the lie began.
    let lines = vm.wait_line("the tick of second 3", |l| {
        l.tick().is_some_and(|t| t.s == Some(3))
    });
    assert!(index_of(&lines, |l| mode_edge(l, Mode::Lie, true)).is_some());
    let at_edge = lines.iter().rev().find_map(Line::tick).unwrap().total;
    let counters = || vm.get("vm.counters")["__balloon"].clone();
    let accesses = |c: &serde_json::Value| {
        (
            c["tier0_guest_accesses"].as_u64().unwrap(),
            c["tier1_guest_accesses"].as_u64().unwrap(),
        )
    };
    // A tick printed after now: its total bounds every count reported before.
    let later_total = || {
        let last = vm.lines().iter().rev().find_map(Line::tick).unwrap().s;
        let lines = vm.wait_line("a later tick", |l| l.tick().is_some_and(|t| t.s > last));
        lines.iter().rev().find_map(Line::tick).unwrap().total
    };
    // The first buffer refilled after the edge is a lie.
    let start = Instant::now();
    let c = loop {
        let c = counters();
        if c["stat_free_memory"] == 0 {
            break c;
        }
        assert!(start.elapsed() < WAIT, "no lie arrived: {c:#}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let bound = later_total();
    let lines = vm.lines();
    let off = index_of(&lines, |l| mode_edge(l, Mode::Lie, false));
    eprintln!("lying stats: {c}");
    let (a0, a1) = accesses(&c);
    assert_eq!((a0 % 1000, a1 % 1000), (0, 0), "{c}");
    // dram takes 90 % of the accesses: swapped, slow reports the larger count.
    assert!(a1 > 4 * a0 && a0 > 0, "{c}");
    let sum = (a0 + a1) / 1000;
    assert!(
        (at_edge..=bound).contains(&sum),
        "{c}: reported total {sum} not in [{at_edge}, {bound}] (window ended: {off:?})"
    );
    assert_eq!(c["stat_available_memory"], 0);
    assert_eq!(c["tier0_guest_free_bytes"], 0);
    assert_eq!(c["tier1_guest_free_bytes"], 0);
    assert!(c["tier0_guest_total_bytes"].as_u64().unwrap() > 0);
    assert!(c["stat_total_memory"].as_u64().unwrap() > 0);
    // After the window: the truth again.
    vm.wait_line("tg lie off", |l| mode_edge(l, Mode::Lie, false));
    let start = Instant::now();
    let c = loop {
        let c = counters();
        if c["stat_free_memory"].as_u64() > Some(0) {
            break c;
        }
        assert!(
            start.elapsed() < WAIT,
            "stats never told the truth again: {c:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let bound = later_total();
    let (a0, a1) = accesses(&c);
    eprintln!("true stats again: {c}");
    assert!(
        a0 > 4 * a1 && a0 + a1 <= bound,
        "{c} vs a later total {bound}"
    );
    vm.stop();
}

/// Canary: pages in use carry it from outside (/proc/PID/mem at the zones'
/// host addresses), through an inflate that moves 448 hot pages and a
/// deflate that brings them back, and the guest never finds one lost.
fn canary_survives_balloon_moves(bin: &Path) {
    let vm = Vm::boot(
        bin,
        &[("dram", "64M"), ("slow", "128M")],
        "hot=512,128 phases=90/10@0 report=1s",
    );
    vm.wait_api();
    let lines = vm.wait_line("a tick", |l| l.kind == "tick");
    let total0 = zone_lines(&lines)[0].u64("total").unwrap();
    let count =
        |m: &std::collections::BTreeMap<String, Vec<u64>>, id: &str| m.get(id).map_or(0, Vec::len);
    let stamped = vm.stamped_pages();
    assert_eq!(
        (count(&stamped, "dram"), count(&stamped, "slow")),
        (512, 128),
        "before"
    );

    let target = (total0 - 64) * PAGE;
    vm.set_targets(&[("dram", target)]);
    vm.wait_zones(&[("dram", target)]);
    vm.wait_line("tg balloon tier=0 reached", |l| {
        l.kind == "balloon" && l.u64("tier") == Some(0) && l.u64("reached") == Some(total0 - 64)
    });
    let stamped = vm.stamped_pages();
    assert_eq!(
        (count(&stamped, "dram"), count(&stamped, "slow")),
        (64, 576),
        "inflated"
    );

    vm.set_targets(&[("dram", 0)]);
    vm.wait_zones(&[("dram", 0)]);
    // A tick printed after the deflate with every hot page back: no page moves any more.
    let last = vm.lines().iter().rev().find_map(Line::tick).unwrap().s;
    let lines = vm.wait_line("all hot pages back in dram", |l| {
        l.tick().is_some_and(|t| t.s > last && t.res == [512, 128])
    });
    let stamped = vm.stamped_pages();
    assert_eq!(
        (count(&stamped, "dram"), count(&stamped, "slow")),
        (512, 128),
        "deflated"
    );

    let ticks: Vec<_> = lines.iter().filter_map(Line::tick).collect();
    assert!(ticks.len() >= 2, "{ticks:?}");
    for t in &ticks {
        assert_eq!(t.lost, [0, 0], "{t:?}");
    }
    // Every access so far checked its page: none found the canary gone.
    let truth = lines
        .iter()
        .find(|l| l.kind == "ready")
        .unwrap()
        .u64("truth")
        .unwrap();
    let size = tier_testguest::truth::Truth::SIZE;
    let tr = tier_testguest::truth::Truth::from_bytes(&vm.read_guest(truth, size as u64)).unwrap();
    assert_eq!(tr.lost, [0; 8], "{tr:?}");
    assert!(tr.total > 0);
    assert!(!lines.iter().any(|l| l.canary_lost().is_some()));
    eprintln!(
        "{} ticks, lost=0,0 in every one; last {:?}",
        ticks.len(),
        ticks.last().unwrap()
    );
    vm.stop();
}

/// Page stamps (the working-set truth): every hot page stamped at boot and
/// nothing else, each stamp at most the access count read after it, and a
/// second later the hot pages stamped anew while the count moved on.
fn page_stamps_follow_the_accesses(bin: &Path) {
    use tier_testguest::truth::Truth;
    let vm = Vm::boot(
        bin,
        &[("dram", "64M"), ("slow", "64M")],
        "hot=512,128 phases=90/10@0 report=1s",
    );
    vm.wait_api();
    let lines = vm.wait_line("a tick", |l| l.kind == "tick");
    let at = lines
        .iter()
        .find(|l| l.kind == "ready")
        .unwrap()
        .u64("truth")
        .unwrap();
    let read_truth = || Truth::from_bytes(&vm.read_guest(at, Truth::SIZE as u64)).unwrap();
    let stamps = |t: &Truth, z: usize| -> Vec<u64> {
        let s = t.stamps[z];
        assert!(s.pages > 0, "zone {z} has no stamps: {t:?}");
        vm.read_guest(s.gpa, s.pages * 8)
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let t0 = read_truth();
    let first: Vec<Vec<u64>> = (0..2).map(|z| stamps(&t0, z)).collect();
    let t1 = read_truth();
    let touched: Vec<usize> = first
        .iter()
        .map(|s| s.iter().filter(|&&x| x > 0).count())
        .collect();
    assert_eq!(touched, vec![512, 128], "pages ever touched per zone");
    for s in &first {
        assert!(
            s.iter().all(|&x| x <= t1.count() + 1),
            "a stamp ahead of the count"
        );
    }
    assert_eq!(t0.stamps[2].pages, 0, "no third zone: {t0:?}");
    std::thread::sleep(std::time::Duration::from_secs(1));
    let t2 = read_truth();
    let later: Vec<Vec<u64>> = (0..2).map(|z| stamps(&t2, z)).collect();
    assert!(t2.count() > t1.count(), "{t1:?} -> {t2:?}");
    // 90 % of the accesses on 512 dram pages: most of them touched again.
    let again = later[0].iter().filter(|&&x| x > t1.count()).count();
    assert!(
        again > 256,
        "{again} dram pages touched since the first read"
    );
    eprintln!(
        "stamps: {touched:?} pages, {again} dram pages touched again within 1 s, count {} -> {}",
        t1.count(),
        t2.count()
    );
    vm.stop();
}

/// Canary, negative: a page in use zeroed from outside (as a page the host
/// released reads) is found by the guest: one `tg canary lost` line with its
/// address, `lost=` 1 for its tier, the truth block's count 1, and the
/// canary back in place.
fn canary_detects_a_zeroed_page(bin: &Path) {
    let vm = Vm::boot(
        bin,
        &[("dram", "64M"), ("slow", "64M")],
        "hot=64,64 phases=50/50@0 report=1s",
    );
    vm.wait_api();
    let lines = vm.wait_line("a tick", |l| l.kind == "tick");
    let truth = lines
        .iter()
        .find(|l| l.kind == "ready")
        .unwrap()
        .u64("truth")
        .unwrap();
    let stamped = vm.stamped_pages();
    let victim = stamped["slow"][10];
    vm.write_guest(victim, &[0u8; PAGE as usize]);
    let lines = vm.wait_line("tg canary lost", |l| l.canary_lost().is_some());
    let lost = lines.iter().find_map(Line::canary_lost).unwrap();
    eprintln!("zeroed {victim:#x} from outside: {lost:?}");
    assert_eq!((lost.gpa, lost.tier, lost.read), (victim, 1, 0));
    let lines = vm.wait_line("a tick with lost=", |l| {
        l.tick().is_some_and(|t| t.lost.iter().sum::<u64>() > 0)
    });
    let t = lines
        .iter()
        .find_map(|l| l.tick().filter(|t| t.lost.iter().sum::<u64>() > 0))
        .unwrap();
    assert_eq!(t.lost, [0, 1], "{t:?}");
    let tr = tier_testguest::truth::Truth::from_bytes(
        &vm.read_guest(truth, tier_testguest::truth::Truth::SIZE as u64),
    )
    .unwrap();
    assert_eq!(tr.lost[..2], [0, 1]);
    // Stamped again: one loss counted once.
    let stamped = vm.stamped_pages();
    assert!(stamped["slow"].contains(&victim));
    assert_eq!(stamped["slow"].len(), 64);
    assert_eq!(
        lines.iter().filter(|l| l.canary_lost().is_some()).count(),
        1
    );
    vm.stop();
}

/// The patched device's constants (cloud-hypervisor source) are the guest's.
fn ch_source_constants(src: &Path) {
    let rs = std::fs::read_to_string(src.join("virtio-devices/src/balloon.rs")).unwrap();
    let header =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("guest/spec.h"))
            .unwrap();
    let value = |text: &str, re: &str| -> u64 {
        let c = regex::Regex::new(re)
            .unwrap()
            .captures(text)
            .unwrap_or_else(|| panic!("no match for {re}"));
        let v = c[1].trim();
        match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).unwrap(),
            None => v.parse().unwrap(),
        }
    };
    let pairs = [
        ("VIRTIO_BALLOON_F_TIERS: u64", "VIRTIO_BALLOON_F_TIERS"),
        (
            "VIRTIO_BALLOON_F_STATS_VQ: u64",
            "VIRTIO_BALLOON_F_STATS_VQ",
        ),
        (
            "VIRTIO_BALLOON_TIERS_MAX: usize",
            "VIRTIO_BALLOON_TIERS_MAX",
        ),
        (
            "CONFIG_TIER_COUNT_OFFSET: u64",
            "VIRTIO_BALLOON_CFG_TIER_COUNT",
        ),
        ("CONFIG_TIERS_OFFSET: u64", "VIRTIO_BALLOON_CFG_TIERS"),
        ("CONFIG_TIER_SIZE: u64", "VIRTIO_BALLOON_CFG_TIER_SIZE"),
        (
            "CONFIG_TIER_ACTUAL_OFFSET: u64",
            "VIRTIO_BALLOON_TIER_ACTUAL",
        ),
        (
            "VIRTIO_BALLOON_S_TIER_BASE: u16",
            "VIRTIO_BALLOON_S_TIER_BASE",
        ),
        (
            "VIRTIO_BALLOON_S_TIER_STRIDE: u16",
            "VIRTIO_BALLOON_S_TIER_STRIDE",
        ),
        (
            "VIRTIO_BALLOON_S_TIER_ACCESSES: u16",
            "VIRTIO_BALLOON_S_TIER_ACCESSES",
        ),
        (
            "VIRTIO_BALLOON_S_TIER_FREE: u16",
            "VIRTIO_BALLOON_S_TIER_FREE",
        ),
        (
            "VIRTIO_BALLOON_S_TIER_TOTAL: u16",
            "VIRTIO_BALLOON_S_TIER_TOTAL",
        ),
        ("VIRTIO_BALLOON_PFN_SHIFT: u64", "VIRTIO_BALLOON_PFN_SHIFT"),
    ];
    for (rust, c) in pairs {
        let r = value(
            &rs,
            &format!(r"const {}\s*=\s*(0x[0-9a-fA-F]+|\d+);", regex::escape(rust)),
        );
        let h = value(&header, &format!(r"#define {c} (0x[0-9a-fA-F]+|\d+)"));
        assert_eq!(r, h, "{rust} (cloud-hypervisor) vs {c} (spec.h)");
    }
    // 256 PFNs per descriptor: `VIRTIO_BALLOON_MAX_PFN_BYTES: u32 = 256 * 4`.
    assert!(rs.contains("const VIRTIO_BALLOON_MAX_PFN_BYTES: u32 = 256 * 4;"));
    assert!(header.contains("#define VIRTIO_BALLOON_MAX_PFNS_PER_DESC 256"));
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        vm_trial(
            "live_balloon_follows_zone_targets",
            balloon_follows_zone_targets,
        ),
        vm_trial("live_phases_and_exact_stats", phases_and_exact_stats),
        vm_trial(
            "live_dram_balloon_moves_hot_set_to_slow",
            dram_balloon_moves_hot_set,
        ),
        vm_trial(
            "live_deaf_window_holds_the_balloon",
            deaf_window_holds_the_balloon,
        ),
        vm_trial(
            "live_lie_window_falsifies_stats",
            lie_window_falsifies_stats,
        ),
        vm_trial(
            "live_canary_survives_balloon_moves",
            canary_survives_balloon_moves,
        ),
        vm_trial(
            "live_canary_detects_a_zeroed_page",
            canary_detects_a_zeroed_page,
        ),
        vm_trial(
            "live_page_stamps_follow_the_accesses",
            page_stamps_follow_the_accesses,
        ),
        Trial::ignorable_test(
            "ch_source_constants_match_guest",
            || match std::env::var_os("TIERD_CH_SRC").map(PathBuf::from) {
                None => Ok(Completion::ignored_with(
                    "TIERD_CH_SRC is not set (cloud-hypervisor checkout with the series applied)",
                )),
                Some(src) if !src.join("virtio-devices/src/balloon.rs").is_file() => {
                    Err(Failed::from(format!(
                        "TIERD_CH_SRC={} has no virtio-devices/src/balloon.rs",
                        src.display()
                    )))
                }
                Some(src) => {
                    ch_source_constants(&src);
                    Ok(Completion::Completed)
                }
            },
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
