//! A minimal HTTP/1.1 client over a unix socket: one request per
//! connection, `Connection: close`, a body framed by `Content-Length` or
//! chunked, or read to EOF when neither is given. cloud-hypervisor's
//! micro-http answers `Connection: keep-alive` with a `Content-Length` (none
//! on 204) whatever the request says, so the body is read by its length and
//! the connection dropped, never read to EOF.

use std::io;
use std::path::Path;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// Largest header section and body accepted (vm.info is a few KiB).
const MAX_HEAD: usize = 64 * 1024;
const MAX_BODY: u64 = 16 * 1024 * 1024;

#[derive(Debug)]
pub(crate) struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

#[derive(Debug)]
pub(crate) enum HttpError {
    Io(io::Error),
    Protocol(String),
}

impl From<io::Error> for HttpError {
    fn from(e: io::Error) -> Self {
        HttpError::Io(e)
    }
}

fn protocol<T>(detail: impl Into<String>) -> Result<T, HttpError> {
    Err(HttpError::Protocol(detail.into()))
}

/// The request bytes: exactly what the recorded fixtures were sent with
/// (controller/tests/fixtures/ch-v53-tierd/README.md).
pub(crate) fn encode_request(method: &str, path: &str, body: Option<&[u8]>) -> Vec<u8> {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\nConnection: close\r\n"
    )
    .into_bytes();
    if let Some(body) = body {
        req.extend_from_slice(
            format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            )
            .as_bytes(),
        );
    }
    req.extend_from_slice(b"\r\n");
    if let Some(body) = body {
        req.extend_from_slice(body);
    }
    req
}

/// Sends one request on a new connection and reads one response.
pub(crate) async fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> Result<Response, HttpError> {
    let mut stream = UnixStream::connect(socket).await?;
    stream
        .write_all(&encode_request(method, path, body))
        .await?;
    stream.flush().await?;
    let mut reader = BufReader::new(stream);
    loop {
        let (status, framing) = read_head(&mut reader, method).await?;
        // 1xx are interim (we never send Expect, but a server may).
        if (100..200).contains(&status) {
            continue;
        }
        let body = match framing {
            Framing::None => Vec::new(),
            Framing::Length(n) => {
                if n > MAX_BODY {
                    return protocol(format!("body of {n} bytes is too large"));
                }
                let mut body = vec![0; usize::try_from(n).unwrap_or(usize::MAX)];
                reader.read_exact(&mut body).await?;
                body
            }
            Framing::Chunked => read_chunked(&mut reader).await?,
            Framing::Eof => {
                let mut body = Vec::new();
                (&mut reader)
                    .take(MAX_BODY + 1)
                    .read_to_end(&mut body)
                    .await?;
                if body.len() as u64 > MAX_BODY {
                    return protocol("body is too large");
                }
                body
            }
        };
        return Ok(Response { status, body });
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    None,
    Length(u64),
    Chunked,
    Eof,
}

async fn read_line(
    reader: &mut BufReader<UnixStream>,
    budget: &mut usize,
) -> Result<String, HttpError> {
    let mut line = Vec::new();
    let n = (&mut *reader)
        .take(*budget as u64 + 1)
        .read_until(b'\n', &mut line)
        .await?;
    if n == 0 {
        return Err(HttpError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before the response was complete",
        )));
    }
    if n > *budget {
        return protocol("header section too large");
    }
    *budget -= n;
    if line.last() != Some(&b'\n') {
        return Err(HttpError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed in the middle of a header line",
        )));
    }
    line.pop();
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    String::from_utf8(line).or_else(|_| protocol("header line is not UTF-8"))
}

async fn read_head(
    reader: &mut BufReader<UnixStream>,
    method: &str,
) -> Result<(u16, Framing), HttpError> {
    let mut budget = MAX_HEAD;
    let status_line = read_line(reader, &mut budget).await?;
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return protocol(format!("bad status line {status_line:?}"));
    }
    let status = match parts.next().map(str::parse::<u16>) {
        Some(Ok(s)) if (100..600).contains(&s) => s,
        _ => return protocol(format!("bad status line {status_line:?}")),
    };
    let mut length: Option<u64> = None;
    let mut chunked = false;
    loop {
        let line = read_line(reader, &mut budget).await?;
        if line.is_empty() {
            break;
        }
        let Some((name, value)) = line.split_once(':') else {
            return protocol(format!("bad header line {line:?}"));
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let n: u64 = match value.parse() {
                Ok(n) if value.bytes().all(|b| b.is_ascii_digit()) => n,
                _ => return protocol(format!("bad Content-Length {value:?}")),
            };
            if length.is_some_and(|l| l != n) {
                return protocol("conflicting Content-Length headers");
            }
            length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            match value.rsplit(',').next().map(str::trim) {
                Some(last) if last.eq_ignore_ascii_case("chunked") => chunked = true,
                _ => return protocol(format!("unsupported Transfer-Encoding {value:?}")),
            }
        }
    }
    // RFC 9112 section 6.3, in order.
    let framing =
        if method == "HEAD" || (100..200).contains(&status) || status == 204 || status == 304 {
            Framing::None
        } else if chunked {
            Framing::Chunked
        } else if let Some(n) = length {
            Framing::Length(n)
        } else {
            Framing::Eof
        };
    Ok((status, framing))
}

async fn read_chunked(reader: &mut BufReader<UnixStream>) -> Result<Vec<u8>, HttpError> {
    let mut body = Vec::new();
    let mut budget = MAX_HEAD;
    loop {
        let line = read_line(reader, &mut budget).await?;
        let size = line.split(';').next().unwrap_or_default().trim();
        let Ok(size) = u64::from_str_radix(size, 16) else {
            return protocol(format!("bad chunk size {line:?}"));
        };
        if size == 0 {
            // Trailers up to the empty line.
            while !read_line(reader, &mut budget).await?.is_empty() {}
            return Ok(body);
        }
        if body.len() as u64 + size > MAX_BODY {
            return protocol("body is too large");
        }
        let start = body.len();
        body.resize(start + usize::try_from(size).unwrap_or(usize::MAX), 0);
        reader.read_exact(&mut body[start..]).await?;
        if !read_line(reader, &mut budget).await?.is_empty() {
            return protocol("chunk not followed by CRLF");
        }
    }
}
