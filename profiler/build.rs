//! Builds the BPF objects in ../bpf into libbpf-rs skeletons.

use std::error::Error;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const PROGRAMS: &[&str] = &["probe", "ept", "pmu"];

fn main() -> Result<(), Box<dyn Error>> {
    let bpf_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../bpf");
    let include = bpf_dir.join("include/x86_64");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("cargo sets OUT_DIR")?);
    for name in PROGRAMS {
        let src = bpf_dir.join(format!("{name}.bpf.c"));
        SkeletonBuilder::new()
            .source(&src)
            .clang_args([
                "-I".as_ref(),
                include.as_os_str(),
                "-Wall".as_ref(),
                "-O2".as_ref(),
            ])
            .build_and_generate(out.join(format!("{name}.skel.rs")))
            .map_err(|e| {
                format!(
                    "building {}: {e:#} (needs clang: `cargo xtask deps`)",
                    src.display()
                )
            })?;
        println!("cargo:rerun-if-changed={}", src.display());
    }
    println!("cargo:rerun-if-changed={}", include.display());
    println!(
        "cargo:rerun-if-changed={}",
        bpf_dir.join("tier_common.h").display()
    );
    println!(
        "cargo:rerun-if-changed={}",
        bpf_dir.join("pmu_data_src.h").display()
    );
    capability_cfgs();
    Ok(())
}

/// Tests that need a capability are compiled as ignored (with the reason)
/// where it is missing, so they are never counted as passed.
fn capability_cfgs() {
    println!("cargo:rustc-check-cfg=cfg(has_kvm)");
    println!("cargo:rerun-if-changed=/dev/kvm");
    let kvm = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm");
    if kvm.is_ok() {
        println!("cargo:rustc-cfg=has_kvm");
    }
    println!("cargo:rustc-check-cfg=cfg(has_page_idle)");
    if std::path::Path::new("/sys/kernel/mm/page_idle/bitmap").exists() {
        println!("cargo:rustc-cfg=has_page_idle");
    }
    // Reading PFNs and page flags needs CAP_SYS_ADMIN (root here).
    println!("cargo:rustc-check-cfg=cfg(has_kpageflags)");
    if std::fs::File::open("/proc/kpageflags").is_ok() {
        println!("cargo:rustc-cfg=has_kpageflags");
    }
    println!("cargo:rustc-check-cfg=cfg(has_thp)");
    println!("cargo:rerun-if-changed=/sys/kernel/mm/transparent_hugepage/enabled");
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if thp.contains("[always]") || thp.contains("[madvise]") {
        println!("cargo:rustc-cfg=has_thp");
    }
}
