//! `cargo xtask linux-bed`: Debian's 6.1 and 6.12 cloud kernels booted
//! under QEMU TCG with two HMAT tiers, virtio-mem and the balloon; each
//! checked and summed up in one RESULT line (docs/linux-bed.md).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use tier_linux_bed::{Bed, Kernel, checks};

use crate::compat::{self, kernel as debs};
use crate::{deps, run};

const MIB: u64 = 1 << 20;

/// The kernels to boot, unpacked: the newest 6.1 and 6.12 cloud-amd64
/// packages apt knows (the .debs shared with `cargo xtask compat`).
pub fn kernels(offline: bool) -> anyhow::Result<Vec<Kernel>> {
    let target = run::target_dir()?;
    let cache = target.join("compat/debs");
    let packages: Vec<String> = if offline {
        debs::cached_packages(&cache)?
    } else {
        debs::default_packages()?
    };
    let packages: Vec<String> = packages
        .into_iter()
        .filter(|p| p.ends_with("-cloud-amd64"))
        .collect();
    if packages.is_empty() {
        bail!("no linux-image-*-cloud-amd64 package known to apt (run `apt-get update`)");
    }
    let mut out = Vec::new();
    for p in packages {
        let deb = compat::fetch(&cache, &p, offline)?;
        let dir = target.join("linux-bed/kernels").join(&p);
        unpack(&deb, &dir)?;
        out.push(Kernel::unpacked(&dir).with_context(|| format!("unpacked {p}"))?);
    }
    Ok(out)
}

