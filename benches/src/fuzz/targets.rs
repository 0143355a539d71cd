//! The parsers fuzzed, each with its corpus of valid inputs and its
//! structure-aware generator. Every `run` calls the crates' own functions,
//! and goes on where tierd goes on with the parsed value.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use tier_balloon::device::{MAX_STATS_BYTES, known_tag, stat_name, stats_entries};
use tier_balloon::{Balloon, DeviceOptions, spec::parse_tier};
use tier_controller::actuate::{BALLOON_DEVICE, parse_counters, parse_vm_info, tier_states};
use tier_profiler::ch::Snapshot;
use tier_profiler::ch::handle::guest_accesses;
use tier_profiler::ch::layout;
use tier_profiler::config::Config;
use tier_profiler::memtier::MemoryTiers;
use tier_proto::v1::TierKind;

use super::mutate::{self, J};
use super::{Rng, Target, Verdict};

/// Largest input of the non-big cases.
const SMALL_MAX: usize = 64 << 10;
/// Largest input of the big cases.
const BIG_MAX: usize = 4 << 20;

/// Every target, in the bench's order.
pub fn all() -> Vec<Box<dyn Target>> {
    vec![
        Box::new(VmInfo::new()),
        Box::new(VmCounters::new()),
        Box::new(ControlLine::new()),
        Box::new(StatsBuffer::new()),
        Box::new(ConfigFile::new()),
    ]
}

/// Names of [`all`].
pub fn names() -> Vec<&'static str> {
    all().iter().map(|t| t.name()).collect()
}

/// Seeds as bytes and as JSON trees (for the JSON targets).
#[derive(Debug)]
struct Corpus {
    seeds: Vec<Vec<u8>>,
    trees: Vec<J>,
}

impl Corpus {
    fn json(seeds: &[&str]) -> Corpus {
        let trees = seeds
            .iter()
            .filter_map(|s| serde_json::from_str::<serde_json::Value>(s).ok())
            .map(|v| J::from_value(&v))
            .collect();
        Corpus {
            seeds: seeds.iter().map(|s| s.as_bytes().to_vec()).collect(),
            trees,
        }
    }

    /// The usual mix: a big structured case when asked; else 8 % random
    /// bytes, 42 % structure-aware (half of them byte-mutated too), 50 %
    /// a seed byte-mutated.
    fn generate(
        &self,
        rng: &mut Rng,
        big: bool,
        out: &mut Vec<u8>,
        structured: &mut dyn FnMut(&mut Rng, bool, &mut Vec<u8>),
    ) {
        if big {
            structured(rng, true, out);
            out.truncate(BIG_MAX);
            return;
        }
        let other = &self.seeds[rng.below(self.seeds.len())];
        match rng.below(100) {
            0..8 => mutate::random(out, rng, 4096),
            8..50 => {
                structured(rng, false, out);
                if rng.chance(1, 2) {
                    mutate::bytes(out, other, rng, SMALL_MAX);
                }
            }
            _ => {
                out.extend_from_slice(rng.pick(&self.seeds).as_slice());
                mutate::bytes(out, other, rng, SMALL_MAX);
            }
        }
        out.truncate(SMALL_MAX);
    }

    /// A seed tree with one to three structural mutations (one if big).
    fn tree(&self, rng: &mut Rng, big: bool, out: &mut Vec<u8>) {
        let mut t = rng.pick(&self.trees).clone();
        if big {
            t.grow(rng);
        } else {
            for _ in 0..1 + rng.below(3) {
                t.mutate(rng, false);
            }
        }
        t.write(out);
    }
}

const ANON_INFO: &str =
    include_str!("../../../profiler/tests/fixtures/ch-layout/anon.vm.info.json");
const SHARED_INFO: &str =
    include_str!("../../../profiler/tests/fixtures/ch-layout/shared.vm.info.json");
const ANON_MAPS: &str = include_str!("../../../profiler/tests/fixtures/ch-layout/anon.maps");
const ANON_NUMA: &str = include_str!("../../../profiler/tests/fixtures/ch-layout/anon.numa_maps");

/// `GET /api/v1/vm.info` bodies: decoded as tierd decodes them, then the
/// tier states the controller reads, the drivability check, and the tier
/// map built from `memory_zones` against a recorded /proc/PID/maps.
#[derive(Debug)]
pub struct VmInfo {
    corpus: Corpus,
    overrides: HashMap<String, TierKind>,
    memtiers: MemoryTiers,
}

