//! Debian's own kernels booted under QEMU TCG: the guest sees two NUMA
//! nodes with the HMAT figures given (and, on 6.12, two memory tiers), its
//! virtio-mem device plugs and unplugs on QMP's word, the balloon takes
//! memory and gives it back, and tierd's BPF programs meet the kernel's own
//! verifier.
//!
//! Needs the unpacked kernels in `TIERD_BED_KERNELS` (colon-separated;
//! `cargo xtask test` prepares them) and QEMU; without them each test is
//! reported as ignored with the reason, never as passed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::path::PathBuf;
use std::time::Duration;

use libtest_mimic::Arguments;
use tier_linux_bed::{Bed, Kernel, checks};
use tier_test_support::gated;

const MIB: u64 = 1 << 20;

fn kernel(series: &str) -> Result<Kernel, String> {
    tier_linux_bed::kernel::from_env(series)
}

fn needs(series: &str) -> Vec<Result<(), String>> {
    vec![
        tier_linux_bed::missing().map_or(Ok(()), Err),
        kernel(series).map(drop),
    ]
}

fn boot(series: &str, programs: &[PathBuf]) -> (Bed, tempfile::TempDir) {
    let k = kernel(series).unwrap();
    let work = tempfile::tempdir().unwrap();
    let (machine, log) = tier_linux_bed::prepare(&k, programs, work.path()).unwrap();
    let bed = Bed::start(&machine, &log, tier_linux_bed::BOOT_TIMEOUT).unwrap();
    eprintln!(
        "{} booted in {:.1} s",
        k.release,
        bed.boot_time().as_secs_f64()
    );
    (bed, work)
}

/// Nodes and tiers, then virtio-mem both ways, then the balloon.
fn memory_devices(series: &str) {
    let (mut bed, _work) = boot(series, &[]);
    let t = checks::tiers(&mut bed).unwrap();
    assert_eq!(
        t.latency_ns,
        vec![80, 250],
        "HMAT latencies as given: {t:?}"
    );
    // 6.12 places nodes in tiers by HMAT; 6.1 only by driver (dax/kmem).
    let want_tiers = if series == "6.1" { 1 } else { 2 };
    assert_eq!(t.kernel_tiers(), want_tiers, "{t:?}");

    let grow = checks::resize(&mut bed, "vmem1", 1, 256 * MIB, Duration::from_secs(60)).unwrap();
    assert_eq!(grow.plugged_after, 256 * MIB, "{grow:?}");
    let grew = grow.node_after.saturating_sub(grow.node_before);
    assert!(
        grew >= 120 * MIB,
        "node 1 grew by the plugged 128 MiB: {grow:?}"
    );
    let shrink = checks::resize(&mut bed, "vmem1", 1, 64 * MIB, Duration::from_secs(60)).unwrap();
    assert_eq!(shrink.plugged_after, 64 * MIB, "{shrink:?}");
    let shrank = shrink.node_before.saturating_sub(shrink.node_after);
    assert!(
        shrank >= 180 * MIB,
        "node 1 shrank by the unplugged 192 MiB: {shrink:?}"
    );

    let b = checks::balloon(&mut bed, 64 * MIB, Duration::from_secs(60)).unwrap();
    eprintln!("{series}: {t:?}\n  grow {grow:?}\n  shrink {shrink:?}\n  balloon {b:?}");
    assert!(
        b.actual_after <= b.target,
        "balloon reached its target: {b:?}"
    );
    assert!(
        b.total_before - b.total_after >= 60 * MIB,
        "the guest's MemTotal lost the ballooned 64 MiB: {b:?}"
    );
}

fn memory_devices_6_1() {
    memory_devices("6.1");
}
fn memory_devices_6_12() {
    memory_devices("6.12");
}

fn program(var: &str) -> Result<PathBuf, String> {
    let p = std::env::var(var)
        .map_err(|_| format!("{var} unset (cargo xtask test builds it for the guest)"))?;
    let p = PathBuf::from(p);
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!("{var}={} is not a file", p.display()))
    }
}

fn needs_program(series: &str, var: &str) -> Vec<Result<(), String>> {
    let mut n = needs(series);
    n.push(program(var).map(drop));
    n
}

