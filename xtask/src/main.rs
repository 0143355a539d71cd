//! `cargo xtask <task>`: everything a fresh machine needs, in one place.

mod ci;
mod compat;
mod demo;
mod demo_ch;
mod deps;
#[cfg(test)]
mod docs;
mod linux_bed;
mod linux_bed_fidelity;
mod linux_bed_plugin;
mod linux_driver;
mod oci;
mod package;
mod run;
mod soak;
mod uml;
mod vmm_patch;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "tierd project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, PartialEq, Subcommand)]
enum Task {
    /// Install the Debian packages the build and tests need (idempotent).
    Deps {
        /// Only report what is missing; install nothing.
        #[arg(long)]
        check: bool,
    },
    /// fmt check, clippy -D warnings, and every test (runs `deps` first).
    Test,
    /// Build, start tierd with the demo VM, show the capability report and `tierctl top`.
    Demo {
        /// Print this many updates as tables instead of the live view (terminal only).
        #[arg(long)]
        updates: Option<u64>,
        /// A patched cloud-hypervisor (`cargo xtask vmm-patch build`): run two
        /// PVH test guests under it and the controller instead of the demo VM.
        #[arg(long, env = "TIERD_CH_BIN")]
        ch_bin: Option<PathBuf>,
    },
    /// Run one benchmark from benches/ (prints a table and a RESULT line).
    Bench {
        /// Benchmark name; `list` shows them.
        name: String,
        /// Passed to the bench binary, with or without `--` before them
        /// (e.g. `fidelity --source linux`, `tierd-scale -- --against
        /// OLD_TIERD`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Closed loop against a patched cloud-hypervisor (needs a v53.0 checkout).
    E2e {
        /// cloud-hypervisor v53.0 source checkout with the series applied
        /// (`cargo xtask vmm-patch apply`).
        #[arg(long)]
        ch_src: Option<PathBuf>,
        /// micro_http checkout at 5c2254d6 (default: beside --ch-src, `micro-http`).
        #[arg(long)]
        micro_http: Option<PathBuf>,
        /// Target dir for the cloud-hypervisor build (default: its own `target/`).
        #[arg(long)]
        ch_target_dir: Option<PathBuf>,
        /// Keep the run's sockets, serial logs and tierd log here.
        #[arg(long)]
        work_dir: Option<PathBuf>,
        /// What the controller drives: `balloon` (the per-tier balloon) or
        /// `resize-zone` (the dram zone's virtio-mem part, issue 33).
        #[arg(long, default_value = "balloon")]
        actuator: String,
        /// A cloud-hypervisor binary to run instead of building --ch-src
        /// (e.g. a clean upstream v53.0 build, with --upstream).
        #[arg(long)]
        ch_bin: Option<PathBuf>,
        /// The binary has none of our series (upstream v53.0).
        #[arg(long)]
        upstream: bool,
        /// Controller mode of the run: `ratio` (default) or `working-set`
        /// (needs tierd to fill the per-tier ages; docs/e2e.md).
        #[arg(long)]
        mode: Option<String>,
        /// Who shares the DRAM budget: `swap` (default: a and b trade
        /// needs) or `three` (one goes idle, one grows, one shrinks).
        #[arg(long)]
        guests: Option<String>,
        /// The VMM: `cloud-hypervisor` (default; the options above) or
        /// `qemu` (two Debian guests on the Linux bed, judged by the truth
        /// plugin; needs no checkout; docs/e2e.md).
        #[arg(long, default_value = "cloud-hypervisor", value_parser = ["cloud-hypervisor", "qemu"])]
        vmm: String,
    },
    /// Chaos soak of the closed loop (tier-soak): faults from a seeded
    /// schedule, invariants checked from outside, a table and a RESULT line.
    Soak(soak::Options),
    /// Boot a real Linux guest (Debian's user-mode-linux) with its stock
    /// virtio_balloon against tier-balloon; inflate and deflate it.
    Uml {
        /// Balloon size to inflate, MiB.
        #[arg(long, default_value_t = 32)]
        target_mib: u64,
    },
    /// Build the .deb (tierd, tierctl, man pages, completions, the systemd
    /// unit, /etc/tierd/tierd.toml) and tierd's OCI image layout
    /// (docs/packaging.md).
    Package(package::Options),
    /// Regenerate bpf/include/x86_64/vmlinux.h from this kernel's BTF.
    Vmlinux,
    Compat(compat::Args),
    /// Build tier_balloon.ko (vmm-patch/linux-driver) from Debian's kernel
    /// sources: for Debian's UML 6.1 kernel, and compile-tested against the
    /// cloud-amd64 6.1 and 6.12 headers.
    LinuxDriver {
        #[arg(long, value_enum, default_value = "all")]
        flavour: linux_driver::Flavour,
        /// Use only the .debs cached under <target>/linux-driver/debs.
        #[arg(long)]
        offline: bool,
    },
    /// Boot Debian's 6.1 and 6.12 cloud kernels under QEMU TCG with two HMAT
    /// tiers, virtio-mem and the balloon; check each (docs/linux-bed.md).
    LinuxBed {
        /// Use only the kernel .debs cached under <target>/compat/debs.
        #[arg(long)]
        offline: bool,
    },
    /// Build the Linux bed's exact-truth QEMU plugin; prints the .so path.
    #[command(hide = true)]
    LinuxBedPlugin,
    /// Apply our patch series to a cloud-hypervisor v53.0 checkout, or build it.
    VmmPatch {
        /// apply: `git am` the series onto a new branch; build: release build of the patched tree.
        #[arg(value_enum)]
        action: vmm_patch::Action,
        /// cloud-hypervisor v53.0 git checkout.
        #[arg(long)]
        ch_src: Option<PathBuf>,
        /// micro_http checkout at 5c2254d6 (default: beside --ch-src, `micro-http`).
        #[arg(long)]
        micro_http: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli.task) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(task: Task) -> anyhow::Result<()> {
    match task {
        Task::Deps { check } => deps::ensure(check),
        Task::Test => test(),
        Task::Demo { updates, ch_bin } => {
            deps::ensure(false)?;
            demo::run(updates, ch_bin)
        }
        Task::Bench { name, args } => bench(&name, &args),
        Task::E2e {
            work_dir,
            mode,
            vmm,
            ..
        } if vmm == "qemu" => linux_bed::e2e_qemu(mode.as_deref(), work_dir, &mut |cmd| {
            run::status(cmd).map(|()| true)
        })
        .and_then(|ok| {
            if ok {
                Ok(())
            } else {
                bail!("tier-e2e-qemu failed")
            }
        }),
        Task::E2e {
            ch_src,
            micro_http,
            ch_target_dir,
            work_dir,
            actuator,
            ch_bin,
            upstream,
            mode,
            guests,
            vmm: _,
        } => e2e(
            ch_src,
            micro_http,
            ch_target_dir,
            work_dir,
            &E2eRun {
                actuator,
                ch_bin,
                upstream,
                mode,
                guests,
            },
        ),
        Task::Soak(o) => soak::run(&o),
        Task::Uml { target_mib } => uml::run(target_mib),
        Task::Package(o) => package::run(&o),
        Task::Vmlinux => vmlinux(),
        Task::Compat(a) => compat::run(a),
        Task::LinuxBed { offline } => linux_bed::run(offline),
        Task::VmmPatch {
            action: vmm_patch::Action::BuildVendored,
            ..
        } => ci::build_vendored_cmd(),
        Task::VmmPatch {
            action,
            ch_src,
            micro_http,
        } => vmm_patch::run(action, ch_src, micro_http),
        Task::LinuxBedPlugin => {
            let so = linux_bed_plugin::build(&run::target_dir()?.join("linux-bed"))?;
            println!("{}", so.display());
            Ok(())
        }
        Task::LinuxDriver { flavour, offline } => {
            deps::ensure(false)?;
            linux_driver::run(flavour, offline)
        }
    }
}

/// A clean `cargo xtask test` writes about 4.5 GiB under the target dir
/// (measured from a clean clone with CARGO_INCREMENTAL=0, as CI runs it;
/// incremental caches add about as much again). Running out half way shows
/// up as a linker bus error, so say it first.
const TEST_GIB: f64 = 8.0;

fn test() -> anyhow::Result<()> {
    let started = std::time::Instant::now();
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
    let t = std::time::Instant::now();
    run::step("test", "cargo fmt --all --check");
    run::cargo(&["fmt", "--all", "--check"])
        .context("cargo fmt --check (run `cargo fmt --all`)")?;
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
    let t = std::time::Instant::now();
    run::step(
        "test",
        "building tier_balloon.ko (cargo xtask linux-driver)",
    );
    linux_driver::run(linux_driver::Flavour::All, false).context("cargo xtask linux-driver")?;
    report.time("tier_balloon.ko", t);
    let live = live_vmm(&mut report)?;
    let t = std::time::Instant::now();
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
    let t = std::time::Instant::now();
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
    times: Vec<(String, std::time::Duration)>,
    /// RESULT lines of the e2e runs.
    results: Vec<String>,
    /// What failed (the run goes on past it).
    failed: Vec<String>,
}

impl Report {
    fn time(&mut self, what: impl Into<String>, since: std::time::Instant) {
        self.times.push((what.into(), since.elapsed()));
    }
}

/// The e2e runs of [`ci::LOOP_RUNS`] against `bin`, each timed.
fn e2e_runs(bin: &std::path::Path, report: &mut Report) -> anyhow::Result<()> {
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
    let t = std::time::Instant::now();
    if let Err(e) = build_e2e_release() {
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
        let t = std::time::Instant::now();
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
        let t = std::time::Instant::now();
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
                    let t = std::time::Instant::now();
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
        "fuzz",
        "10^6 seeded cases per untrusted-input parser (vm.info, vm.counters, control lines, stats buffers, config): panics, RSS",
    ),
];

fn bench(name: &str, args: &[String]) -> anyhow::Result<()> {
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

/// What `e2e` passes on to tier-e2e.
#[derive(Debug, Clone, Default)]
struct E2eRun {
    actuator: String,
    ch_bin: Option<PathBuf>,
    upstream: bool,
    /// Controller mode (`ratio`, `working-set`); None: tier-e2e's default.
    mode: Option<String>,
    /// `swap` or `three`; None: tier-e2e's default.
    guests: Option<String>,
}

fn e2e(
    ch_src: Option<PathBuf>,
    micro_http: Option<PathBuf>,
    ch_target_dir: Option<PathBuf>,
    work_dir: Option<PathBuf>,
    opts: &E2eRun,
) -> anyhow::Result<()> {
    e2e_with(
        ch_src,
        micro_http,
        ch_target_dir,
        work_dir,
        opts,
        &mut |cmd| run::status(cmd).map(|()| true),
    )
    .map(|_| ())
}

/// [`e2e`] with tier-e2e run by `runner` (Ok(false): it failed), so that
/// `cargo xtask test` can keep going and collect its RESULT lines.
fn e2e_with(
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
        (None, src) => e2e_build_ch(src, micro_http, ch_target_dir)?,
    };
    build_e2e_release()?;
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

/// tierd and tier-e2e in release, as the e2e runs them.
fn build_e2e_release() -> anyhow::Result<()> {
    run::step("e2e", "building tierd and tier-e2e (release)");
    run::cargo(&[
        "build",
        "--release",
        "-p",
        "tier-profiler",
        "-p",
        "tier-e2e",
        // `--bin` selects among all the packages named: both binaries.
        "--bin",
        "tierd",
        "--bin",
        "tier-e2e",
    ])
}

/// The patched cloud-hypervisor built from `ch_src`; the path of its binary.
fn e2e_build_ch(
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

fn vmlinux() -> anyhow::Result<()> {
    let out = run::workspace_root()?.join("bpf/include/x86_64/vmlinux.h");
    run::step("vmlinux", "bpftool btf dump of /sys/kernel/btf/vmlinux");
    let dump = std::process::Command::new("bpftool")
        .args([
            "btf",
            "dump",
            "file",
            "/sys/kernel/btf/vmlinux",
            "format",
            "c",
        ])
        .output()
        .context("running bpftool (apt-get install bpftool)")?;
    if !dump.status.success() {
        bail!("bpftool failed: {}", String::from_utf8_lossy(&dump.stderr));
    }
    std::fs::write(&out, &dump.stdout).with_context(|| format!("writing {}", out.display()))?;
    println!("wrote {} ({} bytes)", out.display(), dump.stdout.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Task, clap::Error> {
        let mut all = vec!["cargo-xtask"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).map(|c| c.task)
    }

    #[test]
    fn parses_every_task() {
        assert_eq!(parse(&["deps"]).unwrap(), Task::Deps { check: false });
        assert_eq!(
            parse(&["deps", "--check"]).unwrap(),
            Task::Deps { check: true }
        );
        assert_eq!(parse(&["test"]).unwrap(), Task::Test);
        assert_eq!(
            parse(&["linux-bed", "--offline"]).unwrap(),
            Task::LinuxBed { offline: true }
        );
        assert_eq!(parse(&["linux-bed-plugin"]).unwrap(), Task::LinuxBedPlugin);
        // ch_bin may also come from TIERD_CH_BIN in the environment.
        assert!(matches!(
            parse(&["demo"]).unwrap(),
            Task::Demo { updates: None, .. }
        ));
        assert!(matches!(
            parse(&["demo", "--updates", "3"]).unwrap(),
            Task::Demo {
                updates: Some(3),
                ..
            }
        ));
        assert_eq!(
            parse(&["demo", "--ch-bin", "/opt/ch/cloud-hypervisor"]).unwrap(),
            Task::Demo {
                updates: None,
                ch_bin: Some("/opt/ch/cloud-hypervisor".into())
            }
        );
        assert_eq!(
            parse(&["bench", "balloon"]).unwrap(),
            Task::Bench {
                name: "balloon".into(),
                args: Vec::new(),
            }
        );
        assert_eq!(
            parse(&["bench", "fidelity", "--source", "linux"]).unwrap(),
            Task::Bench {
                name: "fidelity".into(),
                args: vec!["--source".into(), "linux".into()],
            }
        );
        assert_eq!(
            parse(&["bench", "fidelity", "--", "--ch-bin", "/opt/ch"]).unwrap(),
            Task::Bench {
                name: "fidelity".into(),
                args: vec!["--ch-bin".into(), "/opt/ch".into()],
            }
        );
        assert_eq!(
            parse(&["e2e", "--ch-src", "/src/ch"]).unwrap(),
            Task::E2e {
                ch_src: Some("/src/ch".into()),
                micro_http: None,
                ch_target_dir: None,
                work_dir: None,
                actuator: "balloon".into(),
                ch_bin: None,
                upstream: false,
                mode: None,
                guests: None,
                vmm: "cloud-hypervisor".into(),
            }
        );
        assert_eq!(
            parse(&["e2e", "--ch-src", "/src/ch", "--mode", "working-set"]).unwrap(),
            Task::E2e {
                ch_src: Some("/src/ch".into()),
                micro_http: None,
                ch_target_dir: None,
                work_dir: None,
                actuator: "balloon".into(),
                ch_bin: None,
                upstream: false,
                mode: Some("working-set".into()),
                guests: None,
                vmm: "cloud-hypervisor".into(),
            }
        );
        assert!(matches!(
            parse(&["e2e", "--vmm", "qemu", "--mode", "ratio"]).unwrap(),
            Task::E2e { vmm, mode: Some(m), .. } if vmm == "qemu" && m == "ratio"
        ));
        assert!(parse(&["e2e", "--vmm", "xen"]).is_err());
        assert_eq!(parse(&["vmlinux"]).unwrap(), Task::Vmlinux);
        assert_eq!(
            parse(&["package", "--debug", "--out", "/tmp/p"]).unwrap(),
            Task::Package(package::Options {
                debug: true,
                out: Some("/tmp/p".into()),
            })
        );
        assert_eq!(
            parse(&["compat"]).unwrap(),
            Task::Compat(compat::Args {
                kernels: Vec::new(),
                cache: None,
                offline: false,
                report_only: false,
            })
        );
        assert_eq!(
            parse(&[
                "compat",
                "--kernel",
                "linux-image-6.1.0-56-amd64",
                "--kernel",
                "linux-image-6.12.117+deb12-amd64",
                "--cache",
                "/var/cache/debs",
                "--offline",
                "--report-only"
            ])
            .unwrap(),
            Task::Compat(compat::Args {
                kernels: vec![
                    "linux-image-6.1.0-56-amd64".into(),
                    "linux-image-6.12.117+deb12-amd64".into()
                ],
                cache: Some("/var/cache/debs".into()),
                offline: true,
                report_only: true,
            })
        );
        assert_eq!(
            parse(&["vmm-patch", "apply", "--ch-src", "/src/ch"]).unwrap(),
            Task::VmmPatch {
                action: vmm_patch::Action::Apply,
                ch_src: Some("/src/ch".into()),
                micro_http: None,
            }
        );
        assert_eq!(
            parse(&[
                "vmm-patch",
                "build",
                "--ch-src",
                "/src/ch",
                "--micro-http",
                "/src/mh"
            ])
            .unwrap(),
            Task::VmmPatch {
                action: vmm_patch::Action::Build,
                ch_src: Some("/src/ch".into()),
                micro_http: Some("/src/mh".into()),
            }
        );
        assert_eq!(
            parse(&["vmm-patch", "build-vendored"]).unwrap(),
            Task::VmmPatch {
                action: vmm_patch::Action::BuildVendored,
                ch_src: None,
                micro_http: None,
            }
        );
        assert_eq!(
            parse(&["vmm-patch", "build"]).unwrap(),
            Task::VmmPatch {
                action: vmm_patch::Action::Build,
                ch_src: None,
                micro_http: None,
            }
        );
    }

    #[test]
    fn soak_takes_a_binary_or_a_checkout() {
        assert_eq!(
            parse(&[
                "soak",
                "--ch-bin",
                "/ch",
                "--minutes",
                "1.5",
                "--faults",
                "kill-tierd"
            ])
            .unwrap(),
            Task::Soak(soak::Options {
                ch_bin: Some(PathBuf::from("/ch")),
                ch_src: None,
                micro_http: None,
                minutes: 1.5,
                seed: 1,
                faults: Some("kill-tierd".into()),
                work_dir: None,
            })
        );
        assert!(parse(&["soak", "--ch-bin", "/a", "--ch-src", "/b"]).is_err());
    }

    #[test]
    fn soak_without_a_vmm_says_what_it_needs() {
        let e = soak::run(&soak::Options {
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

    #[test]
    fn rejects_bad_arguments() {
        assert!(parse(&[]).is_err());
        assert!(parse(&["bench"]).is_err(), "bench needs a name");
        assert!(parse(&["demo", "--updates", "x"]).is_err());
        assert!(parse(&["frobnicate"]).is_err());
        assert!(parse(&["vmm-patch"]).is_err(), "vmm-patch needs an action");
        assert!(parse(&["vmm-patch", "frob", "--ch-src", "/x"]).is_err());
    }

    #[test]
    fn unknown_bench_lists_the_known_ones() {
        let err = bench("no-such-bench", &[]).unwrap_err().to_string();
        assert!(err.contains("no bench named \"no-such-bench\""), "{err}");
    }

    #[test]
    fn e2e_without_checkout_says_what_it_needs() {
        let none = E2eRun::default();
        let err = e2e(None, None, None, None, &none).unwrap_err().to_string();
        assert!(err.contains("--ch-src") && err.contains("v53.0"), "{err}");
        let dir = std::env::temp_dir();
        let err = e2e(Some(dir), None, None, None, &none)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("does not look like a cloud-hypervisor checkout"),
            "{err}"
        );
    }
}
