//! A raw HTTP GET on loopback: no client library.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

/// HTTP/1.0 GET of `path` (no chunked answers) with an optional Accept
/// header; returns (status line and headers, body).
pub fn http_get(addr: SocketAddr, path: &str, accept: Option<&str>) -> (String, String) {
    let accept = accept.map(|a| format!("Accept: {a}"));
    http_get_with(addr, "HTTP/1.0", path, accept.as_deref())
}

/// GET `path` as `version` (e.g. "HTTP/1.1", for a test that checks the
/// version of the answer) with one optional extra header line; the
/// connection is closed after the answer.
pub fn http_get_with(
    addr: SocketAddr,
    version: &str,
    path: &str,
    header: Option<&str>,
) -> (String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let header = header.map(|h| format!("{h}\r\n")).unwrap_or_default();
    write!(
        s,
        "GET {path} {version}\r\nHost: localhost\r\nConnection: close\r\n{header}\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (head.to_string(), body.to_string())
}
