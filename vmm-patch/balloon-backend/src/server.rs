//! The vhost-user socket: one frontend at a time, served until it
//! disconnects, then the next.
//!
//! Per connection: a fresh `VhostUserDaemon` (vhost-user-backend keeps
//! per-connection state such as ownership and mappings in its handler),
//! reached through [`crate::relay`] over a private socket, plus the stats
//! timer on the daemon's worker epoll.

use std::ffi::{CString, OsString};
use std::io;
use std::net::Shutdown;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use vhost::vhost_user::{Error as VhostUserError, Listener};
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;

use crate::device::Balloon;
use crate::relay;

/// Why a socket could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    // The io::Error is in the message, not a `source`, so that log lines
    // (Display only) keep the cause and anyhow does not print it twice.
    #[error("{what} {path}: {err}")]
    Socket {
        what: &'static str,
        path: PathBuf,
        err: io::Error,
    },
    #[error("vhost-user daemon: {0}")]
    Daemon(String),
    #[error("{0}: {1}")]
    Io(&'static str, io::Error),
}

/// Binds a unix socket at `path`, mode 0600. A stale socket file there
/// (nobody listening) is replaced; any other existing file is an error.
///
/// The socket never exists at `path` with a wider mode: it is bound in a
/// private 0700 directory next to `path` (same filesystem), chmod'ed
/// there, and renamed into place. (Binding at `path` and then chmod'ing
/// left a window in which anyone the umask allowed could connect.)
pub fn bind_socket(path: &Path) -> Result<UnixListener, ServeError> {
    let err = |what, err| ServeError::Socket {
        what,
        path: path.to_path_buf(),
        err,
    };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(err(
                "not a socket, refusing to replace",
                io::Error::from(io::ErrorKind::AlreadyExists),
            ));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(err(
                "another process is listening on",
                io::Error::from(io::ErrorKind::AddrInUse),
            ));
        }
        std::fs::remove_file(path).map_err(|e| err("cannot remove stale socket", e))?;
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let dir = PrivateDir::new_in(&parent).map_err(|e| err("cannot bind", e))?;
    let tmp = dir.0.join("sock");
    let l = UnixListener::bind(&tmp).map_err(|e| err("cannot bind", e))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| err("cannot chmod", e))?;
    std::fs::rename(&tmp, path).map_err(|e| err("cannot move the socket to", e))?;
    Ok(l)
}

/// A private directory (mode 0700) for the relay's internal socket.
struct PrivateDir(PathBuf);

impl PrivateDir {
    fn new() -> io::Result<PrivateDir> {
        Self::new_in(&std::env::temp_dir())
    }

    fn new_in(parent: &Path) -> io::Result<PrivateDir> {
        let template = parent.join(".tier-balloon.XXXXXX");
        let mut buf = CString::new(template.into_os_string().into_encoded_bytes())
            .map_err(io::Error::other)?
            .into_bytes_with_nul();
        // SAFETY: `buf` is a writable NUL-terminated template ending in
        // XXXXXX, which mkdtemp rewrites in place.
        let p = unsafe { libc::mkdtemp(buf.as_mut_ptr().cast()) };
        if p.is_null() {
            return Err(io::Error::last_os_error());
        }
        buf.pop();
        Ok(PrivateDir(PathBuf::from(OsString::from_vec(buf))))
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Serves one frontend connection until it ends.
pub fn serve_connection(device: &Balloon, front: UnixStream) -> Result<(), ServeError> {
    let dir = PrivateDir::new().map_err(|e| ServeError::Io("private dir", e))?;
    let path = dir.0.join("vu.sock");
    let inner_listener = UnixListener::bind(&path).map_err(|e| ServeError::Socket {
        what: "cannot bind",
        path: path.clone(),
        err: e,
    })?;
    // Queued in the backlog; the daemon's accept below returns it.
    let inner = UnixStream::connect(&path).map_err(|e| ServeError::Socket {
        what: "cannot connect",
        path: path.clone(),
        err: e,
    })?;
    let mut listener = Listener::from(inner_listener);
    let mem = GuestMemoryAtomic::new(GuestMemoryMmap::<()>::new());
    let mut daemon = VhostUserDaemon::new("tier-balloon".into(), device.clone(), mem)
        .map_err(|e| ServeError::Daemon(e.to_string()))?;
    let timer = device
        .new_stats_timer()
        .map_err(|e| ServeError::Io("stats timer", e))?;
    let handlers = daemon.get_epoll_handlers();
    let worker = handlers
        .first()
        .ok_or_else(|| ServeError::Daemon("no worker thread".into()))?;
    worker
        .register_listener(timer, EventSet::IN, device.timer_event_id())
        .map_err(|e| ServeError::Io("stats timer on epoll", e))?;
    daemon
        .start(&mut listener)
        .map_err(|e| ServeError::Daemon(e.to_string()))?;
    drop(listener);
    drop(dir);
    device.connected();
    let relays = relay::spawn(
        front
            .try_clone()
            .map_err(|e| ServeError::Io("clone socket", e))?,
        inner
            .try_clone()
            .map_err(|e| ServeError::Io("clone socket", e))?,
        device.clone(),
    )
    .map_err(|e| ServeError::Io("relay threads", e))?;
    let result = daemon.wait();
    let _ = front.shutdown(Shutdown::Both);
    let _ = inner.shutdown(Shutdown::Both);
    for r in relays {
        let _ = r.join();
    }
    device.disconnected();
    drop(daemon);
    match result {
        // A frontend that simply went away is the normal end.
        Ok(())
        | Err(vhost_user_backend::Error::HandleRequest(
            VhostUserError::Disconnected | VhostUserError::PartialMessage,
        )) => Ok(()),
        Err(e) => Err(ServeError::Daemon(e.to_string())),
    }
}

/// Accepts frontends on `listener` forever, one at a time.
pub fn serve(device: &Balloon, listener: &UnixListener) -> Result<(), ServeError> {
    loop {
        let (front, _) = listener.accept().map_err(|e| ServeError::Io("accept", e))?;
        tracing::info!("frontend connected");
        match serve_connection(device, front) {
            Ok(()) => tracing::info!("frontend disconnected"),
            Err(e) => tracing::warn!("frontend connection ended: {e}"),
        }
    }
}
