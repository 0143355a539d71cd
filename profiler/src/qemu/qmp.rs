//! tierd's QMP client: one JSON object per line over QEMU's unix socket,
//! asynchronous events skipped. Every read has a deadline, so a QEMU that
//! stops answering costs its own VM an error, never a blocked task.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

/// Longest line tierd reads from QEMU (answers are a few KiB; `info
/// mtree` of a large machine tens of KiB).
const MAX_LINE: usize = 4 << 20;

/// Why a QMP call failed.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("QMP {socket}: connect: {source}")]
    Connect {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("QMP {socket}: {command}: no answer within {timeout:?}")]
    Timeout {
        socket: PathBuf,
        command: String,
        timeout: Duration,
    },
    #[error("QMP {socket}: {command}: {source}")]
    Io {
        socket: PathBuf,
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("QMP {socket}: {command}: QEMU closed the socket")]
    Closed { socket: PathBuf, command: String },
    #[error("QMP {socket}: {command}: malformed answer: {detail}")]
    Malformed {
        socket: PathBuf,
        command: String,
        detail: String,
    },
    /// QEMU answered with `{"error": {"class", "desc"}}`.
    #[error("QMP {command}: QEMU refused it ({class}): {desc}")]
    Refused {
        command: String,
        class: String,
        desc: String,
    },
    #[error("QMP {socket}: the listener's pid is not visible from tierd's pid namespace")]
    NoPeer { socket: PathBuf },
}

/// One QMP session, past capabilities negotiation.
#[derive(Debug)]
pub struct Qmp {
    socket: PathBuf,
    timeout: Duration,
    r: BufReader<OwnedReadHalf>,
    w: OwnedWriteHalf,
    /// The listener's PID (SO_PEERCRED), not what QEMU says.
    pid: u32,
}

impl Qmp {
    /// Connects, reads the greeting and leaves negotiation mode; each
    /// step within `timeout`.
    pub async fn connect(socket: &Path, timeout: Duration) -> Result<Qmp, QmpError> {
        let s = match tokio::time::timeout(timeout, UnixStream::connect(socket)).await {
            Ok(Ok(s)) => s,
            Ok(Err(source)) => {
                return Err(QmpError::Connect {
                    socket: socket.into(),
                    source,
                });
            }
            Err(_) => {
                return Err(QmpError::Timeout {
                    socket: socket.into(),
                    command: "connect".into(),
                    timeout,
                });
            }
        };
        let pid = s
            .peer_cred()
            .ok()
            .and_then(|c| c.pid())
            .filter(|p| *p > 0)
            .and_then(|p| u32::try_from(p).ok())
            .ok_or_else(|| QmpError::NoPeer {
                socket: socket.into(),
            })?;
        let (r, w) = s.into_split();
        let mut q = Qmp {
            socket: socket.into(),
            timeout,
            r: BufReader::new(r),
            w,
            pid,
        };
        let greeting = q.line("greeting").await?;
        if greeting.get("QMP").is_none() {
            return Err(q.malformed("greeting", format!("no QMP greeting: {greeting}")));
        }
        q.execute("qmp_capabilities", json!({})).await?;
        Ok(q)
    }

