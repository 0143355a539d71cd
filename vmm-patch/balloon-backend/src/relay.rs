//! A pass-through between the frontend's vhost-user connection and
//! vhost-user-backend's request handler, which keeps a copy of the
//! backend-request channel.
//!
//! Why: rust-vmm `vhost` 0.18 hands a backend the frontend's channel only
//! as a `vhost::vhost_user::Backend`, which can send shared-object and
//! shmem requests but not `VHOST_USER_BACKEND_CONFIG_CHANGE_MSG` (SPEC.md
//! section 6 rule 1 needs exactly that), and does not expose its socket.
//! The relay parses only message framing (12-byte header: request, flags,
//! size; then `size` bytes), forwards every message with its file
//! descriptors unchanged, and when it sees `VHOST_USER_SET_BACKEND_REQ_FD`
//! (request 21) gives a duplicate of that fd to the device, which writes
//! config-change messages on it. Replies flow back as plain bytes: none of
//! the features offered returns a file descriptor.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;

use vhost::vhost_user::message::MAX_MSG_SIZE;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::device::Balloon;

const HEADER: usize = 12;
const SET_BACKEND_REQ_FD: u32 = 21;
/// `MAX_ATTACHED_FD_ENTRIES` of the vhost crate.
const MAX_FDS: usize = 32;

/// Frontend -> backend: one message at a time, fds kept with their header.
fn forward_requests(front: &UnixStream, inner: &UnixStream, device: &Balloon) -> io::Result<()> {
    let mut hdr = [0u8; HEADER];
    let mut body = Vec::new();
    loop {
        let mut raw = [-1 as RawFd; MAX_FDS];
        let mut iov = [libc::iovec {
            iov_base: hdr.as_mut_ptr().cast(),
            iov_len: HEADER,
        }];
        // SAFETY: the iovec points into `hdr`, which we own mutably and
        // which outlives the call; any bytes may be written there.
        let (n, nfds) = unsafe { front.recv_with_fds(&mut iov, &mut raw) }
            .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
        // SAFETY: recv_with_fds returned `nfds` new descriptors that nobody
        // else owns.
        let fds: Vec<OwnedFd> = raw[..nfds.min(MAX_FDS)]
            .iter()
            .map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) })
            .collect();
        if n == 0 {
            return Ok(()); // frontend closed
        }
        if n < HEADER {
            (&*front).read_exact(&mut hdr[n..])?;
        }
        let word = |i: usize| u32::from_le_bytes([hdr[i], hdr[i + 1], hdr[i + 2], hdr[i + 3]]);
        let (request, size) = (word(0), word(8) as usize);
        if size > MAX_MSG_SIZE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("vhost-user message {request} of {size} bytes"),
            ));
        }
        body.resize(size, 0);
        (&*front).read_exact(&mut body)?;
        if request == SET_BACKEND_REQ_FD
            && let [fd] = fds.as_slice()
        {
            match fd.as_fd().try_clone_to_owned() {
                Ok(dup) => device.set_notify_channel(Some(UnixStream::from(dup))),
                Err(e) => tracing::warn!("cannot keep the backend channel: {e}"),
            }
        }
        let raw_fds: Vec<RawFd> = fds.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
        let sent = inner
            .send_with_fds(&[&hdr[..], &body[..]], &raw_fds)
            .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
        // The fds went with the first byte; finish the rest as plain bytes.
        let total = HEADER + size;
        if sent < total {
            let mut whole = Vec::with_capacity(total);
            whole.extend_from_slice(&hdr);
            whole.extend_from_slice(&body);
            (&*inner).write_all(&whole[sent..])?;
        }
        // Our copies of the fds close here; the backend received its own.
        drop(fds);
    }
}

/// Starts the two relay threads. They end when either side closes; both
/// sockets are then shut down so the other direction ends too.
pub fn spawn(
    front: UnixStream,
    inner: UnixStream,
    device: Balloon,
) -> io::Result<[JoinHandle<()>; 2]> {
    let (front2, inner2) = (front.try_clone()?, inner.try_clone()?);
    let up = std::thread::Builder::new()
        .name("vu-relay-req".into())
        .spawn(move || {
            if let Err(e) = forward_requests(&front, &inner, &device) {
                tracing::debug!("vhost-user relay (requests): {e}");
            }
            let _ = inner.shutdown(Shutdown::Write);
        })?;
    let down = std::thread::Builder::new()
        .name("vu-relay-reply".into())
        .spawn(move || {
            let (mut i, mut f) = (&inner2, &front2);
            if let Err(e) = io::copy(&mut i, &mut f) {
                tracing::debug!("vhost-user relay (replies): {e}");
            }
            let _ = front2.shutdown(Shutdown::Both);
        })?;
    Ok([up, down])
}
