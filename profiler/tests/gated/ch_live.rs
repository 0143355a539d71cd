//! tierd against the real patched cloud-hypervisor: discovery through the
//! API socket directory and, for a VM started later, through
//! `--api-socket` on the command line,
//! the tier map from `vm.info` (guest-physical ranges, host addresses
//! checked by reading what the guest wrote into each zone through the
//! VMM's memory), SetBalloonTargets round-tripping through `vm.resize` /
//! `vm.info`, the controller marking a guest without a balloon driver,
//! a dead socket affecting nobody, and a VM leaving.
//!
//! The guest (tests/guest/zone_marker.S, assembled here) writes "tierDRAM"
//! at GPA 0x200000 and "tierSLOW" at 0x1000 into the second zone, prints
//! `tierd-zones` and halts; it has no balloon driver, so balloon actuals
//! stay 0 and the per-tier balloon is never negotiated.
//!
//! Custom harness (libtest-mimic): runs when `TIERD_CH_BIN` names the
//! patched cloud-hypervisor, /dev/kvm is usable and `cc`/`ld` can build
//! the guest; otherwise reported as ignored with the reason.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use libtest_mimic::{Completion, Failed, Trial};
use tier_controller::actuate::ChApi;
use tier_proto::v1::*;
use tier_test_support::{ChildGuard, wait_until};
use tokio_stream::StreamExt;

const M: u64 = 1 << 20;

fn capability() -> Result<PathBuf, String> {
    let bin = tier_test_support::ch_kvm()?;
    for tool in ["cc", "ld"] {
        if let Some(why) = tier_test_support::tool_missing(tool, "to build the PVH test guest") {
            return Err(why);
        }
    }
    Ok(bin)
}

/// The PVH guest with its second zone at `slow_base`.
fn guest(dir: &Path, slow_base: u64) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/guest/zone_marker.S");
    let obj = dir.join(format!("guest-{slow_base:x}.o"));
    let elf = dir.join(format!("guest-{slow_base:x}.elf"));
    let ok = Command::new("cc")
        .args(["-c", "-m64", &format!("-DSLOW_BASE={slow_base:#x}")])
        .arg(&src)
        .arg("-o")
        .arg(&obj)
        .status()
        .unwrap();
    assert!(ok.success(), "cc {}", src.display());
    let ok = Command::new("ld")
        .args(["-m", "elf_x86_64", "-Ttext=0x100000"])
        .arg(&obj)
        .arg("-o")
        .arg(&elf)
        .status()
        .unwrap();
    assert!(ok.success(), "ld");
    elf
}

struct ChVm {
    proc: ChildGuard,
    socket: PathBuf,
    serial: PathBuf,
}

impl ChVm {
    fn pid(&self) -> u32 {
        self.proc.id()
    }
}