    /// PID of the process listening on the socket.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    fn malformed(&self, command: &str, detail: String) -> QmpError {
        QmpError::Malformed {
            socket: self.socket.clone(),
            command: command.into(),
            detail,
        }
    }

    async fn line(&mut self, command: &str) -> Result<Value, QmpError> {
        let mut buf = Vec::new();
        let read = async {
            loop {
                let chunk = self.r.fill_buf().await?;
                if chunk.is_empty() {
                    return Ok::<bool, std::io::Error>(false);
                }
                match chunk.iter().position(|b| *b == b'\n') {
                    Some(i) => {
                        buf.extend_from_slice(&chunk[..=i]);
                        self.r.consume(i + 1);
                        return Ok(true);
                    }
                    None => {
                        let n = chunk.len();
                        buf.extend_from_slice(chunk);
                        self.r.consume(n);
                        if buf.len() > MAX_LINE {
                            return Err(std::io::Error::other("answer longer than 4 MiB"));
                        }
                    }
                }
            }
        };
        let got = match tokio::time::timeout(self.timeout, read).await {
            Ok(Ok(got)) => got,
            Ok(Err(source)) => {
                return Err(QmpError::Io {
                    socket: self.socket.clone(),
                    command: command.into(),
                    source,
                });
            }
            Err(_) => {
                return Err(QmpError::Timeout {
                    socket: self.socket.clone(),
                    command: command.into(),
                    timeout: self.timeout,
                });
            }
        };
        if !got {
            return Err(QmpError::Closed {
                socket: self.socket.clone(),
                command: command.into(),
            });
        }
        serde_json::from_slice(&buf).map_err(|e| {
            let text = String::from_utf8_lossy(&buf);
            let head: String = text.chars().take(200).collect();
            self.malformed(command, format!("not JSON ({e}): {head:?}"))
        })
    }

    /// Runs `command`; its `return` value, or QEMU's `error` as
    /// [`QmpError::Refused`].
    pub async fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, QmpError> {
        let mut req = json!({ "execute": command });
        if arguments.as_object().is_some_and(|o| !o.is_empty()) {
            req["arguments"] = arguments;
        }
        let mut text = req.to_string();
        text.push('\n');
        let io = |source| QmpError::Io {
            socket: self.socket.clone(),
            command: command.into(),
            source,
        };
        match tokio::time::timeout(self.timeout, self.w.write_all(text.as_bytes())).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(io(e)),
            Err(_) => {
                return Err(QmpError::Timeout {
                    socket: self.socket.clone(),
                    command: command.into(),
                    timeout: self.timeout,
                });
            }
        }
        loop {
            let v = self.line(command).await?;
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
                return Err(QmpError::Refused {
                    command: command.into(),
                    class: s("class"),
                    desc: s("desc"),
                });
            }
            if v.get("event").is_none() {
                return Err(
                    self.malformed(command, format!("neither return, error nor event: {v}"))
                );
            }
        }
    }

    /// An HMP command's text (`human-monitor-command`).
    pub async fn hmp(&mut self, command_line: &str) -> Result<String, QmpError> {
        let v = self
            .execute(
                "human-monitor-command",
                json!({ "command-line": command_line }),
            )
            .await?;
        v.as_str().map(str::to_string).ok_or_else(|| {
            self.malformed(
                "human-monitor-command",
                format!("{command_line}: not a string: {v}"),
            )
        })
    }

    /// `qom-get PATH PROPERTY`.
    pub async fn qom_get(&mut self, path: &str, property: &str) -> Result<Value, QmpError> {
        self.execute("qom-get", json!({ "path": path, "property": property }))
            .await
    }

    /// Asks virtio-mem device `id` for `bytes` plugged.
    pub async fn set_requested_size(&mut self, id: &str, bytes: u64) -> Result<(), QmpError> {
        self.execute(
            "qom-set",
            json!({ "path": format!("/machine/peripheral/{id}"), "property": "requested-size", "value": bytes }),
        )
        .await
        .map(drop)
    }

    /// Asks the balloon to leave the guest `bytes` (QMP `balloon`).
    pub async fn balloon(&mut self, bytes: u64) -> Result<(), QmpError> {
        self.execute("balloon", json!({ "value": bytes }))
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::UnixListener;

    /// A fake QEMU answering each request with the next of `answers`
    /// (after its greeting); returns what it was sent.
    fn fake(sock: &Path, greeting: &'static str, answers: Vec<&'static str>) {
        let l = UnixListener::bind(sock).unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            s.write_all(greeting.as_bytes()).await.unwrap();
            let mut buf = [0u8; 4096];
            for a in answers {
                let _ = s.read(&mut buf).await.unwrap();
                s.write_all(a.as_bytes()).await.unwrap();
            }
            // Keep the socket open: the client must time out, not see EOF.
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
    }

    const GREETING: &str = "{\"QMP\": {\"version\": {}, \"capabilities\": []}}\n";

    #[tokio::test]
    async fn answers_events_errors_and_silence() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("q.sock");
        fake(
            &sock,
            GREETING,
            vec![
                "{\"return\": {}}\n",
                "{\"event\": \"BALLOON_CHANGE\", \"data\": {}}\n{\"return\": [1, 2]}\n",
                "{\"error\": {\"class\": \"GenericError\", \"desc\": \"No balloon device has been activated\"}}\n",
                "{\"return\": \"2 nodes\\r\\n\"}\n",
            ],
        );
        let mut q = Qmp::connect(&sock, Duration::from_millis(500))
            .await
            .unwrap();
        assert_eq!(q.pid(), std::process::id());
        assert_eq!(
            q.execute("query-x", json!({})).await.unwrap(),
            json!([1, 2])
        );
        let e = q.balloon(1).await.unwrap_err();
        assert!(e.to_string().contains("No balloon device"), "{e}");
        assert_eq!(q.hmp("info numa").await.unwrap(), "2 nodes\r\n");
        let e = q.execute("query-y", json!({})).await.unwrap_err();
        assert!(matches!(e, QmpError::Timeout { .. }), "{e}");
    }

    #[tokio::test]
    async fn malformed_greeting_and_answers_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("a.sock");
        fake(&sock, "HTTP/1.1 200 OK\n", vec![]);
        let e = Qmp::connect(&sock, Duration::from_millis(500))
            .await
            .unwrap_err();
        assert!(matches!(e, QmpError::Malformed { .. }), "{e}");
        let sock = dir.path().join("b.sock");
        fake(&sock, "{\"hello\": 1}\n", vec![]);
        let e = Qmp::connect(&sock, Duration::from_millis(500))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("no QMP greeting"), "{e}");
        let sock = dir.path().join("c.sock");
        fake(
            &sock,
            GREETING,
            vec!["{\"return\": {}}\n", "{\"neither\": 1}\n"],
        );
        let mut q = Qmp::connect(&sock, Duration::from_millis(500))
            .await
            .unwrap();
        let e = q.execute("query-z", json!({})).await.unwrap_err();
        assert!(e.to_string().contains("neither return"), "{e}");
        let e = Qmp::connect(&dir.path().join("none.sock"), Duration::from_millis(500))
            .await
            .unwrap_err();
        assert!(matches!(e, QmpError::Connect { .. }), "{e}");
    }
}