impl VmInfo {
    pub fn new() -> VmInfo {
        VmInfo {
            corpus: Corpus::json(&[
                ANON_INFO,
                SHARED_INFO,
                r#"{"state":"Created"}"#,
                r#"{"state":"Running","memory_actual_size":0,"balloon":null,"memory_zones":[]}"#,
                r#"{"state":"Running","balloon":{"tiers_offered":true,"tiers_negotiated":true,"legacy_target":0,"legacy_actual":0,"zones":[{"id":"dram","tier":0,"target":67108864,"actual":4096,"host_ballooned":4096,"inflated_pfns":1,"deflated_pfns":0,"rejected_pfns":0},{"id":"slow","tier":1,"target":0,"actual":0,"host_ballooned":0,"inflated_pfns":0,"deflated_pfns":0,"rejected_pfns":0}]},"memory_zones":[{"id":"dram","host_numa_node":0,"guest_numa_node":0,"ranges":[{"start":0,"size":134217728},{"start":4294967296,"size":134217728}]},{"id":"slow","host_numa_node":1,"guest_numa_node":1,"ranges":[{"start":268435456,"size":268435456}]}]}"#,
            ]),
            overrides: HashMap::from([("slow".to_string(), TierKind::Cxl)]),
            // Two tiers, so the kernel-tier branch of the kind runs too.
            memtiers: MemoryTiers::from_tiers(vec![(4, vec![0]), (5, vec![1])]),
        }
    }
}

impl Default for VmInfo {
    fn default() -> Self {
        VmInfo::new()
    }
}

impl Target for VmInfo {
    fn name(&self) -> &'static str {
        "vm-info"
    }

    fn generate(&mut self, rng: &mut Rng, big: bool, out: &mut Vec<u8>) {
        let c = &self.corpus;
        c.generate(rng, big, out, &mut |rng, big, out| c.tree(rng, big, out));
    }

    fn run(&mut self, input: &[u8]) -> Verdict {
        let Ok(info) = parse_vm_info(input) else {
            return Verdict::Rejected;
        };
        let _ = std::hint::black_box(tier_states(info.clone()));
        if let Some(zones) = &info.memory_zones {
            let tiers = layout::tiers(zones, ANON_MAPS, ANON_NUMA, &self.overrides, &self.memtiers);
            std::hint::black_box(tiers);
        }
        let snap = Snapshot {
            info: Some(info),
            read_at: Some(Instant::now()),
            ..Default::default()
        };
        let _ = std::hint::black_box(snap.drivable(Duration::from_secs(5), &["dram", "slow"]));
        std::hint::black_box(snap.zone("dram"));
        Verdict::Accepted
    }
}

/// `GET /api/v1/vm.counters` bodies: decoded, then the per-tier guest
/// access counters tierd takes from the balloon's entry.
#[derive(Debug)]
pub struct VmCounters {
    corpus: Corpus,
}

impl VmCounters {
    pub fn new() -> VmCounters {
        VmCounters {
            corpus: Corpus::json(&[
                r#"{"__balloon":{"tier0_guest_accesses":10,"tier1_guest_accesses":30,"tier0_target_bytes":4096,"stat_free_memory":1,"stat_total_memory":268435456,"tier1_guest_free_bytes":0,"tier1_guest_total_bytes":268435456}}"#,
                r#"{"_disk0":{"read_bytes":0,"read_ops":0,"write_bytes":0,"write_ops":0},"_net1":{"rx_bytes":1514,"rx_frames":1,"tx_bytes":0,"tx_frames":0},"__balloon":{"tier0_guest_accesses":18446744073709551615}}"#,
                "{}",
            ]),
        }
    }
}

impl Default for VmCounters {
    fn default() -> Self {
        VmCounters::new()
    }
}

impl Target for VmCounters {
    fn name(&self) -> &'static str {
        "vm-counters"
    }

    fn generate(&mut self, rng: &mut Rng, big: bool, out: &mut Vec<u8>) {
        let c = &self.corpus;
        c.generate(rng, big, out, &mut |rng, big, out| c.tree(rng, big, out));
    }

    fn run(&mut self, input: &[u8]) -> Verdict {
        let Ok(counters) = parse_counters(input) else {
            return Verdict::Rejected;
        };
        std::hint::black_box(guest_accesses(counters.get(BALLOON_DEVICE)));
        Verdict::Accepted
    }
}

/// Request lines of the backend's control socket, as read from the
/// socket (bytes, newline included), answered by a two-tier device
/// without a frontend; accepted = an `"ok":true` answer (or a blank line,
/// which gets none).
#[derive(Debug)]
pub struct ControlLine {
    corpus: Corpus,
    device: Balloon,
}

