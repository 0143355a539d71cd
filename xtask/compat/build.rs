//! Tests that need Debian's kernel packages (or this kernel's BTF) are
//! compiled as ignored, with the reason, where apt does not know them (not
//! Debian 12, or no package lists yet), so they are never counted as passed.

use std::process::Command;

fn main() {
    println!("cargo:rustc-check-cfg=cfg(debian_kernels)");
    println!("cargo:rustc-check-cfg=cfg(host_btf)");
    if std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        println!("cargo:rustc-cfg=host_btf");
    }
    // apt-get update rewrites the lists: look again then.
    println!("cargo:rerun-if-changed=/var/lib/apt/lists");
    let names = Command::new("apt-cache")
        .args(["pkgnames", "linux-image-6."])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let known = |prefix: &str| names.lines().any(|l| l.starts_with(prefix));
    if known("linux-image-6.1.0-") && known("linux-image-6.12.") {
        println!("cargo:rustc-cfg=debian_kernels");
    }
}