/// `dpkg-deb -x` once (a `done` marker says it finished).
fn unpack(deb: &Path, dir: &Path) -> anyhow::Result<()> {
    if dir.join("done").exists() {
        return Ok(());
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    run::status(
        std::process::Command::new("dpkg-deb")
            .arg("-x")
            .arg(deb)
            .arg(dir),
    )?;
    std::fs::write(dir.join("done"), "").context("marking the unpacked kernel")
}

/// The unpacked kernels' roots joined by `:` (`TIERD_BED_KERNELS` of the
/// bed's tests).
pub fn kernels_env(kernels: &[Kernel]) -> String {
    kernels
        .iter()
        .filter_map(|k| {
            k.vmlinuz
                .parent()?
                .parent()
                .map(|r| r.display().to_string())
        })
        .collect::<Vec<_>>()
        .join(":")
}

/// What one kernel showed.
#[derive(Debug)]
struct Row {
    release: String,
    boot_s: f64,
    tiers: checks::Tiers,
    /// BPF programs the kernel refused to load or attach, by name.
    bpf_refused: Vec<String>,
    bpf_programs: usize,
    /// tier-bed-agent damon's answer (None: no DAMON in this kernel).
    damon: Option<serde_json::Value>,
    grow: checks::Resize,
    shrink: checks::Resize,
    balloon: checks::Balloon,
}

/// Boot Debian's 6.1 and 6.12 cloud kernels under QEMU TCG with two HMAT
/// tiers, virtio-mem and the balloon; check each (docs/linux-bed.md).
#[derive(Debug, PartialEq, clap::Args)]
pub struct Args {
    /// Use only the kernel .debs cached under <target>/compat/debs.
    #[arg(long)]
    pub offline: bool,
}

/// Boots each kernel, checks it, prints the table and the RESULT line.
pub fn run(Args { offline }: Args) -> anyhow::Result<()> {
    deps::ensure(false)?;
    if let Some(why) = tier_linux_bed::missing() {
        bail!("cannot run the Linux bed: {why}");
    }
    let kernels = kernels(offline)?;
    let programs = guest_programs()?;
    let work = run::target_dir()?.join("linux-bed/run");
    let mut rows = Vec::new();
    for k in &kernels {
        run::step("linux-bed", format!("booting {} under QEMU TCG", k.release));
        let dir = work.join(&k.release);
        rows.push(
            survey(k, &programs, &dir)
                .with_context(|| format!("{} (files in {})", k.release, dir.display()))?,
        );
    }
    print(&rows);
    Ok(())
}

fn survey(k: &Kernel, programs: &[PathBuf], dir: &Path) -> anyhow::Result<Row> {
    let (machine, log) = tier_linux_bed::prepare(k, programs, dir)?;
    let mut bed = Bed::start(&machine, &log, tier_linux_bed::BOOT_TIMEOUT)?;
    let wait = Duration::from_secs(60);
    let tiers = checks::tiers(&mut bed)?;
    let out = bed.sh("tierd probe --programs --json", Duration::from_secs(120))?;
    let v: serde_json::Value =
        serde_json::from_str(out.trim()).context("tierd probe --programs --json")?;
    let progs = v["programs"].as_array().cloned().unwrap_or_default();
    let bpf_refused: Vec<String> = progs
        .iter()
        .filter(|p| p["loaded"] != true || p["attached"] == false)
        .map(|p| p["program"].as_str().unwrap_or("?").to_string())
        .collect();
    let damon = if k.config_on("CONFIG_DAMON_SYSFS") {
        let out = bed.sh(
            "tier-bed-agent damon --pages 2048 --hot 512 --sample-ms 100 --rounds 10",
            Duration::from_secs(120),
        )?;
        Some(serde_json::from_str(out.trim()).context("tier-bed-agent damon")?)
    } else {
        None
    };
    let grow = checks::resize(&mut bed, "vmem1", 1, 256 * MIB, wait)?;
    let shrink = checks::resize(&mut bed, "vmem1", 1, 64 * MIB, wait)?;
    let balloon = checks::balloon(&mut bed, 64 * MIB, wait)?;
    let row = Row {
        release: k.release.clone(),
        boot_s: bed.boot_time().as_secs_f64(),
        tiers,
        bpf_refused,
        bpf_programs: progs.len(),
        damon,
        grow,
        shrink,
        balloon,
    };
    bed.shutdown(Duration::from_secs(10))?;
    Ok(row)
}

fn print(rows: &[Row]) {
    let m = checks::mib;
    println!(
        "{:<28} {:>6} {:>9} {:>6} {:>18} {:>18} {:>16}",
        "kernel",
        "boot s",
        "HMAT ns",
        "tiers",
        "vmem1 128->256",
        "vmem1 256->64",
        "balloon -64 MiB"
    );
    for r in rows {
        let lat: Vec<String> = r.tiers.latency_ns.iter().map(u64::to_string).collect();
        println!(
            "{:<28} {:>6.1} {:>9} {:>6} {:>18} {:>18} {:>16} {:>8} {:>14}",
            r.release,
            r.boot_s,
            lat.join("/"),
            r.tiers.kernel_tiers(),
            format!(
                "{} MiB, node +{}",
                m(r.grow.plugged_after),
                m(r.grow.node_after.saturating_sub(r.grow.node_before))
            ),
            format!(
                "{} MiB, node -{}",
                m(r.shrink.plugged_after),
                m(r.shrink.node_before.saturating_sub(r.shrink.node_after))
            ),
            format!(
                "total -{} MiB",
                m(r.balloon.total_before.saturating_sub(r.balloon.total_after))
            ),
            format!(
                "{}/{}",
                r.bpf_programs - r.bpf_refused.len(),
                r.bpf_programs
            ),
            damon_cell(r.damon.as_ref()),
        );
        if !r.bpf_refused.is_empty() {
            println!("  {}: refused {}", r.release, r.bpf_refused.join(", "));
        }
    }
    println!(
        "tiers: distinct memory tiers the kernel made of the two nodes (6.1 tiers only dax/kmem memory)"
    );
    let ok = |f: &dyn Fn(&Row) -> bool| rows.iter().filter(|r| f(r)).count();
    let tiers_ok = ok(&|r| r.tiers.hmat_ok());
    let vmem_ok = ok(&|r| {
        r.grow.plugged_after == r.grow.requested && r.shrink.plugged_after == r.shrink.requested
    });
    let balloon_ok = ok(&|r| r.balloon.actual_after <= r.balloon.target);
    let per: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{}:{}",
                r.release.split('.').take(2).collect::<Vec<_>>().join("."),
                r.tiers.kernel_tiers()
            )
        })
        .collect();
    let bpf_failures: usize = rows.iter().map(|r| r.bpf_refused.len()).sum();
    let damon = match rows
        .iter()
        .filter_map(|r| r.damon.as_ref())
        .map(damon_ok)
        .collect::<Vec<_>>()
    {
        v if v.is_empty() => "absent",
        v if v.iter().all(|ok| *ok) => "real",
        _ => "failed",
    };
    println!(
        "RESULT kernels={} tiers_ok={tiers_ok} memory_tiers={} virtio_mem_ok={vmem_ok} balloon_ok={balloon_ok} bpf_load_failures={bpf_failures} damon={damon}",
        rows.len(),
        per.join(","),
    );
}

