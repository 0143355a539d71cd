//! A raw HTTP/1.0 GET on loopback: no client library, no chunked answers.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

/// GET `path` with an optional Accept header; returns (status line and
/// headers, body).
pub fn http_get(addr: SocketAddr, path: &str, accept: Option<&str>) -> (String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n{accept}\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (head.to_string(), body.to_string())
}
