//! tierd and a real QEMU: Debian's 6.12 cloud kernel on the Linux bed
//! (docs/linux-bed.md; TCG, two guest NUMA nodes, virtio-mem on each). The
//! bed keeps its own QMP connection, so the guest gets a second `-qmp`
//! for tierd, as a libvirt host would (docs/discovery.md).
//!
//! Needs `TIERD_BED_KERNELS` (`cargo xtask test` unpacks the kernels) and
//! QEMU; each test is reported as ignored with the reason otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::path::{Path, PathBuf};
use std::time::Duration;

use libtest_mimic::Trial;
use tier_linux_bed::{Bed, Kernel, checks};
use tier_proto::v1::*;
use tier_test_support::stream::Client;
use tier_test_support::{Tierd, gated, try_wait_until, wait_until, within};
use tokio_stream::StreamExt;

const M: u64 = 1 << 20;

fn kernel() -> Result<Kernel, String> {
    tier_linux_bed::kernel::from_env("6.12")
}

fn needs() -> Vec<Result<(), String>> {
    vec![
        tier_linux_bed::missing().map_or(Ok(()), Err),
        kernel().map(drop),
    ]
}

/// A booted guest with a QMP socket for tierd at `work/tierd.qmp`.
fn boot(work: &Path) -> (Bed, PathBuf) {
    boot_with(work, |_| {})
}

/// As `boot`, the machine changed by `edit` first.
fn boot_with(work: &Path, edit: impl FnOnce(&mut tier_linux_bed::Machine)) -> (Bed, PathBuf) {
    let (mut machine, log) = tier_linux_bed::prepare(&kernel().unwrap(), &[], work).unwrap();
    let qmp = work.join("tierd.qmp");
    machine.extra_args = vec![
        "-qmp".into(),
        format!("unix:{},server=on,wait=off", qmp.display()),
    ];
    edit(&mut machine);
    let bed = Bed::start(&machine, &log, tier_linux_bed::BOOT_TIMEOUT).unwrap();
    eprintln!("guest booted in {:.1} s", bed.boot_time().as_secs_f64());
    (bed, qmp)
}

fn config(qmp_glob: &str) -> String {
    format!(
        "backend = \"hostpte\"\ninterval_ms = 500\n[discovery]\nch_api_dir = \"\"\nqemu_qmp = [{qmp_glob}]\n[tier_kinds]\nnode0 = \"dram\"\nm1 = \"cxl\"\n"
    )
}

/// tierd in `dir` with `config` and `extra`, discovery as the config says.
fn tierd(dir: &Path, config: &str, extra: &[&str]) -> Tierd {
    crate::tierd_in(dir, config).args(extra).start()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The next update whose stats of `vm` satisfy `ok`, within `timeout`.
async fn until(
    s: &mut tonic::Streaming<StatsUpdate>,
    vm: &str,
    timeout: Duration,
    ok: impl Fn(&VmStats) -> bool,
) -> VmStats {
    within(&format!("matching stats of {vm}"), timeout, async {
        loop {
            let u = s.next().await.unwrap().unwrap();
            if let Some(v) = u.stats.iter().find(|v| v.vm_id == vm)
                && ok(v)
            {
                return v.clone();
            }
        }
    })
    .await
}

fn tier<'a>(v: &'a VmStats, name: &str) -> &'a TierSample {
    v.tiers.iter().find(|t| t.tier == name).unwrap()
}