/// Every region aged, nothing outside them (tier-bed-agent damon).
fn damon_ok(v: &serde_json::Value) -> bool {
    v["idle_covered"] == v["covered"] && v["idle_uncovered"] == 0 && v["idle_before"] == 0
}

fn damon_cell(v: Option<&serde_json::Value>) -> String {
    match v {
        None => "no DAMON".into(),
        Some(v) => format!("{}/{} pages", v["idle_covered"], v["covered"]),
    }
}

/// tierd and tier-bed-agent, built and stripped for the guest.
pub fn guest_programs() -> anyhow::Result<Vec<PathBuf>> {
    run::cargo(&[
        "build",
        "-p",
        "tier-profiler",
        "-p",
        "tier-bed-agent",
        // `--bin` selects among all the packages named: name both.
        "--bin",
        "tierd",
        "--bin",
        "tier-bed-agent",
    ])?;
    Ok(vec![for_guest("tierd")?, for_guest("tier-bed-agent")?])
}

/// The environment of the bed's tests in `cargo xtask test`: the
/// unpacked kernels, tierd and the agent built for the guest, the truth
/// plugin; or why they cannot run.
/// `Ok(Err(why))`: this machine cannot run the bed (no QEMU), the tests
/// say so; `Err`: preparing it failed, which fails `cargo xtask test`.
pub fn test_env() -> anyhow::Result<Result<Vec<(String, String)>, String>> {
    if let Some(why) = tier_linux_bed::missing() {
        return Ok(Err(why));
    }
    let kernels = kernels(false).context("Debian's kernels")?;
    let programs = guest_programs()?;
    let plugin = crate::linux_bed_plugin::build(&run::target_dir()?.join("linux-bed"))
        .context("the truth plugin")?;
    Ok(Ok(vec![
        ("TIERD_BED_KERNELS".into(), kernels_env(&kernels)),
        ("TIERD_BED_TIERD".into(), programs[0].display().to_string()),
        ("TIERD_BED_AGENT".into(), programs[1].display().to_string()),
        ("TIERD_TRUTH_PLUGIN".into(), plugin.display().to_string()),
    ]))
}

/// A debug binary, stripped of debug info (the guest unpacks its
/// initramfs into RAM: tierd is 50 MB with it, 34 MB without).
pub fn for_guest(name: &str) -> anyhow::Result<PathBuf> {
    let target = run::target_dir()?;
    let bin = target.join("debug").join(name);
    let out = target.join("linux-bed").join(name);
    std::fs::create_dir_all(target.join("linux-bed")).context("creating linux-bed dir")?;
    run::status(
        std::process::Command::new("objcopy")
            .arg("--strip-debug")
            .arg(&bin)
            .arg(&out),
    )?;
    Ok(out)
}
