//! The `tier-balloon` binary driven over a real vhost-user socket by the
//! `vhost` crate's frontend (`vhost::vhost_user::Frontend`), the way a VMM
//! would: memfd guest memory (one memfd: a ring area, a `dram` zone and a
//! `slow` zone at different file offsets), real split virtqueues laid out
//! in that memory, kick/call eventfds, GET/SET_CONFIG, a backend-request
//! channel for config-change messages, and the control socket.
//!
//! Freed pages are checked on the test's own mapping of the memfd with
//! `mincore` and on the file with `fstat().st_blocks`: a punch by the
//! backend (in another process, through its own mapping and the fd it
//! received) is visible in both.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
use vhost::vhost_user::{
    Frontend, FrontendReqHandler, HandlerResult, VhostUserFrontend, VhostUserFrontendReqHandler,
};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

const PAGE: u64 = 4096;
const MIB: u64 = 1 << 20;
/// Guest layout: one memfd, three SET_MEM_TABLE regions.
const RINGS_GPA: u64 = 0x2000_0000; // file offset 0, 1 MiB, in no tier
const DRAM_GPA: u64 = 0; // file offset 1 MiB, 8 MiB: tier 0
const SLOW_GPA: u64 = 0x1000_0000; // file offset 9 MiB, 8 MiB: tier 1
const ZONE: u64 = 8 * MIB;
/// Second range of the slow tier: declared on the command line, never
/// mapped by the frontend.
const SLOW_UNMAPPED_GPA: u64 = 0x1800_0000;
const MEMFD_SIZE: u64 = 17 * MIB;
/// Where PFN arrays go (inside the ring area, after the rings).
const BUF_GPA: u64 = RINGS_GPA + 0x1_0000;
const QSIZE: u16 = 128;

const F_STATS_VQ: u64 = 1 << 1;
const F_TIERS: u64 = 1 << 23;
const F_INDIRECT_DESC: u64 = 1 << 28;
const F_EVENT_IDX: u64 = 1 << 29;
const F_PROTOCOL_FEATURES: u64 = 1 << 30;
const F_VERSION_1: u64 = 1 << 32;

/// Queues with stats and tiers negotiated (SPEC.md section 3).
const LEGACY_INFLATE: usize = 0;
const STATS: usize = 2;
const DRAM_INFLATE: usize = 3;
const DRAM_DEFLATE: usize = 4;
const SLOW_INFLATE: usize = 5;
const SLOW_DEFLATE: usize = 6;

fn dram_pfn(page: u64) -> u32 {
    ((DRAM_GPA >> 12) + page) as u32
}
fn slow_pfn(page: u64) -> u32 {
    ((SLOW_GPA >> 12) + page) as u32
}

/// The guest memory as the test (the "VMM") maps it.
struct Guest {
    fd: OwnedFd,
    base: *mut u8,
}

impl Guest {
    fn new() -> Guest {
        let fd = tier_balloon::memfd("guest", MEMFD_SIZE, false).unwrap();
        // SAFETY: fresh shared mapping of our own memfd.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                MEMFD_SIZE as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Guest { fd, base: p.cast() }
    }

    /// (gpa, size, file offset) of each region, by ascending gpa (as
    /// SET_MEM_TABLE wants them).
    fn regions() -> [(u64, u64, u64); 3] {
        [
            (DRAM_GPA, ZONE, MIB),
            (SLOW_GPA, ZONE, 9 * MIB),
            (RINGS_GPA, MIB, 0),
        ]
    }

    fn file_offset(gpa: u64, len: u64) -> u64 {
        for (g, size, off) in Self::regions() {
            if gpa >= g && gpa + len <= g + size {
                return off + (gpa - g);
            }
        }
        panic!("gpa {gpa:#x}+{len:#x} is not guest memory");
    }

    fn host(&self, gpa: u64, len: u64) -> *mut u8 {
        // SAFETY: inside our mapping (file_offset checks the range).
        unsafe { self.base.add(Self::file_offset(gpa, len) as usize) }
    }

