//! `cargo xtask vmm-patch apply|build --ch-src DIR [--micro-http DIR]`:
//! applies our cloud-hypervisor v53.0 patch series (`vmm-patch/patches/`)
//! to a checkout the user provides and builds it. No upstream source ever
//! enters this repository: the checkout lives wherever the user put it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::run;

/// cloud-hypervisor tag v53.0.
pub const V53_COMMIT: &str = "9ed824d6d08df3e96f7d5f50795d9449ac99f431";
/// micro_http, cloud-hypervisor's one git dependency, as v53.0's Cargo.lock pins it.
pub const MICRO_HTTP_COMMIT: &str = "5c2254d6cf4f32a668d0d8e57ba20bebad9d4fba";
const MICRO_HTTP_URL: &str = "https://github.com/firecracker-microvm/micro-http";
/// Branch `apply` creates for the series.
pub const BRANCH: &str = "tierd-vmm-patch";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Action {
    /// `git am` the series onto a new branch of a v53.0 checkout.
    Apply,
    /// Build the patched tree in release and print where the binaries are.
    Build,
    /// Unpack `../shared/vendor`'s tarballs into the cache, apply, build
    /// (or reuse the cached build); print the binary (docs/ci.md).
    BuildVendored,
}

const NEEDS: &str = "vmm-patch needs a cloud-hypervisor v53.0 git checkout (tag v53.0, commit 9ed824d6):\n  \
     git clone https://github.com/cloud-hypervisor/cloud-hypervisor DIR && git -C DIR checkout v53.0\n  \
     cargo xtask vmm-patch apply --ch-src DIR\n  \
     cargo xtask vmm-patch build --ch-src DIR [--micro-http DIR2]\n\
     build also needs micro_http at 5c2254d6 (default DIR/../micro-http):\n  \
     git clone https://github.com/firecracker-microvm/micro-http DIR2 && git -C DIR2 checkout 5c2254d6";

/// Apply our patch series to a cloud-hypervisor v53.0 checkout, or build it.
#[derive(Debug, PartialEq, clap::Args)]
pub struct Args {
    /// apply: `git am` the series onto a new branch; build: release build of the patched tree.
    #[arg(value_enum)]
    pub action: Action,
    /// cloud-hypervisor v53.0 git checkout.
    #[arg(long)]
    pub ch_src: Option<PathBuf>,
    /// micro_http checkout at 5c2254d6 (default: beside --ch-src, `micro-http`).
    #[arg(long)]
    pub micro_http: Option<PathBuf>,
}

pub fn run(
    Args {
        action,
        ch_src,
        micro_http,
    }: Args,
) -> anyhow::Result<()> {
    let Some(dir) = ch_src else {
        bail!("{NEEDS}");
    };
    check_checkout(&dir)?;
    let patches = series(&run::workspace_root()?.join("vmm-patch/patches"))?;
    match action {
        Action::Apply => apply(&dir, &patches),
        Action::Build => build(&dir, &patches, micro_http, None).map(|_| ()),
        // main dispatches it to ci (it needs no checkout).
        Action::BuildVendored => bail!("vmm-patch build-vendored takes no --ch-src"),
    }
}

/// Checks `dir` carries the series and builds it: the directory of the
/// release binaries. `target_dir` overrides cloud-hypervisor's target dir.
pub fn build_checkout(
    dir: &Path,
    micro_http: Option<PathBuf>,
    target_dir: Option<PathBuf>,
) -> anyhow::Result<PathBuf> {
    check_checkout(dir)?;
    let patches = series(&run::workspace_root()?.join("vmm-patch/patches"))?;
    build(dir, &patches, micro_http, target_dir)
}

/// The series, in order: `NNNN-*.patch` files of `dir`.
pub fn series(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut patches: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "patch"))
        .collect();
    patches.sort();
    if patches.is_empty() {
        bail!("no .patch files in {}", dir.display());
    }
    Ok(patches)
}

