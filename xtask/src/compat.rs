//! `cargo xtask compat`: checks every BPF object of the project, offline,
//! against real Debian kernels with tier-compat, and writes docs/compat.md.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
pub use tier_compat::kernel;
use tier_compat::{Dirs, Options, report};

use crate::run;

/// Check every BPF object offline against Debian's 6.1 and 6.12 kernels
/// (CO-RE, kfuncs, attach targets, capabilities); writes docs/compat.md.
#[derive(Debug, PartialEq, clap::Args)]
pub struct Args {
    /// Kernel package to check (repeatable; default: newest 6.1 and 6.12,
    /// amd64 and cloud-amd64, known to apt).
    #[arg(long = "kernel", value_name = "PKG")]
    pub kernels: Vec<String>,
    /// Where the .debs are cached (default: <target>/compat/debs).
    #[arg(long)]
    pub cache: Option<PathBuf>,
    /// Use only the cache; download nothing.
    #[arg(long)]
    pub offline: bool,
    /// Exit 0 even when an object would be refused.
    #[arg(long)]
    pub report_only: bool,
}

/// A kernel package's .deb from `cache`, or downloaded into it (said as
/// `compat: apt-get download PKG`).
pub fn fetch(cache: &Path, pkg: &str, offline: bool) -> anyhow::Result<PathBuf> {
    Ok(kernel::fetch(cache, pkg, offline, &mut |s| {
        run::step("compat", s)
    })?)
}

/// Prints the matrix, writes docs/compat.md, ends with the RESULT line;
/// fails on load failures unless `--report-only`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let root = run::workspace_root()?;
    let dirs = Dirs {
        bpf: root.join("bpf"),
        work: run::target_dir()?.join("compat"),
    };
    let opts = Options {
        kernels: args.kernels,
        cache: args.cache,
        offline: args.offline,
    };
    let summary = tier_compat::check_all(&opts, &dirs, &mut |s| run::step("compat", s))?;
    for n in &summary.notes {
        println!("note: {n}");
    }
    print!("{}", report::matrix(&summary.kernels));
    let result = summary.result_line();
    let doc = root.join("docs/compat.md");
    std::fs::write(
        &doc,
        report::document(&summary.kernels, &summary.notes, &result),
    )
    .with_context(|| format!("writing {}", doc.display()))?;
    eprintln!(
        "compat: wrote {} in {:.1}s",
        doc.display(),
        started.elapsed().as_secs_f64()
    );
    println!("{result}");
    if summary.load_failures() > 0 && !args.report_only {
        bail!(
            "{} (object, kernel) pairs libbpf would refuse",
            summary.load_failures()
        );
    }
    Ok(())
}
