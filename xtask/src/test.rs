//! `cargo xtask test`: fmt, clippy and every test, with the live
//! cloud-hypervisor and Linux bed tests where this machine can run them,
//! then the e2e runs; times and RESULT lines at the end.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::{ci, deps, e2e, linux_bed, linux_driver, run};

/// A clean `cargo xtask test` writes about 4.5 GiB under the target dir
/// (measured from a clean clone with CARGO_INCREMENTAL=0, as CI runs it;
/// incremental caches add about as much again). Running out half way shows
/// up as a linker bus error, so say it first.
const TEST_GIB: f64 = 8.0;

/// fmt, clippy, the kernel module, the Linux bed, every test, the e2e runs;
/// one report of all at the end, failing if anything failed.
pub fn run() -> anyhow::Result<()> {
    let started = Instant::now();
    let mut report = Report::default();
    deps::ensure(false)?;
    let target = run::target_dir()?;
    match run::free_gib(&target) {
        Some(free) if free < TEST_GIB => run::step(
            "test",
            format!(
                "warning: {free:.1} GiB free under {}; a clean test build needs about {TEST_GIB:.0} GiB",
                target.display()
            ),
        ),
        Some(free) => run::step(
            "test",
            format!("{free:.1} GiB free under {}", target.display()),
        ),
        None => {}
    }
    let t = Instant::now();
    run::step("test", "cargo fmt --all --check");
    run::cargo(&["fmt", "--all", "--check"])
        .context("cargo fmt --check (run `cargo fmt --all`)")?;
    bpf_format()?;
    run::step("test", "cargo clippy --workspace --all-targets -D warnings");
    run::cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])
    .context("clippy")?;
    report.time("fmt, clippy", t);
    // Before the tests: the UML driver test loads the module it builds
    // (about 30 s from a clean target, 3 s after), and both cloud-amd64
    // kernels must compile it without warnings (about 40 s, once).
    let t = Instant::now();
    run::step(
        "test",
        "building tier_balloon.ko (cargo xtask linux-driver)",
    );
    linux_driver::build(linux_driver::Flavour::All, false).context("cargo xtask linux-driver")?;
    report.time("tier_balloon.ko", t);
    let live = live_vmm(&mut report)?;
    let t = Instant::now();
    run::step(
        "test",
        "preparing the Linux bed (Debian's kernels, a guest-sized tierd)",
    );
    let bed = match linux_bed::test_env() {
        Ok(b) => b,
        Err(e) => {
            report
                .failed
                .push(format!("preparing the Linux bed: {e:#}"));
            Err(format!("preparing it failed: {e:#}"))
        }
    };
    report.time("Linux bed kernels", t);
    run::step("test", "cargo test --workspace --all-targets");
    let mut cmd =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    // Every test binary runs, whichever fails first: one report of all.
    cmd.args(["test", "--workspace", "--all-targets", "--no-fail-fast"])
        .current_dir(run::workspace_root()?);
    for (k, v) in &live.env {
        cmd.env(k, v);
    }
    for (k, v) in bed.iter().flatten() {
        cmd.env(k, v);
    }
    let t = Instant::now();
    // Keep going on failure: the e2e runs still say what they say.
    if let Err(e) = run::status(&mut cmd) {
        report.failed.push(format!("cargo test: {e:#}"));
    }
    report.time("cargo test --workspace (live tests included)", t);
    if let Some(bin) = &live.ch_bin {
        e2e_runs(bin, &mut report)?;
    }
    if bed.is_ok() {
        qemu_runs(&mut report);
    }
    eprintln!();
    run::step("test", "times");
    for (what, d) in &report.times {
        eprintln!("  {:>6}  {what}", ci::mmss(*d));
    }
    eprintln!(
        "  {:>6}  cargo xtask test in all",
        ci::mmss(started.elapsed())
    );
    for l in &report.results {
        eprintln!("  {l}");
    }
    if let Err(why) = &bed {
        run::step("test", format!("Linux bed tests skipped: {why}"));
    }
    if let Some(why) = &live.skipped {
        run::step(
            "test",
            format!("live cloud-hypervisor tests and e2e runs skipped: {why}"),
        );
    }
    if !report.failed.is_empty() {
        bail!("failed: {}", report.failed.join("; "));
    }
    Ok(())
}

/// What `cargo xtask test` prints at its end.
#[derive(Debug, Default)]
struct Report {
    /// Each piece's wall time.
    times: Vec<(String, Duration)>,
    /// RESULT lines of the e2e runs.
    results: Vec<String>,
    /// What failed (the run goes on past it).
    failed: Vec<String>,
}

impl Report {
    fn time(&mut self, what: impl Into<String>, since: Instant) {
        self.times.push((what.into(), since.elapsed()));
    }
}

