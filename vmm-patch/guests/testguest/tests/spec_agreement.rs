//! The test guest's driver and `vmm-patch/SPEC.md` agree: feature bits,
//! config-space layout, queue order, stats tags and byte formats. Values are
//! read from SPEC.md's tables and examples and from `guest/spec.h`, and the
//! behaviour is checked on the guest's own C code compiled for the host
//! (`tier_testguest::wire`). The backend crate's constants are compared too.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::collections::BTreeMap;
use std::path::PathBuf;

use regex::Regex;
use tier_testguest::wire::{
    self, QueueLayout, TierField, TierStat, TierStats, config_size, encode_stats, parse_config,
    stat_tier_tag, tier_field_offset,
};

fn crate_file(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn spec() -> String {
    crate_file("../../SPEC.md")
}

/// The part of SPEC.md from heading `start` up to the next `## ` heading.
fn section(spec: &str, start: &str) -> String {
    let from = spec
        .find(start)
        .unwrap_or_else(|| panic!("SPEC.md has no {start:?}"));
    let rest = &spec[from + start.len()..];
    let to = rest.find("\n## ").unwrap_or(rest.len());
    rest[..to].to_string()
}

/// Prose with line breaks folded, for sentences that wrap in SPEC.md.
fn flat(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn num(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap(),
        None => s.parse().unwrap(),
    }
}

/// `#define NAME VALUE` of guest/spec.h.
fn header() -> BTreeMap<String, u64> {
    let re = Regex::new(r"(?m)^#define (\w+) (0x[0-9a-fA-F]+|\d+)\s*$").unwrap();
    let text = crate_file("guest/spec.h");
    let defs: BTreeMap<String, u64> = re
        .captures_iter(&text)
        .map(|c| (c[1].to_string(), num(&c[2].to_lowercase())))
        .collect();
    assert!(
        defs.len() > 40,
        "spec.h parsed to only {} constants",
        defs.len()
    );
    defs
}

fn h(defs: &BTreeMap<String, u64>, name: &str) -> u64 {
    *defs
        .get(name)
        .unwrap_or_else(|| panic!("guest/spec.h lacks {name}"))
}

/// Bytes and `name=value` annotations of a SPEC hex dump (`0000: xx xx ...   notes`).
fn hexdump(block: &str) -> (Vec<u8>, String) {
    let line_re = Regex::new(r"(?m)^([0-9a-f]{4}): (.*)$").unwrap();
    let mut bytes = Vec::new();
    let mut notes = String::new();
    for c in line_re.captures_iter(block) {
        assert_eq!(
            num(&format!("0x{}", &c[1])) as usize,
            bytes.len(),
            "dump offsets"
        );
        let mut tokens = c[2].split_whitespace().peekable();
        let mut n = 0;
        while n < 16 {
            match tokens.peek() {
                Some(t) if t.len() == 2 && t.chars().all(|ch| ch.is_ascii_hexdigit()) => {
                    bytes.push(u8::from_str_radix(t, 16).unwrap());
                    tokens.next();
                    n += 1;
                }
                _ => break,
            }
        }
        notes.push_str(&tokens.collect::<Vec<_>>().join(" "));
        notes.push(' ');
    }
    (bytes, notes)
}

#[test]
fn feature_bits_match_spec_section_1() {
    let defs = header();
    let sec = section(&spec(), "## 1. Feature bits");
    let row = Regex::new(r"(?m)^\| \**(\d+)\** \| \**`(\w+)`").unwrap();
    let bits: BTreeMap<String, u64> = row
        .captures_iter(&sec)
        .map(|c| (c[2].to_string(), num(&c[1])))
        .collect();
    assert_eq!(bits.len(), 5, "feature table rows: {bits:?}");
    for (name, bit) in &bits {
        assert_eq!(h(&defs, name), *bit, "{name}");
    }
    assert_eq!(bits["VIRTIO_BALLOON_F_TIERS"], 23);
    // Every feature bit the header names is in the SPEC table.
    for (name, v) in defs.iter().filter(|(n, _)| n.contains("_F_")) {
        assert_eq!(
            bits.get(name),
            Some(v),
            "spec.h {name} not in SPEC.md section 1"
        );
    }
    // "a minimal polled driver reads it with device_feature_select = 0".
    assert!(h(&defs, "VIRTIO_BALLOON_F_TIERS") < 32);
    assert!(flat(&spec()).contains(&format!(
        "PCI vendor {:#x}, device {:#x} (virtio device type 5)",
        h(&defs, "VIRTIO_PCI_VENDOR_ID"),
        h(&defs, "VIRTIO_BALLOON_PCI_DEVICE_ID")
    )));
}

#[test]
fn config_layout_matches_spec_section_2() {
    let defs = header();
    let spec = spec();
    let sec = section(&spec, "## 2. Config space");
    let row =
        Regex::new(r"(?m)^\| (\+?0x[0-9a-f]+)(?: \+ (\d+)\*i)? \| (\d+) \| `(\w+)(\[i\])?` \|")
            .unwrap();
    let mut top = Vec::new();
    let mut tier = Vec::new();
    for c in row.captures_iter(&sec) {
        let off = &c[1];
        let size = num(&c[3]);
        let name = c[4].to_string();
        if let Some(rel) = off.strip_prefix('+') {
            tier.push((num(rel), size, name));
        } else {
            top.push((num(off), size, name, c.get(2).map(|m| num(m.as_str()))));
        }
    }
    assert_eq!(top.len(), 7, "top-level rows {top:?}");
    assert_eq!(tier.len(), 7, "per-tier rows {tier:?}");

    // Header names: VIRTIO_BALLOON_CFG_<FIELD> and VIRTIO_BALLOON_TIER_<FIELD>.
    let mut end = 0;
    for (off, size, name, stride) in &top {
        assert_eq!(*off, end, "{name} follows the previous field");
        if name == "tier" {
            assert_eq!(h(&defs, "VIRTIO_BALLOON_CFG_TIERS"), *off);
            assert_eq!(h(&defs, "VIRTIO_BALLOON_CFG_TIER_SIZE"), *size);
            assert_eq!(*stride, Some(*size), "tier[i] stride is its size");
        } else {
            assert_eq!(
                h(
                    &defs,
                    &format!("VIRTIO_BALLOON_CFG_{}", name.to_uppercase())
                ),
                *off,
                "{name}"
            );
            assert_eq!(*size, 4);
        }
        end = off + size;
    }
    let mut end = 0;
    let fields = [
        ("num_pages", TierField::NumPages),
        ("actual", TierField::Actual),
        ("guest_node", TierField::GuestNode),
        ("reserved", TierField::Reserved),
        ("gpa_start", TierField::GpaStart),
        ("zone_pages", TierField::ZonePages),
        ("span_pages", TierField::SpanPages),
    ];
    for ((off, size, name), (fname, field)) in tier.iter().zip(fields) {
        assert_eq!(name, fname);
        assert_eq!(*off, end, "{name} follows the previous field");
        assert_eq!(
            h(
                &defs,
                &format!("VIRTIO_BALLOON_TIER_{}", name.to_uppercase())
            ),
            *off
        );
        assert_eq!(field as u64, *off);
        // The driver's offsets for every tier.
        for i in 0..8u32 {
            assert_eq!(
                u64::from(tier_field_offset(i, field)),
                0x18 + 32 * u64::from(i) + off,
                "tier {i} {name}"
            );
        }
        end = off + size;
    }
    assert_eq!(end, h(&defs, "VIRTIO_BALLOON_CFG_TIER_SIZE"));

    // "At most 8 tiers (`VIRTIO_BALLOON_TIERS_MAX = 8`)", sizes, no-node value.
    let max = Regex::new(r"VIRTIO_BALLOON_TIERS_MAX = (\d+)")
        .unwrap()
        .captures(&spec)
        .unwrap();
    assert_eq!(h(&defs, "VIRTIO_BALLOON_TIERS_MAX"), num(&max[1]));
    assert_eq!(wire::TIERS_MAX as u64, num(&max[1]));
    let total = Regex::new(r"Total size: `0x18 \+ 32\*N` bytes \((\d+) for two tiers\)").unwrap();
    assert_eq!(
        config_size(2) as u64,
        num(&total.captures(&sec).unwrap()[1])
    );
    assert!(flat(&sec).contains("Without `tiers=on` the config space is the v53.0 one, 8 bytes"));
    assert_eq!(config_size(0), 8);
    assert!(flat(&sec).contains("`0xffffffff` if none"));
    assert_eq!(h(&defs, "VIRTIO_BALLOON_TIER_NO_NODE"), 0xffff_ffff);
    // The driver writes tier actuals at "0x18 + 32*i + 4".
    assert!(flat(&sec).contains("(offset `0x18 + 32*i + 4`)"));
    assert_eq!(tier_field_offset(1, TierField::Actual), 0x18 + 32 + 4);
}

#[test]
fn config_example_decodes_to_its_annotations() {
    let sec = section(&spec(), "## 2. Config space");
    let from = sec.find("Example: two 256 MiB zones").unwrap();
    let (bytes, notes) = hexdump(&sec[from..]);
    assert_eq!(bytes.len(), 88);
    let cfg = parse_config(&bytes).unwrap();
    let ann = Regex::new(r"(t(\d)\.)?(\w+)=(0x[0-9a-f]+|\d+)").unwrap();
    let mut checked = 0;
    for c in ann.captures_iter(&notes) {
        let want = num(&c[4]);
        let got = match (c.get(2).map(|m| num(m.as_str()) as usize), &c[3]) {
            (None, "tier_count") => cfg.tiers.len() as u64,
            (Some(i), field) => {
                let t = &cfg.tiers[i];
                match field {
                    "num_pages" => t.num_pages.into(),
                    "actual" => t.actual.into(),
                    "guest_node" => t.guest_node.into(),
                    "gpa_start" => t.gpa_start,
                    "zone_pages" => t.zone_pages.into(),
                    "span_pages" => t.span_pages.into(),
                    other => panic!("unknown annotation field {other}"),
                }
            }
            (None, other) => panic!("unknown annotation {other}"),
        };
        assert_eq!(got, want, "{}", &c[0]);
        checked += 1;
    }
    assert_eq!(checked, 13, "annotations in {notes:?}");
    assert_eq!(
        (cfg.num_pages, cfg.actual),
        (0, 0),
        "no legacy target in the example"
    );
}

#[test]
fn queue_order_matches_spec_section_3() {
    let defs = header();
    let spec = spec();
    let sec = section(&spec, "## 3. Queues");
    // The table and its formula.
    assert!(flat(&sec).contains("`B = 2 + STATS_VQ + REPORTING`"));
    assert!(sec.contains("| 0 | inflate (legacy) | always |"));
    assert!(sec.contains("| 1 | deflate (legacy) | always |"));
    assert!(sec.contains("| B + 2*i | tier i inflate |"));
    assert!(sec.contains("| B + 2*i + 1 | tier i deflate |"));
    assert_eq!(h(&defs, "VIRTIO_BALLOON_QUEUE_INFLATE"), 0);
    assert_eq!(h(&defs, "VIRTIO_BALLOON_QUEUE_DEFLATE"), 1);
    for stats in [false, true] {
        for reporting in [false, true] {
            let b = 2 + u32::from(stats) + u32::from(reporting);
            for tiers in 1..=8u32 {
                let q = QueueLayout {
                    stats,
                    reporting,
                    tiers,
                };
                assert_eq!(q.count(), b + 2 * tiers);
                assert_eq!(q.stats_queue(), stats.then_some(2));
                assert_eq!(
                    q.reporting_queue(),
                    reporting.then_some(2 + u32::from(stats))
                );
                for i in 0..tiers {
                    assert_eq!(q.tier_queue(i, true), b + 2 * i);
                    assert_eq!(q.tier_queue(i, false), b + 2 * i + 1);
                }
            }
        }
    }
    // The worked example, name by name.
    let ex = Regex::new(r"Example: stats negotiated, reporting not, two tiers: ([^.]+)\.").unwrap();
    let list = ex.captures(&flat(&sec)).expect("queue example")[1].to_string();
    let q = QueueLayout {
        stats: true,
        reporting: false,
        tiers: 2,
    };
    let item = Regex::new(r"(\d+) ([a-z-]+)").unwrap();
    let mut n = 0;
    for c in item.captures_iter(&list) {
        let want = match &c[2] {
            "inflate" => h(&defs, "VIRTIO_BALLOON_QUEUE_INFLATE") as u32,
            "deflate" => h(&defs, "VIRTIO_BALLOON_QUEUE_DEFLATE") as u32,
            "stats" => q.stats_queue().unwrap(),
            "dram-inflate" => q.tier_queue(0, true),
            "dram-deflate" => q.tier_queue(0, false),
            "slow-inflate" => q.tier_queue(1, true),
            "slow-deflate" => q.tier_queue(1, false),
            other => panic!("unknown queue {other}"),
        };
        assert_eq!(num(&c[1]) as u32, want, "{}", &c[0]);
        n += 1;
    }
    assert_eq!(n, 7);
    assert_eq!(q.count(), 7);
    // Buffers: u32 PFNs, at most 1024 bytes (256 PFNs), 4 KiB pages.
    assert!(flat(&sec).contains("at most 1024 bytes (256 PFNs)"));
    assert_eq!(h(&defs, "VIRTIO_BALLOON_MAX_PFNS_PER_DESC"), 256);
    assert_eq!(h(&defs, "VIRTIO_BALLOON_PFN_SIZE"), 4);
    let shift = Regex::new(r"`VIRTIO_BALLOON_PFN_SHIFT = (\d+)`").unwrap();
    assert_eq!(
        h(&defs, "VIRTIO_BALLOON_PFN_SHIFT"),
        num(&shift.captures(&spec).unwrap()[1])
    );
}

#[test]
fn stats_tags_match_spec_section_4() {
    let defs = header();
    let sec = section(&spec(), "## 4. Stats queue");
    // Standard tags 0-9, in order.
    let std_row = Regex::new(r"(?m)^\| 0-9 \| (.+?) \|").unwrap();
    let names: Vec<String> = Regex::new(r"`(\w+)`")
        .unwrap()
        .captures_iter(&std_row.captures(&sec).unwrap()[1])
        .map(|c| c[1].to_string())
        .collect();
    assert_eq!(names.len(), 10);
    for (tag, name) in names.iter().enumerate() {
        assert_eq!(
            h(&defs, &format!("VIRTIO_BALLOON_S_{name}")),
            tag as u64,
            "{name}"
        );
    }
    // Ours: 0x8000 + 0x10*i + k.
    let tier_row =
        Regex::new(r"(?m)^\| `(0x[0-9a-f]+) \+ (0x[0-9a-f]+)\*i \+ (\d+)` \| `TIER_(\w+)\(i\)`")
            .unwrap();
    let mut kinds = 0;
    for c in tier_row.captures_iter(&sec) {
        let (base, stride, k) = (num(&c[1]), num(&c[2]), num(&c[3]));
        assert_eq!(h(&defs, "VIRTIO_BALLOON_S_TIER_BASE"), base);
        assert_eq!(h(&defs, "VIRTIO_BALLOON_S_TIER_STRIDE"), stride);
        assert_eq!(h(&defs, &format!("VIRTIO_BALLOON_S_TIER_{}", &c[4])), k);
        let kind = match &c[4] {
            "ACCESSES" => TierStat::Accesses,
            "FREE" => TierStat::Free,
            "TOTAL" => TierStat::Total,
            other => panic!("unknown tier stat {other}"),
        };
        for i in 0..8u32 {
            assert_eq!(
                u64::from(stat_tier_tag(i, kind)),
                base + stride * u64::from(i) + k
            );
        }
        kinds += 1;
    }
    assert_eq!(kinds, 3);
    assert!(flat(&sec).contains("so our tags are 0x8000-0x807f"));
    assert_eq!(stat_tier_tag(7, TierStat::Total), 0x8072);
    assert!(flat(&sec).contains("packed 10-byte entries `{ u16 tag; u64 val; }`"));
    assert_eq!(h(&defs, "VIRTIO_BALLOON_S_ENTRY_SIZE"), 10);
}

#[test]
fn stats_example_is_what_the_driver_encodes() {
    let sec = section(&spec(), "## 4. Stats queue");
    let from = sec.find("Example stats buffer").unwrap();
    let (bytes, notes) = hexdump(&sec[from..]);
    assert_eq!(bytes.len(), 60);
    // Entries from the annotations ("tag 5 ... ... = 0x20000000" spans lines).
    let ann = Regex::new(r"tag (0x[0-9a-f]+|\d+)\s*(?:\.\.\.\s*)*=\s*(0x[0-9a-f]+|\d+)").unwrap();
    let entries: Vec<(u16, u64)> = ann
        .captures_iter(&notes)
        .map(|c| (num(&c[1]) as u16, num(&c[2])))
        .collect();
    assert_eq!(entries.len(), 6, "{notes}");
    assert_eq!(encode_stats(&entries), bytes);
    // The prose: MEMFREE = 192 MiB, MEMTOT = 512 MiB, tier 0: 1,000,000
    // accesses, 64 MiB free, 256 MiB total; tier 1: 250,000 accesses.
    const MIB: u64 = 1 << 20;
    assert_eq!(
        entries,
        vec![
            (4, 192 * MIB),
            (5, 512 * MIB),
            (stat_tier_tag(0, TierStat::Accesses), 1_000_000),
            (stat_tier_tag(0, TierStat::Free), 64 * MIB),
            (stat_tier_tag(0, TierStat::Total), 256 * MIB),
            (stat_tier_tag(1, TierStat::Accesses), 250_000),
        ]
    );
}

#[test]
fn driver_stats_buffer_uses_only_spec_tags() {
    let defs = header();
    let tiers = [
        TierStats {
            accesses: 7,
            free_bytes: 4096,
            total_bytes: 8192,
        },
        TierStats {
            accesses: 9,
            free_bytes: 0,
            total_bytes: 40960,
        },
    ];
    let entries = wire::stats_entries(&tiers).unwrap();
    let mut want = vec![
        (h(&defs, "VIRTIO_BALLOON_S_MEMFREE") as u16, 4096),
        (h(&defs, "VIRTIO_BALLOON_S_MEMTOT") as u16, 49152),
        (h(&defs, "VIRTIO_BALLOON_S_AVAIL") as u16, 4096),
    ];
    for (i, t) in tiers.iter().enumerate() {
        want.push((0x8000 + 0x10 * i as u16, t.accesses));
        want.push((0x8001 + 0x10 * i as u16, t.free_bytes));
        want.push((0x8002 + 0x10 * i as u16, t.total_bytes));
    }
    assert_eq!(entries, want);
    let bytes = encode_stats(&entries);
    assert_eq!(bytes.len(), 9 * 10);
    // Eight tiers fill the largest buffer the driver sends.
    let full = wire::stats_entries(&[TierStats::default(); 8]).unwrap();
    assert_eq!(full.len(), wire::STATS_MAX_ENTRIES);
    assert!(
        full.iter()
            .all(|(tag, _)| *tag < 10 || (0x8000..=0x807f).contains(tag))
    );
}

#[test]
fn backend_crate_agrees() {
    let defs = header();
    assert_eq!(
        tier_balloon::MAX_TIERS as u64,
        h(&defs, "VIRTIO_BALLOON_TIERS_MAX")
    );
    assert_eq!(
        tier_balloon::PAGE_SIZE,
        1 << h(&defs, "VIRTIO_BALLOON_PFN_SHIFT")
    );
    // One driver descriptor (256 PFNs) is one chain, well within the backend's limit.
    assert!(tier_balloon::MAX_CHAIN_PFNS as u64 >= h(&defs, "VIRTIO_BALLOON_MAX_PFNS_PER_DESC"));
}
