//! tierd's config file.

use tier_profiler::config::Config;

use super::Corpus;
use crate::fuzz::mutate;
use crate::fuzz::{Rng, Target, Verdict};

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

[sampler]
cpu_budget_pct = 1.0
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
