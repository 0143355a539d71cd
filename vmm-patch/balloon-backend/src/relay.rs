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
//!
//! It also trims `VHOST_USER_SET_MEM_TABLE` to the regions it declares
//! ([`normalise`]): Linux's virtio_uml sends the room for two regions with
//! `num_regions = 1` (72 bytes), which the vhost crate rejects; the
//! vhost-user spec makes `num_regions` the rule.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;

use vhost::vhost_user::message::MAX_MSG_SIZE;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::device::Balloon;

const HEADER: usize = 12;
const SET_MEM_TABLE: u32 = 5;
const SET_BACKEND_REQ_FD: u32 = 21;
/// `VhostUserMemory`: num_regions (u32) and padding (u32).
const MEM_TABLE_HEAD: usize = 8;
/// `VhostUserMemoryRegion`: guest address, size, user address, mmap offset.
const MEM_REGION: usize = 32;

/// Makes a message what the vhost crate accepts without changing its
/// meaning: a `SET_MEM_TABLE` body longer than its `num_regions` regions is
/// cut to them and the header's size follows. A body too short for its
/// regions is left alone, for the vhost crate to refuse.
pub fn normalise(hdr: &mut [u8; HEADER], body: &mut Vec<u8>) {
    let request = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
    if request != SET_MEM_TABLE || body.len() < MEM_TABLE_HEAD {
        return;
    }
    let regions = u32::from_le_bytes([body[0], body[1], body[2], body[3]]) as usize;
    let needed = MEM_TABLE_HEAD + regions.saturating_mul(MEM_REGION);
    if needed < body.len() {
        body.truncate(needed);
        hdr[8..12].copy_from_slice(&(needed as u32).to_le_bytes());
    }
}
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
        normalise(&mut hdr, &mut body);
        let size = body.len();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The 72-byte SET_MEM_TABLE of Linux 6.1's virtio_uml
    /// (arch/um/drivers/virtio_uml.c, vhost_user_set_mem_table: room for
    /// `regions[2]`, `num = 1`), as captured from linux.uml.
    fn uml_mem_table() -> ([u8; HEADER], Vec<u8>) {
        let mut hdr = [0u8; HEADER];
        hdr[0..4].copy_from_slice(&5u32.to_le_bytes());
        hdr[4..8].copy_from_slice(&1u32.to_le_bytes()); // version 1
        hdr[8..12].copy_from_slice(&72u32.to_le_bytes());
        let mut body = vec![0u8; 72];
        body[0..4].copy_from_slice(&1u32.to_le_bytes());
        // Region 0: guest 0xaa8000, size 0x7558000, user 0x7f00_0000_0000,
        // mmap offset 0xaa8000; region 1 left as zeros.
        for (i, v) in [0xaa8000u64, 0x7558000, 0x7f00_0000_0000, 0xaa8000]
            .iter()
            .enumerate()
        {
            body[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        (hdr, body)
    }

    #[test]
    fn uml_trailing_room_is_cut_to_the_declared_region() {
        let (mut hdr, mut body) = uml_mem_table();
        let region = body[8..40].to_vec();
        normalise(&mut hdr, &mut body);
        assert_eq!(body.len(), 40);
        assert_eq!(u32::from_le_bytes([hdr[8], hdr[9], hdr[10], hdr[11]]), 40);
        assert_eq!(
            &body[8..40],
            &region[..],
            "the region is kept byte for byte"
        );
        assert_eq!(
            &hdr[0..8],
            &uml_mem_table().0[0..8],
            "request and flags kept"
        );
    }

    #[test]
    fn exact_and_short_tables_and_other_requests_are_untouched() {
        // Exact size (CH, QEMU): nothing to do.
        let (mut hdr, mut body) = uml_mem_table();
        body.truncate(40);
        hdr[8..12].copy_from_slice(&40u32.to_le_bytes());
        let before = (hdr, body.clone());
        normalise(&mut hdr, &mut body);
        assert_eq!((hdr, body), before);
        // More regions declared than sent: left for the vhost crate to
        // refuse, never padded.
        let (mut hdr, mut body) = uml_mem_table();
        body[0..4].copy_from_slice(&3u32.to_le_bytes());
        normalise(&mut hdr, &mut body);
        assert_eq!(body.len(), 72);
        // A huge num_regions cannot overflow.
        let (mut hdr, mut body) = uml_mem_table();
        body[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        normalise(&mut hdr, &mut body);
        assert_eq!(body.len(), 72);
        // Too short for the table head, and another request: untouched.
        let (mut hdr, mut body) = uml_mem_table();
        body.truncate(4);
        normalise(&mut hdr, &mut body);
        assert_eq!(body.len(), 4);
        let (mut hdr, mut body) = uml_mem_table();
        hdr[0..4].copy_from_slice(&6u32.to_le_bytes());
        normalise(&mut hdr, &mut body);
        assert_eq!(body.len(), 72);
    }
}
