//! Running commands with their output shown and their failure explained.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> anyhow::Result<PathBuf> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map(PathBuf::from)
        .context("xtask has no parent directory")
}

/// Where cargo puts this workspace's builds (`CARGO_TARGET_DIR` or `target/`).
pub fn target_dir() -> anyhow::Result<PathBuf> {
    Ok(match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) => PathBuf::from(t),
        None => workspace_root()?.join("target"),
    })
}

/// GiB free to unprivileged writers on the filesystem holding `path` (or
/// its nearest existing ancestor); None when statvfs fails.
pub fn free_gib(path: &std::path::Path) -> Option<f64> {
    use std::os::unix::ffi::OsStrExt;
    let existing = path.ancestors().find(|p| p.exists())?;
    let c = std::ffi::CString::new(existing.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain data; zeroed is a valid value for it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path, `st` a valid out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as f64 * st.f_frsize as f64 / (1u64 << 30) as f64)
}

/// Says on stderr what the next step of `task` does, before it starts
/// (`demo: building tierd and tierctl (debug)`), as `deps:` lines do.
pub fn step(task: &str, what: impl std::fmt::Display) {
    eprintln!("{task}: {what}");
}

/// Runs `cargo ARGS` in the workspace root; an error names the command.
pub fn cargo(args: &[&str]) -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    status(
        Command::new(cargo)
            .args(args)
            .current_dir(workspace_root()?),
    )
}

/// [`cargo`] with `env` added to its environment.
pub fn cargo_env(args: &[&str], env: &[(String, String)]) -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    status(
        Command::new(cargo)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(workspace_root()?),
    )
}

/// Runs a command to completion; non-zero exit is an error naming it.
pub fn status(cmd: &mut Command) -> anyhow::Result<()> {
    let shown = format!("{cmd:?}");
    eprintln!("+ {shown}");
    let st = cmd.status().with_context(|| format!("starting {shown}"))?;
    if !st.success() {
        bail!("{shown} failed: {st}");
    }
    Ok(())
}

/// SIGTERM to a child we spawned, by its PID; SIGKILL after 5 s.
pub fn stop(child: &mut Child) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    let pid = child.id() as i32;
    // SAFETY: kill(2) on the PID of a child we spawned and have not reaped.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}
