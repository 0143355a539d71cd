//! `cargo xtask bench NAME [ARGS]`: one benchmark of the tier-benches
//! crate, built in release beside tierd.

use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::{linux_bed, linux_bed_fidelity, run};

/// Run one benchmark from benches/ (prints a table and a RESULT line).
#[derive(Debug, PartialEq, clap::Args)]
pub struct Args {
    /// Benchmark name; `list` shows them.
    pub name: String,
    /// Passed to the bench binary, with or without `--` before them
    /// (e.g. `fidelity --source linux`, `tierd-scale -- --against
    /// OLD_TIERD`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
}

/// Benchmarks are binaries of the tier-benches crate, built in release.
const BENCHES: &[(&str, &str)] = &[
    (
        "demo-vm",
        "guest speed of the demo VM on this KVM vs the exit+entry cost",
    ),
    (
        "tierd-scale",
        "tierd CPU with 1000 synthetic VMs x 4 tiers streamed to 10 watchers",
    ),
    (
        "bpf-cost",
        "ns per event of the EPT sampler's BPF programs vs an empty raw_tp program",
    ),
    ("controller", "policy on simulated 8/64/1000-VM fleets"),
    (
        "sampler-scale",
        "sampler CPU per interval and RSS against guest size (0.25-8 GiB), hostpte and EPT user space, budget on/off",
    ),
    (
        "tierctl-render",
        "tierctl top frame time for 1000 VMs on a TestBackend",
    ),
    (
        "balloon",
        "tier-balloon inflate GiB/s (coalesced runs) vs per-page punch+madvise and one call",
    ),
    (
        "fidelity",
        "DRAM-hit ratio of each source (guest-reported, host backends) vs the guest's exact counts: error, lag, CSV + SVG",
    ),
    (
        "refit",
        "re-fits a recorded fidelity run's per-pass counts with this build's estimate (CSV arg), no VM",
    ),
    (
        "schedule",
        "pass schedules on simulated accessed bits: interval coverage, width, point error, walks; no VM",
    ),
    (
        "overhead",
        "guest throughput with vs without each sampler, BPF run time per program, hostpte CPU per GiB",
    ),
    (
        "twin",
        "trace-driven twin of EPT ageing, hostpte and PMU at real access rates through tierd's estimator and controller: errors, coverage, hot set, cost per GiB, fleets",
    ),
    (
        "value",
        "modelled guest slowdown vs slow-tier share under all-DRAM, static, guest tiering, tierd (ratio, working_set) and an oracle, on the Linux bed; --source ch: 3 test guests under the patched cloud-hypervisor; --fleet: 1000 simulated VMs per backend",
    ),
    (
        "fuzz",
        "10^6 seeded cases per untrusted-input parser (vm.info, vm.counters, control lines, stats buffers, config): panics, RSS",
    ),
];

/// Builds tierd and the bench in release and runs it (`list`: the names).
pub fn run(args: Args) -> anyhow::Result<()> {
    let Args { name, args } = &args;
    let name = name.as_str();
    let known: Vec<&str> = BENCHES.iter().map(|(n, _)| *n).collect();
    if name == "list" {
        for (n, what) in BENCHES {
            println!("{n:16} {what}");
        }
        return Ok(());
    }
    if !known.contains(&name) {
        bail!(
            "no bench named {name:?}; available: {}",
            if known.is_empty() {
                "none yet".to_string()
            } else {
                known.join(", ")
            }
        );
    }
    // Benches may start tierd itself: build it in release beside them.
    run::step("bench", "building tierd (release)");
    run::cargo(&["build", "--release", "-p", "tier-profiler"])?;
    // The Linux source needs the bed's kernels, plugin and guest programs.
    let env = if name == "fidelity" && linux_bed_fidelity::wanted(args) {
        run::step(
            "bench",
            "preparing the Linux bed (kernels, truth plugin, kv_zipf)",
        );
        linux_bed_fidelity::env()?
    } else if name == "value" && value_source_ch(args) {
        run::step("bench", "the patched cloud-hypervisor for the test guests");
        value_ch_env()?
    } else if name == "value" && !args.iter().any(|a| a == "--fleet" || a == "--from-csv") {
        run::step(
            "bench",
            "preparing the Linux bed (kernels, truth plugin, agent, tierd)",
        );
        value_env()?
    } else {
        Vec::new()
    };
    run::step("bench", format!("building and running {name} (release)"));
    let mut cmd = vec![
        "run",
        "--release",
        "-p",
        "tier-benches",
        "--bin",
        name,
        "--",
    ];
    cmd.extend(args.iter().map(String::as_str));
    run::cargo_env(&cmd, &env)
}

