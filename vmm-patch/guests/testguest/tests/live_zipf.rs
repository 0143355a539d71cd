//! `zipf=` in the running guest: the exact per-tier counts the guest keeps
//! follow the popularity of the pages each tier holds, as the host build of
//! the guest's own tables (`tier_testguest::zipf`) computes it.
//!
//! Custom harness (libtest-mimic): the trials run only when `TIERD_CH_BIN`
//! names the patched cloud-hypervisor and /dev/kvm opens; otherwise they
//! are reported as ignored with the reason.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

mod live_vm;

use std::path::Path;
use std::time::Instant;

use libtest_mimic::Arguments;
use live_vm::{Vm, vm_trial};
use tier_testguest::serial::Line;
use tier_testguest::zipf::Table;

/// Share of the first `head` of the first `touched` ranks of `n` at `milli`.
fn head_share(n: u32, milli: u32, touched: u32, head: u32) -> f64 {
    Table::new(n, milli).unwrap().shares(touched)[..head as usize]
        .iter()
        .sum()
}

/// Five binomial standard deviations of a share `p` over `n` draws.
fn tolerance(p: f64, n: f64) -> f64 {
    5.0 * (p * (1.0 - p) / n).sqrt()
}

fn line(lines: &[Line], pred: impl Fn(&Line) -> bool) -> &Line {
    lines.iter().find(|l| pred(l)).unwrap()
}

/// `hot=512,1536 zipf=1,+`: one ranking over 2048 pages, dram holding its
/// 512-page head and slow its tail; then the tail shrinks to 512 pages.
fn chain_head_in_dram(bin: &Path) {
    let cmdline = "hot=512,1536 zipf=1,+ phases=100/0@20k,100/0@20k:0/512 loop=0 accesses=40k report=0 seed=5";
    let vm = Vm::boot(bin, &[("dram", "64M"), ("slow", "64M")], cmdline);
    vm.wait_api();
    let start = Instant::now();
    let lines = vm.wait_line("tg done", |l| l.kind == "done");
    eprintln!("boot to 40k accesses: {:?}", start.elapsed());
    let p1 = line(&lines, |l| {
        l.kind == "phase" && l.u64("n") == Some(1) && l.u64("at").is_some()
    });
    assert_eq!(p1.u64("at"), Some(20_000));
    assert_eq!(p1.list("active"), Some(vec![512, 512]));
    let a1 = p1.list("acc").unwrap();
    let done = line(&lines, |l| l.kind == "done").list("acc").unwrap();
    let got = [a1[0] as f64 / 20_000.0, (done[0] - a1[0]) as f64 / 20_000.0];
    let want = [
        head_share(2048, 1000, 2048, 512),
        head_share(2048, 1000, 1024, 512),
    ];
    for (g, w) in got.iter().zip(&want) {
        eprintln!("dram share {g:.4}, popularity of its pages {w:.4}");
        assert!((g - w).abs() < tolerance(*w, 20_000.0), "{g} vs {w}");
    }
    // A shorter tail leaves the head a larger share.
    assert!(
        want[1] > want[0] + 0.05,
        "the shrunk tail must show: {want:?}"
    );
    vm.stop();
}

/// `hot=6000 zipf=0.8` with a 16 MiB dram zone: the set's first pages fill
/// dram, the rest spill to slow (the guest allocates them in rank order),
/// and dram's share is the popularity of the head it holds.
fn set_spills_its_tail(bin: &Path) {
    let cmdline = "hot=6000 zipf=0.8 phases=100@0 accesses=30k report=0 seed=9";
    let vm = Vm::boot(bin, &[("dram", "16M"), ("slow", "64M")], cmdline);
    vm.wait_api();
    let lines = vm.wait_line("tg done", |l| l.kind == "done");
    let done = line(&lines, |l| l.kind == "done");
    let res = done.list("res").unwrap();
    let acc = done.list("acc").unwrap();
    assert_eq!(res[0] + res[1], 6000);
    assert!(
        res[0] > 1000 && res[1] > 1000,
        "the set must straddle: {res:?}"
    );
    let got = acc[0] as f64 / 30_000.0;
    let want = head_share(6000, 800, 6000, res[0] as u32);
    eprintln!(
        "dram holds {} of 6000 pages: share {got:.4}, popularity {want:.4}",
        res[0]
    );
    assert!(
        (got - want).abs() < tolerance(want, 30_000.0),
        "{got} vs {want}"
    );
    // Uniform would give the page share; the skew must be visible.
    let pages = res[0] as f64 / 6000.0;
    assert!(want > pages + 0.1, "{want} vs {pages}");
    vm.stop();
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        vm_trial("live_zipf_chain_head_in_dram", chain_head_in_dram),
        vm_trial("live_zipf_set_spills_its_tail", set_spills_its_tail),
    ];
    libtest_mimic::run(&args, trials).exit();
}
