//! `tier-balloon`: the per-tier virtio balloon (vmm-patch/SPEC.md) as a
//! vhost-user backend process, with a control socket for targets.
//!
//! ```text
//! tier-balloon --socket /run/tier-balloon/vm1.sock \
//!     --control /run/tier-balloon/vm1.ctl \
//!     --tier name=dram,ranges=0x0-0x10000000,node=0 \
//!     --tier name=slow,ranges=0x10000000-0x20000000,node=1
//! ```

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use tier_balloon::device::{Balloon, DeviceOptions};
use tier_balloon::spec::{self, TierSpec};
use tier_balloon::{control, server};

/// Per-tier virtio balloon vhost-user backend (vmm-patch/SPEC.md).
#[derive(Debug, Parser)]
#[command(name = "tier-balloon", version, about)]
struct Args {
    /// vhost-user socket the VMM connects to (created, mode 0600).
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,

    /// Control socket (newline-delimited JSON: targets and state; created,
    /// mode 0600).
    #[arg(long, value_name = "PATH")]
    control: PathBuf,

    /// A tier, in SPEC order (tier 0 first): `name=NAME,ranges=R[:R...][,node=N]`
    /// with each range `START-END` (end exclusive) or `START+SIZE`, decimal
    /// or 0x hex, optional K/M/G/T suffix; 4 KiB aligned. The ranges are the
    /// zone's guest RAM (`vm.info memory_zones[].ranges`). 1 to 8 tiers.
    #[arg(long = "tier", value_name = "SPEC", required = true, value_parser = parse_tier)]
    tiers: Vec<TierSpec>,

    /// Offer VIRTIO_BALLOON_F_DEFLATE_ON_OOM.
    #[arg(long)]
    deflate_on_oom: bool,

    /// How long the device holds the guest's stats buffer before asking for
    /// new stats (SPEC section 4: 1000).
    #[arg(long, value_name = "MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    stats_interval_ms: u64,
}

fn parse_tier(s: &str) -> Result<TierSpec, String> {
    spec::parse_tier(s).map_err(|e| e.to_string())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TIER_BALLOON_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    spec::validate(&args.tiers).context("invalid --tier set")?;
    if args.socket == args.control {
        anyhow::bail!("--socket and --control must be different paths");
    }
    let device = Balloon::new(
        args.tiers.clone(),
        DeviceOptions {
            deflate_on_oom: args.deflate_on_oom,
            stats_interval: Duration::from_millis(args.stats_interval_ms),
        },
    )
    .context("building the device")?;
    let ctl = server::bind_socket(&args.control).context("control socket")?;
    let vu = match server::bind_socket(&args.socket) {
        Ok(l) => l,
        Err(e) => {
            let _ = std::fs::remove_file(&args.control);
            return Err(e).context("vhost-user socket");
        }
    };
    for (i, t) in args.tiers.iter().enumerate() {
        tracing::info!(
            tier = i,
            name = %t.name,
            bytes = t.zone_bytes(),
            ranges = ?t.ranges.iter().map(|r| format!("{:#x}-{:#x}", r.start, r.end())).collect::<Vec<_>>(),
            "tier"
        );
    }
    tracing::info!(socket = %args.socket.display(), control = %args.control.display(), "serving");
    control::spawn(device.clone(), ctl).context("control thread")?;
    server::serve(&device, &vu).context("vhost-user socket")?;
    Ok(())
}
