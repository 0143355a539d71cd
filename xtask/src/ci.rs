//! The live part of `cargo xtask test` (docs/ci.md): when the upstream
//! sources are beside the clone (`../shared/vendor/`, docs/ci.md), build
//! the patched cloud-hypervisor from them in a cache outside the clone, run
//! the tests that need it, then the closed-loop runs. Nothing built here
//! ever lands in the clone.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::e2e::{self, E2eRun};
use crate::{run, vmm_patch};

pub const CH_TARBALL: &str = "cloud-hypervisor-v53.0.tar.gz";
pub const MH_TARBALL: &str = "micro-http-5c2254d6.tar.gz";

/// Where CI puts the upstream tarballs: `TIERD_VENDOR_DIR`, else
/// `../shared/vendor` beside the clone.
pub fn vendor_dir() -> anyhow::Result<PathBuf> {
    if let Some(d) = std::env::var_os("TIERD_VENDOR_DIR") {
        return Ok(PathBuf::from(d));
    }
    let root = run::workspace_root()?;
    Ok(root
        .parent()
        .context("the workspace has no parent directory")?
        .join("shared/vendor"))
}

/// The two tarballs in `vendor`, or why they cannot be used.
pub fn tarballs(vendor: &Path) -> Result<(PathBuf, PathBuf), String> {
    let ch = vendor.join(CH_TARBALL);
    let mh = vendor.join(MH_TARBALL);
    for p in [&ch, &mh] {
        if !p.is_file() {
            return Err(format!(
                "{} is absent (git archive of the upstream source, docs/ci.md)",
                p.display()
            ));
        }
    }
    Ok((ch, mh))
}

/// Cache root, outside the clone: `TIERD_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/tierd`, else `$HOME/.cache/tierd`.
pub fn cache_root() -> anyhow::Result<PathBuf> {
    if let Some(d) = std::env::var_os("TIERD_CACHE_DIR") {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("tierd"));
    }
    let home = std::env::var_os("HOME")
        .context("neither TIERD_CACHE_DIR, XDG_CACHE_HOME nor HOME is set")?;
    Ok(PathBuf::from(home).join(".cache/tierd"))
}