    fn write(&self, gpa: u64, bytes: &[u8]) {
        // SAFETY: inside our live shared mapping; the backend only reads
        // these bytes after the fence + kick that follow.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.host(gpa, bytes.len() as u64),
                bytes.len(),
            )
        };
    }

    fn read_u16(&self, gpa: u64) -> u16 {
        // SAFETY: aligned u16 inside our mapping; written by the backend.
        unsafe { std::ptr::read_volatile(self.host(gpa, 2).cast::<u16>()) }
    }

    fn read_u32(&self, gpa: u64) -> u32 {
        // SAFETY: as read_u16.
        unsafe { std::ptr::read_volatile(self.host(gpa, 4).cast::<u32>()) }
    }

    /// Writes a marker into every page of [gpa, gpa + len).
    fn touch(&self, gpa: u64, len: u64) {
        for p in 0..len / PAGE {
            let a = gpa + p * PAGE;
            self.write(a, &(a | 1).to_le_bytes());
        }
    }

    fn marker(&self, gpa: u64) -> u64 {
        // SAFETY: aligned u64 inside our mapping.
        unsafe { std::ptr::read_volatile(self.host(gpa, 8).cast::<u64>()) }
    }

    /// mincore residency of each page of [gpa, gpa + pages * 4 KiB).
    fn resident(&self, gpa: u64, pages: u64) -> Vec<bool> {
        let mut v = vec![0u8; pages as usize];
        // SAFETY: the range is inside our mapping, v has one byte per page.
        let rc = unsafe {
            libc::mincore(
                self.host(gpa, pages * PAGE).cast(),
                (pages * PAGE) as usize,
                v.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        v.iter().map(|b| b & 1 == 1).collect()
    }

    /// 4 KiB pages allocated in the memfd.
    fn allocated(&self) -> u64 {
        // SAFETY: fstat into a zeroed buffer we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid fd, valid out pointer.
        assert_eq!(unsafe { libc::fstat(self.fd.as_raw_fd(), &mut st) }, 0);
        st.st_blocks as u64 * 512 / PAGE
    }

    fn region_infos(&self) -> Vec<VhostUserMemoryRegionInfo> {
        Self::regions()
            .iter()
            .map(|&(gpa, size, off)| VhostUserMemoryRegionInfo {
                guest_phys_addr: gpa,
                memory_size: size,
                userspace_addr: self.host(gpa, size) as u64,
                mmap_offset: off,
                mmap_handle: self.fd.as_raw_fd(),
            })
            .collect()
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        // SAFETY: our mapping, unmapped once.
        unsafe { libc::munmap(self.base.cast(), MEMFD_SIZE as usize) };
    }
}

/// One split virtqueue laid out in the ring area: 8 KiB per queue.
struct Vq {
    desc: u64,
    avail: u64,
    used: u64,
    next_avail: u16,
    used_seen: u16,
    kick: EventFd,
    call: EventFd,
}

impl Vq {
    fn new(index: usize) -> Vq {
        let base = RINGS_GPA + index as u64 * 0x2000;
        Vq {
            desc: base,
            avail: base + 0x1000,
            used: base + 0x1800,
            next_avail: 0,
            used_seen: 0,
            kick: EventFd::new(EFD_NONBLOCK).unwrap(),
            call: EventFd::new(EFD_NONBLOCK).unwrap(),
        }
    }

    /// Makes one chain of `descs` (gpa, len, device-writable) available,
    /// starting at descriptor `first`, and kicks.
    fn post_at(&mut self, g: &Guest, first: u16, descs: &[(u64, u32, bool)]) -> u16 {
        for (i, &(addr, len, writable)) in descs.iter().enumerate() {
            let idx = first + i as u16;
            let last = i + 1 == descs.len();
            let flags: u16 = if last { 0 } else { 1 } | if writable { 2 } else { 0 };
            let mut d = [0u8; 16];
            d[0..8].copy_from_slice(&addr.to_le_bytes());
            d[8..12].copy_from_slice(&len.to_le_bytes());
            d[12..14].copy_from_slice(&flags.to_le_bytes());
            d[14..16].copy_from_slice(&(idx + 1).to_le_bytes());
            g.write(self.desc + 16 * u64::from(idx), &d);
        }
        self.publish(g, first)
    }

    /// Puts `head` in the avail ring, bumps the index and kicks.
    fn publish(&mut self, g: &Guest, head: u16) -> u16 {
        let first = head;
        let slot = u64::from(self.next_avail % QSIZE);
        g.write(self.avail + 4 + 2 * slot, &first.to_le_bytes());
        fence(Ordering::SeqCst);
        self.next_avail = self.next_avail.wrapping_add(1);
        g.write(self.avail + 2, &self.next_avail.to_le_bytes());
        fence(Ordering::SeqCst);
        self.kick.write(1).unwrap();
        first
    }

    fn post(&mut self, g: &Guest, descs: &[(u64, u32, bool)]) -> u16 {
        self.post_at(g, 0, descs)
    }

    /// Waits until `n` more used entries arrived; returns (id, len) each.
    fn wait_used(&mut self, g: &Guest, n: u16) -> Vec<(u32, u32)> {
        let want = self.used_seen.wrapping_add(n);
        let deadline = Instant::now() + Duration::from_secs(15);
        while g.read_u16(self.used + 2) != want {
            assert!(
                Instant::now() < deadline,
                "queue at {:#x}: used idx {} never reached {want}",
                self.desc,
                g.read_u16(self.used + 2)
            );
            // Poll the call eventfd briefly (and also cover EVENT_IDX, where
            // the device may skip interrupts).
            let mut pfd = libc::pollfd {
                fd: self.call.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, 20) };
            let _ = self.call.read();
        }
        fence(Ordering::SeqCst);
        let mut out = Vec::new();
        while self.used_seen != want {
            let e = self.used + 4 + 8 * u64::from(self.used_seen % QSIZE);
            out.push((g.read_u32(e), g.read_u32(e + 4)));
            self.used_seen = self.used_seen.wrapping_add(1);
        }
        out
    }

    fn used_idx(&self, g: &Guest) -> u16 {
        g.read_u16(self.used + 2)
    }
}

struct RawFdRef(std::os::fd::RawFd);

impl AsRawFd for RawFdRef {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0
    }
}

/// Counts config-change messages from the backend.
#[derive(Default)]
struct ConfigChanges(AtomicU64);

impl VhostUserFrontendReqHandler for ConfigChanges {
    fn handle_config_change(&self) -> HandlerResult<u64> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(0)
    }
}

struct Backend {
    child: Child,
    _dir: tempfile::TempDir,
    socket: PathBuf,
    control: PathBuf,
}

