//! `cargo xtask e2e`: the closed loop, tierd and the controller driving
//! two guests, against a patched cloud-hypervisor or on the Linux bed's
//! QEMU (docs/e2e.md).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::{deps, linux_bed, linux_bed_plugin, run, vmm_patch};

/// Closed loop against a patched cloud-hypervisor (needs a v53.0 checkout).
#[derive(Debug, PartialEq, clap::Args)]
pub struct Args {
    /// cloud-hypervisor v53.0 source checkout with the series applied
    /// (`cargo xtask vmm-patch apply`).
    #[arg(long)]
    pub ch_src: Option<PathBuf>,
    /// micro_http checkout at 5c2254d6 (default: beside --ch-src, `micro-http`).
    #[arg(long)]
    pub micro_http: Option<PathBuf>,
    /// Target dir for the cloud-hypervisor build (default: its own `target/`).
    #[arg(long)]
    pub ch_target_dir: Option<PathBuf>,
    /// Keep the run's sockets, serial logs and tierd log here.
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// What the controller drives: `balloon` (the per-tier balloon) or
    /// `resize-zone` (the dram zone's virtio-mem part, docs/virtio-mem.md).
    #[arg(long, default_value = "balloon")]
    pub actuator: String,
    /// A cloud-hypervisor binary to run instead of building --ch-src
    /// (e.g. a clean upstream v53.0 build, with --upstream).
    #[arg(long)]
    pub ch_bin: Option<PathBuf>,
    /// The binary has none of our series (upstream v53.0).
    #[arg(long)]
    pub upstream: bool,
    /// Controller mode of the run: `ratio` (default) or `working-set`
    /// (needs tierd to fill the per-tier ages; docs/e2e.md).
    #[arg(long)]
    pub mode: Option<String>,
    /// Who shares the DRAM budget: `swap` (default: a and b trade
    /// needs) or `three` (one goes idle, one grows, one shrinks).
    #[arg(long)]
    pub guests: Option<String>,
    /// The VMM: `cloud-hypervisor` (default; the options above) or
    /// `qemu` (two Debian guests on the Linux bed, judged by the truth
    /// plugin; needs no checkout; docs/e2e.md).
    #[arg(long, default_value = "cloud-hypervisor", value_parser = ["cloud-hypervisor", "qemu"])]
    pub vmm: String,
}

/// One run, its tier-e2e (or tier-e2e-qemu) output passed through.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut passthrough = |cmd: &mut std::process::Command| run::status(cmd).map(|()| true);
    if args.vmm == "qemu" {
        if !run_qemu(args.mode.as_deref(), args.work_dir, &mut passthrough)? {
            bail!("tier-e2e-qemu failed");
        }
        return Ok(());
    }
    let opts = E2eRun {
        actuator: args.actuator,
        ch_bin: args.ch_bin,
        upstream: args.upstream,
        mode: args.mode,
        guests: args.guests,
    };
    run_ch(
        args.ch_src,
        args.micro_http,
        args.ch_target_dir,
        args.work_dir,
        &opts,
        &mut passthrough,
    )
    .map(|_| ())
}

/// What `e2e` passes on to tier-e2e.
#[derive(Debug, Clone, Default)]
pub struct E2eRun {
    pub actuator: String,
    pub ch_bin: Option<PathBuf>,
    pub upstream: bool,
    /// Controller mode (`ratio`, `working-set`); None: tier-e2e's default.
    pub mode: Option<String>,
    /// `swap` or `three`; None: tier-e2e's default.
    pub guests: Option<String>,
}

/// The closed loop against a patched cloud-hypervisor, tier-e2e run by
/// `runner` (Ok(false): it failed), so that `cargo xtask test` can keep
/// going and collect its RESULT lines.
pub fn run_ch(
    ch_src: Option<PathBuf>,
    micro_http: Option<PathBuf>,
    ch_target_dir: Option<PathBuf>,
    work_dir: Option<PathBuf>,
    opts: &E2eRun,
    runner: &mut dyn FnMut(&mut std::process::Command) -> anyhow::Result<bool>,
) -> anyhow::Result<bool> {
    let ch_bin = match (&opts.ch_bin, ch_src) {
        (Some(bin), _) => {
            if !bin.is_file() {
                bail!("--ch-bin {}: no such file", bin.display());
            }
            deps::ensure(false)?;
            bin.clone()
        }
        (None, src) => build_ch(src, micro_http, ch_target_dir)?,
    };
    build_release(&["tierd", "tier-e2e"])?;
    let target = run::target_dir()?.join("release");
    let mut cmd = std::process::Command::new(target.join("tier-e2e"));
    cmd.arg("--ch-bin")
        .arg(ch_bin)
        .arg("--tierd")
        .arg(target.join("tierd"))
        .arg("--actuator")
        .arg(if opts.actuator.is_empty() {
            "balloon"
        } else {
            &opts.actuator
        });
    if opts.upstream {
        cmd.arg("--upstream");
    }
    if let Some(m) = &opts.mode {
        cmd.arg("--mode").arg(m);
    }
    if let Some(g) = &opts.guests {
        cmd.arg("--guests").arg(g);
    }
    if let Some(w) = work_dir {
        cmd.arg("--work-dir").arg(w);
    }
    run::step(
        "e2e",
        "running tier-e2e (two guests, tierd, the controller)",
    );
    runner(&mut cmd)
}

