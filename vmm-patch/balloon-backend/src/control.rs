//! The control socket: newline-delimited JSON over a unix stream socket,
//! through which the controller sets per-tier targets and reads the
//! device's state without going through the VMM. Byte-level protocol in
//! `docs/balloon-backend.md` ("Control socket").
//!
//! Requests, one JSON object per line (at most [`MAX_LINE`] bytes), any
//! number per connection, answered in order with one line each:
//! - `{"op":"ping"}`
//! - `{"op":"state"}`
//! - `{"op":"set_targets","targets":{"dram":67108864,"slow":0},"legacy":0}`
//!   (`targets` and/or `legacy`, bytes)
//!
//! Answers: `{"ok":true,...}` or `{"ok":false,"status":N,"error":"..."}`
//! with HTTP-like status: 400 malformed request, 422 targets refused
//! (nothing changed), 503 too many connections.
//!
//! Connections cannot lock the controller out: a new connection must
//! send its first request within [`FIRST_REQUEST_TIMEOUT`], every request
//! line must be complete within [`LINE_TIMEOUT`] of its first byte, and
//! when all [`MAX_CONNECTIONS`] slots are taken a new connection evicts
//! the oldest one that is waiting for a request (not one mid-request). So
//! idle or slow clients hold a slot for seconds at most, and only
//! connections busy with a request make the next one wait (503).

use std::io::{self, BufRead, BufReader, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};

use crate::device::Balloon;

/// Longest request line, newline included.
pub const MAX_LINE: usize = 64 << 10;
/// Protocol version reported by `ping` and `state`.
pub const PROTOCOL: u32 = 1;
/// Connections served at once; more are answered 503 and closed.
pub const MAX_CONNECTIONS: usize = 32;
/// A connection idle this long between requests is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// A new connection that sends no request this long is closed.
pub const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// A request line must be complete this long after its first byte.
pub const LINE_TIMEOUT: Duration = Duration::from_secs(2);
/// An answer the client does not read this long closes the connection.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

fn error(status: u16, msg: impl std::fmt::Display) -> Value {
    json!({"ok": false, "status": status, "error": msg.to_string()})
}

/// A request line. Unknown fields are refused so that a typo never goes
/// unnoticed.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    op: String,
    #[serde(default, deserialize_with = "targets")]
    targets: Option<Vec<(String, u64)>>,
    #[serde(default)]
    legacy: Option<u64>,
}

/// `targets`: an object zone -> bytes, order kept; a repeated key is an
/// error (a map would silently keep one of the two values).
fn targets<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<(String, u64)>>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Vec<(String, u64)>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object of zone name -> target bytes")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut m: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out: Vec<(String, u64)> = Vec::new();
            while let Some((k, v)) = m.next_entry::<String, u64>()? {
                if out.iter().any(|(z, _)| *z == k) {
                    return Err(serde::de::Error::custom(format!("zone {k:?} listed twice")));
                }
                out.push((k, v));
            }
            Ok(out)
        }
    }
    d.deserialize_map(V).map(Some)
}

/// Answers one request line.
pub fn handle_line(device: &Balloon, line: &str) -> Value {
    let req: Request = match serde_json::from_str(line) {
        Ok(r) => r,
        Err(e) => return error(400, format!("bad request: {e}")),
    };
    let has_args = req.targets.is_some() || req.legacy.is_some();
    match req.op.as_str() {
        "ping" | "state" if has_args => error(
            400,
            format!("op {:?} takes no \"targets\" or \"legacy\"", req.op),
        ),
        "ping" => json!({
            "ok": true,
            "protocol": PROTOCOL,
            "version": env!("CARGO_PKG_VERSION"),
            "tiers": device.specs().iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        }),
        "state" => match serde_json::to_value(device.snapshot()) {
            Ok(state) => json!({"ok": true, "state": state}),
            Err(e) => error(500, e),
        },
        "set_targets" if !has_args => error(400, "set_targets needs \"targets\" and/or \"legacy\""),
        "set_targets" => {
            match device.set_targets(req.targets.as_deref().unwrap_or_default(), req.legacy) {
                Ok(a) => json!({"ok": true, "changed": a.changed, "notified": a.notified}),
                Err(e) => error(422, e),
            }
        }
        other => error(
            400,
            format!("unknown op {other:?} (ping, state, set_targets)"),
        ),
    }
}