impl Backend {
    fn start() -> Backend {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("vu.sock");
        let control = dir.path().join("ctl.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_tier-balloon"))
            .arg("--socket")
            .arg(&socket)
            .arg("--control")
            .arg(&control)
            .args(["--tier", "name=dram,ranges=0x0-0x800000,node=0"])
            .args([
                "--tier",
                "name=slow,ranges=0x10000000+8M:0x18000000+1M,node=1",
            ])
            .args(["--stats-interval-ms", "200"])
            .env("TIER_BALLOON_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let b = Backend {
            child,
            _dir: dir,
            socket,
            control,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if b.control.exists()
                && b.socket.exists()
                && let Ok(v) = try_control(&b.control, &json!({"op": "ping"}))
            {
                assert_eq!(v["ok"], true, "{v}");
                break;
            }
            assert!(Instant::now() < deadline, "tier-balloon did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        b
    }

    fn control(&self, req: &Value) -> Value {
        try_control(&self.control, req).unwrap()
    }

    fn state(&self) -> Value {
        let v = self.control(&json!({"op": "state"}));
        assert_eq!(v["ok"], true, "{v}");
        v["state"].clone()
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        // Our own child, by its pid.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn try_control(path: &Path, req: &Value) -> std::io::Result<Value> {
    let mut s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(format!("{req}\n").as_bytes())?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line)?;
    serde_json::from_str(&line).map_err(std::io::Error::other)
}

/// A connected, negotiated frontend with every queue set up.
struct Vmm {
    fe: Frontend,
    guest: Guest,
    queues: Vec<Vq>,
    changes: Arc<ConfigChanges>,
}

impl Vmm {
    fn connect(b: &Backend, event_idx: bool) -> Vmm {
        let guest = Guest::new();
        // The ring area is allocated (written) up front so that st_blocks
        // deltas count only balloon pages; rings start zeroed.
        guest.write(RINGS_GPA, &vec![0u8; MIB as usize]);
        let mut fe = Frontend::connect(&b.socket, 1).unwrap();
        fe.set_owner().unwrap();
        let offered = fe.get_features().unwrap();
        for bit in [
            F_VERSION_1,
            F_STATS_VQ,
            F_TIERS,
            F_PROTOCOL_FEATURES,
            F_EVENT_IDX,
            F_INDIRECT_DESC,
        ] {
            assert_ne!(
                offered & bit,
                0,
                "feature {bit:#x} not offered: {offered:#x}"
            );
        }
        let proto = fe.get_protocol_features().unwrap();
        let want = VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::BACKEND_REQ;
        assert!(proto.contains(want), "protocol features {proto:?}");
        fe.set_protocol_features(want).unwrap();
        let nq = fe.get_queue_num().unwrap();
        assert_eq!(nq, 7, "2 legacy + stats + 2 tiers x 2");
        let mut acked = F_VERSION_1 | F_STATS_VQ | F_TIERS | F_PROTOCOL_FEATURES | F_INDIRECT_DESC;
        if event_idx {
            acked |= F_EVENT_IDX;
        }
        fe.set_features(acked).unwrap();
        fe.set_mem_table(&guest.region_infos()).unwrap();
        let changes = Arc::new(ConfigChanges::default());
        let mut handler = FrontendReqHandler::new(Arc::clone(&changes)).unwrap();
        // The backend gets the handler's tx end (its AsRawFd is the rx end).
        fe.set_backend_request_fd(&RawFdRef(handler.get_tx_raw_fd()))
            .unwrap();
        std::thread::spawn(move || while handler.handle_request().is_ok() {});
        let mut queues = Vec::new();
        for q in 0..nq as usize {
            let vq = Vq::new(q);
            fe.set_vring_num(q, QSIZE).unwrap();
            fe.set_vring_addr(
                q,
                &VringConfigData {
                    queue_max_size: QSIZE,
                    queue_size: QSIZE,
                    flags: 0,
                    desc_table_addr: guest.host(vq.desc, 16 * u64::from(QSIZE)) as u64,
                    used_ring_addr: guest.host(vq.used, 6 + 8 * u64::from(QSIZE)) as u64,
                    avail_ring_addr: guest.host(vq.avail, 6 + 2 * u64::from(QSIZE)) as u64,
                    log_addr: None,
                },
            )
            .unwrap();
            fe.set_vring_base(q, 0).unwrap();
            fe.set_vring_call(q, &vq.call).unwrap();
            fe.set_vring_kick(q, &vq.kick).unwrap();
            fe.set_vring_enable(q, true).unwrap();
            queues.push(vq);
        }
        Vmm {
            fe,
            guest,
            queues,
            changes,
        }
    }

    /// Sends one chain of PFNs (one descriptor) on queue `q`; waits for it
    /// to come back with used length 0.
    fn pfns(&mut self, q: usize, pfns: &[u32]) {
        let bytes: Vec<u8> = pfns.iter().flat_map(|p| p.to_le_bytes()).collect();
        self.raw(q, &bytes);
    }

    fn raw(&mut self, q: usize, bytes: &[u8]) {
        self.guest.write(BUF_GPA, bytes);
        self.chain(q, &[(BUF_GPA, bytes.len() as u32, false)]);
    }

    fn chain(&mut self, q: usize, descs: &[(u64, u32, bool)]) {
        let head = self.queues[q].post(&self.guest, descs);
        let used = self.queues[q].wait_used(&self.guest, 1);
        assert_eq!(used, vec![(u32::from(head), 0)], "queue {q}");
    }

    fn config(&mut self, offset: u32, size: u32) -> Vec<u8> {
        let (hdr, data) = self
            .fe
            .get_config(
                offset,
                size,
                VhostUserConfigFlags::WRITABLE,
                &vec![0u8; size as usize],
            )
            .unwrap();
        assert_eq!((hdr.offset, hdr.size), (offset, size));
        data
    }
}

fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}

