//! A real terminal for tests: a private tmux server (its socket in a
//! temporary folder) with one session of a fixed size; only that session
//! and server are killed on drop.

use std::process::Command;
use std::time::Duration;

#[derive(Debug)]
pub struct Tmux {
    dir: tempfile::TempDir,
    session: String,
}

impl Tmux {
    /// Starts `cmd` (a shell command line) in a detached session named
    /// `name`-PID of `width` x `height`, without any tmux config file.
    pub fn start(name: &str, width: u16, height: u16, cmd: &str) -> Tmux {
        let t = Tmux {
            dir: tempfile::tempdir().unwrap(),
            session: format!("{name}-{}", std::process::id()),
        };
        let (w, h) = (width.to_string(), height.to_string());
        t.tmux(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            &t.session,
            "-x",
            &w,
            "-y",
            &h,
            cmd,
        ]);
        t
    }

    pub fn session(&self) -> &str {
        &self.session
    }

    /// Runs a tmux command against this server; its stdout.
    pub fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(self.dir.path().join("tmux.sock"))
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The visible screen of the session (capture-pane).
    pub fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", &self.session])
    }

    /// One key at a time, `gap` apart: Esc followed at once by a letter
    /// would read as Alt.
    pub fn keys(&self, keys: &[&str], gap: Duration) {
        for k in keys {
            self.tmux(&["send-keys", "-t", &self.session, k]);
            std::thread::sleep(gap);
        }
    }

    pub fn resize(&self, width: u16, height: u16) {
        let (w, h) = (width.to_string(), height.to_string());
        self.tmux(&["resize-window", "-t", &self.session, "-x", &w, "-y", &h]);
    }

    /// Polls the screen until `ok`; fails with the screen after `timeout`.
    pub fn wait(&self, what: &str, timeout: Duration, ok: impl Fn(&str) -> bool) -> String {
        crate::wait_until(what, timeout, || {
            let s = self.screen();
            if ok(&s) {
                Ok(s)
            } else {
                Err(format!("screen:\n{s}"))
            }
        })
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let sock = self.dir.path().join("tmux.sock");
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&sock)
            .args(["kill-session", "-t", &self.session])
            .output();
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&sock)
            .arg("kill-server")
            .output();
    }
}
