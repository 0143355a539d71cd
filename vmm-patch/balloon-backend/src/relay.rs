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
//!
//! And it answers `GET_CONFIG` / `SET_CONFIG` requests the vhost crate
//! would drop the connection over ([`config_refusal`]): an offset or
//! length outside the 4 KiB config window (`0xfffffffc + 4` included: the
//! arithmetic is checked), a zero length, unknown flags, a payload that
//! does not match its size. A bad `GET_CONFIG` gets the vhost-user error
//! reply (a config header with size 0 and no payload, as the spec and the
//! vhost crate's frontend read it); a bad `SET_CONFIG` is ignored (virtio:
//! writes outside the device config are ignored) and, if `REPLY_ACK` is
//! negotiated and asked, acked with success like every ignored write
//! (SPEC.md section 6 rule 2). Replies from both sources are written whole
//! under one lock, so they never interleave.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use vhost::vhost_user::message::MAX_MSG_SIZE;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::config::CONFIG_WINDOW;
use crate::device::Balloon;

const HEADER: usize = 12;
const SET_FEATURES: u32 = 2;
const SET_MEM_TABLE: u32 = 5;
const SET_PROTOCOL_FEATURES: u32 = 16;
const SET_BACKEND_REQ_FD: u32 = 21;
const GET_CONFIG: u32 = 24;
const SET_CONFIG: u32 = 25;
/// Header flags: version 1, reply, need-reply.
const VERSION: u32 = 0x1;
const REPLY: u32 = 0x4;
const NEED_REPLY: u32 = 0x8;
/// `VhostUserConfig`: offset, size, flags (u32 each).
const CONFIG_HEAD: usize = 12;
/// `VhostUserConfigFlags::all()`: WRITABLE | LIVE_MIGRATION.
const CONFIG_FLAGS: u32 = 0x3;
/// `VHOST_USER_F_PROTOCOL_FEATURES` and `VHOST_USER_PROTOCOL_F_REPLY_ACK`.
const F_PROTOCOL_FEATURES: u64 = 1 << 30;
const PROTOCOL_F_REPLY_ACK: u64 = 1 << 3;
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
/// What the relay learned from the messages it forwarded.
#[derive(Debug, Clone, Copy, Default)]
pub struct Negotiated {
    features: u64,
    protocol: u64,
}

impl Negotiated {
    /// Notes `SET_FEATURES` / `SET_PROTOCOL_FEATURES`.
    pub fn observe(&mut self, hdr: &[u8; HEADER], body: &[u8]) {
        let (Ok(v), request) = (<[u8; 8]>::try_from(body), word(hdr, 0)) else {
            return;
        };
        match request {
            SET_FEATURES => self.features = u64::from_le_bytes(v),
            SET_PROTOCOL_FEATURES => self.protocol = u64::from_le_bytes(v),
            _ => {}
        }
    }

    /// The vhost crate's rule for sending acks.
    fn reply_ack(&self) -> bool {
        self.features & F_PROTOCOL_FEATURES != 0 && self.protocol & PROTOCOL_F_REPLY_ACK != 0
    }
}

fn word(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// A config request the relay answers instead of forwarding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `GET_CONFIG` (else `SET_CONFIG`).
    pub read: bool,
    pub offset: u32,
    pub size: u32,
    /// The bytes to send the frontend, if any.
    pub reply: Option<Vec<u8>>,
}

