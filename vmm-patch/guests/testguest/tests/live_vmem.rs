//! The test guest's virtio-mem driver under the real patched
//! cloud-hypervisor: `vm.resize-zone` grows and shrinks a zone's virtio-mem
//! part, the guest plugs and unplugs blocks (moving its workload in and out
//! of them), and vm.info's `virtio_mem` (vmm-patch 0009) reports requested
//! and plugged sizes that match what the guest says it plugged. Guests that
//! never answer (`virtio_mem=mute`), only draw errors (`virtio_mem=error`)
//! or have no driver (`virtio_mem=off`) leave the plugged size where it was
//! while the requested size moves.
//!
//! Custom harness (libtest-mimic): the VM trials run only when
//! `TIERD_CH_BIN` names the patched cloud-hypervisor and /dev/kvm opens;
//! otherwise they are reported as ignored with the reason.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

mod live_vm;

use std::path::Path;
use std::time::{Duration, Instant};

use libtest_mimic::Arguments;
use live_vm::{MIB, PAGE, Vm, WAIT, vm_trial};
use serde_json::Value;
use tier_testguest::serial::Line;

/// Boot part of the virtio-mem zone `dram`.
const DRAM_BOOT: u64 = 128 * MIB;
/// Its hotpluggable part (the virtio-mem region).
const DRAM_HOTPLUG: u64 = 512 * MIB;
const BLOCK: u64 = 2 * MIB;
/// Hot set 0, pages: dram's boot part (128 MiB, less what the guest
/// reserves) plus a little.
const HOT0: u64 = 34816;

/// The command line of docs/virtio-mem.md: zone `dram` = 128 MiB at boot +
/// a 512 MiB virtio-mem region, on guest node 0; zone `slow` on node 1.
fn vmm_args() -> Vec<String> {
    [
        "--memory",
        "size=0,hotplug_method=virtio-mem",
        "--memory-zone",
        "id=dram,size=128M,hotplug_size=512M,host_numa_node=0",
        "--memory-zone",
        "id=slow,size=256M,host_numa_node=0",
        "--numa",
        "guest_numa_id=0,memory_zones=dram",
        "--numa",
        "guest_numa_id=1,memory_zones=slow",
    ]
    .map(String::from)
    .to_vec()
}

fn zone(info: &Value, id: &str) -> Value {
    info["memory_zones"]
        .as_array()
        .unwrap()
        .iter()
        .find(|z| z["id"] == id)
        .unwrap_or_else(|| panic!("no zone {id} in vm.info: {info}"))
        .clone()
}

fn vmem(vm: &Vm) -> Value {
    let z = zone(&vm.get("vm.info"), "dram");
    assert!(z["virtio_mem"].is_object(), "no virtio_mem in {z}");
    z["virtio_mem"].clone()
}

fn resize_zone(vm: &Vm, id: &str, desired_ram: u64) -> (u16, String) {
    let body = serde_json::json!({ "id": id, "desired_ram": desired_ram }).to_string();
    vm.api("PUT", "vm.resize-zone", Some(&body))
}

/// Ask for `plugged` bytes in the virtio-mem part of `dram`.
fn resize(vm: &Vm, plugged: u64) {
    let (status, body) = resize_zone(vm, "dram", DRAM_BOOT + plugged);
    assert_eq!(status, 204, "vm.resize-zone dram +{plugged}: {body}");
    assert_eq!(vmem(vm)["requested_size"], plugged, "set at once");
}