/// One served connection, as the accept loop sees it.
struct Slot {
    id: u64,
    /// A clone of the connection, to shut it down when evicted.
    stream: UnixStream,
    /// Waiting for the first byte of a request (evictable).
    idle: Arc<AtomicBool>,
}

/// The served connections, oldest first.
#[derive(Default)]
struct Slots {
    slots: Mutex<Vec<Slot>>,
}

impl Slots {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a slot for a new connection, evicting the oldest idle one if
    /// all are taken; false if every slot is busy with a request.
    fn admit(&self, slot: Slot) -> bool {
        let mut slots = self.lock();
        if slots.len() >= MAX_CONNECTIONS {
            let Some(i) = slots.iter().position(|s| s.idle.load(Ordering::SeqCst)) else {
                return false;
            };
            let old = slots.remove(i);
            // Its thread sees end-of-file (or an error) and ends.
            let _ = old.stream.shutdown(Shutdown::Both);
            tracing::debug!("control: evicted an idle connection for a new one");
        }
        slots.push(slot);
        true
    }

    fn release(&self, id: u64) {
        self.lock().retain(|s| s.id != id);
    }
}

/// Reads one request line into `line` (at most `MAX_LINE + 1` bytes):
/// waits up to `idle` for its first byte (marked idle meanwhile), then
/// up to [`LINE_TIMEOUT`] for the rest. `Ok(false)` at end of file.
fn read_line(
    reader: &mut BufReader<&UnixStream>,
    idle_flag: &AtomicBool,
    idle: Duration,
    line: &mut Vec<u8>,
) -> io::Result<bool> {
    line.clear();
    reader.get_ref().set_read_timeout(Some(idle))?;
    idle_flag.store(true, Ordering::SeqCst);
    let first = reader.fill_buf().map(|b| b.is_empty());
    idle_flag.store(false, Ordering::SeqCst);
    if first? {
        return Ok(false);
    }
    let deadline = Instant::now() + LINE_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "request line not complete in time",
            ));
        }
        reader.get_ref().set_read_timeout(Some(left))?;
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(true); // end of file after a partial line
        }
        let room = MAX_LINE + 1 - line.len();
        let take = buf.len().min(room);
        let (n, done) = match buf[..take].iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (take, take == room),
        };
        line.extend_from_slice(&buf[..n]);
        reader.consume(n);
        if done {
            return Ok(true);
        }
    }
}

/// Serves one connection: reads lines, answers each.
fn serve_connection(
    device: &Balloon,
    stream: &UnixStream,
    idle_flag: &AtomicBool,
) -> io::Result<()> {
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    let mut idle = FIRST_REQUEST_TIMEOUT;
    loop {
        if !read_line(&mut reader, idle_flag, idle, &mut line)? {
            return Ok(());
        }
        idle = IDLE_TIMEOUT;
        let Some(answer) = answer_line(device, &line) else {
            continue;
        };
        write_answer(stream, &answer)?;
        if line.len() > MAX_LINE {
            return Ok(()); // the rest of the line cannot be resynchronised
        }
    }
}

/// The answer to one request line as read from the socket (bytes, the
/// newline included or not); `None` for a blank line, which gets none.
/// A line longer than [`MAX_LINE`] is refused (the caller then closes the
/// connection). Fuzzed by the `fuzz` bench.
pub fn answer_line(device: &Balloon, line: &[u8]) -> Option<Value> {
    if line.len() > MAX_LINE {
        return Some(error(
            400,
            format!("request line longer than {MAX_LINE} bytes"),
        ));
    }
    match std::str::from_utf8(line) {
        Ok(text) if text.trim().is_empty() => None,
        Ok(text) => Some(handle_line(device, text.trim_end())),
        Err(_) => Some(error(400, "request is not UTF-8")),
    }
}

fn write_answer(mut stream: &UnixStream, v: &Value) -> io::Result<()> {
    let mut out = v.to_string().into_bytes();
    out.push(b'\n');
    stream.write_all(&out)
}