/// `zones`: (id, size), each its own guest NUMA node; `shared`: memfd
/// zones; `balloon`: the `--balloon` value.
fn start_ch(
    bin: &Path,
    kernel: &Path,
    socket: &Path,
    zones: &[(&str, u64)],
    shared: bool,
    balloon: &str,
) -> ChVm {
    let serial = socket.with_extension("serial");
    let mut cmd = Command::new(bin);
    cmd.arg("--api-socket")
        .arg(format!("path={}", socket.display()))
        .arg("--kernel")
        .arg(kernel)
        .args(["--cpus", "boot=1", "--memory", "size=0"]);
    for (i, (id, size)) in zones.iter().enumerate() {
        // memfd zones unbound; anonymous ones bound to host node 0.
        cmd.arg("--memory-zone").arg(format!(
            "id={id},size={}M{}",
            size / M,
            if shared {
                ",shared=on"
            } else {
                ",host_numa_node=0"
            }
        ));
        cmd.arg("--numa")
            .arg(format!("guest_numa_id={i},memory_zones={id}"));
    }
    cmd.args(["--balloon", balloon])
        .arg("--serial")
        .arg(format!("file={}", serial.display()))
        .args(["--console", "off"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    ChVm {
        proc: ChildGuard::new(cmd.spawn().unwrap()),
        socket: socket.to_path_buf(),
        serial,
    }
}

/// The kvm-vm fd of `pid`.
fn kvm_fd(pid: u32) -> u32 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .find(|f| std::fs::read_link(f.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:kvm-vm"))
        .and_then(|f| f.file_name().to_str()?.parse().ok())
        .expect("a kvm-vm fd")
}

/// 8 bytes of the VMM's memory at `hva`.
fn peek(pid: u32, hva: u64) -> [u8; 8] {
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut b = [0u8; 8];
    mem.read_exact_at(&mut b, hva).unwrap();
    b
}

/// Checks a discovered VM's tier map against the command line it was
/// started with and against what its guest wrote; returns whether the
/// host addresses came from vm.info (`host_address`, vmm-patch 0005).
async fn check_tiers(vm: &Vm, ch: &ChVm, zones: &[(&str, u64)]) -> bool {
    let got: Vec<(&str, TierKind, u64, u64)> = vm
        .tiers
        .iter()
        .map(|t| {
            (
                t.name.as_str(),
                t.kind(),
                t.ranges[0].gpa_start,
                t.size_bytes,
            )
        })
        .collect();
    // Zones one after the other from GPA 0 (all below the 3 GiB hole).
    assert_eq!(
        got,
        vec![
            ("dram", TierKind::Dram, 0, zones[0].1),
            ("slow", TierKind::Cxl, zones[0].1, zones[1].1)
        ],
        "{vm:#?}"
    );
    assert!(vm.tiers.iter().all(|t| t.ranges.len() == 1));
    let info = ChApi::new(&ch.socket).vm_info().await.unwrap();
    let reported: Vec<Option<u64>> = info
        .memory_zones
        .unwrap()
        .iter()
        .map(|z| z.ranges[0].host_address)
        .collect();
    let patched = reported.iter().all(Option::is_some);
    let hva: Vec<u64> = vm.tiers.iter().map(|t| t.ranges[0].hva_start).collect();
    if patched {
        assert_eq!(hva, reported.iter().map(|r| r.unwrap()).collect::<Vec<_>>());
    }
    // From host_numa_node=0 or the pages' node in numa_maps: this host
    // has node 0 only.
    for t in &vm.tiers {
        let expect: &[u32] =
            if t.ranges[0].hva_start != 0 || t.derivation.contains("bound to host node 0") {
                &[0]
            } else {
                &[]
            };
        assert_eq!(t.host_numa_nodes, expect, "{}", t.derivation);
    }
    if hva.iter().all(|a| *a != 0) {
        // What the guest wrote at GPA 0x200000 and slow + 0x1000, read
        // through the VMM's mappings at the host addresses tierd derived.
        assert_eq!(&peek(ch.pid(), hva[0] + 0x200000), b"tierDRAM");
        assert_eq!(&peek(ch.pid(), hva[1] + 0x1000), b"tierSLOW");
        eprintln!(
            "{}: host addresses {hva:#x?} verified by the guest's markers",
            vm.name
        );
    } else {
        assert!(!patched);
        assert!(
            vm.tiers
                .iter()
                .all(|t| t.derivation.contains("host address unknown")),
            "{vm:#?}"
        );
        eprintln!(
            "{}: this VMM lacks vmm-patch 0005 and the layout cannot be matched by size: host addresses unknown, as the derivation says",
            vm.name
        );
    }
    patched
}

async fn next_update(s: &mut tonic::Streaming<StatsUpdate>) -> StatsUpdate {
    tokio::time::timeout(Duration::from_secs(10), s.next())
        .await
        .expect("an update within 10 s")
        .unwrap()
        .unwrap()
}

/// Reads updates until `id` is in the VM list (at most 80 intervals).
async fn wait_listed(s: &mut tonic::Streaming<StatsUpdate>, vms: &mut Vec<Vm>, id: &str) {
    for _ in 0..80 {
        if vms.iter().any(|v| v.id == id) {
            return;
        }
        let u = next_update(s).await;
        if !u.vms_unchanged {
            *vms = u.vms.clone();
        }
    }
    assert!(vms.iter().any(|v| v.id == id), "{id} not listed: {vms:#?}");
}

async fn live(bin: PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let api_dir = dir.path().join("ch");
    std::fs::create_dir(&api_dir).unwrap();
    let elsewhere = dir.path().join("other");
    std::fs::create_dir(&elsewhere).unwrap();

    // vm1: in the API directory; anonymous zones (the kernel merges them
    // into one VMA); a per-tier balloon.
    let z1 = [("dram", 128 * M), ("slow", 256 * M)];
    let vm1 = start_ch(
        &bin,
        &guest(dir.path(), z1[0].1),
        &api_dir.join("vm1.sock"),
        &z1,
        false,
        "size=0,tiers=on,stats=on",
    );
    // A socket nobody listens on.
    drop(std::os::unix::net::UnixListener::bind(api_dir.join("dead.sock")).unwrap());
    wait_until("guest output", Duration::from_secs(30), || {
        std::fs::read_to_string(&vm1.serial)
            .is_ok_and(|s| s.contains("tierd-zones"))
            .then_some(())
    });

    let tierd = crate::tierd()
        .dir(dir.path())
        .config(format!(
            "interval_ms = 250\nbackend = \"hostpte\"\n[tier_kinds]\nslow = \"cxl\"\n[metrics]\nlisten = \"\"\n[discovery]\nch_api_dir = \"{}\"\nch_timeout_ms = 1000\n",
            api_dir.display()
        ))
        .discover()
        .env("TIERD_LOG", "info")
        .start();
    let (mut client, mut stream) = tier_test_support::open_watch_stats(tierd.socket()).await;

    let id1 = format!("ch:{}:{}", vm1.pid(), kvm_fd(vm1.pid()));
    let mut vms = Vec::new();
    wait_listed(&mut stream, &mut vms, &id1).await;

    // plain, started while tierd runs: outside the directory (found by its
    // command line); memfd zones; no per-tier balloon.
    let z2 = [("dram", 64 * M), ("slow", 192 * M)];
    let plain = start_ch(
        &bin,
        &guest(dir.path(), z2[0].1),
        &elsewhere.join("plain.sock"),
        &z2,
        true,
        "size=0",
    );
    wait_until("guest output", Duration::from_secs(30), || {
        std::fs::read_to_string(&plain.serial)
            .is_ok_and(|s| s.contains("tierd-zones"))
            .then_some(())
    });
    let id2 = format!("ch:{}:{}", plain.pid(), kvm_fd(plain.pid()));
    wait_listed(&mut stream, &mut vms, &id2).await;
    let v1 = vms
        .iter()
        .find(|v| v.id == id1)
        .unwrap_or_else(|| panic!("{id1} not found: {vms:#?}"));
    let v2 = vms
        .iter()
        .find(|v| v.id == id2)
        .unwrap_or_else(|| panic!("{id2} not found: {vms:#?}"));
    for (v, ch, name) in [(v1, &vm1, "vm1"), (v2, &plain, "plain")] {
        assert_eq!(v.source(), VmSource::CloudHypervisor);
        assert_eq!(v.name, name);
        assert_eq!(v.vmm_pid, ch.pid());
        assert_eq!(v.api_socket, ch.socket.display().to_string());
        assert_eq!(v.vcpus, 1);
    }
    // No kvm-fd duplicate of either process.
    assert!(
        !vms.iter().any(|v| v.source() == VmSource::KvmFd
            && (v.vmm_pid == vm1.pid() || v.vmm_pid == plain.pid())),
        "{vms:#?}"
    );
    let patched = check_tiers(v1, &vm1, &z1).await;
    check_tiers(v2, &plain, &z2).await;
    if patched {
        assert!(
            v1.tiers[0].derivation.contains("part of a larger VMA"),
            "{}",
            v1.tiers[0].derivation
        );
    }

    // SetBalloonTargets -> vm.resize; vm.info and the stream show them.
    let r = client
        .set_balloon_targets(SetBalloonTargetsRequest {
            vm_id: id1.clone(),
            targets: vec![
                BalloonTarget {
                    tier: "dram".into(),
                    target_bytes: 64 * M,
                },
                BalloonTarget {
                    tier: "slow".into(),
                    target_bytes: 32 * M,
                },
            ],
        })
        .await
        .unwrap()
        .into_inner();
    let got: Vec<(&str, u64)> = r
        .targets
        .iter()
        .map(|t| (t.tier.as_str(), t.target_bytes))
        .collect();
    assert_eq!(got, vec![("dram", 64 * M), ("slow", 32 * M)]);
    let info = ChApi::new(&vm1.socket).vm_info().await.unwrap();
    let b = info.balloon.unwrap();
    let zones: Vec<(&str, u64, u64)> = b
        .zones
        .iter()
        .map(|z| (z.id.as_str(), z.target, z.actual))
        .collect();
    assert_eq!(zones, vec![("dram", 64 * M, 0), ("slow", 32 * M, 0)]);
    assert!(!b.tiers_negotiated);
    // Over the policy's grace period and more, the guest (no driver)
    // never follows: actual stays 0 while the targets stay in force.
    let mut seen = 0;
    for _ in 0..40 {
        let u = next_update(&mut stream).await;
        let Some(s) = u.stats.iter().find(|s| s.vm_id == id1) else {
            continue;
        };
        let bt: Vec<(u64, u64)> = s
            .tiers
            .iter()
            .map(|t| (t.balloon_target_bytes, t.balloon_actual_bytes))
            .collect();
        if bt == vec![(64 * M, 0), (32 * M, 0)] {
            seen += 1;
            if seen == 5 {
                break;
            }
        }
    }
    assert_eq!(
        seen, 5,
        "5 intervals with the targets in force and actual 0"
    );

    // plain has no per-tier balloon: refused, nothing sent.
    let e = client
        .set_balloon_targets(SetBalloonTargetsRequest {
            vm_id: id2.clone(),
            targets: vec![BalloonTarget {
                tier: "dram".into(),
                target_bytes: 4096,
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("tiers=on"), "{}", e.message());

    // The controller marked both uncooperative once, with why, and never
    // sent them a target.
    let mut decisions = client
        .watch_decisions(WatchDecisionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    // Other VMMs on the host (another test's, found by their command
    // line) have decisions too: read until both of ours have one.
    let mut last = std::collections::BTreeMap::new();
    while !(last.contains_key(&id1) && last.contains_key(&id2)) {
        let d = tokio::time::timeout(Duration::from_secs(10), decisions.next())
            .await
            .expect("the last decision of each VM")
            .unwrap()
            .unwrap();
        last.insert(d.vm_id.clone(), d);
    }
    for (id, why) in [
        (&id1, "has not negotiated VIRTIO_BALLOON_F_TIERS"),
        (&id2, "tiers=on"),
    ] {
        let d = &last[id];
        assert_eq!(d.reason(), DecisionReason::Uncooperative, "{d:?}");
        assert_eq!(d.outcome(), DecisionOutcome::Skipped);
        assert!(d.changes.is_empty());
        assert!(d.detail.contains(why), "{}", d.detail);
        eprintln!("{id}: {}", d.detail);
    }

    // plain leaves; vm1 stays.
    drop(plain);
    let mut departed = false;
    for _ in 0..3 {
        let u = next_update(&mut stream).await;
        if u.departed_vm_ids.contains(&id2) {
            assert!(!u.vms_unchanged && u.vms.iter().any(|v| v.id == id1));
            departed = true;
            break;
        }
    }
    assert!(
        departed,
        "{id2} still listed 3 intervals after its VMM died"
    );

    let log = tierd.log();
    let dead: Vec<&str> = log.lines().filter(|l| l.contains("dead.sock")).collect();
    assert!(
        dead.iter()
            .any(|l| l.contains("not usable") && l.contains("Connection refused")),
        "{log}"
    );
    eprintln!("dead socket: {}", dead[0]);
    assert!(!log.contains("panicked"), "{log}");
    drop((stream, decisions, client, tierd, vm1));
}

/// This file's trials, named `ch_live::NAME`.
pub fn trials() -> Vec<Trial> {
    let ready = capability();
    let trial = Trial::ignorable_test(
        "ch_live::tierd_discovers_and_drives_patched_cloud_hypervisor",
        move || match ready {
            Err(reason) => Ok(Completion::ignored_with(reason)),
            Ok(bin) => {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(|e| Failed::from(e.to_string()))?;
                rt.block_on(live(bin));
                Ok(Completion::Completed)
            }
        },
    );
    vec![trial]
}
