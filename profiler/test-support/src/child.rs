//! A child process ended by PID when dropped: SIGTERM first so it can
//! clean up (tierd removes its socket), SIGKILL if it outlives the grace.

use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// How long a child gets between SIGTERM and SIGKILL.
pub const GRACE: Duration = Duration::from_secs(10);

/// Owns a child; on drop, terminates it unless it has already exited.
#[derive(Debug)]
pub struct ChildGuard {
    child: Child,
    grace: Duration,
}

impl ChildGuard {
    pub fn new(child: Child) -> ChildGuard {
        ChildGuard::with_grace(child, GRACE)
    }

    /// With its own time between SIGTERM and SIGKILL in place of [`GRACE`].
    pub fn with_grace(child: Child, grace: Duration) -> ChildGuard {
        ChildGuard { child, grace }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status if it has exited, without waiting.
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        self.child.try_wait()
    }

    /// The child itself, e.g. to SIGKILL it or to poll its status.
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// SIGTERM by PID, then waits up to its grace. `None` if it ignored
    /// SIGTERM (it is then SIGKILLed and reaped).
    pub fn terminate(&mut self) -> Option<ExitStatus> {
        if let Ok(Some(st)) = self.child.try_wait() {
            return Some(st);
        }
        // SAFETY: kill(2) on our own child's PID; not reaped yet (checked
        // just above), so the PID cannot belong to another process.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + self.grace;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        // A reaped child keeps its status in `Child`: no signal is sent then.
        self.terminate();
    }
}

/// Spawns `cmd` with stdout piped and reads its first line (a "ready ..."
/// announcement); the rest of stdout is left unread.
pub fn spawn_ready_line(cmd: &mut std::process::Command) -> (ChildGuard, String) {
    use std::io::BufRead;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (ChildGuard::new(child), line)
}
