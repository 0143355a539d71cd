//! tierctl's command line. It lives in the library so that completions,
//! argument tests and the binary share one definition.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use clap_complete::Shell;

#[derive(Debug, Parser)]
#[command(name = "tierctl", version, about = "Watch and steer tierd")]
pub struct Cli {
    /// tierd endpoint: unix:/path, /path or http(s)://host:port.
    #[arg(long, global = true, env = "TIERD_ENDPOINT", default_value = tier_proto::DEFAULT_SOCKET)]
    pub endpoint: String,
    #[command(subcommand)]
    pub cmd: Cmd,
}

/// Format of `top` in batch mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Output {
    /// Aligned table, one per update.
    #[default]
    Table,
    /// One JSON object per update and line (controller/tierctl/schema/top.schema.json).
    Json,
    /// CSV with a header row, one row per VM tier.
    Csv,
}

/// Format of `vms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum ListOutput {
    #[default]
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Daemon version and what this host can measure.
    Info,
    /// VMs tierd knows, with their tiers.
    Vms {
        #[arg(long, value_enum, default_value_t)]
        output: ListOutput,
    },
    /// One VM's identity and tier map (JSON), by id or name.
    Vm { vm: String },
    /// Live per-VM view (full screen on a terminal), or batch output.
    Top(TopArgs),
    /// The controller's policy.
    Policy {
        #[command(subcommand)]
        cmd: PolicyCmd,
    },
    /// Per-tier balloons.
    Balloon {
        #[command(subcommand)]
        cmd: BalloonCmd,
    },
    /// Print a shell completion script, e.g. `tierctl completions bash > /etc/bash_completion.d/tierctl`.
    Completions { shell: Shell },
    /// Print the man page, roff (`cargo xtask package` ships it).
    #[command(hide = true)]
    Man,
}

#[derive(Debug, Clone, Args)]
pub struct TopArgs {
    /// Print one update and exit (batch mode).
    #[arg(long, conflicts_with = "iterations")]
    pub once: bool,
    /// Print N updates and exit (batch mode); 0 streams until interrupted.
    #[arg(short = 'n', long = "iterations")]
    pub iterations: Option<u64>,
    /// Output format; anything but `table` means batch mode.
    #[arg(long, value_enum, default_value_t)]
    pub output: Output,
}

impl TopArgs {
    /// Whether to run the full-screen view, given whether stdout is a terminal.
    pub fn interactive(&self, stdout_is_terminal: bool) -> bool {
        stdout_is_terminal
            && !self.once
            && self.iterations.is_none()
            && self.output == Output::Table
    }

