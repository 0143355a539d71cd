//! `cargo xtask soak`: builds tierd, tier-balloon and tier-soak in release
//! (and the patched cloud-hypervisor from a checkout, if given one) and
//! runs the chaos soak (docs/soak.md).

use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::{deps, run, vmm_patch};

/// Chaos soak of the closed loop (tier-soak): faults from a seeded
/// schedule, invariants checked from outside, a table and a RESULT line.
#[derive(Debug, PartialEq, clap::Args)]
pub struct Args {
    /// A patched cloud-hypervisor binary (`cargo xtask vmm-patch build`).
    #[arg(long, env = "TIERD_CH_BIN", conflicts_with = "ch_src")]
    pub ch_bin: Option<PathBuf>,
    /// Or a v53.0 checkout with the series applied, built first.
    #[arg(long)]
    pub ch_src: Option<PathBuf>,
    /// micro_http checkout at 5c2254d6 (default: beside --ch-src, `micro-http`).
    #[arg(long)]
    pub micro_http: Option<PathBuf>,
    #[arg(long, default_value_t = 10.0)]
    pub minutes: f64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Only these faults (tier-soak --help lists them).
    #[arg(long)]
    pub faults: Option<String>,
    /// Keep sockets, logs and the policy file here.
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
}

pub fn run(o: Args) -> anyhow::Result<()> {
    let ch = match (&o.ch_bin, &o.ch_src) {
        (Some(bin), _) => bin.clone(),
        (None, Some(src)) => {
            deps::ensure(false)?;
            vmm_patch::build_checkout(src, o.micro_http.clone(), None)?.join("cloud-hypervisor")
        }
        (None, None) => bail!(
            "soak needs the patched cloud-hypervisor: --ch-bin PATH (or TIERD_CH_BIN), or \
             --ch-src DIR with our series applied (cargo xtask vmm-patch apply --ch-src DIR)"
        ),
    };
    if !ch.is_file() {
        bail!("{}: no such file", ch.display());
    }
    run::step(
        "soak",
        "building tierd, tier-balloon and tier-soak (release)",
    );
    run::cargo(&[
        "build",
        "--release",
        "-p",
        "tier-profiler",
        "--bin",
        "tierd",
        "-p",
        "tier-balloon",
        "--bin",
        "tier-balloon",
        "-p",
        "tier-e2e",
        "--bin",
        "tier-soak",
    ])?;
    let target = run::target_dir()?.join("release");
    let mut cmd = std::process::Command::new(target.join("tier-soak"));
    cmd.arg("--ch-bin")
        .arg(&ch)
        .arg("--tierd")
        .arg(target.join("tierd"))
        .arg("--balloon")
        .arg(target.join("tier-balloon"))
        .arg("--minutes")
        .arg(o.minutes.to_string())
        .arg("--seed")
        .arg(o.seed.to_string());
    if let Some(f) = &o.faults {
        cmd.arg("--faults").arg(f);
    }
    if let Some(w) = &o.work_dir {
        cmd.arg("--work-dir").arg(w);
    }
    run::step(
        "soak",
        format!("running tier-soak for {} min, seed {}", o.minutes, o.seed),
    );
    run::status(&mut cmd).context("tier-soak")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soak_without_a_vmm_says_what_it_needs() {
        let e = run(Args {
            ch_bin: None,
            ch_src: None,
            micro_http: None,
            minutes: 1.0,
            seed: 1,
            faults: None,
            work_dir: None,
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("--ch-bin") && e.contains("vmm-patch apply"),
            "{e}"
        );
    }
}