/// `value -- --source ch` that boots guests (not a re-costing).
fn value_source_ch(args: &[String]) -> bool {
    args.windows(2).any(|w| w[0] == "--source" && w[1] == "ch")
        && !args.iter().any(|a| a == "--fleet" || a == "--from-csv")
}

/// The value bench's cloud-hypervisor source: `TIERD_CH_BIN` as given,
/// else the patched VMM built from the vendored tarballs into the cache
/// (docs/ci.md), as `cargo xtask test` finds it.
fn value_ch_env() -> anyhow::Result<Vec<(String, String)>> {
    if let Some(bin) = std::env::var_os("TIERD_CH_BIN").filter(|v| !v.is_empty()) {
        return Ok(vec![(
            "TIERD_CH_BIN".into(),
            PathBuf::from(bin).display().to_string(),
        )]);
    }
    let vendor = crate::ci::vendor_dir()?;
    let (ch, mh) = crate::ci::tarballs(&vendor).map_err(|why| {
        anyhow::anyhow!("no patched cloud-hypervisor: {why}; or set TIERD_CH_BIN")
    })?;
    let vmm = crate::ci::build_vendored(&ch, &mh).context("the patched cloud-hypervisor")?;
    Ok(vec![("TIERD_CH_BIN".into(), vmm.bin.display().to_string())])
}

/// The bed's environment for the value bench; a variable already set is
/// kept (a prepared bed elsewhere).
fn value_env() -> anyhow::Result<Vec<(String, String)>> {
    let keys = [
        "TIERD_BED_KERNELS",
        "TIERD_BED_TIERD",
        "TIERD_BED_AGENT",
        "TIERD_TRUTH_PLUGIN",
    ];
    let set: Vec<(String, String)> = keys
        .iter()
        .filter_map(|k| {
            Some((
                k.to_string(),
                std::env::var(k).ok().filter(|v| !v.is_empty())?,
            ))
        })
        .collect();
    if set.len() == keys.len() {
        return Ok(set);
    }
    let env = match linux_bed::test_env()? {
        Ok(env) => env,
        Err(why) => bail!("cannot run the Linux bed: {why}"),
    };
    // The workload's instructions per miss enter the cost model: the
    // guest runs an optimised agent, not the tests' debug build.
    let agent = release_agent()?.display().to_string();
    Ok(env
        .into_iter()
        .map(|(k, v)| {
            let kept = set.iter().find(|s| s.0 == k).map(|s| s.1.clone());
            let v = if k == "TIERD_BED_AGENT" {
                agent.clone()
            } else {
                v
            };
            (k, kept.unwrap_or(v))
        })
        .collect())
}

/// tier-bed-agent in release, stripped, under its own name for the guest.
fn release_agent() -> anyhow::Result<PathBuf> {
    run::cargo(&[
        "build",
        "--release",
        "-p",
        "tier-bed-agent",
        "--bin",
        "tier-bed-agent",
    ])?;
    let target = run::target_dir()?;
    let dir = target.join("linux-bed").join("release");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let out = dir.join("tier-bed-agent");
    run::status(
        std::process::Command::new("objcopy")
            .arg("--strip-debug")
            .arg(target.join("release").join("tier-bed-agent"))
            .arg(&out),
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_bench_lists_the_known_ones() {
        let err = run(Args {
            name: "no-such-bench".into(),
            args: Vec::new(),
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("no bench named \"no-such-bench\""), "{err}");
    }

    #[test]
    fn value_boots_test_guests_only_for_source_ch() {
        let v = |a: &[&str]| value_source_ch(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(v(&["--source", "ch"]));
        assert!(v(&["--", "--source", "ch", "--phase-s", "30"]));
        assert!(!v(&[]));
        assert!(!v(&["--source", "linux"]));
        assert!(!v(&["--source", "ch", "--from-csv", "x.csv"]));
    }
}
