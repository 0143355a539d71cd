//! `cargo xtask package`: a Debian package of tierd and tierctl, and an OCI
//! image of tierd for the DaemonSet (`oci.rs`), from one build.
//!
//! The .deb is staged here and packed by `dpkg-deb --build` (docs/packaging.md
//! says why not cargo-deb): every path, the conffile and the maintainer
//! scripts are in this file, and nothing is installed from crates.io.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::oci::{VERSION, gzip, shared_libs};
use crate::run;

/// Build the .deb (tierd, tierctl, man pages, completions, the systemd
/// unit, /etc/tierd/tierd.toml) and tierd's OCI image layout
/// (docs/packaging.md).
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct Args {
    /// Package the debug build (fast; for tests) instead of the release one.
    #[arg(long)]
    pub debug: bool,
    /// Output directory (default: <target>/package).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Writes `tierd_<version>_amd64.deb`, `oci/` and `tierd_<version>_oci.tar`.
pub fn run(o: Args) -> anyhow::Result<()> {
    let profile = if o.debug { "debug" } else { "release" };
    run::step("package", format!("building tierd and tierctl ({profile})"));
    let mut args = vec![
        "build",
        "-p",
        "tier-profiler",
        "-p",
        "tierctl",
        "--bin",
        "tierd",
        "--bin",
        "tierctl",
    ];
    if !o.debug {
        args.push("--release");
    }
    run::cargo(&args)?;
    let target = run::target_dir()?;
    let out = o.out.clone().unwrap_or_else(|| target.join("package"));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let root = out.join("deb-root");
    stage(&target.join(profile), &root)?;
    let deb = out.join(format!("tierd_{VERSION}_amd64.deb"));
    run::step("package", format!("dpkg-deb --build -> {}", deb.display()));
    // A debug build is for tests: fast compression (xz -6 of its 57 MB
    // took most of a minute), the release one as small as it gets.
    let level = if o.debug { "-z1" } else { "-z9" };
    run::status(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zxz", level, "--build"])
            .arg(&root)
            .arg(&deb),
    )
    .context("dpkg-deb (apt-get install dpkg)")?;
    let (oci, oci_tar) = crate::oci::build(&root.join("usr/bin"), &out, o.debug)?;
    for p in [&deb, &oci_tar] {
        let size = std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        println!("{} ({:.1} MiB)", p.display(), size as f64 / 1048576.0);
    }
    println!(
        "{} (OCI layout, tierd:{VERSION}; `skopeo copy oci:{}:{VERSION} docker://REGISTRY/tierd:{VERSION}`)",
        oci.display(),
        oci.display()
    );
    Ok(())
}

/// The package's tree under `root`, DEBIAN/ included; binaries from `bins`.
fn stage(bins: &Path, root: &Path) -> anyhow::Result<()> {
    if root.exists() {
        std::fs::remove_dir_all(root).with_context(|| format!("removing {}", root.display()))?;
    }
    let repo = run::workspace_root()?;
    for name in ["tierd", "tierctl"] {
        let dst = root.join("usr/bin").join(name);
        put(&dst, &std::fs::read(bins.join(name)).context(name)?, 0o755)?;
        // Line tables stay in target/; the package need not carry them.
        run::status(Command::new("strip").arg("--strip-debug").arg(&dst))
            .context("strip (binutils)")?;
        let man = output(&dst, &["man"])?;
        put(
            &root.join(format!("usr/share/man/man1/{name}.1.gz")),
            &gzip(&man, true)?,
            0o644,
        )?;
        for (shell, path) in [
            (
                "bash",
                format!("usr/share/bash-completion/completions/{name}"),
            ),
            ("zsh", format!("usr/share/zsh/vendor-completions/_{name}")),
            (
                "fish",
                format!("usr/share/fish/vendor_completions.d/{name}.fish"),
            ),
        ] {
            put(
                &root.join(path),
                &output(&dst, &["completions", shell])?,
                0o644,
            )?;
        }
    }
    let unit = std::fs::read_to_string(repo.join("profiler/deploy/systemd/tierd.service"))
        .context("reading the systemd unit")?;
    const EXEC: &str = "ExecStart=/usr/local/bin/tierd ";
    if unit.matches(EXEC).count() != 1 {
        bail!("the unit has no single `{EXEC}` line");
    }
    let unit = unit.replace(EXEC, "ExecStart=/usr/bin/tierd ");
    put(
        &root.join("usr/lib/systemd/system/tierd.service"),
        unit.as_bytes(),
        0o644,
    )?;
    let config = std::fs::read(repo.join("profiler/deploy/debian/tierd.toml"))
        .context("reading the default config")?;
    put(&root.join("etc/tierd/tierd.toml"), &config, 0o644)?;
    let doc = root.join("usr/share/doc/tierd");
    for (src, dst) in [
        ("README.md", "README.md"),
        ("docs/config.md", "config.md"),
        ("docs/grpc.md", "grpc.md"),
    ] {
        let text = std::fs::read(repo.join(src)).with_context(|| format!("reading {src}"))?;
        put(&doc.join(dst), &text, 0o644)?;
    }
    put(&doc.join("copyright"), COPYRIGHT.as_bytes(), 0o644)?;
    let depends = depends(&[&root.join("usr/bin/tierd"), &root.join("usr/bin/tierctl")])?;
    let control = control(&depends, installed_kib(root)?);
    let debian = root.join("DEBIAN");
    put(&debian.join("control"), control.as_bytes(), 0o644)?;
    put(&debian.join("conffiles"), b"/etc/tierd/tierd.toml\n", 0o644)?;
    put(&debian.join("postinst"), POSTINST.as_bytes(), 0o755)?;
    put(&debian.join("postrm"), POSTRM.as_bytes(), 0o755)?;
    Ok(())
}

const COPYRIGHT: &str = "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: tierd
Source: https://example.invalid/tierd

Files: *
License: Apache-2.0
 On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.
";

// The unit is not enabled or started: tierd samples every VM of the host,
// which the operator turns on (`systemctl enable --now tierd`).
const POSTINST: &str = "#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null || true
fi
";

const POSTRM: &str = "#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null || true
fi
if [ \"$1\" = purge ]; then
    rm -rf /var/lib/tierd
fi
";

fn control(depends: &str, kib: u64) -> String {
    format!(
        "Package: tierd
Version: {VERSION}
Architecture: amd64
Maintainer: tierd developers <tierd@example.invalid>
Installed-Size: {kib}
Depends: {depends}
Section: admin
Priority: optional
Homepage: https://example.invalid/tierd
Description: per-VM, per-memory-tier access sampling daemon
 tierd samples how each VM's memory accesses split across memory tiers
 (DRAM, PMEM, CXL, remote NUMA) from the host, with eBPF and the VMM's page
 tables, and streams per-VM, per-tier statistics over gRPC (tier.v1) and
 Prometheus; tierctl watches it. The systemd unit is installed but not
 enabled: systemctl enable --now tierd.
"
    )
}

/// Writes `data` to `path` (parents created) with `mode`.
fn put(path: &Path, data: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, data).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", path.display()))
}

/// stdout of `bin args`.
fn output(bin: &Path, args: &[&str]) -> anyhow::Result<Vec<u8>> {
    let o = Command::new(bin)
        .args(args)
        .output()
        .with_context(|| format!("running {} {}", bin.display(), args.join(" ")))?;
    if !o.status.success() {
        bail!("{} {} failed: {}", bin.display(), args.join(" "), o.status);
    }
    Ok(o.stdout)
}

/// `Depends:` from the Debian packages owning the libraries `bins` load;
/// libc6 at least at this machine's upstream version.
fn depends(bins: &[&Path]) -> anyhow::Result<String> {
    let mut pkgs = std::collections::BTreeSet::new();
    for lib in shared_libs(bins)? {
        let usr = Path::new("/usr").join(lib.strip_prefix("/").unwrap_or(&lib));
        let owner = [lib.clone(), usr]
            .iter()
            .find_map(|p| owner(p))
            .with_context(|| format!("no Debian package owns {}", lib.display()))?;
        pkgs.insert(owner);
    }
    let glibc = Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", "libc6"])
        .output()
        .context("dpkg-query libc6")?;
    let glibc = String::from_utf8_lossy(&glibc.stdout);
    let glibc = glibc.split('-').next().unwrap_or_default().to_string();
    Ok(pkgs
        .into_iter()
        .map(|p| match p.as_str() {
            "libc6" if !glibc.is_empty() => format!("libc6 (>= {glibc})"),
            _ => p,
        })
        .collect::<Vec<_>>()
        .join(", "))
}

fn owner(path: &Path) -> Option<String> {
    let o = Command::new("dpkg-query")
        .arg("-S")
        .arg(path)
        .output()
        .ok()?;
    if !o.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let pkg = text.lines().next()?.split(':').next()?.trim();
    Some(pkg.to_string())
}

/// Installed-Size: the staged files' sizes, KiB (DEBIAN/ excluded).
fn installed_kib(root: &Path) -> anyhow::Result<u64> {
    fn walk(dir: &Path, sum: &mut u64) -> anyhow::Result<()> {
        for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let e = e.context("a directory entry")?;
            let meta = e.metadata().context("metadata")?;
            if meta.is_dir() {
                walk(&e.path(), sum)?;
            } else {
                *sum += meta.len().div_ceil(1024);
            }
        }
        Ok(())
    }
    let mut sum = 0;
    walk(root, &mut sum)?;
    Ok(sum)
}
