//! Checks BPF objects offline against real Debian kernels: CO-RE
//! relocations, kfuncs and attach targets resolved against each kernel's
//! BTF as libbpf would, and the capabilities that follow (docs/compat.md).
//! `cargo xtask compat` drives it.

pub mod attach;
pub mod btf;
pub mod caps;
pub mod check;
pub mod core;
pub mod elf;
mod error;
pub mod kernel;
pub mod object;
pub mod report;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_debian;
pub mod types;

use std::path::{Path, PathBuf};

use error::{Context, bail};
pub use error::{Error, Result};
pub use report::KernelReport;

/// The objects profiler/build.rs builds.
pub const OBJECTS: [&str; 3] = ["probe", "ept", "pmu"];

#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Packages to check; empty: the newest 6.1 and 6.12 (amd64, cloud) in apt.
    pub kernels: Vec<String>,
    /// Where the .debs are kept (default `<work>/debs`).
    pub cache: Option<PathBuf>,
    /// Use only the cache.
    pub offline: bool,
}

/// Where a run reads and writes.
#[derive(Debug, Clone)]
pub struct Dirs {
    /// The project's `bpf/` (the objects' sources and headers).
    pub bpf: PathBuf,
    /// Scratch space kept between runs: .debs, extracted kernels, objects
    /// (`<target>/compat`).
    pub work: PathBuf,
}

impl Dirs {
    /// The extracted kernel of `package`, as [`check_all`] leaves it.
    pub fn kernel(&self, package: &str) -> PathBuf {
        self.work.join("kernels").join(package)
    }
}

/// What a run found.
#[derive(Debug)]
pub struct Summary {
    pub kernels: Vec<KernelReport>,
    pub notes: Vec<String>,
}

impl Summary {
    pub fn load_failures(&self) -> usize {
        self.kernels.iter().map(KernelReport::load_failures).sum()
    }

    pub fn result_line(&self) -> String {
        format!(
            "RESULT kernels={} load_failures={}",
            self.kernels.len(),
            self.load_failures()
        )
    }
}

/// Fetches and extracts the kernels, compiles the objects, checks each
/// pair; `progress` hears each step before it starts.
pub fn check_all(opts: &Options, dirs: &Dirs, progress: &mut dyn FnMut(String)) -> Result<Summary> {
    let cache = opts.cache.clone().unwrap_or_else(|| dirs.work.join("debs"));
    let mut notes = Vec::new();
    let packages = if !opts.kernels.is_empty() {
        opts.kernels.clone()
    } else if opts.offline {
        let cached = kernel::cached_packages(&cache)?;
        if cached.is_empty() {
            bail!(
                Missing,
                "--offline: no linux-image-*.deb in {}; run once without --offline (or pass --cache DIR)",
                cache.display()
            );
        }
        cached
    } else {
        kernel::default_packages()?
    };
    if packages.is_empty() {
        bail!(
            Missing,
            "apt knows no linux-image-6.1.0-NN-amd64 or 6.12 package (run `apt-get update`)"
        );
    }
    if !packages.iter().any(|p| p.starts_with("linux-image-6.12")) {
        notes.push("no linux-image-6.12.* kernel in this machine's apt sources or the list".into());
    }
    progress(format!("compiling bpf/{{{}}}.bpf.c", OBJECTS.join(",")));
    let objects = compile_objects(&dirs.bpf, &dirs.work.join("obj"))?;
    let mut kernels = Vec::new();
    for pkg in &packages {
        let deb = kernel::fetch(&cache, pkg, opts.offline, progress)?;
        let dir = dirs.kernel(pkg);
        progress(format!("extracting and checking {pkg}"));
        kernel::extract(&deb, &dir).with_context(|| format!("extracting {}", deb.display()))?;
        let k = kernel::load(pkg, &dir).with_context(|| format!("loading {pkg}"))?;
        kernels.push(check_kernel(&objects, &k)?);
    }
    Ok(Summary { kernels, notes })
}

/// Every object against one kernel, and the capabilities that follow.
pub fn check_kernel(objects: &[object::Object], k: &kernel::Kernel) -> Result<KernelReport> {
    let reports = objects
        .iter()
        .map(|o| check::check_object(o, k).with_context(|| format!("{} on {}", o.name, k.package)))
        .collect::<Result<Vec<_>>>()?;
    let caps = caps::derive(k, &reports);
    Ok(KernelReport {
        package: k.package.clone(),
        objects: reports,
        caps,
    })
}

/// `bpf/{probe,ept,pmu}.bpf.c` -> `out/NAME.bpf.o`, read back.
pub fn compile_objects(bpf: &Path, out: &Path) -> Result<Vec<object::Object>> {
    OBJECTS
        .iter()
        .map(|name| {
            let obj = out.join(format!("{name}.bpf.o"));
            object::compile(&bpf.join(format!("{name}.bpf.c")), &obj, bpf, &[])?;
            object::read(name, &obj)
        })
        .collect()
}
