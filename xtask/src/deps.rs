//! `cargo xtask deps`: the Debian packages the build and the tests need.

use std::process::Command;

use anyhow::{Context, bail};

/// Package and why it is needed.
pub const PACKAGES: &[(&str, &str)] = &[
    ("clang", "compiles bpf/*.bpf.c"),
    ("llvm", "llvm-strip for BPF objects"),
    ("libelf-dev", "libbpf-sys links libelf"),
    ("zlib1g-dev", "libbpf-sys links zlib"),
    ("pkg-config", "libbpf-sys finds libelf and zlib"),
    ("make", "libbpf-sys builds the vendored libbpf"),
    (
        "tmux",
        "terminal tests of tierctl top and bench progress bars",
    ),
    ("binutils", "as/objcopy check the demo guest's machine code"),
    ("bpftool", "cargo xtask vmlinux regenerates vmlinux.h"),
    (
        "clang-format-14",
        "cargo xtask test checks bpf/ against bpf/.clang-format",
    ),
    (
        "flex",
        "cargo xtask linux-driver: UML kernel modules_prepare",
    ),
    (
        "bison",
        "cargo xtask linux-driver: UML kernel modules_prepare",
    ),
    ("bc", "cargo xtask linux-driver: UML kernel modules_prepare"),
    (
        "patch",
        "cargo xtask linux-driver applies virtio_balloon-*.patch",
    ),
    (
        "gcc-12",
        "cargo xtask linux-driver: Debian's headers build with gcc-12",
    ),
    (
        "lz4",
        "cargo xtask compat: vmlinux in Debian 6.1's vmlinuz is lz4",
    ),
    (
        "zstd",
        "cargo xtask compat: vmlinux in Debian 6.12's vmlinuz is zstd",
    ),
    (
        "xz-utils",
        "cargo xtask compat: Debian 6.12 ships kvm*.ko.xz; bench twin reads benches/traces/*.pgs.xz",
    ),
    (
        "user-mode-linux",
        "a real Linux 6.1 guest for tier-balloon (cargo xtask uml, tests)",
    ),
    (
        "kmod",
        "insmod in the user-mode-linux guest; modinfo for the Linux bed",
    ),
    (
        "qemu-system-x86",
        "the Linux bed: Debian's kernels under QEMU TCG (cargo xtask linux-bed, tests)",
    ),
    ("busybox-static", "the Linux bed's initramfs"),
    (
        "redis-server",
        "bench fidelity --source linux: redis-server as a guest workload",
    ),
    (
        "redis-tools",
        "bench fidelity --source linux: redis-benchmark drives redis-server in the guest",
    ),
    (
        "stress-ng",
        "bench fidelity --source linux: stress-ng --vm as a guest workload",
    ),
    (
        "sysbench",
        "bench fidelity --source linux: sysbench memory as a guest workload",
    ),
    (
        "numactl",
        "bench fidelity --source linux: places guest workloads on both NUMA nodes",
    ),
    ("cpio", "the Linux bed's initramfs"),
    ("gcc", "the Linux bed's TCG plugin (tier_truth.so)"),
    (
        "libglib2.0-dev",
        "the Linux bed's TCG plugin includes QEMU's plugin header, which needs glib",
    ),
    (
        "prometheus",
        "promtool and a real Prometheus check tierd's metrics, rules and dashboard",
    ),
    (
        "systemd",
        "tests: systemd-analyze verify checks profiler/deploy/systemd/tierd.service",
    ),
];

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Install the Debian packages the build and tests need (idempotent).
#[derive(Debug, PartialEq, clap::Args)]
pub struct Args {
    /// Only report what is missing; install nothing.
    #[arg(long)]
    pub check: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    ensure(args.check)
}

/// Installs what is missing (or, with `check_only`, reports it).
pub fn ensure(check_only: bool) -> anyhow::Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| !installed(p))
        .collect();
    if missing.is_empty() {
        eprintln!("deps: all {} packages present", PACKAGES.len());
        ensure_components()?;
        return ensure_grpcurl(check_only);
    }
    for (p, why) in PACKAGES.iter().filter(|(p, _)| missing.contains(p)) {
        eprintln!("deps: missing {p:12} ({why})");
    }
    let line = format!(
        "apt-get install -y --no-install-recommends {}",
        missing.join(" ")
    );
    if check_only {
        bail!("missing packages; install them with: {line}");
    }
    if !is_root() {
        bail!(
            "not root: install the packages yourself with `sudo apt-get update && sudo {line}`, then run again"
        );
    }
    eprintln!("deps: installing {}", missing.join(" "));
    crate::run::status(
        Command::new("apt-get")
            .args(["update", "-qq"])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .context("apt-get update")?;
    crate::run::status(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .context("apt-get install")?;
    ensure_components()?;
    ensure_grpcurl(false)
}

/// Where `go install` puts grpcurl: outside the clone, so a fresh clone on
/// the same machine reuses it (the grpcurl test looks there too).
pub const GOPATH: &str = "/root/go";

/// grpcurl, the generic gRPC client of profiler/tests/gated/grpcurl.rs, built
/// from its Go module through the Go module proxy (needs Go; without Go
/// the test is reported as ignored with the reason, not failed).
fn ensure_grpcurl(check_only: bool) -> anyhow::Result<()> {
    let bin = std::path::Path::new(GOPATH).join("bin/grpcurl");
    let on_path = Command::new("grpcurl").arg("-version").output().is_ok();
    if bin.is_file() || on_path {
        return Ok(());
    }
    let go = ["go", "/usr/local/go/bin/go"]
        .into_iter()
        .find(|g| Command::new(g).arg("version").output().is_ok());
    match (go, check_only) {
        (None, _) => {
            eprintln!("deps: no Go toolchain: grpcurl not installed (its test will be ignored)");
            Ok(())
        }
        (Some(_), true) => {
            eprintln!("deps: missing grpcurl (`cargo xtask deps` builds it with go install)");
            Ok(())
        }
        (Some(go), false) => {
            eprintln!("deps: building grpcurl into {GOPATH}/bin (go install)");
            crate::run::status(
                Command::new(go)
                    .args([
                        "install",
                        "github.com/fullstorydev/grpcurl/cmd/grpcurl@latest",
                    ])
                    .env("GOPATH", GOPATH)
                    .env("GOFLAGS", "-mod=mod"),
            )
            .context("go install grpcurl")
        }
    }
}

/// rustfmt and clippy are part of `cargo xtask test`.
fn ensure_components() -> anyhow::Result<()> {
    let have = |sub: &str| {
        Command::new("cargo")
            .args([sub, "--version"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if have("fmt") && have("clippy") {
        return Ok(());
    }
    eprintln!("deps: adding rustfmt and clippy");
    crate::run::status(Command::new("rustup").args(["component", "add", "rustfmt", "clippy"]))
        .context("rustup component add rustfmt clippy")
}
