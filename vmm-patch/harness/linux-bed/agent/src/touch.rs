//! `tier-bed-agent touch --mib N [--hot-mib H --grow-after-s T]`: the
//! closed loop's guest workload. Populates an N MiB anonymous buffer (no
//! THP, so the guest's own tiering moves it page by page), then keeps
//! writing one byte per page (or per `--stride` bytes) of its first H MiB
//! per pass, and of all N MiB
//! from T seconds after it started: a hot set that grows in place, without
//! the minute a fresh allocation takes under the truth plugin (every byte
//! the kernel zeroes is counted). Runs until killed; says on stdout when
//! the buffer is populated and when the hot set grew.

use std::time::{Duration, Instant};

use anyhow::bail;

const PAGE: usize = 4096;

/// What to touch.
#[derive(Debug, Clone, Copy)]
pub struct Touch {
    pub mib: usize,
    /// Hot part before `grow_after`; `None`: all of it.
    pub hot_mib: Option<usize>,
    pub grow_after: Duration,
    pub pause: Duration,
    /// Bytes between writes in a pass: a page (the default) keeps the
    /// pass's lines few enough to stay in a last-level cache; 64 writes
    /// every line, so a hot set larger than the LLC misses it.
    pub stride: usize,
}

pub fn run(t: Touch) -> anyhow::Result<()> {
    let len = t.mib << 20;
    if t.stride == 0 || t.stride > PAGE {
        bail!("--stride {} outside 1..={PAGE}", t.stride);
    }
    if t.hot_mib.is_some_and(|h| h > t.mib) {
        bail!("--hot-mib {:?} > --mib {}", t.hot_mib, t.mib);
    }
    let started = Instant::now();
    // SAFETY: a fresh private anonymous mapping; nothing else is touched.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        bail!("mmap {} MiB: {}", t.mib, std::io::Error::last_os_error());
    }
    // SAFETY: ptr/len are the mapping made above.
    unsafe { libc::madvise(ptr, len, libc::MADV_NOHUGEPAGE) };
    let base = ptr.cast::<u8>();
    let write = |bytes: usize, stride: usize, v: u8| {
        for off in (0..bytes).step_by(stride) {
            // SAFETY: off < bytes <= len: inside the mapping.
            unsafe { std::ptr::write_volatile(base.add(off), v) };
        }
    };
    write(len, PAGE, 1);
    println!(
        "touch: {} MiB populated in {:.1?}",
        t.mib,
        started.elapsed()
    );
    let mut grown = t.hot_mib.is_none();
    let mut pass: u8 = 2;
    loop {
        if !grown && started.elapsed() >= t.grow_after {
            grown = true;
            println!(
                "touch: hot set {} MiB from {:.1?}",
                t.mib,
                started.elapsed()
            );
        }
        let hot = if grown {
            t.mib
        } else {
            t.hot_mib.unwrap_or(t.mib)
        };
        write(hot << 20, t.stride, pass);
        pass = pass.wrapping_add(1).max(1);
        std::thread::sleep(t.pause);
    }
}
