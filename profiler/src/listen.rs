//! Where tierd listens: the unix socket (mode and group) and, optionally,
//! TCP with TLS.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use anyhow::{Context, bail};
use tokio::net::UnixListener;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use tier_profiler::config::TcpSettings;

/// Binds the socket. A stale socket file (nobody listening) is replaced; a
/// live one or a non-socket file is an error, never deleted.
pub fn unix(path: &Path, mode: u32, group: Option<u32>) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            bail!(
                "{} exists and is not a socket; not touching it",
                path.display()
            );
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!("another tierd is already serving on {}", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(path, None, Some(gid))
            .with_context(|| format!("chgrp {gid} {}", path.display()))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", path.display()))?;
    Ok(listener)
}

/// TLS for the TCP listener; with `client_ca`, clients must present a
/// certificate it signed.
pub fn tls(tcp: &TcpSettings) -> anyhow::Result<ServerTlsConfig> {
    let read = |p: &Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
    let mut tls =
        ServerTlsConfig::new().identity(Identity::from_pem(read(&tcp.cert)?, read(&tcp.key)?));
    if let Some(ca) = &tcp.client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(read(ca)?));
    }
    Ok(tls)
}
