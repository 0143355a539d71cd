//! `cargo xtask package --debug` once, then: the .deb installed on this
//! machine and removed again (root only), and the OCI image layout checked
//! blob by blob, its binary run from the unpacked layer (chroot, root
//! only), and named by the DaemonSet.
//!
//! Custom harness (libtest-mimic): without root or dpkg a test is reported
//! as ignored with the reason, never as passed. The debug build is packaged
//! (already built by `cargo test --workspace`); `cargo xtask package`
//! packages the release build.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Instant;

use libtest_mimic::Arguments;
use serde_json::Value;
use sha2::{Digest, Sha256};

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The package directory, built once for every test.
fn built() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let started = Instant::now();
        let st = Command::new(env!("CARGO_BIN_EXE_xtask"))
            .args(["package", "--debug", "--out"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(st.success(), "cargo xtask package --debug: {st}");
        eprintln!(
            "cargo xtask package --debug took {:.1} s",
            started.elapsed().as_secs_f64()
        );
        dir
    })
    .path()
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Installed files that must come and go with the package.
const FILES: &[&str] = &[
    "/usr/bin/tierd",
    "/usr/bin/tierctl",
    "/usr/lib/systemd/system/tierd.service",
    "/usr/share/man/man1/tierd.1.gz",
    "/usr/share/man/man1/tierctl.1.gz",
    "/usr/share/bash-completion/completions/tierctl",
    "/usr/share/zsh/vendor-completions/_tierd",
    "/usr/share/doc/tierd/README.md",
];
const CONFFILE: &str = "/etc/tierd/tierd.toml";

fn deb_installs_runs_and_removes() {
    let deb = built().join(format!("tierd_{VERSION}_amd64.deb"));
    run(Command::new("dpkg").arg("-i").arg(&deb));
    // Whatever fails below, the machine is left without the package.
    struct Purge;
    impl Drop for Purge {
        fn drop(&mut self) {
            let _ = Command::new("dpkg").args(["-P", "tierd"]).status();
        }
    }
    let _purge = Purge;
    for f in FILES.iter().chain([&CONFFILE]) {
        assert!(Path::new(f).exists(), "{f} not installed");
    }
    let version = text(&run(Command::new("/usr/bin/tierd").arg("--version")));
    assert_eq!(version.trim(), format!("tierd {VERSION}"));
    let probe = text(&run(
        Command::new("/usr/bin/tierd").args(["probe", "--json"])
    ));
    let probe: Value = serde_json::from_str(&probe).unwrap();
    assert!(probe["checks"].as_array().is_some_and(|c| !c.is_empty()));
    run(Command::new("/usr/bin/tierctl").arg("--version"));
    // The installed unit, with the installed binary as ExecStart.
    let verify = run(Command::new("systemd-analyze")
        .args(["verify", "--man=no", "--recursive-errors=no"])
        .arg("/usr/lib/systemd/system/tierd.service"));
    let stderr = String::from_utf8_lossy(&verify.stderr);
    assert!(
        !stderr.contains("tierd.service"),
        "systemd-analyze about the unit:\n{stderr}"
    );
    let conffiles = text(&run(Command::new("dpkg-query").args([
        "-W",
        "-f=${Conffiles}",
        "tierd",
    ])));
    assert!(conffiles.contains(CONFFILE), "conffiles: {conffiles}");

    run(Command::new("dpkg").args(["-r", "tierd"]));
    for f in FILES {
        assert!(!Path::new(f).exists(), "{f} left after dpkg -r");
    }
    assert!(Path::new(CONFFILE).exists(), "dpkg -r keeps conffiles");
    run(Command::new("dpkg").args(["-P", "tierd"]));
    assert!(!Path::new(CONFFILE).exists(), "dpkg -P removes conffiles");
}

fn sha256(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The blob a descriptor names, its digest and size checked.
fn blob(layout: &Path, desc: &Value) -> Vec<u8> {
    let digest = desc["digest"].as_str().unwrap();
    let hex = digest.strip_prefix("sha256:").unwrap();
    let data = std::fs::read(layout.join("blobs/sha256").join(hex)).unwrap();
    assert_eq!(sha256(&data), hex, "digest of {digest}");
    assert_eq!(desc["size"].as_u64(), Some(data.len() as u64), "{digest}");
    data
}

fn oci_layout_is_complete_and_named_by_the_daemonset() {
    let layout = built().join("oci");
    let marker: Value =
        serde_json::from_slice(&std::fs::read(layout.join("oci-layout")).unwrap()).unwrap();
    assert_eq!(marker["imageLayoutVersion"], "1.0.0");
    let index: Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let m = &index["manifests"][0];
    assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    let tag = m["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .unwrap();
    assert_eq!(tag, VERSION);
    let manifest: Value = serde_json::from_slice(&blob(&layout, m)).unwrap();
    let config: Value = serde_json::from_slice(&blob(&layout, &manifest["config"])).unwrap();
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/usr/local/bin/tierd"])
    );
    assert_eq!(config["os"], "linux");
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    let gz = blob(&layout, &layers[0]);
    let mut tar = Vec::new();
    flate2::read::GzDecoder::new(gz.as_slice())
        .read_to_end(&mut tar)
        .unwrap();
    assert_eq!(
        config["rootfs"]["diff_ids"][0],
        format!("sha256:{}", sha256(&tar))
    );
    let root = tempfile::tempdir().unwrap();
    tar::Archive::new(tar.as_slice())
        .unpack(root.path())
        .unwrap();
    for f in [
        "usr/local/bin/tierd",
        "usr/local/bin/tierctl",
        "lib64/ld-linux-x86-64.so.2",
    ] {
        assert!(root.path().join(f).is_file(), "{f} not in the layer");
    }
    // The layer alone runs tierd: every library it loads is in it.
    if is_root() {
        let v = text(&run(Command::new("chroot")
            .arg(root.path())
            .args(["/usr/local/bin/tierd", "--version"])));
        assert_eq!(v.trim(), format!("tierd {VERSION}"));
    } else {
        eprintln!("not root: the layer's tierd is not run in a chroot");
    }
    assert_eq!(
        daemonset_image(),
        format!("tierd:{tag}"),
        "the DaemonSet names the image"
    );
}

/// The tierd container's `image:` in the DaemonSet.
fn daemonset_image() -> String {
    let yaml =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiler/deploy/kubernetes/tierd.yaml");
    let text = std::fs::read_to_string(&yaml).unwrap();
    let after = text
        .split("- name: tierd\n")
        .nth(1)
        .expect("a container named tierd");
    after
        .lines()
        .find_map(|l| l.trim().strip_prefix("image: "))
        .unwrap()
        .trim()
        .to_string()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn main() {
    let args = Arguments::from_args();
    let dpkg = Command::new("dpkg-deb")
        .arg("--version")
        .output()
        .map(drop)
        .map_err(|e| format!("needs dpkg-deb (a Debian host): {e}"));
    let installed = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", "tierd"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"));
    let root = if !is_root() {
        Err("needs root to dpkg -i (run under `cargo xtask test` as root)".to_string())
    } else if installed {
        Err("a tierd package is installed here already; not replacing it".to_string())
    } else {
        Ok(())
    };
    let trial = tier_test_support::gated;
    let tests = vec![
        trial(
            "deb_installs_runs_and_removes",
            vec![dpkg.clone(), root],
            deb_installs_runs_and_removes,
        ),
        trial(
            "oci_layout_is_complete_and_named_by_the_daemonset",
            vec![dpkg],
            oci_layout_is_complete_and_named_by_the_daemonset,
        ),
    ];
    libtest_mimic::run(&args, tests).exit();
}
