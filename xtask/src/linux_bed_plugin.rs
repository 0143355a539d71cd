//! Builds the Linux bed's exact-truth TCG plugin
//! (vmm-patch/harness/linux-bed/plugin/tier_truth.c) against the `qemu-plugin.h` of
//! the installed QEMU's own Debian source, fetched at build time into a
//! cache (never committed) through a private apt configuration: the
//! system's sources and lists are left alone.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::run;

const SOURCE: &str = "vmm-patch/harness/linux-bed/plugin/tier_truth.c";
const HEADER: &str = "include/qemu/qemu-plugin.h";
/// deb-src for the suites that carry bookworm's QEMU builds.
const SOURCES: &str = "\
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-updates main
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main
";

/// `cargo xtask linux-bed-plugin`: builds it under `<target>/linux-bed`,
/// prints the .so's path.
pub fn run() -> anyhow::Result<()> {
    let so = build(&run::target_dir()?.join("linux-bed"))?;
    println!("{}", so.display());
    Ok(())
}

/// `<cache>/tier_truth.so`, rebuilt only when the plugin source or the
/// installed QEMU changed. `cache` is e.g. `<target>/linux-bed`.
pub fn build(cache: &Path) -> anyhow::Result<PathBuf> {
    let version = qemu_source_version()?;
    let src = run::workspace_root()?.join(SOURCE);
    let code = std::fs::read(&src).with_context(|| format!("reading {}", src.display()))?;
    let so = cache.join("tier_truth.so");
    let stamp = cache.join("tier_truth.stamp");
    let want = format!("{version}\n{:x}\n", stamp_hash(&code));
    if so.is_file() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == want) {
        return Ok(so);
    }
    let include = header(cache, &version)?;
    run::step("linux-bed-plugin", format!("building {}", so.display()));
    let glib = pkg_config_glib()?;
    let tmp = cache.join("tier_truth.so.tmp");
    run::status(
        Command::new("gcc")
            .args(["-O2", "-g", "-Wall", "-Wextra", "-Werror"])
            .args(["-Wno-unused-parameter", "-shared", "-fPIC", "-I"])
            .arg(&include)
            .args(glib.cflags.split_whitespace())
            .arg(&src)
            .arg("-o")
            .arg(&tmp)
            .args(glib.libs.split_whitespace())
            .arg("-lpthread"),
    )
    .context("gcc (apt-get install gcc)")?;
    std::fs::rename(&tmp, &so)?;
    std::fs::write(&stamp, want)?;
    Ok(so)
}

/// The source version of the installed qemu-system-x86 (its binNMU
/// suffix, if any, is not part of the source).
fn qemu_source_version() -> anyhow::Result<String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f", "${source:Version}", "qemu-system-x86"])
        .output()
        .context("running dpkg-query")?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || v.is_empty() {
        bail!("qemu-system-x86 is not installed (apt-get install qemu-system-x86)");
    }
    Ok(v)
}

/// The directory holding `qemu-plugin.h` of source `version`, cached.
fn header(cache: &Path, version: &str) -> anyhow::Result<PathBuf> {
    let dir = cache.join(format!("qemu-plugin-h/{}", version.replace(':', "_")));
    if dir.join("qemu-plugin.h").is_file() {
        return Ok(dir);
    }
    let apt = cache.join("apt");
    let lists = apt.join("lists");
    let archives = apt.join("cache/archives");
    for d in [lists.join("partial"), archives.join("partial")] {
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    }
    let list = apt.join("sources.list");
    std::fs::write(&list, SOURCES)?;
    let opts = [
        format!("Dir::Etc::SourceList={}", list.display()),
        "Dir::Etc::SourceParts=/dev/null".to_string(),
        // Our cache is not readable by apt's _apt user: no sandbox warning.
        "APT::Sandbox::User=root".to_string(),
        format!("Dir::State::Lists={}", lists.display()),
        format!("Dir::Cache={}", apt.join("cache").display()),
    ];
    let apt_get = |args: &[&str], cwd: &Path| -> anyhow::Result<()> {
        let mut cmd = Command::new("apt-get");
        cmd.arg("-q");
        for o in &opts {
            cmd.args(["-o", o]);
        }
        run::status(cmd.args(args).current_dir(cwd))
    };
    run::step(
        "linux-bed-plugin",
        format!("fetching Debian's qemu {version} source (about 24 MB)"),
    );
    let dl = apt.join("src");
    std::fs::create_dir_all(&dl)?;
    apt_get(&["update"], &dl).context("apt-get update of the private deb-src list")?;
    apt_get(
        &["source", "--download-only", &format!("qemu={version}")],
        &dl,
    )
    .with_context(|| format!("apt-get source qemu={version}: not in bookworm's deb-src?"))?;
    let upstream = version
        .split_once(':')
        .map_or(version, |(_, v)| v)
        .split('-')
        .next()
        .unwrap_or(version);
    let orig = dl.join(format!("qemu_{upstream}.orig.tar.xz"));
    let debian = dl.join(format!(
        "qemu_{}.debian.tar.xz",
        version.split_once(':').map_or(version, |(_, v)| v)
    ));
    patched_elsewhere(&debian)?;
    let out = Command::new("tar")
        .arg("-xJOf")
        .arg(&orig)
        .args(["--wildcards", &format!("*/{HEADER}")])
        .output()
        .context("tar (apt-get install xz-utils)")?;
    if !out.status.success() || out.stdout.is_empty() {
        bail!("no {HEADER} in {}", orig.display());
    }
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("qemu-plugin.h"), &out.stdout)?;
    // Only the header is kept: the tarballs are 24 MB.
    std::fs::remove_dir_all(&dl)?;
    Ok(dir)
}

/// Fails if a Debian patch touches the header (the upstream copy would then
/// not be what the installed QEMU was built with).
fn patched_elsewhere(debian: &Path) -> anyhow::Result<()> {
    let out = Command::new("tar")
        .arg("-xJOf")
        .arg(debian)
        .args(["--wildcards", "debian/patches/*"])
        .output()
        .with_context(|| format!("reading {}", debian.display()))?;
    if !out.status.success() {
        bail!("cannot read the patches of {}", debian.display());
    }
    let needle = format!("+++ b/{HEADER}");
    if String::from_utf8_lossy(&out.stdout).contains(&needle) {
        bail!("a Debian patch changes {HEADER}: apply debian/patches before building");
    }
    Ok(())
}

struct Glib {
    cflags: String,
    libs: String,
}

fn pkg_config_glib() -> anyhow::Result<Glib> {
    let get = |flag: &str| -> anyhow::Result<String> {
        let out = Command::new("pkg-config")
            .args([flag, "glib-2.0"])
            .output()
            .context("running pkg-config (apt-get install pkg-config)")?;
        if !out.status.success() {
            bail!("pkg-config {flag} glib-2.0 failed (apt-get install libglib2.0-dev)");
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    Ok(Glib {
        cflags: get("--cflags")?,
        libs: get("--libs")?,
    })
}

/// FNV-1a: enough to notice that the plugin source changed.
fn stamp_hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
