//! BPF objects: compiling them as profiler/build.rs does, and reading their
//! programs, extern symbols and CO-RE relocations.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Context, bail};

use crate::Result;
use crate::btf::{Btf, Kind};
use crate::core::{CoreRelo, parse_btf_ext};
use crate::elf::{Elf, STB_WEAK, STT_FUNC};

/// One program: a global FUNC symbol in an executable section other than .text.
#[derive(Debug, Clone)]
pub struct Program {
    pub name: String,
    pub section: String,
    /// Byte range of its instructions in the section.
    pub start: u64,
    pub end: u64,
    /// The program's BTF FUNC_PROTO in the object, if any.
    pub proto: Option<u32>,
}

/// An undefined symbol resolved by libbpf against the kernel (`__ksym`).
#[derive(Debug, Clone)]
pub struct Extern {
    pub name: String,
    pub weak: bool,
    /// A FUNC (kfunc) or a VAR (typed ksym) in the object's `.ksyms` DATASEC.
    pub is_func: bool,
    /// Its BTF id in the object (FUNC or VAR).
    pub btf_id: u32,
}

#[derive(Debug)]
pub struct Object {
    pub name: String,
    pub btf: Btf,
    pub programs: Vec<Program>,
    pub externs: Vec<Extern>,
    pub relos: Vec<CoreRelo>,
}

impl Object {
    /// Programs whose instructions contain `relo` (a relocation in .text
    /// belongs to a subprogram every program of the object may call).
    pub fn programs_of(&self, relo: &CoreRelo) -> Vec<&Program> {
        let off = u64::from(relo.insn_off);
        let exact: Vec<&Program> = self
            .programs
            .iter()
            .filter(|p| p.section == relo.section && p.start <= off && off < p.end)
            .collect();
        if exact.is_empty() {
            self.programs.iter().collect()
        } else {
            exact
        }
    }
}