    /// Updates to print in batch mode; `None` streams until interrupted.
    pub fn batch_limit(&self) -> Option<u64> {
        match (self.once, self.iterations) {
            (_, Some(0)) => None,
            (_, Some(n)) => Some(n),
            _ => Some(1),
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum PolicyCmd {
    /// Print the policy in force (JSON).
    Get,
    /// Replace the policy through tierd, which validates it; prints the policy now in force.
    Set(PolicySetArgs),
}

/// Keys left out of the file and flags keep their value in force.
#[derive(Debug, Clone, Default, Args)]
#[group(required = true, multiple = true)]
pub struct PolicySetArgs {
    /// JSON file in the shape `policy get` prints ("-" for stdin); flags apply on top.
    #[arg(long, short = 'f')]
    pub file: Option<PathBuf>,
    /// Whether the controller acts at all.
    #[arg(long)]
    pub enabled: Option<bool>,
    /// Decide and report, but never change a balloon.
    #[arg(long)]
    pub dry_run: Option<bool>,
    /// Default target DRAM-hit ratio, in [0, 1].
    #[arg(long)]
    pub default_target: Option<f64>,
    /// No action while |ratio - target| <= epsilon, in [0, 0.5].
    #[arg(long)]
    pub epsilon: Option<f64>,
    /// DRAM the controller may hand out in total (e.g. 64G); 0 = sum of DRAM tiers.
    #[arg(long, value_parser = parse_size)]
    pub budget: Option<u64>,
    /// Largest balloon change per VM per interval (e.g. 64M).
    #[arg(long, value_parser = parse_size)]
    pub max_step: Option<u64>,
    /// Intervals a VM is left alone after a change.
    #[arg(long)]
    pub cooldown: Option<u32>,
    /// Share of a tier found idle above which idle memory is reclaimed first.
    #[arg(long)]
    pub idle_threshold: Option<f64>,
    /// What the controller keeps each VM at: `ratio` (DRAM-hit ratio at
    /// its target) or `working-set` (hot working set in DRAM).
    #[arg(long, value_enum)]
    pub mode: Option<ModeArg>,
    /// working_set mode: the horizon, seconds, whose working set counts as
    /// hot; 0: the shortest.
    #[arg(long)]
    pub hot_horizon: Option<f64>,
    /// working_set mode: most slow-tier promotion per minute, as a share of
    /// the working set within the longest horizon (e.g. 0.002); 0: no limit.
    #[arg(long)]
    pub promotion_slo: Option<f64>,
    /// When DRAM a VM does not need is taken back: `on-demand` (only for a
    /// VM short of DRAM) or `eager` (as soon as found; tierd's default).
    #[arg(long, value_enum)]
    pub reclaim: Option<ReclaimArg>,
}

/// `--reclaim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReclaimArg {
    OnDemand,
    Eager,
}

impl From<ReclaimArg> for tier_proto::v1::ReclaimMode {
    fn from(r: ReclaimArg) -> Self {
        match r {
            ReclaimArg::OnDemand => tier_proto::v1::ReclaimMode::OnDemand,
            ReclaimArg::Eager => tier_proto::v1::ReclaimMode::Eager,
        }
    }
}

/// `--mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    Ratio,
    WorkingSet,
    /// Ratio on a PMU count, else working_set, per VM.
    Auto,
}

impl From<ModeArg> for tier_proto::v1::PolicyMode {
    fn from(m: ModeArg) -> Self {
        match m {
            ModeArg::Ratio => tier_proto::v1::PolicyMode::Ratio,
            ModeArg::WorkingSet => tier_proto::v1::PolicyMode::WorkingSet,
            ModeArg::Auto => tier_proto::v1::PolicyMode::Auto,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum BalloonCmd {
    /// Set per-tier balloon targets of a VM (memory taken from the guest).
    Set {
        /// VM id or name.
        vm: String,
        /// TIER=SIZE, e.g. `--tier dram=512M --tier slow=2G`; repeatable.
        #[arg(long = "tier", value_parser = parse_tier_size, required = true)]
        tiers: Vec<TierSize>,
    },
}

/// One `--tier NAME=SIZE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierSize {
    pub tier: String,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("{0:?}: expected a size like 512M, 2G, 1.5G or 4096")]
    Malformed(String),
    #[error("{0:?}: unknown unit {1:?} (use K, M, G or T, powers of 1024)")]
    Unit(String, String),
    #[error("{0:?} is too large")]
    TooLarge(String),
    #[error("{0:?}: expected TIER=SIZE, e.g. dram=512M")]
    NoTier(String),
    #[error("{0:?}: {1} bytes is not a multiple of 4 KiB (the balloon works in pages)")]
    NotPageMultiple(String, u64),
}

/// Parses `512M`, `2G`, `1.5G`, `64KiB`, `4096`: binary units.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() || num.starts_with('.') || num.ends_with('.') {
        return Err(SizeError::Malformed(s.into()));
    }
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(SizeError::Unit(s.into(), unit.into())),
    };
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(1u64 << shift)
            .ok_or_else(|| SizeError::TooLarge(s.into()));
    }
    let f: f64 = num.parse().map_err(|_| SizeError::Malformed(s.into()))?;
    let bytes = (f * (1u64 << shift) as f64).round();
    if bytes >= u64::MAX as f64 {
        return Err(SizeError::TooLarge(s.into()));
    }
    Ok(bytes as u64)
}