impl ControlLine {
    pub fn new() -> ControlLine {
        let spec = |s: &str| parse_tier(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        let device = Balloon::new(
            vec![
                spec("name=dram,ranges=0-0x1000000"),
                spec("name=slow,ranges=0x10000000-0x11000000"),
            ],
            DeviceOptions::default(),
        )
        .unwrap_or_else(|e| panic!("device: {e}"));
        ControlLine {
            corpus: Corpus::json(&[
                r#"{"op":"ping"}"#,
                r#"{"op":"state"}"#,
                r#"{"op":"set_targets","targets":{"dram":67108864,"slow":0},"legacy":0}"#,
                r#"{"op":"set_targets","targets":{"slow":8191,"dram":12288}}"#,
                r#"{"op":"set_targets","legacy":4096}"#,
            ]),
            device,
        }
    }
}

impl Default for ControlLine {
    fn default() -> Self {
        ControlLine::new()
    }
}

impl Target for ControlLine {
    fn name(&self) -> &'static str {
        "control-line"
    }

    fn generate(&mut self, rng: &mut Rng, big: bool, out: &mut Vec<u8>) {
        let c = &self.corpus;
        c.generate(rng, big, out, &mut |rng, big, out| {
            c.tree(rng, big, out);
            match rng.below(4) {
                0 => {}
                1 => out.extend_from_slice(b"\r\n"),
                _ => out.push(b'\n'),
            }
        });
    }

    fn run(&mut self, input: &[u8]) -> Verdict {
        match tier_balloon::control::answer_line(&self.device, input) {
            None => Verdict::Accepted,
            Some(answer) => {
                // As the socket writes it.
                std::hint::black_box(answer.to_string());
                if answer.get("ok").and_then(serde_json::Value::as_bool) == Some(true) {
                    Verdict::Accepted
                } else {
                    Verdict::Rejected
                }
            }
        }
    }
}

/// Stats-queue buffers as the guest writes them (10-byte le16 tag + le64
/// value entries): the entries the device keeps, then their counter names
/// and the per-tier guest accesses tierd takes from those names.
/// Accepted = stored (the device counts an update); rejected = longer than
/// [`MAX_STATS_BYTES`], which the device refuses before parsing.
#[derive(Debug)]
pub struct StatsBuffer {
    seeds: Vec<Vec<u8>>,
}

/// Tags a guest plausibly sends: SPEC's and their neighbours.
const TAGS: &[u16] = &[
    0, 1, 4, 5, 6, 10, 15, 16, 0x7fff, 0x8000, 0x8001, 0x8002, 0x8003, 0x8010, 0x8072, 0x8073,
    0x8080, 0xffff,
];

fn entry(out: &mut Vec<u8>, tag: u16, value: u64) {
    out.extend_from_slice(&tag.to_le_bytes());
    out.extend_from_slice(&value.to_le_bytes());
}

impl StatsBuffer {
    pub fn new() -> StatsBuffer {
        let mut full = Vec::new();
        for tag in 0..16 {
            entry(&mut full, tag, u64::from(tag) << 20);
        }
        for i in 0..2u16 {
            for k in 0..3u16 {
                entry(&mut full, 0x8000 + 0x10 * i + k, 1000 * u64::from(i + 1));
            }
        }
        let mut linux = Vec::new();
        for tag in [0u16, 1, 2, 3, 4, 5, 6, 7, 8, 9] {
            entry(&mut linux, tag, 12345);
        }
        StatsBuffer {
            seeds: vec![full, linux, Vec::new()],
        }
    }

    fn structured(rng: &mut Rng, big: bool, out: &mut Vec<u8>) {
        let n = if big {
            (1 << 20) / 10 + rng.below(1000)
        } else {
            rng.size(8000)
        };
        for _ in 0..n {
            let tag = if rng.chance(3, 4) {
                *rng.pick(TAGS)
            } else {
                rng.u64() as u16
            };
            let value = match rng.below(4) {
                0 => u64::MAX,
                1 => 0,
                _ => rng.u64() >> rng.below(64),
            };
            entry(out, tag, value);
        }
        // A trailing partial entry.
        if rng.chance(1, 4) {
            for _ in 0..1 + rng.below(9) {
                out.push(rng.byte());
            }
        }
    }
}

impl Default for StatsBuffer {
    fn default() -> Self {
        StatsBuffer::new()
    }
}

