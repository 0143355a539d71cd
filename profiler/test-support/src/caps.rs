//! What the host must offer: each check returns why a test cannot run
//! here (to report it as ignored with that reason), or a tool that the
//! project's own dependencies provide (missing it is a failure).

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Why /dev/kvm is not usable, if it is not.
pub fn kvm_missing() -> Option<String> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => None,
        Err(e) => Some(format!("needs a usable /dev/kvm: {e}")),
    }
}

/// Why tmux cannot run here, if it cannot.
pub fn tmux_missing() -> Option<String> {
    match Command::new("tmux").arg("-V").output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!("tmux -V failed: {}", o.status)),
        Err(e) => Some(format!(
            "needs tmux for a real terminal (install with `cargo xtask deps`): {e}"
        )),
    }
}

/// Why `name --version` does not run, if it does not.
pub fn tool_missing(name: &str, why: &str) -> Option<String> {
    match Command::new(name)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(_) => None,
        Err(e) => Some(format!("{name} ({why}): {e}")),
    }
}

/// The patched cloud-hypervisor named by TIERD_CH_BIN, or why there is none.
pub fn ch_bin() -> Result<PathBuf, String> {
    let bin = std::env::var_os("TIERD_CH_BIN")
        .map(PathBuf::from)
        .ok_or("TIERD_CH_BIN is not set (path of the patched cloud-hypervisor)")?;
    if !bin.is_file() {
        return Err(format!("TIERD_CH_BIN={} is not a file", bin.display()));
    }
    Ok(bin)
}

/// What a test with a live patched cloud-hypervisor needs: [`ch_bin`] and
/// a usable /dev/kvm. Err: why not, to report the test ignored with it.
pub fn ch_kvm() -> Result<PathBuf, String> {
    let bin = ch_bin()?;
    match kvm_missing() {
        Some(why) => Err(why),
        None => Ok(bin),
    }
}

/// A command for `name` found on PATH; fails (not skips) without it, as
/// the project's dependencies provide it: `package` names what installs it.
pub fn tool(name: &str, package: &str) -> Command {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "{name} not found on PATH: install with `cargo xtask deps` ({package})"
    );
    Command::new(name)
}

/// grpcurl, the generic gRPC client (`cargo xtask deps` builds it with
/// `go install` into /root/go/bin), or why there is none: `TIERD_GRPCURL`,
/// then PATH, then `$GOPATH/bin`, `$HOME/go/bin` and `/root/go/bin`.
pub fn grpcurl() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("TIERD_GRPCURL") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("TIERD_GRPCURL={} is not a file", p.display()))
        };
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for var in ["GOPATH", "HOME"] {
        if let Some(v) = std::env::var_os(var) {
            let base = PathBuf::from(v);
            dirs.push(if var == "HOME" {
                base.join("go/bin")
            } else {
                base.join("bin")
            });
        }
    }
    dirs.push("/root/go/bin".into());
    dirs.into_iter()
        .map(|d| d.join("grpcurl"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "needs grpcurl (`cargo xtask deps` installs it: go install github.com/fullstorydev/grpcurl/cmd/grpcurl@latest)".to_string()
        })
}

/// A trial that runs `f` where every one of `needs` holds, and is reported
/// as ignored with the first reason where one does not.
pub fn gated(name: &'static str, needs: Vec<Result<(), String>>, f: fn()) -> libtest_mimic::Trial {
    let ready = needs.into_iter().collect::<Result<Vec<()>, String>>();
    libtest_mimic::Trial::ignorable_test(name, move || match &ready {
        Err(reason) => Ok(libtest_mimic::Completion::ignored_with(reason.clone())),
        Ok(_) => {
            f();
            Ok(libtest_mimic::Completion::Completed)
        }
    })
}

/// Runs each group's trials in turn, the trials of one group in parallel
/// as [`libtest_mimic::run`] does: the groups share a binary but not the
/// machine, as separate test binaries did. A group whose trials are all
/// filtered out is not announced. One conclusion for all of them.
pub fn run_in_turn(
    args: &libtest_mimic::Arguments,
    groups: impl IntoIterator<Item = fn() -> Vec<libtest_mimic::Trial>>,
) -> libtest_mimic::Conclusion {
    let mut all = libtest_mimic::Conclusion {
        num_filtered_out: 0,
        num_passed: 0,
        num_failed: 0,
        num_ignored: 0,
        num_measured: 0,
    };
    for group in groups {
        let trials = group();
        if !args.list && trials.iter().all(|t| args.is_filtered_out(t)) {
            all.num_filtered_out += trials.len() as u64;
            continue;
        }
        let c = libtest_mimic::run(args, trials);
        all.num_filtered_out += c.num_filtered_out;
        all.num_passed += c.num_passed;
        all.num_failed += c.num_failed;
        all.num_ignored += c.num_ignored;
        all.num_measured += c.num_measured;
    }
    all
}