/// tierd and `bins` of tier-e2e (tier-e2e, tier-e2e-qemu) in release, as
/// the e2e runs use them.
pub fn build_release(bins: &[&str]) -> anyhow::Result<()> {
    run::step("e2e", format!("building {} (release)", bins.join(" and ")));
    let mut args = vec![
        "build",
        "--release",
        "-p",
        "tier-profiler",
        "-p",
        "tier-e2e",
    ];
    // `--bin` selects among all the packages named: name each.
    for bin in bins {
        args.extend(["--bin", bin]);
    }
    run::cargo(&args)
}

/// The patched cloud-hypervisor built from `ch_src`; the path of its binary.
fn build_ch(
    ch_src: Option<PathBuf>,
    micro_http: Option<PathBuf>,
    ch_target_dir: Option<PathBuf>,
) -> anyhow::Result<PathBuf> {
    let Some(dir) = ch_src else {
        bail!(
            "e2e needs a cloud-hypervisor v53.0 checkout (commit 9ed824d6) with our series applied \
             and micro_http at 5c2254d6 beside it:\n  \
             git clone https://github.com/cloud-hypervisor/cloud-hypervisor DIR && git -C DIR checkout v53.0\n  \
             cargo xtask vmm-patch apply --ch-src DIR\n  \
             cargo xtask e2e --ch-src DIR"
        );
    };
    if !dir.join("vmm").is_dir() || !dir.join("virtio-devices").is_dir() {
        bail!(
            "{} does not look like a cloud-hypervisor checkout (no vmm/ or virtio-devices/)",
            dir.display()
        );
    }
    deps::ensure(false)?;
    let release = vmm_patch::build_checkout(&dir, micro_http, ch_target_dir)?;
    Ok(release.join("cloud-hypervisor"))
}

/// The closed loop on the bed (`cargo xtask e2e --vmm qemu`): release
/// tierd and tier-e2e-qemu, the guest's agent, the truth plugin, 6.12.
/// `runner` runs tier-e2e-qemu (Ok(false): it failed).
pub fn run_qemu(
    mode: Option<&str>,
    work_dir: Option<PathBuf>,
    runner: &mut dyn FnMut(&mut std::process::Command) -> anyhow::Result<bool>,
) -> anyhow::Result<bool> {
    deps::ensure(false)?;
    if let Some(why) = tier_linux_bed::missing() {
        bail!("cannot run the Linux bed: {why}");
    }
    let kernel = linux_bed::kernels(false)?
        .into_iter()
        .find(|k| k.series() == "6.12")
        .context("no 6.12 cloud kernel known to apt")?;
    let root = kernel
        .vmlinuz
        .parent()
        .and_then(Path::parent)
        .context("the kernel's root")?
        .to_path_buf();
    let programs = linux_bed::guest_programs()?;
    let target = run::target_dir()?;
    let plugin = linux_bed_plugin::build(&target.join("linux-bed"))?;
    build_release(&["tierd", "tier-e2e-qemu"])?;
    let release = target.join("release");
    let mut cmd = std::process::Command::new(release.join("tier-e2e-qemu"));
    cmd.arg("--tierd")
        .arg(release.join("tierd"))
        .arg("--agent")
        .arg(&programs[1])
        .arg("--plugin")
        .arg(plugin)
        .arg("--kernel")
        .arg(root);
    if let Some(m) = mode {
        cmd.arg("--mode").arg(m);
    }
    if let Some(w) = work_dir {
        cmd.arg("--work-dir").arg(w);
    }
    run::step(
        "e2e",
        "running tier-e2e-qemu (two Linux guests under QEMU, tierd, the controller)",
    );
    runner(&mut cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn without_vmm(ch_src: Option<PathBuf>) -> String {
        let none = E2eRun::default();
        run_ch(ch_src, None, None, None, &none, &mut |_| Ok(true))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn e2e_without_checkout_says_what_it_needs() {
        let err = without_vmm(None);
        assert!(err.contains("--ch-src") && err.contains("v53.0"), "{err}");
        let err = without_vmm(Some(std::env::temp_dir()));
        assert!(
            err.contains("does not look like a cloud-hypervisor checkout"),
            "{err}"
        );
    }
}