/// Wait until vm.info says the device has `bytes` requested and plugged.
fn wait_plugged(vm: &Vm, bytes: u64) -> Duration {
    let start = Instant::now();
    loop {
        let v = vmem(vm);
        if v["requested_size"] == bytes && v["plugged_size"] == bytes {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < WAIT,
            "plugged_size never reached {bytes}: {v}\nserial:\n{}",
            log(vm)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn log(vm: &Vm) -> String {
    vm.lines()
        .iter()
        .filter(|l| l.kind == "vmem" || l.kind == "error" || l.kind == "canary")
        .map(|l| format!("{l:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The guest's `tg vmem reached plugged=BYTES ...` line.
fn wait_reached(vm: &Vm, bytes: u64) -> Line {
    let lines = vm.wait_line(&format!("tg vmem reached plugged={bytes}"), |l| {
        l.kind == "vmem"
            && l.words.first().is_some_and(|w| w == "reached")
            && l.u64("plugged") == Some(bytes)
    });
    lines
        .into_iter()
        .rev()
        .find(|l| l.kind == "vmem" && l.u64("plugged") == Some(bytes) && !l.words.is_empty())
        .unwrap()
}

/// Workload pages (carrying their canary) in the plugged part, read
/// through /proc/PID/mem at vm.info's `host_address`.
fn stamped_in_region(vm: &Vm, v: &Value, len: u64) -> Vec<u64> {
    use std::os::unix::fs::FileExt;
    let mem = std::fs::File::open(format!("/proc/{}/mem", vm.pid())).unwrap();
    let mut buf = vec![0u8; len as usize];
    mem.read_exact_at(&mut buf, v["host_address"].as_u64().unwrap())
        .unwrap();
    tier_testguest::canary::stamped_pages(&buf, v["start"].as_u64().unwrap())
}

fn guest_follows_resize_zone(bin: &Path) {
    // The guest reads its nodes from the SRAT: zone 0 is dram's boot part
    // (node 0), zone 1 slow (node 1), zone 2 the virtio-mem region, in
    // dram's tier. Set 0 is a little larger than the boot part: the rest
    // starts in slow and moves into plugged blocks. Page moves cost ~2 ms
    // each here (emulated copies), hence a small overflow.
    let vm = Vm::spawn(
        bin,
        &vmm_args(),
        &format!("hot={HOT0},256 phases=50/50@0 report=1s virtio_mem=on"),
    );
    vm.wait_api();
    let lines = vm.wait_line("tg ready", |l| l.kind == "ready");

    // vm.info: the region and sizes, for the virtio-mem zone only.
    let info = vm.get("vm.info");
    assert!(
        zone(&info, "slow").get("virtio_mem").is_none(),
        "{}",
        zone(&info, "slow")
    );
    let v = vmem(&vm);
    eprintln!("vm.info memory_zones: {}", info["memory_zones"]);
    assert_eq!(v["size"], DRAM_HOTPLUG);
    assert_eq!(v["block_size"], BLOCK);
    assert_eq!(
        (v["requested_size"].as_u64(), v["plugged_size"].as_u64()),
        (Some(0), Some(0))
    );
    assert_ne!(v["host_address"], 0);
    let start = v["start"].as_u64().unwrap();
    let dram = zone(&info, "dram");
    for r in dram["ranges"].as_array().unwrap() {
        let (s, n) = (r["start"].as_u64().unwrap(), r["size"].as_u64().unwrap());
        assert!(
            s + n <= start || s >= start + DRAM_HOTPLUG,
            "boot range {r} overlaps the region"
        );
    }

    // The guest's driver sees the same device: region, block, node (ACPI_PXM).
    let probe = lines
        .iter()
        .find(|l| l.kind == "vmem" && l.fields.contains_key("acked"))
        .unwrap_or_else(|| panic!("no tg vmem probe line:\n{}", log(&vm)));
    assert_eq!(probe.u64("addr"), Some(start), "{probe:?}");
    assert_eq!(probe.u64("region"), Some(DRAM_HOTPLUG));
    assert_eq!(probe.u64("block"), Some(BLOCK));
    assert_eq!(probe.fields["node"], dram["guest_numa_node"].to_string());
    assert_eq!(
        probe.u64("acked"),
        Some((1 << 32) | 1),
        "VERSION_1 + ACPI_PXM"
    );
    let gz = lines
        .iter()
        .find(|l| l.kind == "zone" && l.u64("start") == Some(start))
        .unwrap_or_else(|| panic!("no guest zone at the region"));
    assert_eq!(gz.u64("total"), Some(0), "nothing plugged at boot: {gz:?}");
    assert_eq!(gz.u64("tier"), Some(0), "the region is dram's: {gz:?}");
    let boot: Vec<&Line> = lines.iter().filter(|l| l.kind == "zone").collect();
    assert_eq!(boot.len(), 3, "two SRAT nodes and the region: {boot:?}");
    assert_eq!(
        (boot[0].u64("node"), boot[1].u64("node")),
        (Some(0), Some(1)),
        "{boot:?}"
    );
    assert_eq!(boot[1].u64("span"), Some(256 * MIB / PAGE), "{boot:?}");
    let away = HOT0 - boot[0].u64("free").unwrap();
    assert!(
        (1024..=4096).contains(&away),
        "set 0 overflows dram's boot part by {away} pages"
    );

    // Grow by 256 MiB.
    resize(&vm, 256 * MIB);
    let took = wait_plugged(&vm, 256 * MIB);
    let r = wait_reached(&vm, 256 * MIB);
    eprintln!(
        "plug 256 MiB: {took:?} ({:.0} MiB/s): {r:?}",
        256.0 / took.as_secs_f64()
    );
    assert_eq!(r.u64("device_plugged"), Some(256 * MIB));
    assert_eq!(r.u64("blocks"), Some(128));
    assert_eq!(vmem(&vm)["plugged_size"], r.u64("plugged").unwrap());

    // Set 0's overflow moves into the plugged blocks (tick `res=` per
    // tier): its pages are there when read at vm.info's host address, and
    // only in the plugged part.
    let t = Instant::now();
    vm.wait_line(&format!("tg tick res={HOT0},256"), |l| {
        l.kind == "tick" && l.list("res") == Some(vec![HOT0, 256])
    });
    eprintln!(
        "{away} pages moved into plugged blocks in {:?}",
        t.elapsed()
    );
    let stamped = stamped_in_region(&vm, &v, DRAM_HOTPLUG);
    assert_eq!(stamped.len() as u64, away, "workload pages in the region");
    assert!(stamped.iter().all(|&g| g < start + 256 * MIB));

    // Shrink to 4 MiB: the guest moves all but 1024 pages out first.
    resize(&vm, 4 * MIB);
    let took = wait_plugged(&vm, 4 * MIB);
    let r = wait_reached(&vm, 4 * MIB);
    eprintln!("unplug 252 MiB: {took:?}: {r:?}");
    assert_eq!(r.u64("device_plugged"), Some(4 * MIB));
    let stamped = stamped_in_region(&vm, &v, DRAM_HOTPLUG);
    assert!(
        stamped.iter().all(|&g| g < start + 4 * MIB),
        "a workload page is left in an unplugged block"
    );
    assert_eq!(
        stamped.len() as u64,
        4 * MIB / PAGE,
        "the 2 blocks left are full"
    );

    // Below the zone's boot size: refused, the request stays.
    let (status, body) = resize_zone(&vm, "dram", DRAM_BOOT - 64 * MIB);
    assert!(
        status >= 400,
        "resize below the boot size accepted: {status} {body}"
    );
    assert_eq!(vmem(&vm)["requested_size"], 4 * MIB);
    // The same size again: the device refuses an identical request.
    let (status, body) = resize_zone(&vm, "dram", DRAM_BOOT + 4 * MIB);
    assert!(status >= 400, "an identical request accepted: {status}");
    eprintln!("resize-zone to the current size: {status} {body}");
    // Beyond hotplug_size: refused.
    let (status, body) = resize_zone(&vm, "dram", DRAM_BOOT + DRAM_HOTPLUG + BLOCK);
    assert!(
        status >= 400,
        "resize beyond hotplug_size accepted: {status} {body}"
    );

    // Everything back: unplug the last 4 MiB.
    resize(&vm, 0);
    wait_plugged(&vm, 0);
    wait_reached(&vm, 0);
    assert!(stamped_in_region(&vm, &v, DRAM_HOTPLUG).is_empty());
    let lines = vm.lines();
    assert!(
        !lines.iter().any(|l| l.kind == "canary"),
        "the workload lost a page:\n{}",
        log(&vm)
    );
    vm.stop();
}

/// A guest whose driver does not follow: requested_size moves, plugged
/// stays 0, and the guest says why on its serial line.
fn not_following(bin: &Path, mode: &str) {
    let vm = Vm::spawn(
        bin,
        &vmm_args(),
        // One hot set: with `off` there is no virtio-mem zone in the guest.
        &format!("hot=64 phases=100@0 report=0 virtio_mem={mode}"),
    );
    vm.wait_api();
    vm.wait_line("tg ready", |l| l.kind == "ready");
    resize(&vm, 64 * MIB);
    match mode {
        "mute" => {
            vm.wait_line("tg vmem requested=67108864 ... mode=mute", |l| {
                l.kind == "vmem" && l.u64("requested") == Some(64 * MIB)
            });
        }
        "error" => {
            let lines = vm.wait_line("tg vmem refused resp=ERROR", |l| {
                l.kind == "vmem" && l.words.first().is_some_and(|w| w == "refused")
            });
            let r = lines
                .iter()
                .find(|l| l.kind == "vmem" && l.words.first().is_some_and(|w| w == "refused"))
                .unwrap();
            assert_eq!(r.fields["resp"], "ERROR", "{r:?}");
            assert_eq!(r.fields["op"], "plug", "{r:?}");
        }
        _ => {
            vm.wait_line("tg vmem off", |l| {
                l.kind == "vmem" && l.words.first().is_some_and(|w| w == "off")
            });
        }
    }
    // Give a following guest ample time (plugging 64 MiB takes well under
    // a second here), then check nothing was plugged.
    std::thread::sleep(Duration::from_secs(6));
    let v = vmem(&vm);
    assert_eq!(v["requested_size"], 64 * MIB, "{v}");
    assert_eq!(v["plugged_size"], 0, "{v}");
    // Shrinking the request back works the same against a silent guest.
    resize(&vm, 0);
    assert_eq!(vmem(&vm)["plugged_size"], 0);
    vm.stop();
}

fn mute_guest_leaves_plugged(bin: &Path) {
    not_following(bin, "mute");
}

fn error_guest_leaves_plugged(bin: &Path) {
    not_following(bin, "error");
}

fn driverless_guest_leaves_plugged(bin: &Path) {
    not_following(bin, "off");
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        vm_trial("live_vmem_follows_resize_zone", guest_follows_resize_zone),
        vm_trial(
            "live_vmem_mute_guest_leaves_plugged",
            mute_guest_leaves_plugged,
        ),
        vm_trial(
            "live_vmem_error_guest_leaves_plugged",
            error_guest_leaves_plugged,
        ),
        vm_trial(
            "live_vmem_driverless_guest_leaves_plugged",
            driverless_guest_leaves_plugged,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