/// Every BPF program tierd ships, loaded by the guest kernel's own
/// verifier and attached (`tierd probe --programs`): with kvm.ko loaded,
/// kvm_age_gfn's fexit and kvm's raw tracepoints exist, though no VM ever
/// fires them (no vendor module under TCG). The capability probe agrees.
fn bpf_probe(series: &str) {
    let tierd = program("TIERD_BED_TIERD").unwrap();
    let (mut bed, _work) = boot(series, &[tierd]);
    let text = bed
        .sh("tierd probe --programs", Duration::from_secs(120))
        .unwrap();
    eprintln!("{series}:\n{text}");
    let out = bed
        .sh("tierd probe --programs --json", Duration::from_secs(120))
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let progs = v["programs"].as_array().unwrap();
    assert!(progs.len() >= 10, "every object's programs: {v}");
    for p in progs {
        assert_eq!(p["loaded"], true, "the {series} verifier accepts {p}");
        assert_ne!(p["attached"], false, "{p} attaches in {series}");
    }
    let out = bed
        .sh("tierd probe --json", Duration::from_secs(120))
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let check = |name: &str| {
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(check("btf")["available"], true, "{v}");
    assert_eq!(check("ept-fexit")["available"], true, "{v}");
    let raw = check("ept-tracepoint");
    assert!(
        raw["reason"]
            .as_str()
            .unwrap()
            .starts_with("raw_tp attaches"),
        "{raw}"
    );
}

fn bpf_probe_6_1() {
    bpf_probe("6.1");
}
fn bpf_probe_6_12() {
    bpf_probe("6.12");
}

/// tierd's DAMON driver against the guest's real DAMON (6.12; Debian's 6.1
/// cloud kernel has no DAMON): one region per page over three quarters of
/// a buffer a thread keeps touching. Every page with a region is aged
/// (DAMON marks its folio idle), none without one is, and the driver
/// leaves no kdamond behind.
fn damon_ages_every_region_6_12() {
    let agent = program("TIERD_BED_AGENT").unwrap();
    let (mut bed, _work) = boot("6.12", &[agent]);
    let out = bed
        .sh(
            "tier-bed-agent damon --pages 2048 --hot 512 --sample-ms 100 --rounds 10",
            Duration::from_secs(120),
        )
        .unwrap();
    eprintln!("6.12: tier-bed-agent damon: {out}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["present"], 2048, "{v}");
    assert_eq!(
        v["idle_before"], 0,
        "nothing is idle before DAMON runs: {v}"
    );
    assert_eq!(v["nr_regions"], "1536", "regions kept as given: {v}");
    assert_eq!(v["idle_covered"], 1536, "every region was aged: {v}");
    assert_eq!(
        v["idle_uncovered"], 0,
        "no page outside the regions was: {v}"
    );
    assert_eq!(
        v["nr_kdamonds_after_drop"], "0",
        "the driver removed its kdamond: {v}"
    );
}

/// tier_truth counts a known write where it lands: 32 MiB written into a
/// tmpfs bound to node 1 touch at least that many node-1 pages between two
/// snapshots; the plugin's address check never disagrees; QEMU 7.2's
/// "physical" address is the GPA for node 0 and GPA + 256 MiB for node 1
/// (tier_truth.c says why).
fn truth_counts_node1_writes_6_12() {
    let plugin = program("TIERD_TRUTH_PLUGIN").unwrap();
    let k = kernel("6.12").unwrap();
    let work = tempfile::tempdir().unwrap();
    let (mut machine, log) = tier_linux_bed::prepare(&k, &[], work.path()).unwrap();
    let out = machine.backends.with_extension("truth");
    machine.plugin = Some(machine.truth_plugin(&plugin, &out));
    let mut bed = Bed::start(&machine, &log, tier_linux_bed::BOOT_TIMEOUT).unwrap();
    let layout = machine.layout();
    let t = tier_linux_bed::truth::Truth::open(&out).unwrap();
    bed.sh(
        "mkdir -p /mnt && mount -t tmpfs -o size=64m,mpol=bind:1 tmpfs /mnt",
        Duration::from_secs(60),
    )
    .unwrap();
    let a = t.snapshot();
    bed.sh(
        "dd if=/dev/zero of=/mnt/f bs=1M count=32 2>/dev/null",
        Duration::from_secs(300),
    )
    .unwrap();
    let b = t.snapshot();
    let d = b.since(&a).unwrap();
    let range = |id: &str| {
        layout
            .iter()
            .find(|l| l.0 == id)
            .map(|l| (l.1, l.2))
            .unwrap()
    };
    let (s1, l1) = range("m1");
    let node1 = d.sum_in(s1, l1);
    let (v1, vl1) = range("vm1");
    let vmem1 = d.sum_in(v1, vl1);
    eprintln!(
        "6.12 with tier_truth: booted in {:.1} s; dd: node1 {node1:?} vm1 {vmem1:?} insns {}",
        bed.boot_time().as_secs_f64(),
        d.counters.instructions
    );
    let pages = node1.pages_touched + vmem1.pages_touched;
    assert!(
        pages >= 32 * MIB / tier_linux_bed::truth::PAGE,
        "32 MiB written on node 1: {node1:?} + {vmem1:?}"
    );
    assert!(node1.misses <= node1.touches);
    assert!(d.counters.instructions > 0);
    let c = t.counters();
    assert!(c.check_samples > 0);
    assert_eq!(
        c.check_mismatches, 0,
        "phys_addr - host varied within a backend"
    );
    let r = t.ranges();
    assert_eq!(r[0].phys_minus_gpa, Some(0));
    assert_eq!(r[1].phys_minus_gpa, Some((256 * MIB) as i64));
    drop(bed);
    let _ = std::fs::remove_file(&out);
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        gated(
            "tiers_virtio_mem_and_balloon_6_1",
            needs("6.1"),
            memory_devices_6_1,
        ),
        gated(
            "tiers_virtio_mem_and_balloon_6_12",
            needs("6.12"),
            memory_devices_6_12,
        ),
        gated(
            "bpf_probe_in_real_kernel_6_1",
            needs_program("6.1", "TIERD_BED_TIERD"),
            bpf_probe_6_1,
        ),
        gated(
            "bpf_probe_in_real_kernel_6_12",
            needs_program("6.12", "TIERD_BED_TIERD"),
            bpf_probe_6_12,
        ),
        gated(
            "damon_driver_ages_every_region_6_12",
            needs_program("6.12", "TIERD_BED_AGENT"),
            damon_ages_every_region_6_12,
        ),
        gated(
            "truth_counts_node1_writes_6_12",
            needs_program("6.12", "TIERD_TRUTH_PLUGIN"),
            truth_counts_node1_writes_6_12,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