/// The `Subject:` of a format-patch file, unfolded (format-patch wraps long
/// subjects onto indented continuation lines), without the `[PATCH n/m]`
/// prefix: what `git log --format=%s` shows once applied.
pub fn subject(patch: &str) -> Option<String> {
    let mut lines = patch.lines().skip_while(|l| !l.starts_with("Subject: "));
    let mut s = lines.next()?.trim_start_matches("Subject: ").to_string();
    for cont in lines.take_while(|l| l.starts_with(' ') || l.starts_with('\t')) {
        s.push(' ');
        s.push_str(cont.trim());
    }
    let s = match s.strip_prefix('[') {
        Some(rest) => rest.split_once("] ").map_or(rest, |(_, t)| t),
        None => &s,
    };
    Some(s.trim().to_string())
}

fn git(dir: &Path) -> Command {
    let mut cmd = Command::new("git");
    cmd.arg("-C").arg(dir);
    cmd
}

fn git_out(dir: &Path, args: &[&str]) -> anyhow::Result<Option<String>> {
    let out = git(dir)
        .args(args)
        .output()
        .context("running git (apt-get install git)")?;
    Ok(out
        .status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string()))
}

fn check_checkout(dir: &Path) -> anyhow::Result<()> {
    if !dir.join("vmm").is_dir() || !dir.join("virtio-devices").is_dir() {
        bail!(
            "{} does not look like a cloud-hypervisor checkout (no vmm/ or virtio-devices/)\n{NEEDS}",
            dir.display()
        );
    }
    if git_out(dir, &["rev-parse", "--git-dir"])?.is_none() {
        bail!(
            "{} is not a git checkout: `git am` needs one\n{NEEDS}",
            dir.display()
        );
    }
    Ok(())
}

/// Where a checkout stands relative to the series.
#[derive(Debug, PartialEq, Eq)]
pub enum State {
    /// HEAD is v53.0: ready to apply.
    Pristine,
    /// HEAD descends from v53.0 and carries every patch of the series.
    Applied,
    /// HEAD descends from v53.0 and carries some patches of the series.
    Partial(usize),
    /// Anything else.
    Other(String),
}

/// Classify a checkout from its HEAD, whether v53.0 is an ancestor of it,
/// and the subjects of the commits since v53.0.
pub fn classify(head: &str, descends: bool, log: &[String], series: &[String]) -> State {
    if head == V53_COMMIT {
        return State::Pristine;
    }
    if !descends {
        return State::Other(head.to_string());
    }
    let present = series.iter().filter(|s| log.contains(s)).count();
    match present {
        0 => State::Other(head.to_string()),
        n if n == series.len() => State::Applied,
        n => State::Partial(n),
    }
}

fn state(dir: &Path, subjects: &[String]) -> anyhow::Result<State> {
    let head = git_out(dir, &["rev-parse", "HEAD"])?.context("git rev-parse HEAD failed")?;
    let descends = git(dir)
        .args(["merge-base", "--is-ancestor", V53_COMMIT, "HEAD"])
        .status()
        .context("running git")?
        .success();
    let log = if descends {
        git_out(dir, &["log", "--format=%s", &format!("{V53_COMMIT}..HEAD")])?
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    } else {
        Vec::new()
    };
    Ok(classify(&head, descends, &log, subjects))
}

fn subjects(patches: &[PathBuf]) -> anyhow::Result<Vec<String>> {
    patches
        .iter()
        .map(|p| {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            subject(&text).with_context(|| format!("{} has no Subject:", p.display()))
        })
        .collect()
}