/// sha256 (hex) of every file's name, length and bytes, in order: a
/// change to a tarball or to any patch, or a patch added or renamed,
/// gives a new key.
pub fn cache_key(files: &[PathBuf]) -> anyhow::Result<String> {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("running sha256sum (coreutils)")?;
    {
        let mut stdin = child.stdin.take().context("sha256sum stdin")?;
        for f in files {
            let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            let name = f
                .file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default();
            write!(stdin, "{name}\0{}\0", bytes.len()).context("writing to sha256sum")?;
            stdin.write_all(&bytes).context("writing to sha256sum")?;
        }
    }
    let out = child.wait_with_output().context("sha256sum")?;
    if !out.status.success() {
        bail!("sha256sum failed: {}", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let key = text.split_whitespace().next().unwrap_or_default();
    if key.len() != 64 {
        bail!("sha256sum printed {text:?}");
    }
    Ok(key.to_string())
}

/// The commit a `git archive` tarball was made from (its pax header).
fn tar_commit_id(tarball: &Path) -> anyhow::Result<String> {
    let tar = Command::new("gzip")
        .arg("-dc")
        .arg(tarball)
        .output()
        .with_context(|| format!("gzip -dc {}", tarball.display()))?;
    if !tar.status.success() {
        bail!("gzip -dc {} failed: {}", tarball.display(), tar.status);
    }
    let mut git = Command::new("git")
        .arg("get-tar-commit-id")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("running git get-tar-commit-id")?;
    // It reads only the first blocks and may exit before the rest is
    // written: a broken pipe here is expected.
    if let Some(mut stdin) = git.stdin.take() {
        let _ = stdin.write_all(&tar.stdout[..tar.stdout.len().min(64 << 10)]);
    }
    let out = git.wait_with_output().context("git get-tar-commit-id")?;
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || id.is_empty() {
        bail!(
            "{} carries no commit id: not a `git archive` output",
            tarball.display()
        );
    }
    Ok(id)
}

/// The patched VMM in the cache.
#[derive(Debug, Clone)]
pub struct Vmm {
    /// `cloud-hypervisor`, copied out of the target dir for this key.
    pub bin: PathBuf,
    /// The patched source tree (for the source-constant test).
    pub src: PathBuf,
    /// Wall time of the build; None when the cache had it.
    pub built_in: Option<Duration>,
}

/// An exclusive lock on `<cache>/lock` while it lives: two runs on one
/// machine do not unpack or build one key at once.
struct Lock(#[allow(dead_code)] std::fs::File);

fn lock(cache: &Path) -> anyhow::Result<Lock> {
    let path = cache.join("lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock(2) on a descriptor this File owns.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        run::step(
            "ci",
            format!("waiting for {} (another build)", path.display()),
        );
        // SAFETY: as above, blocking this time.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("flock {}", path.display()));
        }
    }
    Ok(Lock(f))
}

/// Trees of older keys kept beside the newest (their binaries may still
/// be in use by another run).
const KEEP_OLD_KEYS: usize = 2;

/// Builds (or finds in the cache) cloud-hypervisor v53.0 with our series
/// from the two tarballs. Cache layout, under [`cache_root`]:
/// `ch-<key>/{cloud-hypervisor,micro-http}` (unpacked, a git repo with the
/// series applied), `ch-<key>/bin/` (the binaries, present only once the
/// build succeeded) and `ch-target/` (cargo's target dir, shared by all
/// keys so that a changed patch rebuilds only cloud-hypervisor's crates).
pub fn build_vendored(ch_tar: &Path, mh_tar: &Path) -> anyhow::Result<Vmm> {
    let patches = vmm_patch::series(&run::workspace_root()?.join("vmm-patch/patches"))?;
    let mut keyed = vec![ch_tar.to_path_buf(), mh_tar.to_path_buf()];
    keyed.extend(patches.iter().cloned());
    let key = cache_key(&keyed)?;
    let cache = cache_root()?;
    std::fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    let _lock = lock(&cache)?;
    let dir = cache.join(format!("ch-{}", &key[..16]));
    let src = dir.join("cloud-hypervisor");
    let bin = dir.join("bin/cloud-hypervisor");
    if bin.is_file() && std::fs::read_to_string(dir.join("KEY")).is_ok_and(|k| k.trim() == key) {
        run::step(
            "ci",
            format!(
                "patched cloud-hypervisor cached: {} (key {})",
                bin.display(),
                &key[..16]
            ),
        );
        return Ok(Vmm {
            bin,
            src,
            built_in: None,
        });
    }
    let start = Instant::now();
    if dir.exists() {
        // A run that stopped half way: start this key again from nothing.
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for (tar, commit) in [
        (ch_tar, vmm_patch::V53_COMMIT),
        (mh_tar, vmm_patch::MICRO_HTTP_COMMIT),
    ] {
        let id = tar_commit_id(tar)?;
        if id != commit {
            bail!("{} is a git archive of {id}, not {commit}", tar.display());
        }
        run::status(Command::new("tar").arg("-xzf").arg(tar).arg("-C").arg(&dir))
            .with_context(|| format!("unpacking {}", tar.display()))?;
    }
    let mh = dir.join("micro-http");
    if !src.join("vmm").is_dir() || !mh.join("Cargo.toml").is_file() {
        bail!(
            "{} did not unpack to cloud-hypervisor/ and micro-http/ (expected git archive prefixes)",
            dir.display()
        );
    }
    init_repo(&src)?;
    run::step(
        "ci",
        format!("applying {} patches to {}", patches.len(), src.display()),
    );
    vmm_patch::am_series(&src, &patches).context("the series does not apply to the tarball")?;
    let release = vmm_patch::cargo_build(&src, &mh, Some(cache.join("ch-target")))?;
    let bindir = dir.join("bin");
    std::fs::create_dir_all(&bindir).with_context(|| format!("creating {}", bindir.display()))?;
    // Copied out so that a later key building into the shared target dir
    // does not change this key's binary under a run using it.
    for name in ["ch-remote", "cloud-hypervisor"] {
        std::fs::copy(release.join(name), bindir.join(name))
            .with_context(|| format!("copying {name} to {}", bindir.display()))?;
    }
    std::fs::write(dir.join("KEY"), format!("{key}\n")).context("writing KEY")?;
    let took = start.elapsed();
    run::step(
        "ci",
        format!(
            "patched cloud-hypervisor built in {} (unpack, apply, cargo build): {}",
            mmss(took),
            bin.display()
        ),
    );
    prune(&cache, &dir)?;
    Ok(Vmm {
        bin,
        src,
        built_in: Some(took),
    })
}

/// `cargo xtask vmm-patch build-vendored`: [`build_vendored`] from
/// [`vendor_dir`]; prints the binary's path.
pub fn build_vendored_cmd() -> anyhow::Result<()> {
    let vendor = vendor_dir()?;
    let (ch, mh) = tarballs(&vendor).map_err(anyhow::Error::msg)?;
    let vmm = build_vendored(&ch, &mh)?;
    println!("{}", vmm.bin.display());
    Ok(())
}

/// A git repo of the unpacked tarball at one commit tagged v53.0 (git am
/// needs a repo; cloud-hypervisor's build.rs names its version from
/// `git describe`), fixed identity and dates so it is the same each time.
fn init_repo(src: &Path) -> anyhow::Result<()> {
    let git = |args: &[&str]| -> anyhow::Result<()> {
        run::status(
            Command::new("git")
                .arg("-C")
                .arg(src)
                .args(args)
                .env("GIT_AUTHOR_DATE", "2000-01-01T00:00:00Z")
                .env("GIT_COMMITTER_DATE", "2000-01-01T00:00:00Z"),
        )
    };
    git(&["init", "-q"])?;
    for (k, v) in [
        ("user.name", "tierd xtask"),
        ("user.email", "xtask@tierd.invalid"),
        ("commit.gpgsign", "false"),
        ("tag.gpgsign", "false"),
        // The series carries CRLF files (git am --keep-cr): no conversion.
        ("core.autocrlf", "false"),
    ] {
        git(&["config", k, v])?;
    }
    // -f: upstream tracks a few paths its own .gitignore matches.
    git(&["add", "-A", "-f"])?;
    git(&[
        "commit",
        "-q",
        "--no-verify",
        "-m",
        &format!(
            "cloud-hypervisor v53.0 (git archive of {})",
            vmm_patch::V53_COMMIT
        ),
    ])?;
    git(&["tag", "-a", "v53.0", "-m", "v53.0"])
}

/// Removes the trees of all but the newest [`KEEP_OLD_KEYS`] other keys.
fn prune(cache: &Path, current: &Path) -> anyhow::Result<()> {
    let mut old: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(cache)
        .with_context(|| format!("reading {}", cache.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("ch-") && n != "ch-target")
                && p.as_path() != current
                && p.is_dir()
        })
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .collect();
    old.sort();
    let n = old.len().saturating_sub(KEEP_OLD_KEYS);
    for (_, p) in old.into_iter().take(n) {
        run::step(
            "ci",
            format!("removing an older key's tree {}", p.display()),
        );
        std::fs::remove_dir_all(&p).with_context(|| format!("removing {}", p.display()))?;
    }
    Ok(())
}

/// A PVH guest without a balloon driver for controller/tests/ch_live.rs
/// (`TIERD_CH_KERNEL`): profiler's zone-marker guest with its second zone
/// at 256 MiB, the test's zone size. Built under the workspace target dir.
pub fn pvh_kernel() -> anyhow::Result<PathBuf> {
    let root = run::workspace_root()?;
    let out = run::target_dir()?.join("ci");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let obj = out.join("zone-marker-256m.o");
    let elf = out.join("zone-marker-256m.elf");
    run::status(
        Command::new("cc")
            .args(["-c", "-m64", "-DSLOW_BASE=0x10000000"])
            .arg(root.join("profiler/tests/guest/zone_marker.S"))
            .arg("-o")
            .arg(&obj),
    )?;
    run::status(
        Command::new("ld")
            .args(["-m", "elf_x86_64", "-Ttext=0x100000"])
            .arg(&obj)
            .arg("-o")
            .arg(&elf),
    )?;
    Ok(elf)
}

/// One closed-loop run `cargo xtask test` makes against the patched VMM.
#[derive(Debug, Clone, Copy)]
pub struct LoopRun {
    pub name: &'static str,
    /// `balloon` or `resize-zone`.
    pub actuator: &'static str,
    /// tier-e2e's `--mode`.
    pub mode: &'static str,
    /// tier-e2e's `--guests`.
    pub guests: &'static str,
    /// Off: listed, skipped with its name (turn on once it passes).
    pub enabled: bool,
}

/// The e2e runs of CI: both actuators in both policy modes, and three
/// guests (one going idle, one growing, one shrinking) in the default mode.
/// `TIERD_CI_E2E=name,name` (or `none`) picks others for one run.
pub const LOOP_RUNS: &[LoopRun] = &[
    LoopRun {
        name: "balloon-ratio",
        actuator: "balloon",
        mode: "ratio",
        guests: "swap",
        enabled: true,
    },
    LoopRun {
        name: "balloon-working-set",
        actuator: "balloon",
        mode: "working-set",
        guests: "swap",
        enabled: true,
    },
    LoopRun {
        name: "resize-zone-ratio",
        actuator: "resize-zone",
        mode: "ratio",
        guests: "swap",
        enabled: true,
    },
    LoopRun {
        name: "resize-zone-working-set",
        actuator: "resize-zone",
        mode: "working-set",
        guests: "swap",
        enabled: true,
    },
    LoopRun {
        name: "balloon-ratio-three",
        actuator: "balloon",
        mode: "ratio",
        guests: "three",
        enabled: true,
    },
];

/// The closed loops on the Linux bed (`cargo xtask e2e --vmm qemu`, no
/// cloud-hypervisor needed): name and `--mode`. About 4 min each under
/// TCG with the truth plugin, so one mode in CI.
pub const QEMU_RUNS: &[(&str, &str)] = &[("qemu-working-set", "working-set")];

/// The QEMU runs to make: all of [`QEMU_RUNS`], or those `TIERD_CI_E2E`
/// names.
pub fn selected_qemu(env: Option<&str>) -> Vec<(&'static str, &'static str)> {
    match env.map(str::trim) {
        None => QEMU_RUNS.to_vec(),
        Some(list) => QEMU_RUNS
            .iter()
            .copied()
            .filter(|(n, _)| list.split(',').any(|x| x.trim() == *n))
            .collect(),
    }
}

/// One QEMU loop, its log kept under `<target>/ci/e2e-<name>`.
pub fn e2e_qemu(name: &str, mode: &str) -> anyhow::Result<(bool, Vec<String>)> {
    let work = run::target_dir()?.join("ci").join(format!("e2e-{name}"));
    if work.exists() {
        std::fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    }
    let mut results = Vec::new();
    let ok = e2e::run_qemu(Some(mode), Some(work), &mut |cmd| {
        status_results(cmd, &mut results)
    })?;
    Ok((ok, results))
}

/// The runs to make: the enabled ones, or those `TIERD_CI_E2E` names
/// (QEMU runs, `qemu-*`, are [`selected_qemu`]'s).
pub fn selected_runs(env: Option<&str>) -> anyhow::Result<Vec<LoopRun>> {
    let Some(list) = env.map(str::trim) else {
        return Ok(LOOP_RUNS.iter().copied().filter(|r| r.enabled).collect());
    };
    if list.is_empty() || list == "none" {
        return Ok(Vec::new());
    }
    list.split(',')
        .filter(|n| !n.trim().starts_with("qemu-"))
        .map(|n| {
            LOOP_RUNS
                .iter()
                .find(|r| r.name == n.trim())
                .copied()
                .with_context(|| {
                    format!(
                        "TIERD_CI_E2E: no run named {n:?}; known: {}",
                        LOOP_RUNS
                            .iter()
                            .map(|r| r.name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
        })
        .collect()
}

/// Runs one closed loop through `cargo xtask e2e`'s path, its log kept
/// under `<target>/ci/e2e-<name>`; the RESULT line(s) it printed.
pub fn e2e(r: &LoopRun, ch_bin: &Path) -> anyhow::Result<(bool, Vec<String>)> {
    let work = run::target_dir()?
        .join("ci")
        .join(format!("e2e-{}", r.name));
    if work.exists() {
        std::fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    }
    let opts = E2eRun {
        actuator: r.actuator.to_string(),
        ch_bin: Some(ch_bin.to_path_buf()),
        upstream: false,
        mode: Some(r.mode.to_string()),
        guests: Some(r.guests.to_string()),
    };
    let mut results = Vec::new();
    let ok = e2e::run_ch(None, None, None, Some(work), &opts, &mut |cmd| {
        status_results(cmd, &mut results)
    })?;
    Ok((ok, results))
}

/// Runs `cmd` with its stdout passed through line by line; collects the
/// `RESULT ` lines. Whether it exited 0.
pub fn status_results(cmd: &mut Command, results: &mut Vec<String>) -> anyhow::Result<bool> {
    let shown = format!("{cmd:?}");
    eprintln!("+ {shown}");
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {shown}"))?;
    let stdout = child.stdout.take().context("child stdout")?;
    collect_results(stdout, results);
    let st = child
        .wait()
        .with_context(|| format!("waiting for {shown}"))?;
    Ok(st.success())
}

fn collect_results(r: impl Read, results: &mut Vec<String>) {
    for line in BufReader::new(r).lines() {
        let Ok(line) = line else { break };
        println!("{line}");
        if line.starts_with("RESULT ") {
            results.push(line);
        }
    }
}

/// `3m07s`.
pub fn mmss(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}m{:02}s", s / 60, s % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_follows_every_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.tar.gz");
        let p = dir.path().join("0001-x.patch");
        std::fs::write(&a, b"tar").unwrap();
        std::fs::write(&p, b"patch 1").unwrap();
        let k1 = cache_key(&[a.clone(), p.clone()]).unwrap();
        assert_eq!(k1.len(), 64);
        assert_eq!(k1, cache_key(&[a.clone(), p.clone()]).unwrap());
        std::fs::write(&p, b"patch 2").unwrap();
        let k2 = cache_key(&[a.clone(), p.clone()]).unwrap();
        assert_ne!(k1, k2);
        // The same bytes under another name (a renamed patch) differ too.
        let q = dir.path().join("0002-x.patch");
        std::fs::write(&q, b"patch 2").unwrap();
        assert_ne!(k2, cache_key(&[a.clone(), q]).unwrap());
        // Boundaries count: "ab"+"c" is not "a"+"bc".
        std::fs::write(&a, b"ab").unwrap();
        std::fs::write(&p, b"c").unwrap();
        let k3 = cache_key(&[a.clone(), p.clone()]).unwrap();
        std::fs::write(&a, b"a").unwrap();
        std::fs::write(&p, b"bc").unwrap();
        assert_ne!(k3, cache_key(&[a, p]).unwrap());
    }

    #[test]
    fn absent_tarballs_say_which() {
        let dir = tempfile::tempdir().unwrap();
        let why = tarballs(dir.path()).unwrap_err();
        assert!(why.contains(CH_TARBALL) && why.contains("absent"), "{why}");
        std::fs::write(dir.path().join(CH_TARBALL), b"x").unwrap();
        let why = tarballs(dir.path()).unwrap_err();
        assert!(why.contains(MH_TARBALL), "{why}");
        std::fs::write(dir.path().join(MH_TARBALL), b"x").unwrap();
        assert!(tarballs(dir.path()).is_ok());
    }

    #[test]
    fn a_non_archive_has_no_commit_id() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("t.tar.gz");
        let mut gz = Command::new("gzip")
            .arg("-c")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        gz.stdin.take().unwrap().write_all(&[0u8; 2048]).unwrap();
        std::fs::write(&t, gz.wait_with_output().unwrap().stdout).unwrap();
        let e = tar_commit_id(&t).unwrap_err().to_string();
        assert!(e.contains("no commit id"), "{e}");
    }

    #[test]
    fn runs_by_default_and_by_name() {
        let all = selected_runs(None).unwrap();
        assert_eq!(
            all.iter().filter(|r| r.enabled).count(),
            LOOP_RUNS.iter().filter(|r| r.enabled).count()
        );
        assert!(selected_runs(Some("none")).unwrap().is_empty());
        let two = selected_runs(Some("balloon-ratio, resize-zone-working-set")).unwrap();
        assert_eq!(
            two.iter().map(|r| (r.actuator, r.mode)).collect::<Vec<_>>(),
            vec![("balloon", "ratio"), ("resize-zone", "working-set")]
        );
        let e = selected_runs(Some("frob")).unwrap_err().to_string();
        assert!(e.contains("balloon-ratio"), "{e}");
        // Both actuators in both modes.
        for a in ["balloon", "resize-zone"] {
            for m in ["ratio", "working-set"] {
                assert!(LOOP_RUNS.iter().any(|r| r.actuator == a && r.mode == m));
            }
        }
    }

    #[test]
    fn result_lines_are_collected() {
        let mut r = Vec::new();
        collect_results(&b"PASS x\nRESULT e2e=pass a=1\nend\n"[..], &mut r);
        assert_eq!(r, vec!["RESULT e2e=pass a=1".to_string()]);
        assert_eq!(mmss(Duration::from_secs(187)), "3m07s");
    }
}
