use super::*;
use serde_json::json;

const M: u64 = 1 << 20;

// Recorded from QEMU 7.2 (Debian 1:7.2+dfsg-7+deb12u18) with the bed's
// layout: two boot nodes, two virtio-mem devices, a balloon.
const DEVICES: &str = r#"[{"type": "virtio-mem", "data": {"memdev": "/objects/vm0", "memaddr": 4294967296, "block-size": 2097152, "size": 0, "node": 0, "max-size": 536870912, "requested-size": 0, "id": "vmem0"}}, {"type": "virtio-mem", "data": {"memdev": "/objects/vm1", "memaddr": 4831838208, "block-size": 2097152, "size": 0, "node": 1, "max-size": 536870912, "requested-size": 134217728, "id": "vmem1"}}, {"type": "dimm", "data": {"id": "d0"}}]"#;
const MEMDEV: &str = r#"[{"share": true, "reserve": true, "prealloc": false, "host-nodes": [], "size": 268435456, "merge": true, "dump": true, "policy": "default", "id": "m1"}, {"share": false, "host-nodes": [1], "size": 67108864, "policy": "bind"}]"#;
const OBJECTS: &str = r#"[{"name": "type", "type": "string"}, {"name": "m1", "type": "child<memory-backend-file>"}, {"name": "anon1", "type": "child<memory-backend-ram>"}, {"name": "vm1", "type": "child<memory-backend-memfd>"}, {"name": "iothread0", "type": "child<iothread>"}]"#;
const NUMA: &str = "2 nodes\r\nnode 0 cpus: 0 1\r\nnode 0 size: 256 MB\r\nnode 0 plugged: 0 MB\r\nnode 1 cpus:\r\nnode 1 size: 384 MB\r\nnode 1 plugged: 128 MB\r\n";
const MTREE: &str = "address-space: memory\r\n  0000000000000000-ffffffffffffffff (prio 0, i/o): system\r\n    0000000000000000-000000001fffffff (prio 0, i/o): alias ram-below-4g @pc.ram 0000000000000000-000000001fffffff\r\n    0000000100000000-000000013fffffff (prio 0, i/o): alias ram-above-4g @pc.ram 0000000020000000-000000005fffffff\r\n      0000000100000000-000000011fffffff (prio 0, ram): vm0\r\naddress-space: I/O\r\n    0000000000000000-000000001fffffff (prio 0, i/o): alias ram-below-4g @pc.ram 0000000000000000-000000001fffffff\r\n";

fn v(s: &str) -> Value {
    serde_json::from_str(s).unwrap()
}

#[test]
fn virtio_mem_devices_are_read_and_others_named() {
    let (d, others) = memory_devices(&v(DEVICES)).unwrap();
    assert_eq!(others, vec!["dimm"]);
    assert_eq!(d.len(), 2);
    assert_eq!(
        d[1],
        VirtioMemDev {
            id: "vmem1".into(),
            memdev: "vm1".into(),
            node: 1,
            memaddr: 4831838208,
            block: 2 * M,
            plugged: 0,
            requested: 128 * M,
            max: 512 * M,
        }
    );
}

#[test]
fn malformed_device_answers_are_errors() {
    assert!(memory_devices(&json!({"x": 1})).is_err());
    let e = memory_devices(&json!([{"type": "virtio-mem", "data": {"id": "v"}}])).unwrap_err();
    assert!(e.contains("without memdev"), "{e}");
    let e = memory_devices(&json!([{"type": "virtio-mem"}])).unwrap_err();
    assert!(e.contains("without data"), "{e}");
    let bad_node = json!([{"type": "virtio-mem", "data": {"id": "v", "memdev": "/objects/a",
        "node": 1u64 << 40, "memaddr": 0, "block-size": 1, "size": 0, "requested-size": 0, "max-size": 0}}]);
    assert!(memory_devices(&bad_node).unwrap_err().contains("node"));
}

#[test]
fn memdevs_keep_a_missing_id_as_none() {
    let m = memdevs(&v(MEMDEV)).unwrap();
    assert_eq!(m[0].id.as_deref(), Some("m1"));
    assert_eq!(m[1].id, None);
    assert_eq!(
        (m[1].host_nodes.clone(), m[1].policy.as_str()),
        (vec![1], "bind")
    );
    assert!(memdevs(&json!([{"id": "x"}])).is_err());
    assert!(memdevs(&json!([{"size": 1, "host-nodes": ["a"]}])).is_err());
    assert!(memdevs(&json!("x")).is_err());
}

#[test]
fn backends_among_objects() {
    let b = backend_objects(&v(OBJECTS)).unwrap();
    assert_eq!(
        b,
        vec![
            ("m1".to_string(), "memory-backend-file".to_string()),
            ("anon1".into(), "memory-backend-ram".into()),
            ("vm1".into(), "memory-backend-memfd".into()),
        ]
    );
    let children = json!([{"name": "type", "type": "string"}, {"name": "m0[0]", "type": "child<memory-region>"}]);
    assert_eq!(region_child(&children).as_deref(), Some("m0[0]"));
    assert_eq!(region_child(&json!([])), None);
}

#[test]
fn info_numa_sizes_and_plugged() {
    let n = info_numa(NUMA).unwrap();
    assert_eq!(n.len(), 2);
    assert_eq!(
        (n[1].size, n[1].plugged, n[1].boot()),
        (384 * M, 128 * M, 256 * M)
    );
    assert_eq!(n[0].boot(), 256 * M);
    assert!(info_numa("garbage").is_err());
    assert!(info_numa("2 nodes\nnode 0 size: 1 MB\n").is_err());
    assert!(info_numa("1 nodes\nnode 0 size: lots MB\n").is_err());
    assert_eq!(info_numa("0 nodes\r\n").unwrap(), vec![]);
}

#[test]
fn ram_aliases_map_container_offsets_to_guest_addresses() {
    let a = ram_aliases(MTREE);
    assert_eq!(
        a,
        vec![
            RamAlias {
                gpa: 0,
                offset: 0,
                len: 512 * M
            },
            RamAlias {
                gpa: 1 << 32,
                offset: 512 * M,
                len: 1024 * M
            },
        ]
    );
    // Node 1's 256M at offset 256M: below 4G.
    assert_eq!(
        gpa_pieces(&a, 256 * M, 256 * M),
        Some(vec![(256 * M, 256 * M)])
    );
    // Across the split: two pieces.
    assert_eq!(
        gpa_pieces(&a, 384 * M, 256 * M),
        Some(vec![(384 * M, 128 * M), (1 << 32, 128 * M)])
    );
    // Past what the aliases show: unknown.
    assert_eq!(gpa_pieces(&a, 1500 * M, 100 * M), None);
    assert_eq!(gpa_pieces(&[], 0, M), None);
}
