//! What the e2e and soak binaries share around a run: checking the
//! binaries they were given, the work directory, and the exit status.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;

/// Each `(flag, path)` must name a file.
pub fn require_files(files: &[(&str, &Path)]) -> anyhow::Result<()> {
    for (flag, p) in files {
        anyhow::ensure!(p.is_file(), "{flag} {}: no such file", p.display());
    }
    Ok(())
}

/// `dir` (created if needed), or a temporary directory that lives as long
/// as the returned guard.
pub fn work_dir(dir: Option<&Path>) -> anyhow::Result<(PathBuf, Option<tempfile::TempDir>)> {
    match dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            Ok((d.to_path_buf(), None))
        }
        None => {
            let tmp = tempfile::tempdir().context("creating a work directory")?;
            Ok((tmp.path().to_path_buf(), Some(tmp)))
        }
    }
}

/// 0 for a pass, 1 for a failure, 2 for an error (with `RESULT key=error`
/// on stdout, so a script reading RESULT lines sees it).
pub fn exit(program: &str, key: &str, r: anyhow::Result<bool>) -> ExitCode {
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("{program}: {e:#}");
            println!("RESULT {key}=error");
            ExitCode::from(2)
        }
    }
}