/// Parses `TIER=SIZE` for `balloon set`; sizes are whole pages.
pub fn parse_tier_size(s: &str) -> Result<TierSize, SizeError> {
    let (tier, size) = s
        .split_once('=')
        .filter(|(t, _)| !t.trim().is_empty())
        .ok_or_else(|| SizeError::NoTier(s.into()))?;
    let bytes = parse_size(size)?;
    if !bytes.is_multiple_of(4096) {
        return Err(SizeError::NotPageMultiple(s.into(), bytes));
    }
    Ok(TierSize {
        tier: tier.trim().to_string(),
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("0"), Ok(0));
        assert!(matches!(parse_size("12Q"), Err(SizeError::Unit(..))));
        assert!(matches!(parse_size("M"), Err(SizeError::Malformed(_))));
        assert!(matches!(parse_size("1.2.3G"), Err(SizeError::Malformed(_))));
        assert!(matches!(parse_size("-1G"), Err(SizeError::Malformed(_))));
        assert!(matches!(
            parse_size("99999999T"),
            Err(SizeError::TooLarge(_))
        ));
    }

    #[test]
    fn tier_sizes() {
        assert_eq!(
            parse_tier_size("dram=512M"),
            Ok(TierSize {
                tier: "dram".into(),
                bytes: 512 << 20
            })
        );
        assert!(matches!(parse_tier_size("512M"), Err(SizeError::NoTier(_))));
        assert!(matches!(
            parse_tier_size("=512M"),
            Err(SizeError::NoTier(_))
        ));
        assert!(matches!(
            parse_tier_size("dram=1000"),
            Err(SizeError::NotPageMultiple(_, 1000))
        ));
    }

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn top_modes() {
        let top = |args: &[&str]| match Cli::try_parse_from(args).unwrap().cmd {
            Cmd::Top(t) => t,
            other => panic!("{other:?}"),
        };
        let t = top(&["tierctl", "top"]);
        assert!(t.interactive(true) && !t.interactive(false));
        assert_eq!(t.batch_limit(), Some(1));
        let t = top(&["tierctl", "top", "-n", "3", "--output", "csv"]);
        assert!(!t.interactive(true));
        assert_eq!(t.batch_limit(), Some(3));
        assert_eq!(top(&["tierctl", "top", "-n", "0"]).batch_limit(), None);
        assert!(!top(&["tierctl", "top", "--output", "json"]).interactive(true));
        assert!(Cli::try_parse_from(["tierctl", "top", "--once", "-n", "2"]).is_err());
    }

    #[test]
    fn policy_set_needs_something_to_set() {
        assert!(Cli::try_parse_from(["tierctl", "policy", "set"]).is_err());
        let cli = Cli::try_parse_from([
            "tierctl",
            "policy",
            "set",
            "--default-target",
            "0.9",
            "--epsilon",
            "0.02",
            "--max-step",
            "64M",
        ])
        .unwrap();
        let Cmd::Policy {
            cmd: PolicyCmd::Set(a),
        } = cli.cmd
        else {
            panic!("not policy set");
        };
        assert_eq!(
            (a.default_target, a.epsilon, a.max_step),
            (Some(0.9), Some(0.02), Some(64 << 20))
        );
    }

    #[test]
    fn balloon_set_parses_tiers() {
        let cli = Cli::try_parse_from([
            "tierctl",
            "balloon",
            "set",
            "vm1",
            "--tier",
            "dram=512M",
            "--tier",
            "slow=2G",
        ])
        .unwrap();
        let Cmd::Balloon {
            cmd: BalloonCmd::Set { vm, tiers },
        } = cli.cmd
        else {
            panic!("not balloon set");
        };
        assert_eq!(vm, "vm1");
        assert_eq!(tiers.len(), 2);
        assert_eq!(tiers[1].bytes, 2 << 30);
        assert!(Cli::try_parse_from(["tierctl", "balloon", "set", "vm1"]).is_err());
    }
}
