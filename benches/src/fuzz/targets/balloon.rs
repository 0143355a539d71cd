//! The `tier-balloon` backend's inputs: control-socket request lines and
//! stats-queue buffers.

use std::collections::BTreeMap;

use tier_balloon::device::{MAX_STATS_BYTES, known_tag, stat_name, stats_entries};
use tier_balloon::{Balloon, DeviceOptions, spec::parse_tier};
use tier_profiler::ch::handle::guest_accesses;

use super::Corpus;
use crate::fuzz::mutate;
use crate::fuzz::{Rng, Target, Verdict};

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