/// tierd (a config glob, hostpte) finds the bed's QEMU through QMP with a
/// tier per guest node, node 1 with its virtio-mem region; reports
/// per-tier stats; drops the VM when QEMU dies.
fn qmp_discovery_two_tiers_6_12() {
    let work = tempfile::tempdir().unwrap();
    let (mut bed, _qmp) = boot(work.path());
    let glob = format!("\"{}/*.qmp\"", work.path().display());
    let tierd = tierd(work.path(), &config(&glob), &["--no-controller"]);
    let sock = tierd.socket();
    let id = format!("qemu:{}", bed.pid());
    let rt = rt();
    let (mut client, mut s) = rt.block_on(tier_test_support::open_watch_stats(sock));
    // The guest keeps touching 32 MiB of page cache while tierd samples.
    bed.sh(
        "dd if=/dev/urandom of=/tmp/hot bs=1M count=32 2>/dev/null; (while true; do cat /tmp/hot > /dev/null; done) &",
        Duration::from_secs(60),
    )
    .unwrap();
    let v = rt.block_on(until(&mut s, &id, Duration::from_secs(60), |v| {
        v.tiers.len() == 2 && v.tiers.iter().any(|t| t.young_pages > 0)
    }));
    let vms = rt
        .block_on(client.list_vms(ListVmsRequest::default()))
        .unwrap()
        .into_inner()
        .vms;
    let vm = vms.iter().find(|v| v.id == id).unwrap();
    for t in &vm.tiers {
        eprintln!(
            "tier {} {:?} {} bytes ranges {:x?}\n  {}",
            t.name,
            t.kind(),
            t.size_bytes,
            t.ranges
                .iter()
                .map(|r| (r.gpa_start, r.length, r.hva_start))
                .collect::<Vec<_>>(),
            t.derivation
        );
    }
    for t in &v.tiers {
        eprintln!(
            "stats {}: sampled {} young {} resident {} plugged {:?} source {:?}",
            t.tier,
            t.sampled_pages,
            t.young_pages,
            t.resident_bytes,
            t.hotplug_plugged_bytes,
            t.source()
        );
    }
    assert_eq!(vm.source(), VmSource::Qemu);
    assert_eq!(vm.vmm_pid, bed.pid());
    assert_eq!(vm.vcpus, 2);
    let names: Vec<&str> = vm.tiers.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["node0", "node1"]);
    assert_eq!(vm.tiers[0].kind(), TierKind::Dram);
    assert_eq!(vm.tiers[1].kind(), TierKind::Cxl);
    let n1 = &vm.tiers[1];
    assert_eq!(n1.size_bytes, 256 * M + 512 * M, "boot + virtio-mem region");
    assert_eq!(n1.ranges[0].gpa_start, 256 * M);
    assert_eq!(n1.ranges[1].gpa_start, (1 << 32) + 512 * M);
    assert!(
        vm.tiers
            .iter()
            .flat_map(|t| &t.ranges)
            .all(|r| r.hva_start != 0)
    );
    assert_eq!(n1.hotplug.unwrap().region_bytes, 512 * M);
    assert_eq!(tier(&v, "node1").hotplug_plugged_bytes, Some(128 * M));
    assert_eq!(tier(&v, "node0").hotplug_plugged_bytes, Some(0));
    assert!(tier(&v, "node0").sampled_pages > 0, "{v:?}");
    assert!(tier(&v, "node0").resident_bytes > 0, "{v:?}");

    drop(bed);
    rt.block_on(within(
        &format!("{id} to depart"),
        Duration::from_secs(10),
        async {
            loop {
                let u = s.next().await.unwrap().unwrap();
                if u.departed_vm_ids.contains(&id) {
                    break;
                }
            }
        },
    ));
    let text = tierd.log();
    assert!(text.contains("QEMU VM discovered"), "{text}");
}

/// SetBalloonTargets on node 1 resizes its virtio-mem device (targets are
/// bytes not requested): the guest plugs 256 MiB, then unplugs to 64 MiB,
/// and tierd's stream reports what QEMU says is plugged.
fn virtio_mem_resize_both_ways_6_12() {
    let work = tempfile::tempdir().unwrap();
    let (mut bed, qmp) = boot(work.path());
    let tierd = tierd(
        work.path(),
        &config(""),
        &["--no-controller", "--qmp", qmp.to_str().unwrap()],
    );
    let sock = tierd.socket();
    let id = format!("qemu:{}", bed.pid());
    let rt = rt();
    let (mut client, mut s) = rt.block_on(tier_test_support::open_watch_stats(sock));
    rt.block_on(until(&mut s, &id, Duration::from_secs(60), |v| {
        tier(v, "node1").hotplug_plugged_bytes == Some(128 * M)
    }));
    for (plug, grow) in [(256 * M, true), (64 * M, false)] {
        let before = checks::node_bytes(&mut bed, 1).unwrap();
        let r = rt
            .block_on(client.set_balloon_targets(SetBalloonTargetsRequest {
                vm_id: id.clone(),
                targets: vec![BalloonTarget {
                    tier: "node1".into(),
                    target_bytes: 512 * M - plug,
                }],
            }))
            .unwrap()
            .into_inner();
        assert_eq!(r.targets[0].target_bytes, 512 * M - plug, "{r:?}");
        let v = rt.block_on(until(&mut s, &id, Duration::from_secs(90), |v| {
            tier(v, "node1").hotplug_plugged_bytes == Some(plug)
        }));
        let t = tier(&v, "node1");
        // The guest may take a moment to online or offline the blocks;
        // the asserts below say what it reached.
        let after = try_wait_until("node1's MemTotal to move", Duration::from_secs(20), || {
            let after = checks::node_bytes(&mut bed, 1).unwrap();
            if after == before {
                Err(after)
            } else {
                Ok(after)
            }
        })
        .unwrap_or(before);
        eprintln!(
            "node1 plugged {:?} requested {:?}; guest node1 MemTotal {} -> {} MiB",
            t.hotplug_plugged_bytes,
            t.hotplug_requested_bytes,
            before / M,
            after / M
        );
        assert_eq!(t.hotplug_requested_bytes, Some(plug));
        if grow {
            assert!(after >= before + 120 * M, "{before} -> {after}");
        } else {
            assert!(before >= after + 180 * M, "{before} -> {after}");
        }
    }
    // More than the device holds is refused, nothing sent.
    let e = rt
        .block_on(client.set_balloon_targets(SetBalloonTargetsRequest {
            vm_id: id.clone(),
            targets: vec![BalloonTarget {
                tier: "node0".into(),
                target_bytes: 600 * M,
            }],
        }))
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::OutOfRange, "{e}");
}

