//! `cargo xtask linux-driver`: builds `tier_balloon.ko` (vmm-patch/guests/linux-driver)
//! from Debian's kernel sources, never committed: the .debs are fetched into
//! `<target>/linux-driver/debs`, virtio_balloon.c is copied out of
//! linux-source and patched in a build directory.
//!
//! - `uml`: against linux-source-6.1 at Debian's user-mode-linux version,
//!   prepared with UML's own config (ARCH=um), for `/usr/bin/linux.uml`.
//! - `cloud-amd64`: compile test against the newest 6.1 and 6.12
//!   cloud-amd64 headers known to apt, warnings as errors.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::compat::{self, kernel};
use crate::{deps, run};

/// Debian's user-mode-linux 6.1um4+b13 is built from this linux-source.
pub const UML_SOURCE: (&str, &str) = ("linux-source-6.1", "6.1.176-1");
/// UML's kernel config, as the user-mode-linux package ships it.
const UML_CONFIG: &str = "/usr/share/doc/user-mode-linux/config.gz";
const BALLOON_C: &str = "drivers/virtio/virtio_balloon.c";
/// Our own files, copied beside the patched source.
const OWN_FILES: &[&str] = &["tier_balloon.h", "tier_balloon_tiers.c", "Kbuild"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Flavour {
    Uml,
    CloudAmd64,
    All,
}

/// `<target>/linux-driver`.
pub fn out_dir() -> anyhow::Result<PathBuf> {
    Ok(run::target_dir()?.join("linux-driver"))
}

/// Build tier_balloon.ko (vmm-patch/guests/linux-driver) from Debian's kernel
/// sources: for Debian's UML 6.1 kernel, and compile-tested against the
/// cloud-amd64 6.1 and 6.12 headers.
#[derive(Debug, PartialEq, clap::Args)]
pub struct Args {
    #[arg(long, value_enum, default_value = "all")]
    pub flavour: Flavour,
    /// Use only the .debs cached under <target>/linux-driver/debs.
    #[arg(long)]
    pub offline: bool,
}

pub fn run(Args { flavour, offline }: Args) -> anyhow::Result<()> {
    deps::ensure(false)?;
    build(flavour, offline)
}

/// The flavours' modules (`cargo xtask test` builds them with deps ensured).
pub fn build(flavour: Flavour, offline: bool) -> anyhow::Result<()> {
    let out = out_dir()?;
    if matches!(flavour, Flavour::Uml | Flavour::All) {
        let ko = build_uml(&out, offline)?;
        eprintln!("linux-driver: {}", ko.display());
    }
    if matches!(flavour, Flavour::CloudAmd64 | Flavour::All) {
        for ko in build_cloud(&out, offline)? {
            eprintln!("linux-driver: {}", ko.display());
        }
    }
    Ok(())
}

/// UML flavour: `<out>/uml/tier_balloon.ko`, vermagic `6.1.176 mod_unload`.
fn build_uml(out: &Path, offline: bool) -> anyhow::Result<PathBuf> {
    let (pkg, version) = UML_SOURCE;
    let deb = fetch_pinned(&out.join("debs"), pkg, version, offline)?;
    let tree = out.join(format!("src/{pkg}_{version}"));
    if !tree.join("prepared").exists() {
        run::step(
            "linux-driver",
            format!("preparing the UML kernel tree of {pkg} {version} (about 25 s)"),
        );
        prepare_uml(&deb, &tree)?;
    }
    let src = tree.join("linux");
    let build = out.join("build/uml");
    run::step("linux-driver", "building tier_balloon.ko for UML");
    stage(&std::fs::read(src.join(BALLOON_C))?, "6.1", &build)?;
    kbuild(&src, &build, &["ARCH=um"])?;
    let ko = out.join("uml/tier_balloon.ko");
    copy_ko(&build, &ko)?;
    Ok(ko)
}

/// Unpacks linux-source and runs olddefconfig + modules_prepare with UML's
/// config (about 25 s on 2 cores, most of it xz).
fn prepare_uml(deb: &Path, tree: &Path) -> anyhow::Result<()> {
    if tree.exists() {
        std::fs::remove_dir_all(tree).with_context(|| format!("removing {}", tree.display()))?;
    }
    let tarball = unpack_source_deb(deb, tree)?;
    let src = tree.join("linux");
    std::fs::create_dir_all(&src)?;
    run::status(
        Command::new("tar")
            .args(["-xJf"])
            .arg(&tarball)
            .args(["--strip-components=1", "-C"])
            .arg(&src),
    )?;
    std::fs::remove_file(&tarball)?;
    let config = Command::new("zcat")
        .arg(UML_CONFIG)
        .output()
        .context("zcat the UML config (apt-get install user-mode-linux)")?;
    if !config.status.success() {
        bail!("zcat {UML_CONFIG} failed: is user-mode-linux installed?");
    }
    std::fs::write(src.join(".config"), &config.stdout)?;
    for target in ["olddefconfig", "modules_prepare"] {
        run::status(
            Command::new("make")
                .args(["ARCH=um", "-j2", target])
                .current_dir(&src),
        )
        .with_context(|| format!("make ARCH=um {target} (apt-get install flex bison bc)"))?;
    }
    std::fs::write(tree.join("prepared"), "")?;
    Ok(())
}

/// Cloud flavour: one module per series, against the headers packages.
fn build_cloud(out: &Path, offline: bool) -> anyhow::Result<Vec<PathBuf>> {
    let debs = out.join("debs");
    let images: Vec<String> = kernel::default_packages()?
        .into_iter()
        .filter(|p| p.ends_with("-cloud-amd64"))
        .collect();
    if images.len() != 2 {
        bail!(
            "expected a 6.1 and a 6.12 cloud-amd64 kernel known to apt, found {images:?}; run `apt-get update`"
        );
    }
    let mut built = Vec::new();
    for image in images {
        let headers = image.replacen("linux-image-", "linux-headers-", 1);
        let release = headers.trim_start_matches("linux-headers-").to_string();
        let series = if release.starts_with("6.1.") {
            "6.1"
        } else {
            "6.12"
        };
        let root = out.join(format!("headers/{release}"));
        let hdeb = compat::fetch(&debs, &headers, offline)?;
        if !root.join("done").exists() {
            run::step(
                "linux-driver",
                format!("unpacking {headers} and its dependencies"),
            );
            std::fs::create_dir_all(&root)?;
            for pkg in std::iter::once(headers.clone()).chain(depends(&hdeb)?) {
                let deb = compat::fetch(&debs, &pkg, offline)?;
                run::status(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
            }
            relocate_makefile(&root, &release)?;
            std::fs::write(root.join("done"), "")?;
        }
        // The patch is against the source of the same Debian version.
        let version = deb_field(&hdeb, "Version")?;
        let sdeb = fetch_pinned(&debs, &format!("linux-source-{series}"), &version, offline)?;
        let balloon = balloon_c_of(&sdeb, &out.join(format!("src/{series}_{version}.c")))?;
        let build = out.join(format!("build/{release}"));
        run::step(
            "linux-driver",
            format!("building tier_balloon.ko against {release}"),
        );
        stage(&balloon, series, &build)?;
        let kdir = root.join(format!("usr/src/linux-headers-{release}"));
        // No pahole here and no vmlinux: BTF of the module is not wanted.
        kbuild(&kdir, &build, &["CONFIG_DEBUG_INFO_BTF_MODULES="])?;
        let ko = out.join(format!("cloud-amd64/{release}/tier_balloon.ko"));
        copy_ko(&build, &ko)?;
        built.push(ko);
    }
    Ok(built)
}

/// Debian's headers Makefile includes `/usr/src/<common>/Makefile`: point it
/// at the extracted copy so nothing is installed system-wide.
fn relocate_makefile(root: &Path, release: &str) -> anyhow::Result<()> {
    let mk = root.join(format!("usr/src/linux-headers-{release}/Makefile"));
    let text = std::fs::read_to_string(&mk).with_context(|| format!("reading {}", mk.display()))?;
    let usr_src = root.join("usr/src/");
    let fixed = text.replace(
        "include /usr/src/",
        &format!("include {}", usr_src.display()),
    );
    std::fs::write(&mk, fixed).with_context(|| format!("writing {}", mk.display()))
}

/// The linux-headers/linux-kbuild packages a headers package depends on.
fn depends(deb: &Path) -> anyhow::Result<Vec<String>> {
    let deps = deb_field(deb, "Depends")?;
    Ok(deps
        .split(',')
        .filter_map(|d| d.split_whitespace().next())
        .filter(|n| n.starts_with("linux-headers-") || n.starts_with("linux-kbuild-"))
        .map(str::to_string)
        .collect())
}

fn deb_field(deb: &Path, field: &str) -> anyhow::Result<String> {
    let out = Command::new("dpkg-deb")
        .arg("-f")
        .arg(deb)
        .arg(field)
        .output()
        .context("running dpkg-deb -f")?;
    if !out.status.success() {
        bail!("dpkg-deb -f {} {field} failed", deb.display());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `pkg` at exactly `version`: from the cache, or `apt-get download pkg=version`.
fn fetch_pinned(cache: &Path, pkg: &str, version: &str, offline: bool) -> anyhow::Result<PathBuf> {
    let file = cache.join(format!("{pkg}_{version}_all.deb"));
    if file.exists() {
        return Ok(file);
    }
    if offline {
        bail!("--offline: no {} in the cache", file.display());
    }
    std::fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    eprintln!("linux-driver: apt-get download {pkg}={version}");
    run::status(
        Command::new("apt-get")
            .args(["download", "-q", &format!("{pkg}={version}")])
            .current_dir(cache),
    )
    .with_context(|| format!("apt-get download {pkg}={version} (stale lists? `apt-get update`)"))?;
    if !file.exists() {
        bail!("apt-get download left no {}", file.display());
    }
    Ok(file)
}

/// Extracts the linux-source .deb into `dir`; returns its tarball's path.
fn unpack_source_deb(deb: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    let x = dir.join("deb");
    std::fs::create_dir_all(&x).with_context(|| format!("creating {}", x.display()))?;
    run::status(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&x))?;
    let usr_src = x.join("usr/src");
    for entry in
        std::fs::read_dir(&usr_src).with_context(|| format!("reading {}", usr_src.display()))?
    {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "xz") {
            let tarball = dir.join("linux.tar.xz");
            std::fs::rename(&path, &tarball)?;
            std::fs::remove_dir_all(&x)?;
            return Ok(tarball);
        }
    }
    bail!("no .tar.xz in {}", usr_src.display())
}

/// virtio_balloon.c of a linux-source .deb, cached at `cached`.
fn balloon_c_of(deb: &Path, cached: &Path) -> anyhow::Result<Vec<u8>> {
    if let Ok(bytes) = std::fs::read(cached) {
        return Ok(bytes);
    }
    let parent = cached.parent().context("cache path has no parent")?;
    std::fs::create_dir_all(parent)?;
    let tmp = tempfile::tempdir_in(parent)?;
    let tarball = unpack_source_deb(deb, tmp.path())?;
    let out = Command::new("tar")
        .arg("-xJOf")
        .arg(&tarball)
        .arg("--wildcards")
        .arg(format!("*/{BALLOON_C}"))
        .output()
        .context("tar -xJOf (apt-get install xz-utils)")?;
    if !out.status.success() || out.stdout.is_empty() {
        bail!("no {BALLOON_C} in {}", deb.display());
    }
    std::fs::write(cached, &out.stdout)?;
    Ok(out.stdout)
}

/// A fresh build dir: the patched virtio_balloon.c as tier_balloon.c, and
/// our own files beside it.
fn stage(balloon_c: &[u8], series: &str, build: &Path) -> anyhow::Result<()> {
    let ours = run::workspace_root()?.join("vmm-patch/guests/linux-driver");
    if build.exists() {
        std::fs::remove_dir_all(build).with_context(|| format!("removing {}", build.display()))?;
    }
    std::fs::create_dir_all(build)?;
    let dst = build.join("tier_balloon.c");
    std::fs::write(&dst, balloon_c)?;
    let patch = ours.join(format!("virtio_balloon-{series}.patch"));
    run::status(
        Command::new("patch")
            .args(["--no-backup-if-mismatch", "-F0", "-s"])
            .arg(&dst)
            .arg(&patch),
    )
    .with_context(|| format!("{} does not apply (apt-get install patch)", patch.display()))?;
    for f in OWN_FILES {
        std::fs::copy(ours.join(f), build.join(f)).with_context(|| format!("copying {f}"))?;
    }
    Ok(())
}

/// `make M=build modules`, warnings as errors.
fn kbuild(kdir: &Path, build: &Path, extra: &[&str]) -> anyhow::Result<()> {
    run::status(
        Command::new("make")
            .arg("-C")
            .arg(kdir)
            .arg(format!("M={}", build.display()))
            .args(extra)
            .args(["KCFLAGS=-Werror", "-j2", "modules"]),
    )
    .context("building tier_balloon.ko")
}

fn copy_ko(build: &Path, ko: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(ko.parent().context("no parent")?)?;
    std::fs::copy(build.join("tier_balloon.ko"), ko)
        .with_context(|| format!("copying tier_balloon.ko to {}", ko.display()))?;
    Ok(())
}
