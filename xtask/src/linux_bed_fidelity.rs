//! What `cargo xtask bench fidelity -- --source linux` hands the bench:
//! Debian's kernels, the truth plugin and the guest's skewed key-value
//! program (vmm-patch/harness/linux-bed/guest/kv_zipf.c), as environment
//! variables; each one already set in the environment is kept.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use crate::run;

const KV_SOURCE: &str = "vmm-patch/harness/linux-bed/guest/kv_zipf.c";

/// Whether the bench's arguments ask for the Linux source.
pub fn wanted(args: &[String]) -> bool {
    args.windows(2)
        .any(|w| w[0] == "--source" && w[1] == "linux")
}

/// TIERD_BED_KERNELS, TIERD_TRUTH_PLUGIN, TIERD_BED_KV.
pub fn env() -> anyhow::Result<Vec<(String, String)>> {
    let cache = run::target_dir()?.join("linux-bed");
    let mut out = Vec::new();
    let set = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let kernels = match set("TIERD_BED_KERNELS") {
        Some(v) => v,
        None => crate::linux_bed::kernels_env(&crate::linux_bed::kernels(false)?),
    };
    out.push(("TIERD_BED_KERNELS".into(), kernels));
    let plugin = match set("TIERD_TRUTH_PLUGIN") {
        Some(v) => v,
        None => crate::linux_bed_plugin::build(&cache)?
            .display()
            .to_string(),
    };
    out.push(("TIERD_TRUTH_PLUGIN".into(), plugin));
    let kv = match set("TIERD_BED_KV") {
        Some(v) => v,
        None => kv(&cache)?.display().to_string(),
    };
    out.push(("TIERD_BED_KV".into(), kv));
    Ok(out)
}

/// kv_zipf, static (the guest has no libm of its own), -O2 (TCG runs
/// every instruction through the plugin).
fn kv(cache: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    let out = cache.join("kv_zipf");
    run::status(
        Command::new("gcc")
            .args(["-O2", "-static", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&out)
            .arg(run::workspace_root()?.join(KV_SOURCE))
            .arg("-lm"),
    )
    .context("gcc -static (apt-get install gcc)")?;
    Ok(out)
}
