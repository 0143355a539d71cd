//! Errors of the EPT loader and its maps, with the kernel's errno kept.

use super::{EptProgram, MAX_VMS};

/// Errors of the EPT loader and its maps.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EptError {
    #[error("open ept.bpf.o: {message}")]
    Open { message: String },
    #[error("{program}: load: {message}")]
    Load {
        program: EptProgram,
        errno: Option<i32>,
        message: String,
    },
    #[error("load ept.bpf.o ({programs}): {message}")]
    Object {
        programs: String,
        errno: Option<i32>,
        message: String,
    },
    #[error("{program}: attach: {message}")]
    Attach {
        program: EptProgram,
        errno: Option<i32>,
        message: String,
    },
    #[error("{program} is not loaded")]
    NotLoaded { program: EptProgram },
    #[error("{program}: test run: {message}")]
    TestRun {
        program: EptProgram,
        errno: Option<i32>,
        message: String,
    },
    #[error("map {map}: {op}: {message}")]
    Map {
        map: &'static str,
        op: &'static str,
        message: String,
    },
    #[error("tid 0 cannot own a scan")]
    TidZero,
    #[error("vm slot {slot} out of range (0..{MAX_VMS})")]
    SlotOutOfRange { slot: u32 },
    #[error("gfn ranges: {reason}")]
    BadRanges { reason: String },
    #[error("{what}: {message}")]
    Os { what: &'static str, message: String },
}

impl EptError {
    /// The errno behind the error, where the kernel gave one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            EptError::Load { errno, .. }
            | EptError::Object { errno, .. }
            | EptError::Attach { errno, .. }
            | EptError::TestRun { errno, .. } => *errno,
            _ => None,
        }
    }
}

/// The errno in a libbpf-rs error ("... (os error N)"), which does not
/// expose it otherwise.
pub(super) fn errno_of(e: &libbpf_rs::Error) -> Option<i32> {
    let text = format!("{e:#}");
    let start = text.rfind("(os error ")? + "(os error ".len();
    let rest = &text[start..];
    rest[..rest.find(')')?].parse().ok()
}

/// "EPERM: Operation not permitted (os error 1)" for the common errnos.
pub(super) fn describe(e: &libbpf_rs::Error) -> (Option<i32>, String) {
    let errno = errno_of(e);
    let name = errno.and_then(|n| {
        Some(match n {
            libc::EPERM => "EPERM",
            libc::ENOENT => "ENOENT",
            libc::ESRCH => "ESRCH",
            libc::E2BIG => "E2BIG",
            libc::EACCES => "EACCES",
            libc::EBUSY => "EBUSY",
            libc::EINVAL => "EINVAL",
            libc::ENOMEM => "ENOMEM",
            libc::ENOSPC => "ENOSPC",
            libc::EOPNOTSUPP => "EOPNOTSUPP",
            524 => "ENOTSUPP",
            _ => return None,
        })
    });
    let message = match name {
        Some(name) => format!("{name}: {e:#}"),
        None => format!("{e:#}"),
    };
    (errno, message)
}

pub(super) fn map_err(
    map: &'static str,
    op: &'static str,
) -> impl FnOnce(libbpf_rs::Error) -> EptError {
    move |e| EptError::Map {
        map,
        op,
        message: format!("{e:#}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_is_read_from_libbpf_errors() {
        let e = libbpf_rs::Error::from_raw_os_error(libc::EPERM);
        assert_eq!(errno_of(&e), Some(libc::EPERM));
        let (errno, msg) = describe(&e);
        assert_eq!(errno, Some(1));
        assert!(msg.starts_with("EPERM: "), "{msg}");
    }
}
