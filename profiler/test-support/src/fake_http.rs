//! For tests that stand in for a VMM's HTTP API on a Unix socket: reading
//! one request, and the recorded cloud-hypervisor exchanges to answer with.

use std::path::PathBuf;

use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;

/// Reads one HTTP request (head and Content-Length body); what was read
/// so far if the peer closes first.
pub async fn read_request(stream: &mut UnixStream) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse::<usize>().unwrap());
            if buf.len() >= end + 4 + len {
                return buf;
            }
        }
        let n = stream.read(&mut chunk).await.unwrap();
        if n == 0 {
            return buf;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A recorded request or response of the patched cloud-hypervisor
/// (controller/tests/fixtures/ch-v53-tierd), byte for byte.
pub fn ch_fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../controller/tests/fixtures/ch-v53-tierd")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
