//! The stand-in guest: a child process (this binary with `--hold BYTES`)
//! holding that much resident anonymous memory in 4 KiB pages, as a VMM
//! holds a guest's RAM. It writes `ready BASE LEN` and lives until its
//! stdin closes.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};

use anyhow::{Context, bail};

/// Child mode: maps, touches every page, reports, waits for EOF.
pub fn hold(bytes: u64) -> anyhow::Result<()> {
    let len = usize::try_from(bytes).context("size")?;
    // SAFETY: a new private anonymous mapping; no existing memory is
    // affected. Checked against MAP_FAILED below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if map == libc::MAP_FAILED {
        bail!("mmap {bytes} bytes: {}", std::io::Error::last_os_error());
    }
    // 4 KiB pages, as a VMM's guest RAM without hugepages: the case whose
    // cost grows fastest with size.
    // SAFETY: advice on the mapping just made; contents unaffected.
    unsafe { libc::madvise(map, len, libc::MADV_NOHUGEPAGE) };
    for off in (0..len).step_by(4096) {
        // SAFETY: `off` < len, inside the writable mapping made above.
        unsafe { (map as *mut u8).add(off).write_volatile(1) };
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready {:x} {len}", map as u64)?;
    out.flush()?;
    drop(out);
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    Ok(())
}

/// A running stand-in guest; ended (by its PID) when dropped.
pub struct Guest {
    child: Child,
    stdin: Option<ChildStdin>,
    pub base: u64,
    pub len: u64,
}

impl Guest {
    pub fn start(bytes: u64) -> anyhow::Result<Guest> {
        let exe = std::env::current_exe().context("own path")?;
        let mut child = Command::new(exe)
            .arg("--hold")
            .arg(bytes.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the stand-in guest")?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("child stdout")?;
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .context("reading the guest's ready line")?;
        let mut f = line.split_whitespace();
        let (Some("ready"), Some(base), Some(len)) = (f.next(), f.next(), f.next()) else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("stand-in guest did not start: {line:?}");
        };
        Ok(Guest {
            base: u64::from_str_radix(base, 16).context("base")?,
            len: len.parse().context("len")?,
            stdin,
            child,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident bytes of the guest process (its VmRSS).
    pub fn rss(&self) -> u64 {
        status_kib(self.pid(), "VmRSS:") * 1024
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        // Closing stdin ends it; a kill by PID if it does not.
        drop(self.stdin.take());
        for _ in 0..50 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `/proc/PID/status` field in KiB (0 if absent).
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}