/// Compiles `src` to `out` exactly as profiler/build.rs does through
/// libbpf-cargo's `SkeletonBuilder` (`-I bpf/include/x86_64 -Wall -O2`, then
/// its own `-I <libbpf headers> -fno-stack-protector -D__TARGET_ARCH_x86 -g
/// -O2 -target bpf -c`), plus `extra_includes`. clang is run here directly,
/// with the headers of the workspace's own libbpf-sys, so that xtask builds
/// without libelf: `cargo xtask deps` must run on a machine that has none.
pub fn compile(src: &Path, out: &Path, bpf_dir: &Path, extra_includes: &[PathBuf]) -> Result<()> {
    let headers = libbpf_headers()?;
    let mut cmd = Command::new("clang");
    cmd.arg("-I").arg(bpf_dir.join("include/x86_64"));
    cmd.args(["-Wall", "-O2"]);
    for dir in extra_includes {
        cmd.arg("-I").arg(dir);
    }
    cmd.arg("-I").arg(headers);
    cmd.args(["-fno-stack-protector", "-D__TARGET_ARCH_x86"]);
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // Written beside and renamed, so a concurrent run never reads half an object.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = out.with_extension(format!("o.{}.{seq}", std::process::id()));
    cmd.args(["-g", "-O2", "-target", "bpf", "-c"])
        .arg(src)
        .arg("-o")
        .arg(&tmp);
    let output = cmd.output().with_context(|| {
        format!(
            "running clang on {} (needs clang: `cargo xtask deps`)",
            src.display()
        )
    })?;
    if !output.status.success() {
        bail!(
            Tool,
            "compiling {}: clang {}: {}",
            src.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    std::fs::rename(&tmp, out).with_context(|| format!("renaming into {}", out.display()))
}

/// The ten API headers libbpf-cargo extracts from libbpf-sys
/// (`libbpf_sys::API_HEADERS`), copied once per process from the libbpf-sys
/// package that Cargo.lock pins into `<target>/xtask/libbpf-headers/bpf/`.
fn libbpf_headers() -> Result<PathBuf> {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    if let Some(dir) = DIR.get() {
        return Ok(dir.clone());
    }
    const API_HEADERS: [&str; 10] = [
        "bpf.h",
        "libbpf.h",
        "btf.h",
        "bpf_helpers.h",
        "bpf_helper_defs.h",
        "bpf_tracing.h",
        "bpf_endian.h",
        "bpf_core_read.h",
        "libbpf_common.h",
        "usdt.bpf.h",
    ];
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let meta = Command::new(cargo)
        .args(["metadata", "--format-version", "1"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .context("cargo metadata (for libbpf-sys's headers)")?;
    if !meta.status.success() {
        bail!(
            Tool,
            "cargo metadata: {}",
            String::from_utf8_lossy(&meta.stderr)
        );
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&meta.stdout).context("parsing cargo metadata")?;
    let manifest = meta["packages"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "libbpf-sys"))
        .and_then(|p| p["manifest_path"].as_str())
        .context("cargo metadata lists no libbpf-sys package")?;
    let from = Path::new(manifest)
        .parent()
        .context("libbpf-sys manifest has no parent")?
        .join("libbpf/src");
    let target = meta["target_directory"]
        .as_str()
        .context("cargo metadata has no target_directory")?;
    let root = Path::new(target).join("xtask/libbpf-headers");
    let dir = root.join("bpf");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for name in API_HEADERS {
        let src = from.join(name);
        let text = std::fs::read(&src).with_context(|| format!("reading {}", src.display()))?;
        // Same bytes: left alone, so a concurrent compile never reads a half-written header.
        let dst = dir.join(name);
        if std::fs::read(&dst).ok().as_deref() != Some(&text[..]) {
            let tmp = dst.with_extension(format!("h.{}", std::process::id()));
            std::fs::write(&tmp, &text).with_context(|| format!("writing {}", tmp.display()))?;
            std::fs::rename(&tmp, &dst).with_context(|| format!("renaming {}", dst.display()))?;
        }
    }
    Ok(DIR.get_or_init(|| root).clone())
}

/// Reads programs, `.ksyms` externs and CO-RE relocations of an object file.
pub fn read(name: &str, path: &Path) -> Result<Object> {
    let elf = Elf::read(path)?;
    let raw_btf = elf
        .section(".BTF")?
        .with_context(|| format!("{}: no .BTF section (compiled without -g?)", path.display()))?;
    let btf = Btf::parse(name, raw_btf, None)?;
    let relos = match elf.section(".BTF.ext")? {
        Some(ext) => {
            parse_btf_ext(ext, &btf).with_context(|| format!("{}: .BTF.ext", path.display()))?
        }
        None => Vec::new(),
    };
    let syms = elf.symbols()?;
    let mut programs = Vec::new();
    for s in &syms {
        let Some(sec) = elf.sections.get(usize::from(s.shndx)) else {
            continue;
        };
        // SHT_PROGBITS executable sections other than .text hold programs.
        if s.kind != STT_FUNC || s.bind == 0 || sec.name == ".text" || s.shndx == 0 {
            continue;
        }
        let proto = btf.own_named(&s.name).find_map(|id| match btf.ty(id).kind {
            Kind::Func { proto } => Some(proto),
            _ => None,
        });
        programs.push(Program {
            name: s.name.clone(),
            section: sec.name.clone(),
            start: s.value,
            end: s.value + s.size,
            proto,
        });
    }
    let mut externs = Vec::new();
    let ksyms = btf
        .own_named(".ksyms")
        .find(|id| matches!(btf.ty(*id).kind, Kind::Datasec { .. }));
    if let Some(ds) = ksyms
        && let Kind::Datasec { vars } = &btf.ty(ds).kind
    {
        for v in vars {
            let t = btf.ty(*v);
            let is_func = matches!(t.kind, Kind::Func { .. });
            // The ELF symbol tells weak from strong; it is undefined (shndx 0).
            let Some(sym) = syms.iter().find(|s| s.name == t.name && s.shndx == 0) else {
                continue;
            };
            externs.push(Extern {
                name: t.name.clone(),
                weak: sym.bind == STB_WEAK,
                is_func,
                btf_id: *v,
            });
        }
    }
    Ok(Object {
        name: name.to_string(),
        btf,
        programs,
        externs,
        relos,
    })
}