/// `Some` for a `GET_CONFIG` / `SET_CONFIG` the vhost crate would refuse
/// by dropping the connection; `None` for everything else.
pub fn config_refusal(hdr: &[u8; HEADER], body: &[u8], neg: &Negotiated) -> Option<Refusal> {
    let request = word(hdr, 0);
    if request != GET_CONFIG && request != SET_CONFIG {
        return None;
    }
    let (offset, size, flags) = if body.len() >= CONFIG_HEAD {
        (word(body, 0), word(body, 4), word(body, 8))
    } else {
        (0, 0, 0)
    };
    let in_window = offset
        .checked_add(size)
        .is_some_and(|end| end <= CONFIG_WINDOW);
    let valid = body.len() >= CONFIG_HEAD
        && size > 0
        && in_window
        && flags & !CONFIG_FLAGS == 0
        && body.len() - CONFIG_HEAD == size as usize;
    if valid {
        return None;
    }
    let reply_hdr = |size: u32| {
        let mut r = Vec::with_capacity(HEADER + size as usize);
        r.extend_from_slice(&request.to_le_bytes());
        r.extend_from_slice(&(VERSION | REPLY).to_le_bytes());
        r.extend_from_slice(&size.to_le_bytes());
        r
    };
    let reply = if request == GET_CONFIG {
        // The error reply: the request's offset, size 0, no payload.
        let mut r = reply_hdr(CONFIG_HEAD as u32);
        r.extend_from_slice(&offset.to_le_bytes());
        r.extend_from_slice(&0u32.to_le_bytes());
        r.extend_from_slice(&(flags & CONFIG_FLAGS).to_le_bytes());
        Some(r)
    } else if neg.reply_ack() && word(hdr, 4) & NEED_REPLY != 0 {
        let mut r = reply_hdr(8);
        r.extend_from_slice(&0u64.to_le_bytes());
        Some(r)
    } else {
        None
    };
    Some(Refusal {
        read: request == GET_CONFIG,
        offset,
        size,
        reply,
    })
}

/// The frontend socket's write side, shared by both directions so that
/// whole messages never interleave.
type FrontWriter = Arc<Mutex<UnixStream>>;

fn write_front(front: &FrontWriter, bytes: &[u8]) -> io::Result<()> {
    let guard = front.lock().unwrap_or_else(|p| p.into_inner());
    (&*guard).write_all(bytes)
}

/// `MAX_ATTACHED_FD_ENTRIES` of the vhost crate.
const MAX_FDS: usize = 32;

/// Frontend -> backend: one message at a time, fds kept with their header.
fn forward_requests(
    front: &UnixStream,
    writer: &FrontWriter,
    inner: &UnixStream,
    device: &Balloon,
) -> io::Result<()> {
    let mut hdr = [0u8; HEADER];
    let mut body = Vec::new();
    let mut neg = Negotiated::default();
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
        let (request, size) = (word(&hdr, 0), word(&hdr, 8) as usize);
        if size > MAX_MSG_SIZE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("vhost-user message {request} of {size} bytes"),
            ));
        }
        body.resize(size, 0);
        (&*front).read_exact(&mut body)?;
        normalise(&mut hdr, &mut body);
        neg.observe(&hdr, &body);
        if let Some(r) = config_refusal(&hdr, &body, &neg) {
            device.config_request_refused(r.read, r.offset, r.size);
            if let Some(reply) = r.reply {
                write_front(writer, &reply)?;
            }
            continue; // fds, if any, close here
        }
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

