//! Builds the test guest with the system C compiler and linker:
//! - `$OUT_DIR/tier-testguest.elf`, the freestanding PVH kernel (all of
//!   `guest/*.c` and `guest/boot.S`, linked by `guest/linker.ld`);
//! - `$OUT_DIR/libtgwire.a`, the guest's pure wire-format, command-line and
//!   Zipf code (`guest/proto.c`, `guest/cmdline.c`, `guest/zipf.c`) compiled
//!   for the host, plus
//!   `host/abi.c` (struct layouts), linked into this crate so that its
//!   tests exercise the code the guest runs.
//!
//! `CC` (default `cc`; gcc or clang), `LD` (default `ld`) and `AR` (default
//! `ar`) choose the tools.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::Command;

type Res<T> = Result<T, Box<dyn Error>>;

const GUEST_FLAGS: &[&str] = &[
    "-std=gnu11",
    "-O2",
    "-ffreestanding",
    "-fno-builtin",
    "-fno-pic",
    "-fno-pie",
    "-fno-stack-protector",
    "-fno-asynchronous-unwind-tables",
    "-mno-red-zone",
    "-mno-mmx",
    "-mno-sse",
    "-mno-sse2",
    "-mno-avx",
    "-mcmodel=small",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-nostdinc",
];

const HOST_FLAGS: &[&str] = &["-std=gnu11", "-O2", "-fPIC", "-Wall", "-Wextra", "-Werror"];

/// Host build: the guest's pure code (no guest dependencies, see
/// guest/proto.h and guest/cmdline.h) and the struct-layout probe.
const HOST_SOURCES: &[&str] = &[
    "guest/proto.c",
    "guest/cmdline.c",
    "guest/zipf.c",
    "host/abi.c",
];

fn run(cmd: &mut Command) -> Res<()> {
    let shown = format!("{cmd:?}");
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run `{shown}`: {e} (needs gcc or clang and binutils)"))?;
    if !status.success() {
        return Err(format!("`{shown}` failed ({status})").into());
    }
    Ok(())
}

fn tool(var: &str, default: &str) -> String {
    println!("cargo:rerun-if-env-changed={var}");
    std::env::var(var).unwrap_or_else(|_| default.to_string())
}

/// The compiler's own freestanding headers (stdint.h, stddef.h, stdarg.h).
fn compiler_include(cc: &str) -> Res<PathBuf> {
    let out = Command::new(cc)
        .arg("-print-file-name=include")
        .output()
        .map_err(|e| format!("cannot run `{cc}`: {e} (needs gcc or clang)"))?;
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !dir.join("stdint.h").is_file() {
        return Err(format!(
            "`{cc} -print-file-name=include` gave {}, which has no stdint.h",
            dir.display()
        )
        .into());
    }
    Ok(dir)
}

fn ext(p: &Path) -> &str {
    p.extension().and_then(|e| e.to_str()).unwrap_or("")
}

fn main() -> Res<()> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("cargo sets OUT_DIR")?);
    let guest = manifest.join("guest");
    let cc = tool("CC", "cc");
    let ld = tool("LD", "ld");
    let ar = tool("AR", "ar");

    let mut sources = Vec::new();
    for entry in std::fs::read_dir(&guest)? {
        let path = entry?.path();
        if matches!(ext(&path), "c" | "S" | "h" | "ld") {
            println!("cargo:rerun-if-changed={}", path.display());
            sources.push(path);
        }
    }
    sources.sort();
    println!("cargo:rerun-if-changed={}", guest.display());

    // The guest kernel.
    let include = compiler_include(&cc)?;
    let objdir = out.join("guest-obj");
    std::fs::create_dir_all(&objdir)?;
    let mut objects = Vec::new();
    for src in sources.iter().filter(|p| matches!(ext(p), "c" | "S")) {
        let name = src
            .file_name()
            .ok_or("source without a name")?
            .to_string_lossy();
        let obj = objdir.join(format!("{name}.o"));
        let mut cmd = Command::new(&cc);
        if ext(src) == "c" {
            cmd.args(GUEST_FLAGS).arg("-isystem").arg(&include);
        }
        run(cmd.arg("-c").arg(src).arg("-o").arg(&obj))?;
        objects.push(obj);
    }
    let elf = out.join("tier-testguest.elf");
    run(Command::new(&ld)
        .args([
            "-m",
            "elf_x86_64",
            "-nostdlib",
            "-static",
            "--build-id=none",
        ])
        .args(["-z", "noexecstack", "-T"])
        .arg(guest.join("linker.ld"))
        .arg("-o")
        .arg(&elf)
        .args(&objects))?;
    println!("cargo:rustc-env=TIER_TESTGUEST_ELF={}", elf.display());

    // The host build of the wire code.
    let hostdir = out.join("host-obj");
    std::fs::create_dir_all(&hostdir)?;
    let mut host_objects = Vec::new();
    for name in HOST_SOURCES {
        let src = manifest.join(name);
        println!("cargo:rerun-if-changed={}", src.display());
        let obj = hostdir.join(format!("{}.o", name.replace('/', "_")));
        run(Command::new(&cc)
            .args(HOST_FLAGS)
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(&obj))?;
        host_objects.push(obj);
    }
    let lib = out.join("libtgwire.a");
    if lib.exists() {
        std::fs::remove_file(&lib)?;
    }
    run(Command::new(&ar).arg("crs").arg(&lib).args(&host_objects))?;
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=tgwire");
    Ok(())
}