fn apply(dir: &Path, patches: &[PathBuf]) -> anyhow::Result<()> {
    let subjects = subjects(patches)?;
    match state(dir, &subjects)? {
        State::Pristine => {}
        State::Applied => bail!(
            "the series is already applied in {} (HEAD carries all {} patches); \
             build it with `cargo xtask vmm-patch build --ch-src {}`",
            dir.display(),
            subjects.len(),
            dir.display()
        ),
        State::Partial(n) => bail!(
            "{} carries {n} of the {} patches: a previous apply stopped half way; \
             `git -C {} am --abort` and `git -C {} checkout v53.0`, then apply again",
            dir.display(),
            subjects.len(),
            dir.display(),
            dir.display()
        ),
        State::Other(head) => bail!(
            "{} is at {head}, not cloud-hypervisor v53.0 ({V53_COMMIT}): \
             `git -C {} checkout v53.0` first",
            dir.display(),
            dir.display()
        ),
    }
    // Cargo.lock changes when micro_http is patched to a local path: allowed.
    let dirty =
        git_out(dir, &["status", "--porcelain", "--untracked-files=no"])?.unwrap_or_default();
    if dirty
        .lines()
        .any(|l| !l.trim_end().ends_with(" Cargo.lock"))
    {
        bail!(
            "{} has uncommitted changes; commit or stash them first:\n{dirty}",
            dir.display()
        );
    }
    if git_out(dir, &["rev-parse", "--verify", "--quiet", BRANCH])?.is_some() {
        bail!(
            "branch {BRANCH} already exists in {}; delete it (`git -C {} branch -D {BRANCH}`) or check it out",
            dir.display(),
            dir.display()
        );
    }
    run::step(
        "vmm-patch",
        format!(
            "applying {} patches to {} on a new branch {BRANCH}",
            patches.len(),
            dir.display()
        ),
    );
    run::status(git(dir).args(["checkout", "-b", BRANCH]))?;
    if let Err(e) = am_series(dir, patches) {
        // Put the checkout back as it was: v53.0, detached, no branch.
        let _ = git(dir).args(["am", "--abort"]).status();
        let _ = git(dir).args(["checkout", "-q", V53_COMMIT]).status();
        let _ = git(dir).args(["branch", "-q", "-D", BRANCH]).status();
        return Err(e.context(format!(
            "the series does not apply to {}; it is back at v53.0 without branch {BRANCH}",
            dir.display()
        )));
    }
    println!(
        "applied {} patches to {} on branch {BRANCH}; next: cargo xtask vmm-patch build --ch-src {}",
        patches.len(),
        dir.display(),
        dir.display()
    );
    Ok(())
}

/// `git am --keep-cr` the series onto HEAD of `dir` (`docs/balloon.md`
/// upstream has CRLF line ends); on failure the am is left in progress.
pub fn am_series(dir: &Path, patches: &[PathBuf]) -> anyhow::Result<()> {
    let mut am = git(dir);
    // git am records a committer: supply one if the user has none.
    if git_out(dir, &["config", "user.email"])?.is_none() {
        am.args(IDENTITY);
    }
    am.args(["am", "--keep-cr"]).args(patches);
    run::status(&mut am)
}

/// The committer `git am` uses where the user has configured none.
const IDENTITY: [&str; 4] = [
    "-c",
    "user.name=tierd xtask",
    "-c",
    "user.email=xtask@tierd.invalid",
];

/// The `--config` value that points micro_http at a local checkout.
pub fn micro_http_patch(path: &Path) -> String {
    format!(
        "patch.\"{MICRO_HTTP_URL}\".micro_http.path=\"{}\"",
        path.display()
    )
}

fn build(
    dir: &Path,
    patches: &[PathBuf],
    micro_http: Option<PathBuf>,
    target_dir: Option<PathBuf>,
) -> anyhow::Result<PathBuf> {
    let subjects = subjects(patches)?;
    let why = match state(dir, &subjects)? {
        State::Applied => None,
        State::Pristine => Some("it is plain v53.0".to_string()),
        State::Partial(n) => Some(format!("it carries {n} of the {} patches", subjects.len())),
        State::Other(head) => Some(format!("it is at {head}, not v53.0 plus the series")),
    };
    if let Some(why) = why {
        bail!(
            "{} does not carry the series ({why}); run `cargo xtask vmm-patch apply --ch-src {}` first",
            dir.display(),
            dir.display()
        );
    }
    let mh = match micro_http {
        Some(p) => p,
        None => dir
            .parent()
            .map(|p| p.join("micro-http"))
            .context("--ch-src has no parent directory")?,
    };
    if !mh.join("Cargo.toml").is_file() {
        bail!(
            "micro_http not found at {} (cloud-hypervisor's one git dependency, commit 5c2254d6):\n  \
             git clone {MICRO_HTTP_URL} {} && git -C {} checkout 5c2254d6\nor pass --micro-http DIR",
            mh.display(),
            mh.display(),
            mh.display()
        );
    }
    let mh = mh
        .canonicalize()
        .with_context(|| format!("resolving {}", mh.display()))?;
    match git_out(&mh, &["rev-parse", "HEAD"])? {
        Some(h) if h == MICRO_HTTP_COMMIT => {}
        Some(h) => eprintln!(
            "warning: micro_http at {} is {h}, v53.0 pins {MICRO_HTTP_COMMIT}",
            mh.display()
        ),
        None => eprintln!(
            "warning: {} is not a git checkout; cannot check it is {MICRO_HTTP_COMMIT}",
            mh.display()
        ),
    }
    cargo_build(dir, &mh, target_dir)
}

