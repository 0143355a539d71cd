//! Connecting to tierd, with the failures people actually hit phrased for
//! them: no daemon, the socket's group, a protocol version mismatch, and
//! gRPC statuses turned into sentences.

use std::ffi::CStr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tier_proto::v1::tier_service_client::TierServiceClient;
use tier_proto::v1::{DaemonInfo, GetInfoRequest};
use tier_proto::{ConnectError, Endpoint, PROTOCOL_VERSION};
use tonic::transport::Channel;

/// A connected client and what tierd said about itself.
pub type Client = TierServiceClient<Channel>;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Connect(ConnectError),
    #[error("permission denied on {}: {hint}", path.display())]
    PermissionDenied { path: PathBuf, hint: String },
    #[error(
        "protocol version mismatch: tierd {daemon_version} speaks tier.v1 version {daemon}, this tierctl speaks {ours}; use matching versions"
    )]
    VersionMismatch {
        daemon_version: String,
        daemon: u32,
        ours: u32,
    },
    #[error(transparent)]
    Rpc(#[from] RpcError),
}

/// A failed call, named by its RPC.
#[derive(Debug, thiserror::Error)]
pub struct RpcError {
    pub rpc: &'static str,
    pub status: tonic::Status,
}

impl RpcError {
    pub fn new(rpc: &'static str, status: tonic::Status) -> RpcError {
        RpcError { rpc, status }
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use tonic::Code;
        let (rpc, msg) = (self.rpc, self.status.message());
        match self.status.code() {
            Code::InvalidArgument => write!(f, "tierd refused {rpc}: {msg}"),
            Code::NotFound => write!(f, "{rpc}: not found: {msg}"),
            Code::Unavailable => write!(f, "{rpc}: tierd went away or is unreachable ({msg})"),
            Code::Unimplemented => write!(
                f,
                "{rpc}: this tierd does not implement it (an older daemon?)"
            ),
            Code::PermissionDenied | Code::Unauthenticated => {
                write!(f, "{rpc}: tierd refused access: {msg}")
            }
            code => write!(f, "{rpc}: {code:?}: {msg}"),
        }
    }
}

/// Connects, calls GetInfo and checks the protocol version.
pub async fn connect(endpoint: &Endpoint) -> Result<(Client, DaemonInfo), ClientError> {
    let mut client = tier_proto::connect(endpoint).await.map_err(|e| match e {
        ConnectError::PermissionDenied(path) => ClientError::PermissionDenied {
            hint: permission_hint(&path),
            path,
        },
        e => ClientError::Connect(e),
    })?;
    let info = client
        .get_info(GetInfoRequest {})
        .await
        .map_err(|s| RpcError::new("GetInfo", s))?
        .into_inner();
    check_version(&info)?;
    Ok((client, info))
}

/// Refuses a daemon that speaks another tier.v1 version.
pub fn check_version(info: &DaemonInfo) -> Result<(), ClientError> {
    if info.protocol_version != PROTOCOL_VERSION {
        return Err(ClientError::VersionMismatch {
            daemon_version: info.daemon_version.clone(),
            daemon: info.protocol_version,
            ours: PROTOCOL_VERSION,
        });
    }
    Ok(())
}

/// What to do about EACCES on the socket: name its group from its metadata.
pub fn permission_hint(path: &Path) -> String {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => {
            return format!(
                "cannot even look at it ({e}): a directory above it is not accessible to you; run as root or ask for access to {}",
                path.parent().unwrap_or(path).display()
            );
        }
    };
    let mode = meta.permissions().mode() & 0o777;
    let group = group_name(meta.gid()).unwrap_or_else(|| meta.gid().to_string());
    if mode & 0o060 == 0 {
        return format!(
            "the socket has mode {mode:04o}, so its group ({group}) cannot use it either; run as root or set socket_mode in tierd's config"
        );
    }
    format!(
        "the socket belongs to group `{group}` (mode {mode:04o}); join it (`sudo usermod -aG {group} $USER`, then log in again) or run as root"
    )
}

/// Name of a group id, through NSS (so LDAP groups work too).
pub fn group_name(gid: u32) -> Option<String> {
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: all-zero is a valid `struct group` (null pointers, zero id).
        let mut grp: libc::group = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::group = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call: `grp` and `result` are
        // locals, `buf` is writable for `buf.len()` bytes.
        let rc = unsafe {
            libc::getgrgid_r(
                gid,
                &mut grp,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut result,
            )
        };
        if rc == libc::ERANGE && buf.len() < (1 << 20) {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 || result.is_null() || grp.gr_name.is_null() {
            return None;
        }
        // SAFETY: on success gr_name points to a NUL-terminated string in
        // `buf`, which is still alive here.
        let name = unsafe { CStr::from_ptr(grp.gr_name) };
        return Some(name.to_string_lossy().into_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_zero_is_root() {
        assert_eq!(group_name(0).as_deref(), Some("root"));
        assert_eq!(group_name(4_000_000_000), None);
    }

    #[test]
    fn hint_names_the_group_and_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let _l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660)).unwrap();
        let gid = std::fs::metadata(&path).unwrap().gid();
        let group = group_name(gid).unwrap_or_else(|| gid.to_string());
        let h = permission_hint(&path);
        assert!(h.contains(&format!("group `{group}`")), "{h}");
        assert!(h.contains("0660") && h.contains("usermod -aG"), "{h}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(permission_hint(&path).contains("mode 0600"));
        assert!(permission_hint(&dir.path().join("nope")).contains("not accessible"));
    }

    #[test]
    fn version_mismatch_is_refused() {
        let mut info = DaemonInfo {
            protocol_version: PROTOCOL_VERSION,
            daemon_version: "9.9.9".into(),
            ..Default::default()
        };
        assert!(check_version(&info).is_ok());
        info.protocol_version = PROTOCOL_VERSION + 1;
        let e = check_version(&info).unwrap_err().to_string();
        assert!(
            e.contains("protocol version mismatch") && e.contains("9.9.9"),
            "{e}"
        );
    }

    #[test]
    fn statuses_read_as_sentences() {
        let e = RpcError::new(
            "SetPolicy",
            tonic::Status::invalid_argument("policy.epsilon: 0.9 is not in [0, 0.5]"),
        );
        assert_eq!(
            e.to_string(),
            "tierd refused SetPolicy: policy.epsilon: 0.9 is not in [0, 0.5]"
        );
        let e = RpcError::new("WatchDecisions", tonic::Status::unimplemented(""));
        assert!(e.to_string().contains("does not implement"));
    }
}