/// Backend -> frontend: whole messages (header, then `size` bytes).
fn forward_replies(inner: &UnixStream, writer: &FrontWriter) -> io::Result<()> {
    let mut msg = Vec::new();
    loop {
        let mut hdr = [0u8; HEADER];
        match (&*inner).read_exact(&mut hdr) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            r => r?,
        }
        let size = word(&hdr, 8) as usize;
        if size > MAX_MSG_SIZE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("vhost-user reply of {size} bytes"),
            ));
        }
        msg.clear();
        msg.extend_from_slice(&hdr);
        msg.resize(HEADER + size, 0);
        (&*inner).read_exact(&mut msg[HEADER..])?;
        write_front(writer, &msg)?;
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
    let writer: FrontWriter = Arc::new(Mutex::new(front.try_clone()?));
    let writer2 = Arc::clone(&writer);
    let up = std::thread::Builder::new()
        .name("vu-relay-req".into())
        .spawn(move || {
            if let Err(e) = forward_requests(&front, &writer, &inner, &device) {
                tracing::debug!("vhost-user relay (requests): {e}");
            }
            let _ = inner.shutdown(Shutdown::Write);
        })?;
    let down = std::thread::Builder::new()
        .name("vu-relay-reply".into())
        .spawn(move || {
            if let Err(e) = forward_replies(&inner2, &writer2) {
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

    fn config_msg(
        request: u32,
        flags: u32,
        offset: u32,
        size: u32,
        payload: usize,
    ) -> ([u8; HEADER], Vec<u8>) {
        let mut body = Vec::new();
        for v in [offset, size, 0] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        body.resize(CONFIG_HEAD + payload, 0);
        let mut hdr = [0u8; HEADER];
        hdr[0..4].copy_from_slice(&request.to_le_bytes());
        hdr[4..8].copy_from_slice(&flags.to_le_bytes());
        hdr[8..12].copy_from_slice(&(body.len() as u32).to_le_bytes());
        (hdr, body)
    }

    fn negotiated(reply_ack: bool) -> Negotiated {
        let mut n = Negotiated::default();
        let mut hdr = [0u8; HEADER];
        hdr[0..4].copy_from_slice(&SET_FEATURES.to_le_bytes());
        n.observe(&hdr, &F_PROTOCOL_FEATURES.to_le_bytes());
        hdr[0..4].copy_from_slice(&SET_PROTOCOL_FEATURES.to_le_bytes());
        let p = if reply_ack {
            PROTOCOL_F_REPLY_ACK | 1
        } else {
            1
        };
        n.observe(&hdr, &p.to_le_bytes());
        n
    }

    #[test]
    fn config_requests_inside_the_window_are_forwarded() {
        let n = negotiated(true);
        for (off, size) in [(0, 88), (0xff0, 16), (0, 0x800), (0xffc, 4)] {
            let (h, b) = config_msg(GET_CONFIG, VERSION, off, size, size as usize);
            assert_eq!(config_refusal(&h, &b, &n), None, "get {off:#x}+{size}");
            let (h, b) = config_msg(SET_CONFIG, VERSION | NEED_REPLY, off, size, size as usize);
            assert_eq!(config_refusal(&h, &b, &n), None, "set {off:#x}+{size}");
        }
        // Other requests are never looked at.
        let (h, b) = config_msg(SET_MEM_TABLE, VERSION, 0x1000, 4, 4);
        assert_eq!(config_refusal(&h, &b, &n), None);
    }

    /// The hostile frontend's requests: answered here, never forwarded.
    #[test]
    fn config_requests_outside_the_window_are_answered_here() {
        let n = negotiated(true);
        for (off, size, payload) in [
            (0x1000, 4, 4),
            (0xffff_fffc, 4, 4), // wraps to 0 without checked arithmetic
            (0xffe, 4, 4),
            (0xff0, 0x100, 0x100),
            (0, 0, 0),
            (0, 8, 4), // payload shorter than its size
        ] {
            let (h, b) = config_msg(GET_CONFIG, VERSION, off, size, payload);
            let r = config_refusal(&h, &b, &n).expect("refused");
            assert!(r.read);
            let reply = r.reply.expect("GET always gets a reply");
            // Header: GET_CONFIG, version 1 | REPLY, 12 bytes; then the
            // config header with the request's offset and size 0.
            assert_eq!(word(&reply, 0), GET_CONFIG);
            assert_eq!(word(&reply, 4), VERSION | REPLY);
            assert_eq!(word(&reply, 8), 12);
            assert_eq!((word(&reply, 12), word(&reply, 16)), (off, 0));
            assert_eq!(reply.len(), 24);

            let (h, b) = config_msg(SET_CONFIG, VERSION | NEED_REPLY, off, size, payload);
            let r = config_refusal(&h, &b, &n).expect("refused");
            let reply = r.reply.expect("acked: REPLY_ACK negotiated and asked");
            assert_eq!(word(&reply, 0), SET_CONFIG);
            assert_eq!(word(&reply, 8), 8);
            assert_eq!(&reply[12..], &0u64.to_le_bytes(), "success status");
            // Not asked, or REPLY_ACK not negotiated: no reply at all.
            let (h, b) = config_msg(SET_CONFIG, VERSION, off, size, payload);
            assert_eq!(config_refusal(&h, &b, &n).unwrap().reply, None);
            let (h, b) = config_msg(SET_CONFIG, VERSION | NEED_REPLY, off, size, payload);
            assert_eq!(
                config_refusal(&h, &b, &negotiated(false)).unwrap().reply,
                None
            );
        }
        // Too short for a config header, and unknown flags.
        let (h, _) = config_msg(GET_CONFIG, VERSION, 0, 4, 4);
        assert!(config_refusal(&h, &[0; 5], &n).is_some());
        let (h, mut b) = config_msg(GET_CONFIG, VERSION, 0, 4, 4);
        b[8] = 0x80;
        assert!(config_refusal(&h, &b, &n).is_some());
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