/// The VMs tierd lists whose VMM is `pid`.
fn vms_of(client: &mut Client, rt: &tokio::runtime::Runtime, pid: u32) -> Vec<Vm> {
    rt.block_on(client.list_vms(ListVmsRequest::default()))
        .unwrap()
        .into_inner()
        .vms
        .into_iter()
        .filter(|v| v.vmm_pid == pid)
        .collect()
}

/// A QEMU under KVM with memfd RAM (as libvirt's `<source type='memfd'/>`)
/// holds a kvm-vm fd that kvm-fd discovery tracks on its own; with its QMP
/// socket configured too, tierd lists it once, as the QEMU VM. This host's
/// KVM cannot run a Linux guest (docs/linux-bed.md): QEMU stops the guest
/// with a KVM internal error and stays up, kvm-vm fd and QMP included,
/// which is all discovery reads.
fn kvm_qemu_counted_once() {
    let work = tempfile::tempdir().unwrap();
    let (mut machine, stderr) =
        tier_linux_bed::prepare(&kernel().unwrap(), &[], work.path()).unwrap();
    let qmp = work.path().join("tierd.qmp");
    (machine.kvm, machine.memfd) = (true, true);
    // memfd mappings of QEMU 7.2 are told apart by size only.
    machine.nodes[1].mib = 192;
    machine.nodes[0].vmem_max_mib = 0;
    machine.extra_args = vec![
        "-qmp".into(),
        format!("unix:{},server=on,wait=off", qmp.display()),
    ];
    let qemu = std::process::Command::new(&machine.qemu)
        .args(machine.args())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let qemu = tier_test_support::ChildGuard::new(qemu);
    wait_until("QEMU's QMP socket", Duration::from_secs(30), || {
        if qmp.exists() {
            Ok(())
        } else {
            Err(std::fs::read_to_string(&stderr).unwrap_or_default())
        }
    });
    let rt = rt();
    let pid = qemu.id();
    // Without QMP: the kvm-fd VM, so the check below is not vacuous.
    let alone = work.path().join("kvm-only");
    std::fs::create_dir_all(&alone).unwrap();
    {
        let tierd = tierd(&alone, &config(""), &["--no-controller"]);
        let sock = tierd.socket();
        let (mut client, mut s) = rt.block_on(tier_test_support::open_watch_stats(sock));
        rt.block_on(within(
            "the kvm-fd VM in the stream",
            Duration::from_secs(30),
            async {
                loop {
                    let u = s.next().await.unwrap().unwrap();
                    if u.stats
                        .iter()
                        .any(|v| v.vm_id.starts_with(&format!("kvm:{pid}:")))
                    {
                        break;
                    }
                }
            },
        ));
        let vms = vms_of(&mut client, &rt, pid);
        assert_eq!(vms.len(), 1, "{vms:?}");
        assert_eq!(vms[0].source(), VmSource::KvmFd, "{vms:?}");
    }
    let glob = format!("\"{}/*.qmp\"", work.path().display());
    let tierd = tierd(work.path(), &config(&glob), &["--no-controller"]);
    let sock = tierd.socket();
    let id = format!("qemu:{pid}");
    let (mut client, mut s) = rt.block_on(tier_test_support::open_watch_stats(sock));
    rt.block_on(until(&mut s, &id, Duration::from_secs(60), |v| {
        v.tiers.len() == 2
    }));
    // A few more intervals: kvm-fd discovery runs in every one.
    for _ in 0..4 {
        rt.block_on(until(&mut s, &id, Duration::from_secs(10), |_| true));
    }
    let vms = vms_of(&mut client, &rt, pid);
    assert_eq!(
        vms.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(),
        [id.as_str()],
        "one VM per QEMU"
    );
    assert_eq!(vms[0].source(), VmSource::Qemu);
    assert!(
        vms[0]
            .tiers
            .iter()
            .flat_map(|t| &t.ranges)
            .all(|r| r.hva_start != 0),
        "memfd backends mapped: {:?}",
        vms[0].tiers
    );
    let text = tierd.log();
    assert!(text.contains("QEMU VM discovered"), "{text}");
}

