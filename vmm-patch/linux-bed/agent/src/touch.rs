//! `tier-bed-agent touch --mib N`: the closed loop's guest workload. Keeps
//! touching every page of an N MiB anonymous buffer (one write per page
//! per pass, no THP, so the guest's own tiering moves it page by page)
//! until killed; `--mib` can be grown by starting a second instance. Says
//! on stdout when the buffer is populated.

use std::time::Duration;

use anyhow::bail;

const PAGE: usize = 4096;

/// Touches `mib` MiB forever, sleeping `pause` between passes.
pub fn run(mib: usize, pause: Duration) -> anyhow::Result<()> {
    let len = mib << 20;
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
        bail!("mmap {mib} MiB: {}", std::io::Error::last_os_error());
    }
    // SAFETY: ptr/len are the mapping made above.
    unsafe { libc::madvise(ptr, len, libc::MADV_NOHUGEPAGE) };
    let base = ptr.cast::<u8>();
    let mut pass: u8 = 0;
    loop {
        for p in 0..len / PAGE {
            // SAFETY: p * PAGE < len: inside the mapping.
            unsafe { std::ptr::write_volatile(base.add(p * PAGE), pass) };
        }
        if pass == 0 {
            println!("touch: {mib} MiB populated");
        }
        pass = pass.wrapping_add(1).max(1);
        std::thread::sleep(pause);
    }
}