/// `cargo build --release --bins` of the patched tree `dir` with micro_http
/// patched to `mh` (absolute); the directory holding the two binaries.
pub fn cargo_build(dir: &Path, mh: &Path, target_dir: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    run::step(
        "vmm-patch",
        format!(
            "building cloud-hypervisor and ch-remote (release) in {}",
            dir.display()
        ),
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--release", "--bins", "--config"])
        .arg(micro_http_patch(mh))
        .current_dir(dir);
    if let Some(t) = &target_dir {
        cmd.env("CARGO_TARGET_DIR", t);
    }
    run::status(&mut cmd)?;
    let target = target_dir
        .or_else(|| std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from))
        .unwrap_or_else(|| dir.join("target"));
    let release = if target.is_absolute() {
        target.join("release")
    } else {
        dir.join(target).join("release")
    };
    for bin in ["cloud-hypervisor", "ch-remote"] {
        let p = release.join(bin);
        if !p.is_file() {
            bail!("the build finished but {} is missing", p.display());
        }
        println!("{}", p.display());
    }
    println!(
        "(Cargo.lock in {} now points micro_http at {}; do not commit it)",
        dir.display(),
        mh.display()
    );
    Ok(release)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subject_drops_the_patch_prefix() {
        let p = "From abc Mon Sep 17 00:00:00 2001\nFrom: a <a@b>\nSubject: [PATCH 2/3] virtio-devices: balloon: stats queue\n\nbody";
        assert_eq!(
            subject(p).as_deref(),
            Some("virtio-devices: balloon: stats queue")
        );
        assert_eq!(subject("Subject: plain\n").as_deref(), Some("plain"));
        let folded = "From: a <a@b>\nSubject: [PATCH 1/4] virtio-devices: balloon: per-tier sub-balloons\n (VIRTIO_BALLOON_F_TIERS)\n\nAdd one";
        assert_eq!(
            subject(folded).as_deref(),
            Some("virtio-devices: balloon: per-tier sub-balloons (VIRTIO_BALLOON_F_TIERS)")
        );
        assert_eq!(subject("no header"), None);
    }

    #[test]
    fn classify_checkouts() {
        let series = vec!["a".to_string(), "b".to_string()];
        assert_eq!(classify(V53_COMMIT, true, &[], &series), State::Pristine);
        assert_eq!(
            classify("x", true, &["b".into(), "a".into()], &series),
            State::Applied
        );
        assert_eq!(
            classify("x", true, &["a".into()], &series),
            State::Partial(1)
        );
        assert_eq!(
            classify("x", false, &["a".into(), "b".into()], &series),
            State::Other("x".into())
        );
        assert_eq!(
            classify("x", true, &["c".into()], &series),
            State::Other("x".into())
        );
    }

    #[test]
    fn without_checkout_says_what_it_needs() {
        for action in [Action::Apply, Action::Build] {
            let err = run(Args {
                action,
                ch_src: None,
                micro_http: None,
            })
            .unwrap_err()
            .to_string();
            assert!(err.contains("v53.0") && err.contains("--ch-src"), "{err}");
            assert!(err.contains("micro_http"), "{err}");
        }
        let err = run(Args {
            action: Action::Apply,
            ch_src: Some(std::env::temp_dir()),
            micro_http: None,
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("does not look like a cloud-hypervisor checkout"),
            "{err}"
        );
    }

    #[test]
    fn micro_http_patch_is_a_cargo_config_key() {
        assert_eq!(
            micro_http_patch(Path::new("/w/micro-http")),
            "patch.\"https://github.com/firecracker-microvm/micro-http\".micro_http.path=\"/w/micro-http\""
        );
    }
}
