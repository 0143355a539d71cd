//! `cargo xtask uml`: a real Linux guest (Debian's user-mode-linux, Linux
//! 6.1 as a process) with Linux's own virtio_balloon against tier-balloon.
//! Inflates, deflates, and shows what the guest and the host saw.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;
use tier_uml::{Options, Uml};

use crate::{deps, run};

const MIB: u64 = 1 << 20;

/// Boot a real Linux guest (Debian's user-mode-linux) with its stock
/// virtio_balloon against tier-balloon; inflate and deflate it.
#[derive(Debug, PartialEq, clap::Args)]
pub struct Args {
    /// Balloon size to inflate, MiB.
    #[arg(long, default_value_t = 32)]
    pub target_mib: u64,
}

pub fn run(Args { target_mib }: Args) -> anyhow::Result<()> {
    deps::ensure(false)?;
    if let Some(why) = tier_uml::missing() {
        bail!("cannot boot the Linux guest: {why}");
    }
    run::step("uml", "building tier-balloon");
    run::cargo(&["build", "-p", "tier-balloon"])?;
    let backend = run::target_dir()?.join("debug/tier-balloon");
    let mut opts = Options::new(&backend);
    opts.deflate_on_oom = false;
    if target_mib == 0 || target_mib >= opts.mem_mib / 2 {
        bail!(
            "--target-mib {target_mib}: give 1 to {} (half of the guest's {} MiB)",
            opts.mem_mib / 2 - 1,
            opts.mem_mib
        );
    }
    run::step(
        "uml",
        format!(
            "booting {} ({} MiB, stock virtio_balloon) against {}",
            tier_uml::LINUX_UML,
            opts.mem_mib,
            backend.display()
        ),
    );
    let booted = Instant::now();
    let mut uml = Uml::start(&opts).context("booting the guest")?;
    let boot_s = booted.elapsed().as_secs_f64();
    let wait = Duration::from_secs(30);
    let kernel = uml.sh("uname -r", wait)?.trim().to_string();
    let mem_total = |uml: &mut Uml| -> anyhow::Result<u64> {
        let out = uml.sh("grep MemTotal /proc/meminfo", wait)?;
        out.split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .context("MemTotal")
    };
    // Pages the balloon takes should be resident first, to see them leave.
    uml.sh(
        "mount -t tmpfs -o size=100M none /mnt && dd if=/dev/zero of=/mnt/f bs=1M count=64 \
         2>/dev/null; rm -f /mnt/f",
        wait,
    )?;
    let (host0, guest0) = (uml.host_bytes()?, mem_total(&mut uml)?);
    println!("guest Linux {kernel}, booted in {boot_s:.1} s");
    println!(
        "{:<10} {:>12} {:>16} {:>14} {:>10}",
        "step", "balloon MiB", "guest MemTotal", "host MiB held", "seconds"
    );
    let row = |step: &str, actual: u64, guest: u64, host: u64, s: f64| {
        println!(
            "{step:<10} {:>12.1} {:>13} kB {:>14.1} {s:>10.2}",
            actual as f64 / MIB as f64,
            guest,
            host as f64 / MIB as f64
        );
    };
    row("start", 0, guest0, host0, 0.0);
    let mut steps = Vec::new();
    for (step, bytes) in [("inflate", target_mib * MIB), ("deflate", 0)] {
        let t = Instant::now();
        uml.control(&json!({"op": "set_targets", "legacy": bytes}))?;
        let st = uml.wait_state(step, wait, |s| s["legacy_actual"].as_u64() == Some(bytes))?;
        let secs = t.elapsed().as_secs_f64();
        let (host, guest) = (uml.host_bytes()?, mem_total(&mut uml)?);
        row(step, bytes, guest, host, secs);
        steps.push((st, host, guest, secs));
    }
    let st = uml.state()?;
    let (inflated, deflated) = (
        st["legacy"]["inflated_pfns"].as_u64().unwrap_or(0),
        st["legacy"]["deflated_pfns"].as_u64().unwrap_or(0),
    );
    let stats = st["stats"]["updates"].as_u64().unwrap_or(0);
    let host_freed = host0.saturating_sub(steps[0].1);
    println!(
        "{inflated} PFNs inflated, {deflated} deflated, {} rejected; {stats} stats updates from the guest",
        st["legacy"]["rejected_pfns"]
    );
    println!(
        "RESULT kernel={kernel} boot_s={boot_s:.2} target_mib={target_mib} inflate_s={:.2} deflate_s={:.2} \
         guest_memtotal_drop_kib={} host_freed_mib={:.1} stats_updates={stats}",
        steps[0].3,
        steps[1].3,
        guest0.saturating_sub(steps[0].2),
        host_freed as f64 / MIB as f64
    );
    Ok(())
}
