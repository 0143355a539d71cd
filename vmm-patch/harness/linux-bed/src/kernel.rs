//! A Debian kernel package unpacked for booting: its vmlinuz and the
//! modules the bed loads, with their dependencies (`modinfo -F depends`:
//! Debian ships no modules.dep, depmod makes it at install), decompressed
//! for busybox `insmod` (6.12 ships `.ko.xz`).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{BedError, io};

/// Modules the bed loads in every guest, in this order after their
/// dependencies: the virtio transport where it is a module (6.1), the two
/// memory devices, and kvm (for its BTF and `kvm_age_gfn`, which tierd's
/// BPF programs attach to; no vendor module loads under TCG).
pub const MODULES: &[&str] = &["virtio_pci", "virtio_mem", "virtio_balloon", "kvm"];

/// One unpacked kernel package.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// e.g. `6.12.117+deb12-cloud-amd64` (`uname -r` in the guest).
    pub release: String,
    pub vmlinuz: PathBuf,
    /// `lib/modules/<release>`.
    pub modules: PathBuf,
    pub config: PathBuf,
}

impl Kernel {
    /// The kernel unpacked (`dpkg-deb -x`) under `root`.
    pub fn unpacked(root: &Path) -> Result<Kernel, BedError> {
        let mods = root.join("lib/modules");
        let release = std::fs::read_dir(&mods)
            .map_err(io(format!("reading {}", mods.display())))?
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .next()
            .ok_or_else(|| BedError::Kernel(format!("no release under {}", mods.display())))?;
        let vmlinuz = root.join(format!("boot/vmlinuz-{release}"));
        if !vmlinuz.exists() {
            return Err(BedError::Kernel(format!("{} missing", vmlinuz.display())));
        }
        Ok(Kernel {
            config: root.join(format!("boot/config-{release}")),
            modules: mods.join(&release),
            vmlinuz,
            release,
        })
    }

    /// `6.1` or `6.12` (major.minor of the release).
    pub fn series(&self) -> String {
        self.release
            .split('.')
            .take(2)
            .collect::<Vec<_>>()
            .join(".")
    }

    /// Whether the kernel config sets `key` (`y` or `m`).
    pub fn config_on(&self, key: &str) -> bool {
        std::fs::read_to_string(&self.config).is_ok_and(|c| {
            c.lines()
                .any(|l| l == format!("{key}=y") || l == format!("{key}=m"))
        })
    }

    /// The `.ko`/`.ko.xz` file of module `name`, if the package has it
    /// (absent: built in, or not built).
    pub fn module_file(&self, name: &str) -> Option<PathBuf> {
        let want = name.replace('-', "_");
        find(&self.modules.join("kernel"), &|p: &Path| {
            let f = p.file_name().map(|f| f.to_string_lossy().replace('-', "_"));
            f.is_some_and(|f| f == format!("{want}.ko") || f == format!("{want}.ko.xz"))
        })
    }

    /// `names` and what they depend on, dependencies first, each once;
    /// names the package does not have are built in and skipped.
    pub fn with_dependencies(&self, names: &[&str]) -> Result<Vec<(String, PathBuf)>, BedError> {
        let mut out: Vec<(String, PathBuf)> = Vec::new();
        for n in names {
            self.visit(n, &mut out, 0)?;
        }
        Ok(out)
    }

    fn visit(
        &self,
        name: &str,
        out: &mut Vec<(String, PathBuf)>,
        depth: usize,
    ) -> Result<(), BedError> {
        if depth > 16 {
            return Err(BedError::Kernel(format!(
                "module dependency loop at {name}"
            )));
        }
        if out.iter().any(|(n, _)| n == name) {
            return Ok(());
        }
        let Some(file) = self.module_file(name) else {
            return Ok(());
        };
        let o = Command::new("modinfo")
            .args(["-F", "depends"])
            .arg(&file)
            .output()
            .map_err(io("running modinfo (kmod)"))?;
        if !o.status.success() {
            return Err(BedError::Kernel(format!(
                "modinfo {}: {}",
                file.display(),
                String::from_utf8_lossy(&o.stderr).trim()
            )));
        }
        for dep in String::from_utf8_lossy(&o.stdout)
            .trim()
            .split(',')
            .filter(|d| !d.is_empty())
        {
            self.visit(dep, out, depth + 1)?;
        }
        if !out.iter().any(|(n, _)| n == name) {
            out.push((name.to_string(), file));
        }
        Ok(())
    }
}

fn find(dir: &Path, want: &dyn Fn(&Path) -> bool) -> Option<PathBuf> {
    let rd = std::fs::read_dir(dir).ok()?;
    let mut subdirs = Vec::new();
    for e in rd.filter_map(Result::ok) {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            subdirs.push(p);
        } else if want(&p) {
            return Some(p);
        }
    }
    subdirs.into_iter().find_map(|d| find(&d, want))
}

/// The unpacked kernel of `series` ("6.1", "6.12") among the roots in
/// `TIERD_BED_KERNELS` (colon-separated; `cargo xtask test` sets it), or
/// why there is none: what the bed's tests need, in every crate.
pub fn from_env(series: &str) -> Result<Kernel, String> {
    let list = std::env::var("TIERD_BED_KERNELS").map_err(|_| {
        "TIERD_BED_KERNELS unset (cargo xtask test unpacks Debian's kernels and sets it)"
            .to_string()
    })?;
    list.split(':')
        .filter(|p| !p.is_empty())
        .filter_map(|p| Kernel::unpacked(Path::new(p)).ok())
        .find(|k| k.series() == series)
        .ok_or_else(|| format!("no {series} kernel in TIERD_BED_KERNELS={list}"))
}

/// Writes module `file` to `dest` uncompressed (busybox insmod reads no xz).
pub fn decompress_module(file: &Path, dest: &Path) -> Result<(), BedError> {
    if file.extension().is_some_and(|e| e == "xz") {
        let o = Command::new("xz")
            .args(["-dc"])
            .arg(file)
            .output()
            .map_err(io("running xz (xz-utils)"))?;
        if !o.status.success() {
            return Err(BedError::Kernel(format!("xz -dc {}", file.display())));
        }
        std::fs::write(dest, o.stdout).map_err(io(format!("writing {}", dest.display())))
    } else {
        std::fs::copy(file, dest)
            .map(drop)
            .map_err(io(format!("copying {}", file.display())))
    }
}