/// The e2e runs of [`ci::LOOP_RUNS`] against `bin`, each timed.
fn e2e_runs(bin: &Path, report: &mut Report) -> anyhow::Result<()> {
    let runs = ci::selected_runs(std::env::var("TIERD_CI_E2E").ok().as_deref())?;
    for r in ci::LOOP_RUNS
        .iter()
        .filter(|r| !runs.iter().any(|s| s.name == r.name))
    {
        run::step(
            "test",
            format!("e2e {}: not selected (ci::LOOP_RUNS, TIERD_CI_E2E)", r.name),
        );
    }
    if runs.is_empty() {
        return Ok(());
    }
    // Timed apart from the first run.
    let t = Instant::now();
    if let Err(e) = e2e::build_release(&["tierd", "tier-e2e"]) {
        report
            .failed
            .push(format!("release build for the e2e: {e:#}"));
        return Ok(());
    }
    report.time("release build of tierd, tier-e2e", t);
    for r in &runs {
        run::step(
            "test",
            format!(
                "e2e {}: --actuator {} --mode {}",
                r.name, r.actuator, r.mode
            ),
        );
        let t = Instant::now();
        let (ok, lines) = match ci::e2e(r, bin) {
            Ok(x) => x,
            Err(e) => (false, vec![format!("(no RESULT: {e:#})")]),
        };
        report.time(format!("e2e {}", r.name), t);
        report
            .results
            .extend(lines.iter().map(|l| format!("e2e {}: {l}", r.name)));
        if !ok {
            report.failed.push(format!("e2e {}", r.name));
        }
    }
    Ok(())
}

/// The closed loops on the Linux bed ([`ci::QEMU_RUNS`]), each timed.
fn qemu_runs(report: &mut Report) {
    for (name, mode) in ci::selected_qemu(std::env::var("TIERD_CI_E2E").ok().as_deref()) {
        run::step("test", format!("e2e {name}: --vmm qemu --mode {mode}"));
        let t = Instant::now();
        let (ok, lines) = match ci::e2e_qemu(name, mode) {
            Ok(x) => x,
            Err(e) => (false, vec![format!("(no RESULT: {e:#})")]),
        };
        report.time(format!("e2e {name}"), t);
        report
            .results
            .extend(lines.iter().map(|l| format!("e2e {name}: {l}")));
        if !ok {
            report.failed.push(format!("e2e {name}"));
        }
    }
}

/// What the tests get to run against a live patched cloud-hypervisor.
#[derive(Debug, Default)]
struct Live {
    /// Environment for `cargo test` (TIERD_CH_BIN and friends).
    env: Vec<(String, PathBuf)>,
    /// The VMM the e2e runs use.
    ch_bin: Option<PathBuf>,
    /// Why there is none.
    skipped: Option<String>,
}

/// TIERD_CH_BIN as given, else the VMM built from `../shared/vendor`
/// (docs/ci.md), else why the live tests skip.
fn live_vmm(report: &mut Report) -> anyhow::Result<Live> {
    let mut live = Live::default();
    let given = std::env::var_os("TIERD_CH_BIN").map(PathBuf::from);
    let bin = match given {
        Some(bin) => {
            run::step("test", format!("TIERD_CH_BIN={} (given)", bin.display()));
            bin
        }
        None => {
            let vendor = ci::vendor_dir()?;
            match ci::tarballs(&vendor) {
                Err(why) => {
                    run::step(
                        "test",
                        format!("no patched cloud-hypervisor: {why}; its tests report ignored"),
                    );
                    live.skipped = Some(why);
                    return Ok(live);
                }
                Ok((ch, mh)) => {
                    let t = Instant::now();
                    let vmm = ci::build_vendored(&ch, &mh)
                        .context("building the patched cloud-hypervisor")?;
                    let what = match vmm.built_in {
                        Some(_) => "patched cloud-hypervisor (built)",
                        None => "patched cloud-hypervisor (cached)",
                    };
                    report.time(what, t);
                    if std::env::var_os("TIERD_CH_SRC").is_none() {
                        live.env.push(("TIERD_CH_SRC".into(), vmm.src));
                    }
                    vmm.bin
                }
            }
        }
    };
    live.env.push(("TIERD_CH_BIN".into(), bin.clone()));
    if std::env::var_os("TIERD_CH_KERNEL").is_none() {
        live.env.push((
            "TIERD_CH_KERNEL".into(),
            ci::pvh_kernel().context("building the PVH guest for TIERD_CH_KERNEL")?,
        ));
    }
    for (k, v) in &live.env {
        run::step("test", format!("{k}={}", v.display()));
    }
    live.ch_bin = Some(bin);
    Ok(live)
}

/// The BPF C against `bpf/.clang-format` (clang-format-14, as Debian 12
/// ships it: another version may format differently).
fn bpf_format() -> anyhow::Result<()> {
    let bpf = run::workspace_root()?.join("bpf");
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&bpf)
        .with_context(|| format!("reading {}", bpf.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "c" || x == "h"))
        .collect();
    files.sort();
    run::step("test", "clang-format-14 --dry-run --Werror bpf/*.{c,h}");
    run::status(
        std::process::Command::new("clang-format-14")
            .args(["--style=file", "--dry-run", "--Werror"])
            .args(&files),
    )
    .context("bpf/ is not formatted (run `clang-format-14 -i --style=file bpf/*.c bpf/*.h`)")
}
