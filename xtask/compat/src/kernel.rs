//! Debian kernel packages: choosing them from apt, downloading the .debs
//! (cached), and extracting what the checks need: vmlinux's BTF (from the
//! compressed bzImage, like scripts/extract-vmlinux), the kvm modules' split
//! BTF, and the kernel config.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use crate::error::{Context, bail};

use crate::Result;
use crate::btf::{Btf, KernelBtf};
use crate::elf::Elf;

/// Modules whose split BTF is searched after vmlinux, in this order.
pub const KVM_MODULES: [&str; 3] = ["kvm", "kvm-intel", "kvm-amd"];

/// One kernel, ready to check.
#[derive(Debug)]
pub struct Kernel {
    pub package: String,
    pub btf: KernelBtf,
    /// CONFIG_* -> value ("y", "m", a string; absent = not set).
    pub config: BTreeMap<String, String>,
}

impl Kernel {
    pub fn config_on(&self, key: &str) -> bool {
        matches!(self.config.get(key).map(String::as_str), Some("y" | "m"))
    }

    /// The config value as the report shows it.
    pub fn config_value(&self, key: &str) -> &str {
        self.config.get(key).map_or("n", String::as_str)
    }
}

/// Newest `linux-image-6.1.0-NN-{amd64,cloud-amd64}` and
/// `linux-image-6.12.NN+deb12-{amd64,cloud-amd64}` known to apt, from its
/// local package lists (`apt-get update` refreshes them).
pub fn default_packages() -> Result<Vec<String>> {
    let out = Command::new("apt-cache")
        .args(["pkgnames", "linux-image-6.1"])
        .output()
        .context("running apt-cache pkgnames (Debian/Ubuntu only)")?;
    if !out.status.success() {
        bail!(
            Tool,
            "apt-cache pkgnames failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(newest(&String::from_utf8_lossy(&out.stdout)))
}

/// Picks the newest of each (series, flavour) from package names.
pub fn newest(names: &str) -> Vec<String> {
    let mut best: BTreeMap<(&str, &str), (u32, String)> = BTreeMap::new();
    for name in names.lines().map(str::trim) {
        for flavour in ["cloud-amd64", "amd64"] {
            let Some(stem) = name.strip_suffix(flavour).and_then(|s| s.strip_suffix('-')) else {
                continue;
            };
            // 6.1: linux-image-6.1.0-NN ; 6.12: linux-image-6.12.NN+deb12
            let (series, n) = if let Some(n) = stem.strip_prefix("linux-image-6.1.0-") {
                ("6.1", n)
            } else if let Some(n) = stem
                .strip_prefix("linux-image-6.12.")
                .and_then(|s| s.strip_suffix("+deb12"))
            {
                ("6.12", n)
            } else {
                continue;
            };
            let Ok(n) = n.parse::<u32>() else { continue };
            let e = best
                .entry((series, flavour))
                .or_insert((n, name.to_string()));
            if n > e.0 {
                *e = (n, name.to_string());
            }
            break;
        }
    }
    best.into_values().map(|(_, n)| n).collect()
}

/// Package names of the .debs already in `cache` (offline mode).
pub fn cached_packages(cache: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    let dir = match std::fs::read_dir(cache) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(names),
        Err(e) => return Err(e).with_context(|| format!("reading {}", cache.display())),
    };
    for entry in dir {
        let name = entry
            .with_context(|| format!("reading {}", cache.display()))?
            .file_name();
        let name = name.to_string_lossy();
        if let Some((pkg, _)) = name.strip_suffix(".deb").and_then(|n| n.split_once('_'))
            && pkg.starts_with("linux-image-")
        {
            names.push(pkg.to_string());
        }
    }
    names.sort();
    Ok(names)
}

/// The cached .deb of `pkg`, if any.
fn cached_deb(cache: &Path, pkg: &str) -> Result<Option<PathBuf>> {
    let prefix = format!("{pkg}_");
    let Ok(dir) = std::fs::read_dir(cache) else {
        return Ok(None);
    };
    for entry in dir {
        let path = entry
            .with_context(|| format!("reading {}", cache.display()))?
            .path();
        let file = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        if file.starts_with(&prefix) && file.ends_with(".deb") {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

/// The .deb of `pkg`: from the cache, or `apt-get download` into it
/// (`progress` hears of it first: a download takes a while).
pub fn fetch(
    cache: &Path,
    pkg: &str,
    offline: bool,
    progress: &mut dyn FnMut(String),
) -> Result<PathBuf> {
    if let Some(deb) = cached_deb(cache, pkg)? {
        return Ok(deb);
    }
    if offline {
        bail!(Missing, "--offline: no {pkg}_*.deb in {}", cache.display());
    }
    std::fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    progress(format!("apt-get download {pkg}"));
    let out = Command::new("apt-get")
        .args(["download", "-q", pkg])
        .current_dir(cache)
        .output()
        .context("running apt-get download")?;
    if !out.status.success() {
        bail!(
            Tool,
            "apt-get download {pkg} failed (stale lists? `apt-get update`): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    cached_deb(cache, pkg)?.with_context(|| format!("apt-get download {pkg} left no .deb"))
}

/// Extracts (once) the BTF blobs and config of `deb` into `dir`.
pub fn extract(deb: &Path, dir: &Path) -> Result<()> {
    if dir.join("done").exists() {
        return Ok(());
    }
    let parent = dir.parent().context("kernel dir has no parent")?;
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    // Built in a private directory and renamed into place, so a concurrent
    // run (another test, another shell) never sees half a kernel.
    let staging = tempfile::tempdir_in(parent).context("creating a staging directory")?;
    let out = staging.path();
    let tmp = out.join("deb");
    let dpkg = Command::new("dpkg-deb")
        .arg("-x")
        .arg(deb)
        .arg(&tmp)
        .output()
        .context("running dpkg-deb -x (apt-get install dpkg)")?;
    if !dpkg.status.success() {
        bail!(
            Tool,
            "dpkg-deb -x {} failed: {}",
            deb.display(),
            String::from_utf8_lossy(&dpkg.stderr).trim()
        );
    }
    let boot = tmp.join("boot");
    let vmlinuz = find_prefixed(&boot, "vmlinuz-")?;
    let config = find_prefixed(&boot, "config-")?;
    std::fs::copy(&config, out.join("config")).context("copying the config")?;
    let image =
        std::fs::read(&vmlinuz).with_context(|| format!("reading {}", vmlinuz.display()))?;
    let vmlinux = vmlinux_of(&image)
        .with_context(|| format!("extracting vmlinux from {}", vmlinuz.display()))?;
    write_btf(vmlinux, &out.join("vmlinux.btf"), "vmlinux")?;
    let modules = tmp.join("lib/modules");
    let release = std::fs::read_dir(&modules)
        .with_context(|| format!("reading {}", modules.display()))?
        .next()
        .context("no lib/modules/<release> in the package")?
        .context("reading lib/modules")?
        .path();
    let kvm_dir = release.join("kernel/arch/x86/kvm");
    for m in KVM_MODULES {
        let Some(ko) = module_bytes(&kvm_dir, m)? else {
            continue; // built in, or absent: vmlinux's BTF then has it
        };
        write_btf(ko, &out.join(format!("{m}.btf")), m)?;
    }
    std::fs::remove_dir_all(&tmp).with_context(|| format!("removing {}", tmp.display()))?;
    std::fs::write(out.join("done"), deb.display().to_string()).context("writing done")?;
    if dir.exists() && !dir.join("done").exists() {
        // Left over by an interrupted run of an older layout.
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    let kept = staging.keep();
    if let Err(e) = std::fs::rename(&kept, dir) {
        std::fs::remove_dir_all(&kept).with_context(|| format!("removing {}", kept.display()))?;
        if !dir.join("done").exists() {
            return Err(e).with_context(|| format!("renaming into {}", dir.display()));
        }
    }
    Ok(())
}

fn find_prefixed(dir: &Path, prefix: &str) -> Result<PathBuf> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry
            .with_context(|| format!("reading {}", dir.display()))?
            .path();
        if path
            .file_name()
            .is_some_and(|f| f.to_string_lossy().starts_with(prefix))
        {
            return Ok(path);
        }
    }
    bail!(Missing, "no {prefix}* in {}", dir.display())
}

/// Writes the `.BTF` section of an ELF file (vmlinux or a module).
fn write_btf(elf: Vec<u8>, out: &Path, what: &str) -> Result<()> {
    let elf = Elf::parse(elf).with_context(|| format!("parsing {what}"))?;
    let btf = elf
        .section(".BTF")?
        .with_context(|| format!("{what} has no .BTF section (CONFIG_DEBUG_INFO_BTF off?)"))?;
    std::fs::write(out, btf).with_context(|| format!("writing {}", out.display()))
}

/// A module's ELF bytes, decompressing `.ko.xz` / `.ko.zst`.
fn module_bytes(dir: &Path, name: &str) -> Result<Option<Vec<u8>>> {
    let plain = dir.join(format!("{name}.ko"));
    if plain.exists() {
        return std::fs::read(&plain)
            .map(Some)
            .with_context(|| format!("reading {}", plain.display()));
    }
    for (ext, tool) in [("xz", "xz"), ("zst", "zstd")] {
        let packed = dir.join(format!("{name}.ko.{ext}"));
        if packed.exists() {
            let out = Command::new(tool)
                .arg("-dc")
                .arg(&packed)
                .output()
                .with_context(|| format!("running {tool} (apt-get install xz-utils zstd)"))?;
            if !out.status.success() {
                bail!(Tool, "{tool} -dc {} failed", packed.display());
            }
            return Ok(Some(out.stdout));
        }
    }
    Ok(None)
}

/// vmlinux from a bzImage: try each compression magic found in the file,
/// as scripts/extract-vmlinux does, until the output is an ELF file.
pub fn vmlinux_of(image: &[u8]) -> Result<Vec<u8>> {
    // (magic, decompressor): lz4 legacy frame (6.1), zstd (6.12), xz, gzip.
    const METHODS: [(&[u8], &str, &[&str]); 4] = [
        (b"\x02\x21\x4c\x18", "lz4", &["-dc"]),
        (b"\x28\xb5\x2f\xfd", "zstd", &["-dc"]),
        (b"\xfd7zXZ\x00", "xz", &["-dc"]),
        (b"\x1f\x8b\x08", "gzip", &["-dc"]),
    ];
    let tmp = tempfile::NamedTempFile::new().context("creating a temporary file")?;
    for (magic, tool, args) in METHODS {
        let mut from = 0;
        while let Some(pos) = image[from..].windows(magic.len()).position(|w| w == magic) {
            let at = from + pos;
            from = at + 1;
            std::fs::write(tmp.path(), &image[at..]).context("writing the payload")?;
            let input = std::fs::File::open(tmp.path()).context("reopening the payload")?;
            // Trailing data after the stream makes the tool exit non-zero:
            // the output decides, as in extract-vmlinux.
            let out = Command::new(tool)
                .args(args)
                .stdin(Stdio::from(input))
                .stderr(Stdio::null())
                .output()
                .with_context(|| format!("running {tool} (cargo xtask deps installs it)"))?;
            if out.stdout.starts_with(b"\x7fELF") {
                return Ok(out.stdout);
            }
        }
    }
    bail!(
        Format,
        "no lz4/zstd/xz/gzip payload that decompresses to an ELF file"
    )
}

/// Loads an extracted kernel.
pub fn load(package: &str, dir: &Path) -> Result<Kernel> {
    let read = |f: &str| {
        let p = dir.join(f);
        std::fs::read(&p).with_context(|| format!("reading {}", p.display()))
    };
    let vmlinux = Arc::new(Btf::parse("vmlinux", &read("vmlinux.btf")?, None)?);
    let mut modules = Vec::new();
    for m in KVM_MODULES {
        if dir.join(format!("{m}.btf")).exists() {
            modules.push(Btf::parse(
                m,
                &read(&format!("{m}.btf"))?,
                Some(vmlinux.clone()),
            )?);
        }
    }
    let text = String::from_utf8_lossy(&read("config")?).into_owned();
    Ok(Kernel {
        package: package.to_string(),
        btf: KernelBtf { vmlinux, modules },
        config: parse_config(&text),
    })
}

/// `CONFIG_X=v` lines; `# CONFIG_X is not set` and absent keys are both "off".
pub fn parse_config(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|l| l.starts_with("CONFIG_"))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
        .collect()
}
