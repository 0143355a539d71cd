//! Tier maps built from layouts recorded from the patched cloud-hypervisor
//! (tests/fixtures/ch-layout/, README.md there says how): guest-physical
//! ranges from `vm.info` `memory_zones`, host addresses from its
//! `host_address` (vmm-patch 0005) checked against the recorded
//! /proc/PID/maps, and the fallback by size for a VMM without 0005.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::collections::HashMap;
use std::path::PathBuf;

use tier_controller::actuate::VmInfo;
use tier_profiler::ch::layout::{self, parse_maps};
use tier_profiler::memtier::MemoryTiers;
use tier_proto::v1::{Tier, TierKind};

const M: u64 = 1 << 20;

fn fixture(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/ch-layout")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn info(name: &str) -> VmInfo {
    serde_json::from_str(&fixture(&format!("{name}.vm.info.json"))).unwrap()
}

fn build(name: &str, info: &VmInfo) -> Vec<Tier> {
    let overrides = HashMap::from([("slow".to_string(), TierKind::Cxl)]);
    layout::tiers(
        info.memory_zones.as_ref().unwrap(),
        &fixture(&format!("{name}.maps")),
        &fixture(&format!("{name}.numa_maps")),
        &overrides,
        // This machine: one memory tier, node 0.
        &MemoryTiers::from_tiers(vec![(4, vec![0])]),
    )
}

/// (name, kind, gpa_start, length) of every range.
fn gpa(t: &[Tier]) -> Vec<(&str, TierKind, u64, u64)> {
    t.iter()
        .flat_map(|t| {
            t.ranges
                .iter()
                .map(move |r| (t.name.as_str(), t.kind(), r.gpa_start, r.length))
        })
        .collect()
}

fn reported(info: &VmInfo, zone: usize) -> u64 {
    info.memory_zones.as_ref().unwrap()[zone].ranges[0]
        .host_address
        .unwrap()
}

#[test]
fn anonymous_zones_get_the_reported_host_addresses() {
    let i = info("anon");
    let t = build("anon", &i);
    // Known layout: zones one after the other from GPA 0.
    assert_eq!(
        gpa(&t),
        vec![
            ("dram", TierKind::Dram, 0, 128 * M),
            ("slow", TierKind::Cxl, 128 * M, 256 * M)
        ]
    );
    assert_eq!(t[0].ranges[0].hva_start, reported(&i, 0));
    assert_eq!(t[1].ranges[0].hva_start, reported(&i, 1));
    // Both inside the one merged anonymous VMA the kernel made of them.
    let maps = parse_maps(&fixture("anon.maps"));
    let vma = maps
        .iter()
        .find(|v| v.start <= t[1].ranges[0].hva_start && t[1].ranges[0].hva_start < v.end)
        .unwrap();
    assert_eq!(vma.end - vma.start, 384 * M);
    assert!(vma.start <= t[0].ranges[0].hva_start && t[0].ranges[0].hva_start + 128 * M <= vma.end);
    for tier in &t {
        assert!(
            tier.derivation.contains("from vm.info host_address")
                && tier.derivation.contains("part of a larger VMA"),
            "{}",
            tier.derivation
        );
        assert_eq!(tier.host_numa_nodes, vec![0]);
    }
}

#[test]
fn without_host_address_shared_zones_match_by_size_and_agree() {
    let i = info("shared");
    let with = build("shared", &i);
    // The same VMM as one without vmm-patch 0005: no host_address.
    let mut without = i.clone();
    for z in without.memory_zones.as_mut().unwrap() {
        for r in &mut z.ranges {
            r.host_address = None;
        }
    }
    let by_size = build("shared", &without);
    assert_eq!(gpa(&with), gpa(&by_size));
    for (a, b) in with.iter().zip(&by_size) {
        assert_eq!(a.ranges[0].hva_start, b.ranges[0].hva_start, "{}", a.name);
        assert!(
            b.derivation.contains("one mapping of its size"),
            "{}",
            b.derivation
        );
        assert!(!a.derivation.contains("larger VMA"), "{}", a.derivation);
    }
    // memfd zones: each its own VMA, the later one mapped lower.
    assert!(with[1].ranges[0].hva_start < with[0].ranges[0].hva_start);
}

#[test]
fn without_host_address_merged_anonymous_zones_stay_unknown() {
    let mut i = info("anon");
    for z in i.memory_zones.as_mut().unwrap() {
        for r in &mut z.ranges {
            r.host_address = None;
        }
    }
    let t = build("anon", &i);
    assert!(t.iter().all(|t| t.ranges[0].hva_start == 0));
    assert!(
        t.iter()
            .all(|t| t.derivation.contains("host address unknown"))
    );
}
