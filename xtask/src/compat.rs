//! `cargo xtask compat`: checks every BPF object of the project, offline,
//! against real Debian kernels (docs/compat.md).

mod attach;
mod btf;
mod caps;
mod check;
mod core;
mod elf;
pub(crate) mod kernel;
mod object;
mod report;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_debian;
mod types;

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

pub use report::KernelReport;

/// The objects profiler/build.rs builds.
pub const OBJECTS: [&str; 3] = ["probe", "ept", "pmu"];

#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Packages to check; empty: the newest 6.1 and 6.12 (amd64, cloud) in apt.
    pub kernels: Vec<String>,
    /// Where the .debs are kept (default `<target>/compat/debs`).
    pub cache: Option<PathBuf>,
    /// Use only the cache.
    pub offline: bool,
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

/// `cargo xtask compat`: prints the matrix, writes docs/compat.md, ends with
/// the RESULT line; fails on load failures unless `report_only`.
pub fn run(opts: &Options, report_only: bool) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let summary = check_all(opts)?;
    for n in &summary.notes {
        println!("note: {n}");
    }
    print!("{}", report::matrix(&summary.kernels));
    let result = summary.result_line();
    let doc = crate::run::workspace_root()?.join("docs/compat.md");
    std::fs::write(
        &doc,
        report::document(&summary.kernels, &summary.notes, &result),
    )
    .with_context(|| format!("writing {}", doc.display()))?;
    eprintln!(
        "compat: wrote {} in {:.1}s",
        doc.display(),
        started.elapsed().as_secs_f64()
    );
    println!("{result}");
    if summary.load_failures() > 0 && !report_only {
        bail!(
            "{} (object, kernel) pairs libbpf would refuse",
            summary.load_failures()
        );
    }
    Ok(())
}

/// Fetches and extracts the kernels, compiles the objects, checks each pair.
pub fn check_all(opts: &Options) -> anyhow::Result<Summary> {
    let target = crate::run::target_dir()?.join("compat");
    let cache = opts.cache.clone().unwrap_or_else(|| target.join("debs"));
    let mut notes = Vec::new();
    let packages = if !opts.kernels.is_empty() {
        opts.kernels.clone()
    } else if opts.offline {
        let cached = kernel::cached_packages(&cache)?;
        if cached.is_empty() {
            bail!(
                "--offline: no linux-image-*.deb in {}; run once without --offline (or pass --cache DIR)",
                cache.display()
            );
        }
        cached
    } else {
        kernel::default_packages()?
    };
    if packages.is_empty() {
        bail!("apt knows no linux-image-6.1.0-NN-amd64 or 6.12 package (run `apt-get update`)");
    }
    if !packages.iter().any(|p| p.starts_with("linux-image-6.12")) {
        notes.push("no linux-image-6.12.* kernel in this machine's apt sources or the list".into());
    }
    crate::run::step(
        "compat",
        format!("compiling bpf/{{{}}}.bpf.c", OBJECTS.join(",")),
    );
    let objects = compile_objects(&target.join("obj"))?;
    let mut kernels = Vec::new();
    for pkg in &packages {
        let deb = kernel::fetch(&cache, pkg, opts.offline)?;
        let dir = target.join("kernels").join(pkg);
        crate::run::step("compat", format!("extracting and checking {pkg}"));
        kernel::extract(&deb, &dir).with_context(|| format!("extracting {}", deb.display()))?;
        let k = kernel::load(pkg, &dir).with_context(|| format!("loading {pkg}"))?;
        kernels.push(check_kernel(&objects, &k)?);
    }
    Ok(Summary { kernels, notes })
}

fn check_kernel(objects: &[object::Object], k: &kernel::Kernel) -> anyhow::Result<KernelReport> {
    let reports = objects
        .iter()
        .map(|o| check::check_object(o, k).with_context(|| format!("{} on {}", o.name, k.package)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let caps = caps::derive(k, &reports);
    Ok(KernelReport {
        package: k.package.clone(),
        objects: reports,
        caps,
    })
}

/// bpf/{probe,ept,pmu}.bpf.c -> `out/NAME.bpf.o`, read back.
fn compile_objects(out: &Path) -> anyhow::Result<Vec<object::Object>> {
    let bpf = crate::run::workspace_root()?.join("bpf");
    OBJECTS
        .iter()
        .map(|name| {
            let obj = out.join(format!("{name}.bpf.o"));
            object::compile(&bpf.join(format!("{name}.bpf.c")), &obj, &bpf, &[])?;
            object::read(name, &obj)
        })
        .collect()
}