fn zone(state: &Value, i: usize) -> &Value {
    &state["zones"][i]
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Inflate and deflate per tier through the vrings; pages freed exactly
/// where asked (mincore on our mapping, st_blocks of the memfd), and the
/// accounting on the control socket. Uses EVENT_IDX.
#[test]
fn inflate_and_deflate_per_tier() {
    let b = Backend::start();
    let mut vmm = Vmm::connect(&b, true);
    let g = &vmm.guest;
    g.touch(DRAM_GPA, ZONE);
    g.touch(SLOW_GPA, ZONE);
    assert!(g.resident(DRAM_GPA, ZONE / PAGE).iter().all(|&r| r));
    let base = g.allocated();

    // dram: 256 contiguous PFNs (pages 256..512) in one chain, in reverse
    // order (the backend sorts), plus a scattered chain.
    let run: Vec<u32> = (256..512).rev().map(dram_pfn).collect();
    vmm.pfns(DRAM_INFLATE, &run);
    let scattered = [dram_pfn(10), dram_pfn(20), dram_pfn(21), dram_pfn(2047)];
    vmm.pfns(DRAM_INFLATE, &scattered);
    let g = &vmm.guest;
    let r = g.resident(DRAM_GPA, ZONE / PAGE);
    for (p, &res) in r.iter().enumerate() {
        let ballooned = (256..512).contains(&p) || [10, 20, 21, 2047].contains(&p);
        assert_eq!(res, !ballooned, "dram page {p}");
    }
    assert!(
        g.resident(SLOW_GPA, ZONE / PAGE).iter().all(|&r| r),
        "slow untouched"
    );
    assert!(
        g.resident(RINGS_GPA, MIB / PAGE).iter().all(|&r| r),
        "rings untouched"
    );
    assert_eq!(base - g.allocated(), 260);
    let s = b.state();
    assert_eq!(n(&zone(&s, 0)["host_ballooned"]), 260 * PAGE);
    assert_eq!(n(&zone(&s, 0)["inflated_pfns"]), 260);
    // One run for the 256, three for the scattered (20 and 21 coalesce).
    assert_eq!(n(&zone(&s, 0)["release_calls"]), 4);
    assert_eq!(n(&zone(&s, 0)["released_bytes"]), 260 * PAGE);
    assert_eq!(n(&zone(&s, 1)["host_ballooned"]), 0);
    assert_eq!(s["tiers_negotiated"], true);
    assert_eq!(n(&zone(&s, 0)["mapped_bytes"]), ZONE);
    assert_eq!(
        n(&zone(&s, 1)["mapped_bytes"]),
        ZONE,
        "the 1 MiB range is not mapped"
    );
    assert_eq!(n(&zone(&s, 1)["zone_bytes"]), ZONE + MIB);

    // slow: two descriptors in one chain, a PFN straddling them.
    let slow: Vec<u8> = (100..164u64)
        .flat_map(|p| slow_pfn(p).to_le_bytes())
        .collect();
    vmm.guest.write(BUF_GPA, &slow);
    vmm.chain(
        SLOW_INFLATE,
        &[
            (BUF_GPA, 102, false),
            (BUF_GPA + 102, slow.len() as u32 - 102, false),
        ],
    );
    let g = &vmm.guest;
    let r = g.resident(SLOW_GPA, ZONE / PAGE);
    for (p, &res) in r.iter().enumerate() {
        assert_eq!(res, !(100..164).contains(&p), "slow page {p}");
    }
    assert_eq!(base - g.allocated(), 260 + 64);

    // Deflate part of dram: the pages come back to the guest on touch.
    let back: Vec<u32> = (256..384).map(dram_pfn).collect();
    vmm.pfns(DRAM_DEFLATE, &back);
    let g = &vmm.guest;
    for p in 256..384u64 {
        assert_eq!(
            g.marker(DRAM_GPA + p * PAGE),
            0,
            "a released page reads as zero"
        );
    }
    g.touch(DRAM_GPA + 256 * PAGE, 128 * PAGE);
    assert!(g.resident(DRAM_GPA + 256 * PAGE, 128).iter().all(|&r| r));
    vmm.pfns(SLOW_DEFLATE, &(100..164).map(slow_pfn).collect::<Vec<_>>());
    let s = b.state();
    assert_eq!(n(&zone(&s, 0)["host_ballooned"]), 132 * PAGE);
    assert_eq!(n(&zone(&s, 0)["deflated_pfns"]), 128);
    assert_eq!(n(&zone(&s, 1)["host_ballooned"]), 0);
    assert_eq!(n(&zone(&s, 1)["deflated_pfns"]), 64);
    assert_eq!(n(&zone(&s, 0)["rejected_chains"]), 0);
    assert_eq!(n(&zone(&s, 1)["rejected_chains"]), 0);

    // Legacy queue: any mapped guest page, here one of the ring area's
    // last pages (no tier).
    let legacy_pfn = ((RINGS_GPA + MIB - PAGE) >> 12) as u32;
    let before = vmm.guest.allocated();
    vmm.pfns(LEGACY_INFLATE, &[legacy_pfn]);
    assert_eq!(before - vmm.guest.allocated(), 1);
    assert!(!vmm.guest.resident(RINGS_GPA + MIB - PAGE, 1)[0]);
    let s = b.state();
    assert_eq!(n(&s["legacy"]["host_ballooned"]), PAGE);

    // A new frontend (the VMM restarted): the balloon starts empty, the
    // cumulative counters stay.
    drop(vmm);
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.state()["frontend"]["connected"] == true {
        assert!(Instant::now() < deadline, "disconnect not noticed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut vmm = Vmm::connect(&b, false);
    vmm.pfns(DRAM_INFLATE, &[dram_pfn(300)]);
    let s = b.state();
    assert_eq!(n(&s["frontend"]["connections"]), 2);
    assert_eq!(n(&zone(&s, 0)["host_ballooned"]), PAGE);
    assert_eq!(n(&zone(&s, 0)["inflated_pfns"]), 261);
}

/// Every kind of bad chain is answered (used length 0), rejected whole,
/// counted by reason, and releases nothing; the backend keeps serving.
#[test]
fn bad_chains_are_rejected_and_release_nothing() {
    let b = Backend::start();
    let mut vmm = Vmm::connect(&b, false);
    let g = &vmm.guest;
    g.touch(DRAM_GPA, ZONE);
    g.touch(SLOW_GPA, ZONE);
    // One good inflate first, for the already-ballooned case.
    vmm.pfns(DRAM_INFLATE, &[dram_pfn(5)]);
    let before = vmm.guest.allocated();
    let good = [dram_pfn(100), dram_pfn(101), dram_pfn(102)];
    let with = |bad: u32| -> Vec<u32> { [&good[..], &[bad]].concat() };

    // (queue, chain, reason)
    let pfn_cases: Vec<(usize, Vec<u32>, &str)> = vec![
        (DRAM_INFLATE, with(0x7_0000), "outside_guest_memory"),
        (DRAM_INFLATE, with(u32::MAX), "outside_guest_memory"),
        (DRAM_INFLATE, with(slow_pfn(3)), "wrong_tier"),
        (DRAM_INFLATE, with(dram_pfn(101)), "duplicate_in_chain"),
        (DRAM_INFLATE, with(dram_pfn(5)), "already_ballooned"),
        // Mapped by SET_MEM_TABLE but in no tier's ranges.
        (
            DRAM_INFLATE,
            with((RINGS_GPA >> 12) as u32 + 200),
            "outside_guest_memory",
        ),
        (
            DRAM_DEFLATE,
            vec![dram_pfn(5), dram_pfn(6)],
            "not_ballooned",
        ),
        // In the slow tier's ranges but never mapped by the frontend.
        (
            SLOW_INFLATE,
            vec![slow_pfn(1), (SLOW_UNMAPPED_GPA >> 12) as u32],
            "outside_guest_memory",
        ),
        (SLOW_INFLATE, vec![slow_pfn(1), dram_pfn(1)], "wrong_tier"),
    ];
    for (q, chain, _) in &pfn_cases {
        vmm.pfns(*q, chain);
    }
    // Malformed: 6 bytes.
    let mut six = good[0].to_le_bytes().to_vec();
    six.extend_from_slice(&[0, 0]);
    vmm.raw(DRAM_INFLATE, &six);
    // A device-writable descriptor.
    vmm.guest.write(
        BUF_GPA,
        &good
            .iter()
            .flat_map(|p| p.to_le_bytes())
            .collect::<Vec<_>>(),
    );
    vmm.chain(DRAM_INFLATE, &[(BUF_GPA, 8, false), (BUF_GPA + 8, 4, true)]);
    // A descriptor pointing outside guest memory.
    vmm.chain(
        DRAM_INFLATE,
        &[(BUF_GPA, 12, false), (0x4000_0000, 16, false)],
    );
    // Longer than 8192 PFNs.
    vmm.chain(DRAM_INFLATE, &[(BUF_GPA, 40_000, false)]);
    // A descriptor chain that loops back on itself: malformed, rejected
    // before any PFN is read.
    {
        let q = &mut vmm.queues[DRAM_INFLATE];
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&BUF_GPA.to_le_bytes());
        d[8..12].copy_from_slice(&12u32.to_le_bytes());
        d[12..14].copy_from_slice(&1u16.to_le_bytes()); // NEXT
        d[14..16].copy_from_slice(&0u16.to_le_bytes()); // -> itself
        vmm.guest.write(q.desc, &d);
        let head = q.publish(&vmm.guest, 0);
        let used = q.wait_used(&vmm.guest, 1);
        assert_eq!(used, vec![(u32::from(head), 0)]);
    }

    let g = &vmm.guest;
    assert_eq!(g.allocated(), before, "a rejected chain released something");
    let r = g.resident(DRAM_GPA, ZONE / PAGE);
    for (p, &res) in r.iter().enumerate() {
        assert_eq!(res, p != 5, "dram page {p}");
    }
    assert!(g.resident(SLOW_GPA, ZONE / PAGE).iter().all(|&r| r));
    assert!(g.resident(RINGS_GPA, MIB / PAGE).iter().all(|&r| r));
    for p in [100u64, 101, 102] {
        assert_eq!(g.marker(DRAM_GPA + p * PAGE), (DRAM_GPA + p * PAGE) | 1);
    }

    let s = b.state();
    let mut want: std::collections::BTreeMap<(usize, &str), u64> = Default::default();
    for (q, _, reason) in &pfn_cases {
        let tier = if *q == SLOW_INFLATE { 1 } else { 0 };
        *want.entry((tier, reason)).or_default() += 1;
    }
    *want.entry((0, "malformed_length")).or_default() += 1;
    *want.entry((0, "bad_descriptor")).or_default() += 3; // with the loop
    *want.entry((0, "too_long")).or_default() += 1;
    for tier in 0..2 {
        let rejected = &zone(&s, tier)["rejected"];
        for (reason, count) in rejected.as_object().unwrap() {
            assert_eq!(
                n(count),
                want.get(&(tier, reason.as_str())).copied().unwrap_or(0),
                "tier {tier} {reason}: {rejected}"
            );
        }
        let total: u64 = want
            .iter()
            .filter(|((t, _), _)| *t == tier)
            .map(|(_, c)| c)
            .sum();
        assert_eq!(n(&zone(&s, tier)["rejected_chains"]), total);
    }
    assert_eq!(n(&zone(&s, 0)["host_ballooned"]), PAGE);
    assert_eq!(n(&zone(&s, 0)["release_calls"]), 1);
    assert_eq!(n(&zone(&s, 1)["release_calls"]), 0);

    // Still serving: the good PFNs go through now.
    vmm.pfns(DRAM_INFLATE, &good);
    assert_eq!(before - vmm.guest.allocated(), 3);
    assert_eq!(n(&zone(&b.state(), 0)["host_ballooned"]), 4 * PAGE);
}

/// GET/SET_CONFIG rules of SPEC.md section 6, the config-change message
/// after a control-socket target change, and the stats queue.
#[test]
fn config_space_targets_and_stats() {
    let b = Backend::start();
    let mut vmm = Vmm::connect(&b, false);

    let c = vmm.config(0, 88);
    assert_eq!(le32(&c, 0x10), 2, "tier_count");
    assert_eq!(le32(&c, 0x18 + 8), 0, "dram guest node");
    assert_eq!(le32(&c, 0x38 + 8), 1, "slow guest node");
    assert_eq!(
        u64::from_le_bytes(c[0x38 + 0x10..0x38 + 0x18].try_into().unwrap()),
        SLOW_GPA
    );
    assert_eq!(le32(&c, 0x18 + 0x18), 2048, "dram zone_pages");
    assert_eq!(le32(&c, 0x38 + 0x18), 2048 + 256, "slow zone_pages");
    assert_eq!(
        le32(&c, 0x38 + 0x1c),
        ((SLOW_UNMAPPED_GPA + MIB - SLOW_GPA) / PAGE) as u32
    );
    // Anywhere in the 4 KiB window: zeros past the config space.
    assert_eq!(vmm.config(0xff0, 16), vec![0; 16]);
    // The whole window in two reads (one message carries at most 4 KiB,
    // header included).
    let mut whole = vmm.config(0, 0x800);
    whole.extend(vmm.config(0x800, 0x800));
    assert_eq!(whole.len(), 0x1000);
    assert_eq!(&whole[..88], &c[..]);
    assert!(whole[88..].iter().all(|&x| x == 0));
    assert_eq!(
        vmm.config(0x54, 8),
        vec![c[0x54], c[0x55], c[0x56], c[0x57], 0, 0, 0, 0]
    );

    // Writes: only actual and tier[i].actual, 4 bytes; the rest is
    // ignored. (The vhost crate's frontend never sets NEED_REPLY, so acks
    // are not seen here: config_requests_outside_the_window_keep_the_
    // connection checks them on a raw connection.)
    let w = |vmm: &mut Vmm, off: u32, buf: &[u8]| {
        vmm.fe
            .set_config(off, VhostUserConfigFlags::WRITABLE, buf)
            .unwrap();
    };
    w(&mut vmm, 0x00, &5u32.to_le_bytes()); // legacy num_pages
    w(&mut vmm, 0x18, &7u32.to_le_bytes()); // tier0 num_pages
    w(&mut vmm, 0x10, &9u32.to_le_bytes()); // tier_count
    w(&mut vmm, 0x1c, &[1, 0]); // tier0 actual, 2 bytes
    w(&mut vmm, 0x800, &[1; 16]); // past the config space
    w(&mut vmm, 0x3c, &77u32.to_le_bytes()); // tier1 actual
    w(&mut vmm, 0x04, &3u32.to_le_bytes()); // legacy actual
    let c2 = vmm.config(0, 88);
    assert_eq!((le32(&c2, 0), le32(&c2, 0x18), le32(&c2, 0x10)), (0, 0, 2));
    assert_eq!((le32(&c2, 0x1c), le32(&c2, 0x3c), le32(&c2, 4)), (0, 77, 3));
    let s = b.state();
    assert_eq!(n(&s["config"]["writes_ignored"]), 5);
    assert_eq!(n(&s["config"]["writes_accepted"]), 2);
    assert_eq!(n(&zone(&s, 1)["actual"]), 77 * PAGE);
    assert_eq!(n(&s["legacy_actual"]), 3 * PAGE);

    // Targets only through the control socket; a change reaches the
    // frontend as VHOST_USER_BACKEND_CONFIG_CHANGE_MSG.
    assert_eq!(vmm.changes.0.load(Ordering::SeqCst), 0);
    let a = b.control(&json!({"op": "set_targets", "targets": {"dram": 65536, "slow": 4 * MIB}}));
    assert_eq!(a, json!({"ok": true, "changed": true, "notified": true}));
    let deadline = Instant::now() + Duration::from_secs(10);
    while vmm.changes.0.load(Ordering::SeqCst) < 1 {
        assert!(Instant::now() < deadline, "no config-change message");
        std::thread::sleep(Duration::from_millis(10));
    }
    let c3 = vmm.config(0, 88);
    assert_eq!((le32(&c3, 0x18), le32(&c3, 0x38)), (16, 1024));
    // Same targets again: no change, no message; refused targets change
    // nothing.
    let a = b.control(&json!({"op": "set_targets", "targets": {"dram": 65536}}));
    assert_eq!(a["changed"], false, "{a}");
    let a = b.control(&json!({"op": "set_targets", "targets": {"dram": 0, "fast": 1}}));
    assert_eq!(a["status"], 422, "{a}");
    let a = b.control(&json!({"op": "set_targets", "targets": {"slow": 10 * MIB}}));
    assert_eq!(a["status"], 422, "{a}");
    let a = b.control(&json!({"op": "set_targets", "legacy": 8 * MIB}));
    assert_eq!(a["notified"], true, "{a}");
    while vmm.changes.0.load(Ordering::SeqCst) < 2 {
        assert!(
            Instant::now() < deadline,
            "no config-change message for legacy"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        vmm.changes.0.load(Ordering::SeqCst),
        2,
        "one message per change"
    );
    let c4 = vmm.config(0, 88);
    assert_eq!(
        (le32(&c4, 0), le32(&c4, 0x18), le32(&c4, 0x38)),
        (2048, 16, 1024)
    );
    let s = b.state();
    assert_eq!(n(&zone(&s, 0)["target"]), 65536);
    assert_eq!(n(&zone(&s, 1)["target"]), 4 * MIB);
    assert_eq!(n(&s["config"]["changes_sent"]), 2);

    // Stats: one buffer of 10-byte entries; the device stores it, holds the
    // buffer and gives it back after the stats interval (200 ms here).
    let entries: [(u16, u64); 4] = [
        (4, 192 * MIB),
        (0x8000, 1_000_000),
        (0x8011, 64 * MIB),
        (0x8003, 9),
    ];
    let buf: Vec<u8> = entries
        .iter()
        .flat_map(|(t, v)| t.to_le_bytes().into_iter().chain(v.to_le_bytes()))
        .collect();
    vmm.guest.write(BUF_GPA, &buf);
    let q = &mut vmm.queues[STATS];
    let head = q.post(&vmm.guest, &[(BUF_GPA, buf.len() as u32, false)]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = b.state();
        if n(&st["stats"]["updates"]) == 1 {
            let v = &st["stats"]["values"];
            assert_eq!(n(&v["stat_free_memory"]), 192 * MIB);
            assert_eq!(n(&v["tier0_guest_accesses"]), 1_000_000);
            assert_eq!(n(&v["tier1_guest_free_bytes"]), 64 * MIB);
            // A tag SPEC.md does not define is dropped: a guest cannot grow
            // the state by cycling through tags.
            assert!(v.get("tag_0x8003").is_none(), "{v}");
            break;
        }
        assert!(Instant::now() < deadline, "stats never arrived: {st}");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Given back on the next tick of the periodic stats timer, 0-200 ms
    // after posting depending on the timer's phase: when is not asserted.
    let used = q.wait_used(&vmm.guest, 1);
    assert_eq!(used, vec![(u32::from(head), 0)]);
    assert_eq!(q.used_idx(&vmm.guest), 1);
}

/// Writes descriptor `index` of the table at `table` (a guest address).
fn put_desc(g: &Guest, table: u64, index: u16, addr: u64, len: u32, flags: u16, next: u16) {
    let mut d = [0u8; 16];
    d[0..8].copy_from_slice(&addr.to_le_bytes());
    d[8..12].copy_from_slice(&len.to_le_bytes());
    d[12..14].copy_from_slice(&flags.to_le_bytes());
    d[14..16].copy_from_slice(&next.to_le_bytes());
    g.write(table + 16 * u64::from(index), &d);
}

const D_NEXT: u16 = 1;
const D_INDIRECT: u16 = 4;

/// The hostile frontend's looping chains: (a) all `QSIZE` descriptors of
/// the queue, the last pointing back at the first; (b) an indirect table
/// whose second entry points back at the first, NEXT on both. Each names
/// distinct, valid PFNs, so a walker that stops at a TTL releases them
/// all. Both must be rejected whole (`bad_descriptor`), release nothing,
/// and come back on the used ring; the same chains properly terminated
/// are accepted (the construction is right).
#[test]
fn looping_chains_are_rejected_whole() {
    let b = Backend::start();
    let mut vmm = Vmm::connect(&b, false);
    vmm.guest.touch(DRAM_GPA, ZONE);
    let before = vmm.guest.allocated();
    // One PFN (4 bytes) per descriptor: dram pages 1000 + i.
    let pfns: Vec<u8> = (0..u64::from(QSIZE))
        .flat_map(|i| dram_pfn(1000 + i).to_le_bytes())
        .collect();
    vmm.guest.write(BUF_GPA, &pfns);
    let direct = |vmm: &mut Vmm, terminated: bool| {
        let q = &mut vmm.queues[DRAM_INFLATE];
        for i in 0..QSIZE {
            let last = i + 1 == QSIZE;
            let flags = if last && terminated { 0 } else { D_NEXT };
            let next = if last { 0 } else { i + 1 };
            put_desc(
                &vmm.guest,
                q.desc,
                i,
                BUF_GPA + 4 * u64::from(i),
                4,
                flags,
                next,
            );
        }
        let head = q.publish(&vmm.guest, 0);
        assert_eq!(q.wait_used(&vmm.guest, 1), vec![(u32::from(head), 0)]);
    };
    // The indirect table sits after the PFNs; entries 0 and 1 name dram
    // pages 1000 and 1001 (the first two PFNs of the buffer).
    let table = BUF_GPA + 0x1000;
    let indirect = |vmm: &mut Vmm, terminated: bool| {
        let q = &mut vmm.queues[DRAM_INFLATE];
        put_desc(&vmm.guest, q.desc, 0, table, 32, D_INDIRECT, 0);
        put_desc(&vmm.guest, table, 0, BUF_GPA, 4, D_NEXT, 1);
        let flags = if terminated { 0 } else { D_NEXT };
        put_desc(&vmm.guest, table, 1, BUF_GPA + 4, 4, flags, 0);
        let head = q.publish(&vmm.guest, 0);
        assert_eq!(q.wait_used(&vmm.guest, 1), vec![(u32::from(head), 0)]);
    };

    direct(&mut vmm, false);
    indirect(&mut vmm, false);
    assert_eq!(
        vmm.guest.allocated(),
        before,
        "a looping chain released pages"
    );
    assert!(vmm.guest.resident(DRAM_GPA, ZONE / PAGE).iter().all(|&r| r));
    let s = b.state();
    let z = zone(&s, 0);
    assert_eq!(n(&z["rejected"]["bad_descriptor"]), 2, "{z}");
    assert_eq!(n(&z["rejected_chains"]), 2);
    assert_eq!(n(&z["inflated_pfns"]), 0);
    assert_eq!(n(&z["host_ballooned"]), 0);
    assert_eq!(n(&z["release_calls"]), 0);

    // Terminated: the indirect pair, then the whole queue's chain (which
    // includes those two pages again: deflate them first).
    indirect(&mut vmm, true);
    assert_eq!(before - vmm.guest.allocated(), 2);
    vmm.pfns(DRAM_DEFLATE, &[dram_pfn(1000), dram_pfn(1001)]);
    vmm.guest.write(BUF_GPA, &pfns);
    direct(&mut vmm, true);
    let s = b.state();
    let z = zone(&s, 0);
    assert_eq!(n(&z["host_ballooned"]), u64::from(QSIZE) * PAGE, "{z}");
    assert_eq!(n(&z["rejected_chains"]), 2);
    let r = vmm.guest.resident(DRAM_GPA, ZONE / PAGE);
    for (p, &res) in r.iter().enumerate() {
        let ballooned = (1000..1000 + usize::from(QSIZE)).contains(&p);
        assert_eq!(res, !ballooned, "dram page {p}");
    }
}

/// A raw vhost-user connection, for requests the `vhost` crate's frontend
/// refuses to send.
struct RawFrontend(UnixStream);

impl RawFrontend {
    const NEED_REPLY: u32 = 0x8;

    fn send(&mut self, request: u32, flags: u32, body: &[u8]) {
        let mut m = Vec::new();
        m.extend_from_slice(&request.to_le_bytes());
        m.extend_from_slice(&(0x1 | flags).to_le_bytes());
        m.extend_from_slice(&(body.len() as u32).to_le_bytes());
        m.extend_from_slice(body);
        self.0.write_all(&m).unwrap();
    }

    /// A reply: (request, flags, body).
    fn recv(&mut self) -> (u32, u32, Vec<u8>) {
        use std::io::Read;
        let mut h = [0u8; 12];
        self.0
            .read_exact(&mut h)
            .expect("a reply (connection still up)");
        let mut body = vec![0u8; le32(&h, 8) as usize];
        self.0.read_exact(&mut body).unwrap();
        (le32(&h, 0), le32(&h, 4), body)
    }

    fn config_body(offset: u32, size: u32, payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [offset, size, 0] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(payload);
        b
    }

    /// GET_CONFIG: (reply offset, reply size, payload).
    fn get_config(&mut self, offset: u32, size: u32) -> (u32, u32, Vec<u8>) {
        let body = Self::config_body(offset, size, &vec![0; size as usize]);
        self.send(24, 0, &body);
        let (req, flags, reply) = self.recv();
        assert_eq!((req, flags & 0x4), (24, 0x4), "a GET_CONFIG reply");
        assert!(reply.len() >= 12, "{reply:?}");
        let (o, sz) = (le32(&reply, 0), le32(&reply, 4));
        assert_eq!(reply.len(), 12 + sz as usize, "payload matches its size");
        (o, sz, reply[12..].to_vec())
    }
}

/// GET/SET_CONFIG outside the config window (the hostile frontend's
/// offsets, a wrapping one, a zero length): a SET is ignored and acked, a
/// GET gets the vhost-user error reply (size 0), the config does not
/// change and the connection stays up: a good GET_CONFIG works after each.
#[test]
fn config_requests_outside_the_window_keep_the_connection() {
    let b = Backend::start();
    let mut fe = RawFrontend(UnixStream::connect(&b.socket).unwrap());
    fe.0.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    fe.send(3, 0, &[]); // SET_OWNER
    fe.send(1, 0, &[]); // GET_FEATURES
    let (_, _, f) = fe.recv();
    let features = u64::from_le_bytes(f[..8].try_into().unwrap());
    assert_ne!(features & F_PROTOCOL_FEATURES, 0);
    fe.send(2, 0, &(F_VERSION_1 | F_PROTOCOL_FEATURES).to_le_bytes()); // SET_FEATURES
    fe.send(15, 0, &[]); // GET_PROTOCOL_FEATURES
    let _ = fe.recv();
    let proto = (VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::REPLY_ACK).bits();
    fe.send(16, RawFrontend::NEED_REPLY, &proto.to_le_bytes()); // SET_PROTOCOL_FEATURES
    assert_eq!(fe.recv().2, 0u64.to_le_bytes());

    let (o, sz, good) = fe.get_config(0, 88);
    assert_eq!((o, sz, le32(&good, 0x10)), (0, 88, 2), "tier_count");

    let bad: [(u32, u32); 5] = [
        (0x1000, 4),
        (0xffff_fffc, 4),
        (0xffe, 4),
        (0xff0, 0x100),
        (0, 0),
    ];
    for (off, size) in bad {
        // SET with an ack asked: acked with success (ignored write).
        let payload = vec![9u8; size as usize];
        fe.send(
            25,
            RawFrontend::NEED_REPLY,
            &RawFrontend::config_body(off, size, &payload),
        );
        let (req, _, ack) = fe.recv();
        assert_eq!(
            (req, ack),
            (25, 0u64.to_le_bytes().to_vec()),
            "SET {off:#x}+{size}"
        );
        assert_eq!(
            fe.get_config(0, 88),
            (0, 88, good.clone()),
            "after SET {off:#x}+{size}"
        );
        // SET without an ack: no reply at all (the next reply is the GET's).
        fe.send(25, 0, &RawFrontend::config_body(off, size, &payload));
        assert_eq!(fe.get_config(0, 88), (0, 88, good.clone()));
        // GET: the error reply, then a good GET still works.
        let (o, sz, p) = fe.get_config(off, size);
        assert_eq!((o, sz, p.len()), (off, 0, 0), "GET {off:#x}+{size}");
        assert_eq!(
            fe.get_config(0, 88),
            (0, 88, good.clone()),
            "after GET {off:#x}+{size}"
        );
    }
    // A GET whose payload does not match its size: also answered.
    fe.send(24, 0, &RawFrontend::config_body(0, 8, &[0; 4]));
    let (_, _, r) = fe.recv();
    assert_eq!(le32(&r, 4), 0);
    assert_eq!(fe.get_config(0xff0, 16).1, 16, "the window's end is fine");

    let s = b.state();
    assert_eq!(n(&s["config"]["writes_ignored"]), 2 * bad.len() as u64);
    assert_eq!(n(&s["config"]["reads_refused"]), bad.len() as u64 + 1);
    assert_eq!(n(&s["config"]["writes_accepted"]), 0);
    assert_eq!(s["frontend"]["connected"], true);
    assert_eq!(n(&s["frontend"]["connections"]), 1, "never reconnected");
}

/// 64 control connections that send nothing do not lock out a
/// legitimate request (idle ones are evicted for new ones, and closed
/// after 2 s anyway); 32 that send half a line hold their slots for about
/// 2 s at most.
#[test]
fn idle_and_slow_control_clients_do_not_lock_out_the_controller() {
    use std::io::Read;
    let b = Backend::start();
    let idle: Vec<UnixStream> = (0..64)
        .map(|_| UnixStream::connect(&b.control).unwrap())
        .collect();
    let t = Instant::now();
    let v = b.control(&json!({"op": "ping"}));
    assert_eq!(v["ok"], true, "{v}");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // An idle connection is closed by the backend (FIRST_REQUEST_TIMEOUT).
    let mut last = idle.into_iter().last().unwrap();
    last.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 64];
    assert_eq!(last.read(&mut buf).unwrap(), 0, "closed without an answer");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());

    // Slow clients: half a request each, then nothing. They are busy, not
    // idle, so a new request may be refused (503) until their line
    // deadline (2 s) closes them.
    let slow: Vec<UnixStream> = (0..32)
        .map(|_| {
            let mut s = UnixStream::connect(&b.control).unwrap();
            s.write_all(br#"{"op":"#).unwrap();
            s
        })
        .collect();
    let t = Instant::now();
    loop {
        // A 503 is written and the connection closed at once, so our write
        // may fail (EPIPE) before we read it: read the answer regardless.
        let s = UnixStream::connect(&b.control).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = (&s).write_all(b"{\"op\":\"ping\"}\n");
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        if v["ok"] == true {
            break;
        }
        assert_eq!(v["status"], 503, "{v}");
        assert!(
            t.elapsed() < Duration::from_secs(6),
            "still locked out: {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(slow);
    // A normal multi-request connection still works.
    let s = UnixStream::connect(&b.control).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut r = BufReader::new(&s);
    for _ in 0..2 {
        (&s).write_all(b"{\"op\":\"ping\"}\n").unwrap();
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert!(line.contains("\"ok\":true"), "{line}");
    }
}

/// Both sockets exist with mode 0600, moved into place from a private
/// directory (never bound at their path with the umask's mode), and that
/// directory is gone.
#[test]
fn sockets_are_0600_and_leave_no_private_directory() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let b = Backend::start();
    for p in [&b.socket, &b.control] {
        let m = std::fs::symlink_metadata(p).unwrap();
        assert!(m.file_type().is_socket(), "{}", p.display());
        assert_eq!(m.permissions().mode() & 0o777, 0o600, "{}", p.display());
    }
    let mut names: Vec<String> = std::fs::read_dir(b.socket.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["ctl.sock", "vu.sock"]);
    assert_eq!(b.control(&json!({"op": "ping"}))["ok"], true);
}

/// One memory region the engine cannot use (its memfd is shorter than the
/// region: vhost-user-backend maps it, `Region` refuses it) is skipped:
/// the memory update is acked, the connection stays, the other regions
/// work, and a PFN in the bad region is rejected as outside guest memory.
#[test]
fn one_bad_region_does_not_fail_the_memory_update() {
    let b = Backend::start();
    let mut vmm = Vmm::connect(&b, false);
    vmm.guest.touch(DRAM_GPA, ZONE);
    let short = tier_balloon::memfd("short", MIB, false).unwrap();
    const BAD_GPA: u64 = 0x3000_0000;
    let mut regions = vmm.guest.region_infos();
    regions.push(VhostUserMemoryRegionInfo {
        guest_phys_addr: BAD_GPA,
        memory_size: 2 * MIB,
        userspace_addr: 0x7e00_0000_0000,
        mmap_offset: 0,
        mmap_handle: short.as_raw_fd(),
    });
    // The vhost crate's frontend never sets NEED_REPLY, so this does not
    // wait for the update: poll the state for it.
    vmm.fe.set_mem_table(&regions).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = b.state();
        assert_eq!(s["frontend"]["connected"], true, "connection dropped");
        if n(&s["frontend"]["memory_regions"]) == 4 {
            break;
        }
        assert!(Instant::now() < deadline, "memory update not applied: {s}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = vmm.guest.allocated();
    vmm.pfns(DRAM_INFLATE, &[dram_pfn(7)]);
    assert_eq!(before - vmm.guest.allocated(), 1);
    vmm.pfns(LEGACY_INFLATE, &[(BAD_GPA >> 12) as u32]);
    let s = b.state();
    assert_eq!(
        n(&s["legacy"]["rejected"]["outside_guest_memory"]),
        1,
        "{s}"
    );
    assert_eq!(n(&zone(&s, 0)["host_ballooned"]), PAGE);
}