/// A virtio-mem device added to a running QEMU (`object-add` +
/// `device_add`, as `virsh attach-device` does) after tierd discovered it:
/// tierd re-reads the layout, the node's tier gains the device's region
/// and becomes resizable.
fn hot_added_virtio_mem_6_12() {
    let work = tempfile::tempdir().unwrap();
    let (mut bed, qmp) = boot_with(work.path(), |m| {
        m.nodes[0].vmem_max_mib = 0;
        m.spare_mib = 256;
        m.extra_args.extend([
            "-device".into(),
            "pcie-root-port,id=hp0,chassis=1,bus=pcie.0".into(),
        ]);
    });
    let tierd = tierd(
        work.path(),
        &config(""),
        &["--no-controller", "--qmp", qmp.to_str().unwrap()],
    );
    let sock = tierd.socket();
    let id = format!("qemu:{}", bed.pid());
    let rt = rt();
    let (mut client, mut s) = rt.block_on(tier_test_support::open_watch_stats(sock));
    let v = rt.block_on(until(&mut s, &id, Duration::from_secs(60), |v| {
        v.tiers.len() == 2
    }));
    assert_eq!(tier(&v, "node0").hotplug_plugged_bytes, None, "{v:?}");
    let file = PathBuf::from(format!("/dev/shm/tierd-hotadd-{}", std::process::id()));
    let _rm = RemoveOnDrop(file.clone());
    bed.qmp()
        .execute(
            "object-add",
            serde_json::json!({"qom-type": "memory-backend-file", "id": "vm2",
                "size": 256 * M, "share": true, "mem-path": file}),
        )
        .unwrap();
    bed.qmp()
        .execute(
            "device_add",
            serde_json::json!({"driver": "virtio-mem-pci", "id": "vmem2", "memdev": "vm2",
                "node": 0, "bus": "hp0", "requested-size": 64 * M}),
        )
        .unwrap();
    let v = rt.block_on(until(&mut s, &id, Duration::from_secs(60), |v| {
        tier(v, "node0").hotplug_plugged_bytes == Some(64 * M)
    }));
    eprintln!("after device_add: {:?}", tier(&v, "node0"));
    let vm = vms_of(&mut client, &rt, bed.pid()).remove(0);
    let n0 = &vm.tiers[0];
    assert_eq!(n0.name, "node0");
    assert_eq!(n0.size_bytes, 256 * M + 256 * M, "boot + the new region");
    assert_eq!(n0.hotplug.unwrap().region_bytes, 256 * M);
    assert!(n0.ranges.iter().all(|r| r.hva_start != 0), "{n0:?}");
    let text = tierd.log();
    assert!(text.contains("memory devices changed"), "{text}");
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// This file's trials, named `qemu_bed::NAME`.
pub fn trials() -> Vec<Trial> {
    let trials = vec![
        gated(
            "qemu_bed::qmp_discovery_two_tiers_6_12",
            needs(),
            qmp_discovery_two_tiers_6_12,
        ),
        gated(
            "qemu_bed::virtio_mem_resize_both_ways_6_12",
            needs(),
            virtio_mem_resize_both_ways_6_12,
        ),
        gated(
            "qemu_bed::hot_added_virtio_mem_6_12",
            needs(),
            hot_added_virtio_mem_6_12,
        ),
        gated(
            "qemu_bed::kvm_qemu_counted_once",
            needs()
                .into_iter()
                .chain([tier_test_support::kvm_missing().map_or(Ok(()), Err)])
                .collect(),
            kvm_qemu_counted_once,
        ),
    ];
    trials
}
