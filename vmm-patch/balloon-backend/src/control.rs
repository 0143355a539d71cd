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

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::device::Balloon;

/// Longest request line, newline included.
pub const MAX_LINE: usize = 64 << 10;
/// Protocol version reported by `ping` and `state`.
pub const PROTOCOL: u32 = 1;
/// Connections served at once; more are answered 503 and closed.
pub const MAX_CONNECTIONS: usize = 32;
/// A connection idle this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

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

/// Serves one connection: reads lines, answers each.
fn serve_connection(device: &Balloon, stream: UnixStream) -> io::Result<()> {
    stream.set_read_timeout(Some(IDLE_TIMEOUT))?;
    stream.set_write_timeout(Some(IDLE_TIMEOUT))?;
    let mut reader = BufReader::new(&stream);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(());
        }
        let answer = if line.len() > MAX_LINE {
            let a = error(400, format!("request line longer than {MAX_LINE} bytes"));
            write_answer(&stream, &a)?;
            return Ok(()); // the rest of the line cannot be resynchronised
        } else {
            match std::str::from_utf8(&line) {
                Ok(text) if text.trim().is_empty() => continue,
                Ok(text) => handle_line(device, text.trim_end()),
                Err(_) => error(400, "request is not UTF-8"),
            }
        };
        write_answer(&stream, &answer)?;
    }
}

fn write_answer(mut stream: &UnixStream, v: &Value) -> io::Result<()> {
    let mut out = v.to_string().into_bytes();
    out.push(b'\n');
    stream.write_all(&out)
}

/// Accepts control connections forever, one thread each (at most
/// [`MAX_CONNECTIONS`]).
pub fn serve(device: Balloon, listener: UnixListener) -> io::Result<()> {
    let active = Arc::new(AtomicUsize::new(0));
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
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::SeqCst);
            let _ = write_answer(&stream, &error(503, "too many control connections"));
            continue;
        }
        let (device, active2) = (device.clone(), Arc::clone(&active));
        let spawned = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                if let Err(e) = serve_connection(&device, stream) {
                    tracing::debug!("control connection: {e}");
                }
                active2.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            active.fetch_sub(1, Ordering::SeqCst);
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
}
