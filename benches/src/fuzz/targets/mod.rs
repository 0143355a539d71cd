//! The parsers fuzzed, each with its corpus of valid inputs and its
//! structure-aware generator. Every `run` calls the crates' own functions,
//! and goes on where tierd goes on with the parsed value.

mod balloon;
mod ch;
mod config;

pub use balloon::{ControlLine, StatsBuffer};
pub use ch::{VmCounters, VmInfo};
pub use config::ConfigFile;

use super::mutate::{self, J};
use super::{Rng, Target};

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
pub(super) struct Corpus {
    pub(super) seeds: Vec<Vec<u8>>,
    pub(super) trees: Vec<J>,
}

impl Corpus {
    pub(super) fn json(seeds: &[&str]) -> Corpus {
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
    pub(super) fn generate(
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
    pub(super) fn tree(&self, rng: &mut Rng, big: bool, out: &mut Vec<u8>) {
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
