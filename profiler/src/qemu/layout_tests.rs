use super::*;
use crate::qemu::answers::{NumaNode, RamAlias, VirtioMemDev};

const M: u64 = 1 << 20;

fn backend(id: &str, ty: &str, size: u64, offset: Option<u64>) -> Backend {
    Backend {
        id: id.into(),
        ty: format!("memory-backend-{ty}"),
        size,
        mem_path: (ty == "file").then(|| format!("/tmp/qprobe/{id}")),
        host_nodes: vec![],
        policy: "default".into(),
        container: offset.map(|_| "/machine/pc.ram[0]".into()),
        offset,
    }
}

fn dev(id: &str, memdev: &str, node: u32, memaddr: u64) -> VirtioMemDev {
    VirtioMemDev {
        id: id.into(),
        memdev: memdev.into(),
        node,
        memaddr,
        block: 2 * M,
        plugged: 0,
        requested: 0,
        max: 512 * M,
    }
}

/// The bed's layout as QEMU 7.2 reported it (vm1 made a memfd backend).
fn bed() -> Machine {
    let mut vm0 = backend("vm0", "file", 512 * M, Some(0));
    vm0.container = Some("/machine/device-memory[0]".into());
    Machine {
        name: None,
        cpus: 2,
        nodes: vec![
            NumaNode {
                id: 0,
                size: 256 * M,
                plugged: 0,
            },
            NumaNode {
                id: 1,
                size: 384 * M,
                plugged: 128 * M,
            },
        ],
        // qom-list order, not node order.
        backends: vec![
            backend("m1", "file", 256 * M, Some(256 * M)),
            vm0,
            backend("anon1", "ram", 64 * M, None),
            backend("vm1", "memfd", 512 * M, None),
            backend("m0", "file", 256 * M, Some(0)),
        ],
        devices: vec![
            dev("vmem0", "vm0", 0, 1 << 32),
            dev("vmem1", "vm1", 1, (1 << 32) + 512 * M),
        ],
        other_devices: vec![],
        aliases: vec![RamAlias {
            gpa: 0,
            offset: 0,
            len: 512 * M,
        }],
        balloon: Some(512 * M),
    }
}

// /proc/PID/maps of that QEMU.
const MAPS: &str = "\
7fb083ffc000-7fb0a3ffc000 rw-s 00000000 00:01 9864                       /memfd:memory-backend-memfd (deleted)
7fb0a3ffd000-7fb0c3ffd000 rw-s 00000000 fe:00 10002546                   /tmp/qprobe/vm0
7fb0c3ffe000-7fb0d3ffe000 rw-s 00000000 fe:00 10002530                   /tmp/qprobe/m1
7fb0d3fff000-7fb0e3fff000 rw-s 00000000 fe:00 10002514                   /tmp/qprobe/m0
7fb0e4000000-7fb0e8000000 rw-p 00000000 00:00 0 
";
const NUMA_MAPS: &str =
    "7fb0c3ffe000 default file=/tmp/qprobe/m1 dirty=3 N1=3 kernelpagesize_kB=4\n";