/// Accepts control connections forever, one thread each (at most
/// [`MAX_CONNECTIONS`], idle ones evicted for new ones).
pub fn serve(device: Balloon, listener: UnixListener) -> io::Result<()> {
    let slots = Arc::new(Slots::default());
    let mut next_id = 0u64;
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                // E.g. EMFILE: do not spin.
                tracing::warn!("control accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let clone = match stream.try_clone() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("control connection: {e}");
                continue;
            }
        };
        next_id += 1;
        let (id, idle) = (next_id, Arc::new(AtomicBool::new(true)));
        let slot = Slot {
            id,
            stream: clone,
            idle: Arc::clone(&idle),
        };
        if !slots.admit(slot) {
            let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
            let _ = write_answer(&stream, &error(503, "too many control connections"));
            continue;
        }
        let (device, slots2) = (device.clone(), Arc::clone(&slots));
        let spawned = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                if let Err(e) = serve_connection(&device, &stream, &idle) {
                    tracing::debug!("control connection: {e}");
                }
                slots2.release(id);
            });
        if let Err(e) = spawned {
            slots.release(id);
            tracing::warn!("control thread: {e}");
        }
    }
    Ok(())
}

/// Starts [`serve`] on its own thread.
pub fn spawn(device: Balloon, listener: UnixListener) -> io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("control-accept".into())
        .spawn(move || {
            if let Err(e) = serve(device, listener) {
                tracing::error!("control socket: {e}");
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceOptions;
    use crate::spec::parse_tier;

    fn device() -> Balloon {
        Balloon::new(
            vec![
                parse_tier("name=dram,ranges=0-0x1000000").unwrap(),
                parse_tier("name=slow,ranges=0x10000000-0x11000000").unwrap(),
            ],
            DeviceOptions::default(),
        )
        .unwrap()
    }

    fn status(v: &Value) -> Option<u64> {
        v.get("status").and_then(Value::as_u64)
    }

    #[test]
    fn refuses_malformed_requests_with_400() {
        let d = device();
        for line in [
            "nope",
            "[]",
            r#"{"op":"dance"}"#,
            r#"{"op":"state","targets":{}}"#,
            r#"{"op":"set_targets"}"#,
            r#"{"op":"set_targets","targets":{"dram":-1}}"#,
            r#"{"op":"set_targets","targets":{"dram":1,"dram":2}}"#,
            r#"{"op":"set_targets","target":{"dram":1}}"#,
            r#"{"op":"set_targets","legacy":"1G"}"#,
        ] {
            let a = handle_line(&d, line);
            assert_eq!(status(&a), Some(400), "{line}: {a}");
        }
        assert_eq!(d.snapshot().zones[0].target, 0);
    }

    #[test]
    fn targets_are_all_or_nothing_and_rounded() {
        let d = device();
        let a = handle_line(
            &d,
            r#"{"op":"set_targets","targets":{"slow":8191,"dram":12288}}"#,
        );
        assert_eq!(a["ok"], true, "{a}");
        assert_eq!(a["changed"], true);
        let s = d.snapshot();
        assert_eq!((s.zones[0].target, s.zones[1].target), (12288, 4096));
        for line in [
            r#"{"op":"set_targets","targets":{"dram":0,"fast":0}}"#,
            r#"{"op":"set_targets","targets":{"dram":0,"slow":16777217}}"#,
            r#"{"op":"set_targets","targets":{"dram":0},"legacy":33554433}"#,
        ] {
            let a = handle_line(&d, line);
            assert_eq!(status(&a), Some(422), "{line}: {a}");
        }
        let s = d.snapshot();
        assert_eq!((s.zones[0].target, s.zones[1].target), (12288, 4096));
        let a = handle_line(&d, r#"{"op":"set_targets","targets":{"dram":12288}}"#);
        assert_eq!(a["changed"], false, "{a}");
        // No frontend: nothing to notify.
        assert_eq!(a["notified"], false);
    }

    #[test]
    fn raw_lines_blank_non_utf8_and_too_long() {
        let d = device();
        assert!(answer_line(&d, b"  \r\n").is_none());
        let a = answer_line(&d, b"{\"op\":\"ping\"}\r\n").unwrap();
        assert_eq!(a["ok"], true, "{a}");
        let a = answer_line(&d, b"{\"op\":\"\xff\"}\n").unwrap();
        assert_eq!(status(&a), Some(400), "{a}");
        let mut long = vec![b' '; MAX_LINE];
        long.push(b'\n');
        let a = answer_line(&d, &long).unwrap();
        assert_eq!(status(&a), Some(400), "{a}");
        long.truncate(MAX_LINE);
        assert!(answer_line(&d, &long).is_none());
    }
}
