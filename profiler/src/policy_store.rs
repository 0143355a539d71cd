//! `[controller] policy_file`: the policy in force, kept across restarts.
//!
//! Why: `SetPolicy` lives in tierd's memory. A tierd that restarts (a crash,
//! an upgrade, `kill -9`) would come back with the default policy and its
//! controller would undo the operator's budget and targets on the next
//! interval. With a policy file, `SetPolicy` is written to it before it is
//! answered, and tierd starts from it.
//!
//! The file holds the `tier.v1.Policy` message in protobuf encoding: exact,
//! and versioned by the protocol (read it with `tierctl policy get`).
//! Writes go to a temporary file in the same directory, are synced, then
//! renamed over the old one, so a crash leaves the old or the new policy,
//! never half of one.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use prost::Message;
use tier_proto::v1::Policy;

/// Why the policy file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum PolicyStoreError {
    #[error("policy file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("policy file {path}: not a tier.v1.Policy: {source}")]
    Decode {
        path: PathBuf,
        #[source]
        source: prost::DecodeError,
    },
    #[error("policy file {path}: the policy it holds is invalid: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// The stored policy, validated; `None` if the file does not exist yet.
pub fn load(path: &Path) -> Result<Option<Policy>, PolicyStoreError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(io(path, source)),
    };
    let policy = Policy::decode(bytes.as_slice()).map_err(|source| PolicyStoreError::Decode {
        path: path.to_path_buf(),
        source,
    })?;
    tier_controller::policy::Config::try_from(&policy).map_err(|e| PolicyStoreError::Invalid {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    Ok(Some(policy))
}

/// Replaces the stored policy atomically (temporary file, fsync, rename,
/// fsync of the directory).
pub fn save(path: &Path, policy: &Policy) -> Result<(), PolicyStoreError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| io(path, e))?;
    tmp.write_all(&policy.encode_to_vec())
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| io(path, e))?;
    tmp.persist(path).map_err(|e| io(path, e.error))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io(path, e))
}

fn io(path: &Path, source: std::io::Error) -> PolicyStoreError {
    PolicyStoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tier_controller::policy::default_policy;

    #[test]
    fn a_saved_policy_loads_back_and_a_missing_file_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.pb");
        assert!(load(&path).unwrap().is_none());
        let mut p = default_policy();
        p.host_dram_budget_bytes = 48 << 20;
        p.default_target = 0.8;
        save(&path, &p).unwrap();
        assert_eq!(load(&path).unwrap(), Some(p.clone()));
        p.default_target = 0.7;
        save(&path, &p).unwrap();
        assert_eq!(load(&path).unwrap(), Some(p));
        // Only the file itself remains: no temporary left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn garbage_and_invalid_policies_are_refused_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.pb");
        std::fs::write(&path, b"\xff\xff\xff not protobuf").unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(
            e.contains("policy.pb") && e.contains("not a tier.v1.Policy"),
            "{e}"
        );
        let mut bad = default_policy();
        bad.default_target = 1.5;
        std::fs::write(&path, bad.encode_to_vec()).unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("invalid"), "{e}");
    }

    #[test]
    fn a_save_that_cannot_write_says_so() {
        let e = save(
            Path::new("/proc/tierd-no-such-dir/policy.pb"),
            &default_policy(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("/proc/tierd-no-such-dir/policy.pb"), "{e}");
    }
}
