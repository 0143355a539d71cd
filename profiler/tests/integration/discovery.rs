//! tierd finds a VM in another process by its kvm-vm fd, samples it with
//! hostpte, and drops it from the stream within 2 intervals of its death.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::process::Command;

use tier_proto::v1::*;
use tier_test_support::ChildGuard;
use tokio_stream::StreamExt;

/// Starts tier-demo-vm; returns it and the touched pages it announces.
fn demo_vm() -> (ChildGuard, Vec<u64>) {
    let (vm, line) =
        tier_test_support::spawn_ready_line(&mut Command::new(env!("CARGO_BIN_EXE_tier-demo-vm")));
    // "ready pid=N touched_pages=[50, 96]"
    let touched = line
        .split_once("touched_pages=[")
        .and_then(|(_, r)| r.split_once(']'))
        .map(|(v, _)| v.split(", ").map(|n| n.parse().unwrap()).collect())
        .unwrap_or_else(|| panic!("unexpected ready line {line:?}"));
    (vm, touched)
}

#[tokio::test]
#[cfg_attr(not(has_kvm), ignore = "needs a usable /dev/kvm")]
async fn discovers_samples_and_drops_a_vm_process() {
    let (mut vm, touched) = demo_vm();
    let pid = vm.id();
    let tierd = crate::tierd()
        .discover()
        .metrics("127.0.0.1:0")
        .args(["--interval-ms", "250", "--tier-kind", "slow=cxl"])
        .start();
    let (mut client, mut stream) = tier_test_support::open_watch_stats(tierd.socket()).await;
    let prefix = format!("kvm:{pid}:");

    // Seen, with its tier map, and sampled exactly once armed.
    let mut sampled = 0;
    let mut id = String::new();
    let mut vms = Vec::new();
    for _ in 0..40 {
        let u = stream.next().await.unwrap().unwrap();
        if !u.vms_unchanged {
            vms = u.vms.clone();
        }
        let Some(v) = vms.iter().find(|v| v.id.starts_with(&prefix)) else {
            continue;
        };
        id = v.id.clone();
        assert_eq!(v.source(), VmSource::KvmFd);
        assert_eq!(v.vcpus, 1);
        let tiers: Vec<(&str, TierKind, u64)> = v
            .tiers
            .iter()
            .map(|t| (t.name.as_str(), t.kind(), t.size_bytes))
            .collect();
        assert_eq!(
            tiers,
            vec![
                ("dram", TierKind::Dram, 16 << 20),
                ("slow", TierKind::Cxl, 16 << 20)
            ]
        );
        assert!(
            v.tiers
                .iter()
                .all(|t| t.ranges[0].hva_start != 0 && !t.host_numa_nodes.is_empty())
        );
        let s = u.stats.iter().find(|s| s.vm_id == id).unwrap();
        if s.tiers.iter().all(|t| t.sampled_pages > 0) {
            for (t, truth) in s.tiers.iter().zip(&touched) {
                let err = (t.young_pages as f64 - *truth as f64).abs() / *truth as f64;
                assert!(
                    err <= 0.02,
                    "{}: young {} vs truth {truth}",
                    t.tier,
                    t.young_pages
                );
                assert!(t.resident_bytes >= *truth * 4096, "{t:?}");
            }
            sampled += 1;
            if sampled == 2 {
                break;
            }
        }
    }
    assert_eq!(sampled, 2, "never saw two sampled intervals of {prefix}*");

    // Kill the VM: it leaves the stream within 2 intervals.
    vm.child_mut().kill().unwrap();
    vm.child_mut().wait().unwrap();
    let mut departed = false;
    for _ in 0..2 {
        let u = stream.next().await.unwrap().unwrap();
        if u.departed_vm_ids.contains(&id) {
            assert!(!u.vms_unchanged && u.vms.iter().all(|v| v.id != id));
            departed = true;
            break;
        }
    }
    assert!(
        departed,
        "{id} still in the stream 2 intervals after its death"
    );
    let e = client
        .get_vm(GetVmRequest { id: id.clone() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    drop(tierd);
}
