//! The guest's console: an init script that runs one shell command per
//! line read from it, and the reader of its answers.
//!
//! Markers are printed as `"@@""rc"`: the tty echoes the command lines, and
//! an echo must never read as an answer. Commands travel base64-encoded,
//! so any quoting and newlines survive.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::{Text, UmlError};

const READY: &str = "@@ready";
const FAIL: &str = "@@fail ";

/// The init script: mounts, loads `modules`, says ready, then serves
/// commands until the console closes, and powers off.
pub fn init_script(modules: &[PathBuf]) -> String {
    let mut s = String::from(
        "#!/bin/sh\n\
         mount -t proc proc /proc\n\
         mount -t sysfs sys /sys\n\
         stty -echo 2>/dev/null\n",
    );
    for m in modules {
        let m = m.display();
        s += &format!("insmod {m} || {{ echo \"@@\"\"fail insmod {m}\"; }}\n");
    }
    s + SERVE
}

/// The end of an init script: says ready, runs one base64-encoded command
/// per console line, and powers off when the console closes.
pub const SERVE: &str = "echo \"@@\"\"ready\"\n\
     while IFS= read -r line; do\n\
     \x20 id=${line%% *}\n\
     \x20 echo \"@@\"\"begin $id\"\n\
     \x20 echo \"${line#* }\" | base64 -d | sh 2>&1\n\
     \x20 echo \"@@\"\"rc $id $?\"\n\
     done\n\
     echo o > /proc/sysrq-trigger\n\
     sleep 30\n";

/// `(rc, output)` of `cmd` as a result: a non-zero exit is an error.
pub fn succeeded(cmd: &str, (rc, output): (i32, String)) -> Result<String, UmlError> {
    if rc != 0 {
        return Err(UmlError::Command {
            cmd: cmd.into(),
            rc,
            output,
        });
    }
    Ok(output)
}

/// The console line that runs `cmd` as command `id`.
pub fn command_line(id: u64, cmd: &str) -> String {
    format!("{id} {}\n", base64(cmd.as_bytes()))
}

fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The console text, read by a thread until the guest closes it.
#[derive(Debug, Clone)]
pub struct Console(Text);

impl Console {
    pub fn spawn(out: impl Read + Send + 'static) -> Console {
        let text = Text::default();
        let t = text.clone();
        std::thread::spawn(move || {
            let mut r = BufReader::new(out);
            let mut line = Vec::new();
            while r.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
                let l = String::from_utf8_lossy(&line).replace('\r', "");
                if let Ok(mut t) = t.lock() {
                    t.push_str(&l);
                }
                line.clear();
            }
        });
        Console(text)
    }

    pub fn text(&self) -> String {
        self.0.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// The last lines, for errors.
    pub fn tail(&self) -> String {
        last_lines(&self.text(), 25)
    }

    fn poll<T>(
        &self,
        what: &str,
        timeout: Duration,
        f: impl Fn(&str) -> Option<Result<T, UmlError>>,
    ) -> Result<T, UmlError> {
        let start = Instant::now();
        loop {
            if let Some(r) = f(&self.text()) {
                return r;
            }
            if start.elapsed() > timeout {
                return Err(UmlError::Timeout {
                    what: what.into(),
                    secs: timeout.as_secs_f64(),
                    tail: self.tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the init script's ready line; a failed module load is an
    /// error at once.
    pub fn wait_ready(&self, timeout: Duration) -> Result<(), UmlError> {
        self.poll("guest boot", timeout, |t| {
            if let Some(l) = t.lines().find(|l| l.starts_with(FAIL)) {
                return Some(Err(UmlError::Command {
                    cmd: l[FAIL.len()..].to_string(),
                    rc: 1,
                    output: self.tail(),
                }));
            }
            t.lines().any(|l| l.trim() == READY).then_some(Ok(()))
        })
    }

    /// The exit status and output of command `id`.
    pub fn answer(&self, id: u64, timeout: Duration, cmd: &str) -> Result<(i32, String), UmlError> {
        let begin = format!("@@begin {id}");
        let end = format!("@@rc {id} ");
        self.poll(&format!("guest command `{cmd}`"), timeout, |t| {
            let b = t.find(&begin)?;
            let rest = &t[b + begin.len()..];
            let e = rest.find(&end)?;
            let tail = &rest[e + end.len()..];
            let rc_text = tail.lines().next()?;
            let rc = rc_text.trim().parse().unwrap_or(-1);
            let out = rest[..e].trim_start_matches('\n').to_string();
            Some(Ok((rc, out)))
        })
    }
}

/// The last `n` lines of `text`.
pub fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"echo 'a b'\nls"), "ZWNobyAnYSBiJwpscw==");
    }

    #[test]
    fn answers_are_found_between_markers_not_in_echoes() {
        let c = Console::spawn(
            &b"3 ZWNobw==\n@@begin 3\nhello\nworld\n@@rc 3 0\n@@begin 4\n@@rc 4 2\n"[..],
        );
        let (rc, out) = c.answer(3, Duration::from_secs(2), "x").unwrap();
        assert_eq!((rc, out.as_str()), (0, "hello\nworld\n"));
        assert_eq!(c.answer(4, Duration::from_secs(2), "y").unwrap().0, 2);
        let e = c.answer(5, Duration::from_millis(50), "z").unwrap_err();
        assert!(e.to_string().contains("timed out"), "{e}");
    }

    #[test]
    fn the_script_marks_markers_against_echo() {
        let s = init_script(&[PathBuf::from("/m/virtio_balloon.ko")]);
        assert!(s.contains("insmod /m/virtio_balloon.ko"));
        assert!(!s.contains("@@ready"), "split so an echo never matches");
        assert!(s.contains("\"@@\"\"ready\""));
    }
}