impl Target for StatsBuffer {
    fn name(&self) -> &'static str {
        "stats-buffer"
    }

    fn generate(&mut self, rng: &mut Rng, big: bool, out: &mut Vec<u8>) {
        if big {
            Self::structured(rng, true, out);
            return;
        }
        match rng.below(100) {
            0..8 => mutate::random(out, rng, 4096),
            8..50 => {
                Self::structured(rng, false, out);
                if rng.chance(1, 2) {
                    let other = &self.seeds[rng.below(self.seeds.len())];
                    mutate::bytes(out, other, rng, 2 * MAX_STATS_BYTES);
                }
            }
            _ => {
                out.extend_from_slice(rng.pick(&self.seeds).as_slice());
                let other = &self.seeds[rng.below(self.seeds.len())];
                mutate::bytes(out, other, rng, 2 * MAX_STATS_BYTES);
            }
        }
    }

    fn run(&mut self, input: &[u8]) -> Verdict {
        if input.len() > MAX_STATS_BYTES {
            return Verdict::Rejected;
        }
        let mut values: BTreeMap<u16, u64> = BTreeMap::new();
        values.extend(stats_entries(input));
        debug_assert!(values.keys().all(|t| known_tag(*t)));
        let named: BTreeMap<String, u64> =
            values.iter().map(|(t, v)| (stat_name(*t), *v)).collect();
        std::hint::black_box(guest_accesses(Some(&named)));
        Verdict::Accepted
    }
}

/// tierd's config file: read as UTF-8 (as `Config::load` does), parsed,
/// validated. `pmu_events` files are read by validation: a case naming a
/// path that exists and is not a directory is parsed but not validated
/// (a fuzz case must not read /dev/zero); counted in `unvalidated`.
#[derive(Debug)]
pub struct ConfigFile {
    corpus: Corpus,
    unvalidated: u64,
}

const FULL_CONFIG: &str = r#"socket = "/run/tierd/tierd.sock"
socket_mode = "0660"
socket_group = "root"
interval_ms = 1000
passes_per_interval = 5
backend = "auto"
ept_sample_stride = 1
damon_sample_ms = 100
pmu = "auto"
pmu_events = ["/nonexistent/tierd-fuzz/events.toml"]
discover = true
demo_vm = false
demo_slow_kind = "cxl"
log_format = "text"

[tier_kinds]
slow = "cxl"
dram = "dram"

[metrics]
listen = "127.0.0.1:9464"

[tcp]
listen = "[::1]:50051"
cert = "/etc/tierd/cert.pem"
key = "/etc/tierd/key.pem"

[controller]
enabled = true
act_on = "interval"

[discovery]
ch_api_dir = "/run/cloud-hypervisor"
ch_cmdline = true
ch_timeout_ms = 2000
"#;

impl ConfigFile {
    pub fn new() -> ConfigFile {
        ConfigFile {
            corpus: Corpus {
                trees: Vec::new(),
                seeds: vec![
                FULL_CONFIG.as_bytes().to_vec(),
                b"".to_vec(),
                b"interval_ms = 500\nbackend = \"hostpte\"\n[metrics]\nlisten = \"\"\n".to_vec(),
                b"passes_per_interval = 64\ninterval_ms = 10\n[controller]\nact_on = \"protective\"\n"
                    .to_vec(),
                ],
            },
            unvalidated: 0,
        }
    }
}

impl Default for ConfigFile {
    fn default() -> Self {
        ConfigFile::new()
    }
}

impl Target for ConfigFile {
    fn name(&self) -> &'static str {
        "config"
    }

    fn generate(&mut self, rng: &mut Rng, big: bool, out: &mut Vec<u8>) {
        let c = &self.corpus;
        c.generate(rng, big, out, &mut |rng, big, out| {
            out.extend_from_slice(rng.pick(&c.seeds).as_slice());
            let n = if big { 1 } else { 1 + rng.below(3) };
            for _ in 0..n {
                mutate::toml_lines(out, rng, big);
            }
        });
    }

    fn run(&mut self, input: &[u8]) -> Verdict {
        let Ok(text) = std::str::from_utf8(input) else {
            return Verdict::Rejected;
        };
        let Ok(config) = Config::parse(text, "fuzz.toml") else {
            return Verdict::Rejected;
        };
        let unsafe_path = config
            .pmu_events
            .iter()
            .any(|p| std::fs::symlink_metadata(p).is_ok_and(|m| !m.is_dir()));
        if unsafe_path {
            self.unvalidated += 1;
            return Verdict::Accepted;
        }
        match config.validate() {
            Ok(settings) => {
                std::hint::black_box(settings);
                Verdict::Accepted
            }
            Err(e) => {
                std::hint::black_box(e.to_string());
                Verdict::Rejected
            }
        }
    }

    fn notes(&self) -> String {
        format!(
            "{} parsed but not validated (pmu_events names an existing file)",
            self.unvalidated
        )
    }
}