#[test]
fn one_tier_per_node_with_boot_memory_and_its_virtio_mem_region() {
    let over = HashMap::from([("m1".to_string(), TierKind::Cxl)]);
    let t = tiers(&bed(), MAPS, NUMA_MAPS, &over, &MemoryTiers::default()).unwrap();
    assert_eq!(t.len(), 2);
    assert_eq!(t[0].name, "node0");
    assert_eq!(t[0].kind(), TierKind::Unknown);
    assert_eq!(
        t[0].ranges,
        vec![
            GpaRange {
                gpa_start: 0,
                length: 256 * M,
                hva_start: 0x7fb0_d3ff_f000
            },
            GpaRange {
                gpa_start: 1 << 32,
                length: 512 * M,
                hva_start: 0x7fb0_a3ff_d000
            },
        ]
    );
    assert_eq!(t[0].size_bytes, 768 * M);
    let h = t[0].hotplug.unwrap();
    assert_eq!(
        (h.boot_bytes, h.region_bytes, h.block_bytes),
        (256 * M, 512 * M, 2 * M)
    );
    let n1 = &t[1];
    assert_eq!(n1.kind(), TierKind::Cxl, "{}", n1.derivation);
    assert!(
        n1.derivation.contains("override for \"m1\""),
        "{}",
        n1.derivation
    );
    assert_eq!(n1.ranges[0].gpa_start, 256 * M);
    assert_eq!(n1.ranges[0].hva_start, 0x7fb0_c3ff_e000);
    assert_eq!(n1.ranges[1].hva_start, 0x7fb0_83ff_c000, "memfd by size");
    assert_eq!(n1.host_numa_nodes, vec![1]);
    // An override by tier name; DRAM first.
    let over = HashMap::from([
        ("node1".to_string(), TierKind::Dram),
        ("node0".to_string(), TierKind::Cxl),
    ]);
    let t = tiers(&bed(), MAPS, "", &over, &MemoryTiers::default()).unwrap();
    assert_eq!(t[0].name, "node1");
}

#[test]
fn anonymous_and_ambiguous_backends_stay_unknown() {
    let mut m = bed();
    m.backends[4] = backend("m0", "ram", 256 * M, Some(0));
    let t = tiers(&m, MAPS, "", &HashMap::new(), &MemoryTiers::default()).unwrap();
    assert_eq!(t[0].ranges[0].hva_start, 0);
    assert!(
        t[0].derivation.contains("not measured"),
        "{}",
        t[0].derivation
    );
    // Two memfd backends of one size: QEMU 7.2 names both alike.
    let mut m = bed();
    m.backends[2] = backend("other", "memfd", 512 * M, None);
    let t = tiers(&m, MAPS, "", &HashMap::new(), &MemoryTiers::default()).unwrap();
    assert_eq!(t[1].ranges[1].hva_start, 0);
    assert!(
        t[1].derivation.contains("cannot tell them apart"),
        "{}",
        t[1].derivation
    );
    // A memfd named after its id is found by name.
    let named = MAPS.replace("memory-backend-memfd", "vm1");
    let t = tiers(&m, &named, "", &HashMap::new(), &MemoryTiers::default()).unwrap();
    assert_eq!(t[1].ranges[1].hva_start, 0x7fb0_83ff_c000);
}

#[test]
fn a_layout_that_does_not_add_up_builds_nothing() {
    let mut m = bed();
    m.nodes[1].plugged = 0;
    let e = tiers(&m, MAPS, "", &HashMap::new(), &MemoryTiers::default()).unwrap_err();
    assert!(e.contains("node 1 has"), "{e}");
    let mut m = bed();
    m.backends.retain(|b| b.id != "m1");
    let e = tiers(&m, MAPS, "", &HashMap::new(), &MemoryTiers::default()).unwrap_err();
    assert!(e.contains("no memory backend for node 1"), "{e}");
    let mut m = bed();
    m.nodes.clear();
    m.devices.clear();
    assert!(tiers(&m, MAPS, "", &HashMap::new(), &MemoryTiers::default()).is_err());
    m.backends.retain(|b| b.id != "m1");
    let t = tiers(&m, MAPS, "", &HashMap::new(), &MemoryTiers::default()).unwrap();
    assert_eq!((t.len(), t[0].name.as_str()), (1, "node0"));
}

#[test]
fn a_memoryless_node_with_a_device_is_a_tier() {
    let mut m = bed();
    m.nodes[1] = NumaNode {
        id: 1,
        size: 0,
        plugged: 0,
    };
    m.backends.retain(|b| b.id != "m1");
    let t = tiers(&m, MAPS, "", &HashMap::new(), &MemoryTiers::default()).unwrap();
    assert_eq!(t[1].name, "node1");
    assert_eq!(t[1].ranges.len(), 1);
    assert_eq!(t[1].hotplug.unwrap().boot_bytes, 0);
}
