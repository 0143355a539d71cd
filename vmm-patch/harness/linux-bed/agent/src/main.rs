//! Runs in the Linux bed's guest (`/opt/bin/tier-bed-agent damon`): tierd's
//! DAMON driver ([`Kdamonds`]) ages a buffer of this process, one region
//! per page as tierd gives it one per sampled folio, while a thread keeps
//! re-touching a hot part. DAMON's access check marks each region's
//! sampled folio idle when it clears its young bit (`damon_ptep_mkold`),
//! so after a few rounds every page of the buffer reads KPF_IDLE in
//! /proc/kpageflags if, and only if, every region was aged. (smaps'
//! `Referenced:` cannot show it: it counts the folio's young flag, which
//! the same clear sets.) Also writes `nr_targets` and `nr_contexts` while
//! the kdamond runs, to see whether the kernel refuses. Prints one JSON
//! object.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

mod touch;
use serde_json::json;
use tier_profiler::sampler::damon::{ADMIN, Kdamonds, RealSysfs, Sysfs};

const PAGE: usize = 4096;

/// An anonymous mapping of `pages` 4 KiB pages, populated, without THP.
struct Buffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping lives as long as the Buffer, and the threads only
// write bytes of it (races on the bytes' values are harmless here).
unsafe impl Sync for Buffer {}

impl Buffer {
    fn new(pages: usize) -> anyhow::Result<Buffer> {
        // A PROT_NONE guard page each side keeps the kernel from merging
        // the buffer's VMA with a neighbour: smaps must show it alone.
        let len = (pages + 2) * PAGE;
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            bail!("mmap {len} bytes: {}", std::io::Error::last_os_error());
        }
        // SAFETY: ptr/len are the mapping made above.
        unsafe { libc::madvise(ptr, len, libc::MADV_NOHUGEPAGE) };
        let b = Buffer {
            ptr: ptr.cast(),
            len,
        };
        for p in 0..pages {
            b.touch(p);
        }
        Ok(b)
    }

    fn touch(&self, page: usize) {
        // SAFETY: page < pages, so the byte is inside the mapping, past
        // the leading guard.
        unsafe { std::ptr::write_volatile(self.ptr.add((page + 1) * PAGE), page as u8) };
    }

    /// The first page after the guard.
    fn start(&self) -> u64 {
        self.ptr as u64 + PAGE as u64
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in new().
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// KPF_IDLE in /proc/kpageflags: the folio's idle flag, which DAMON's
/// access check sets on every folio it ages (`damon_ptep_mkold`).
const KPF_IDLE: u64 = 1 << 25;
const PFN_MASK: u64 = (1 << 55) - 1;
const PRESENT: u64 = 1 << 63;

/// How many of the `pages` pages from `start` are present, and how many of
/// those have their idle flag set.
fn idle_pages(start: u64, pages: usize) -> anyhow::Result<(u64, u64)> {
    use std::os::unix::fs::FileExt;
    let pagemap =
        std::fs::File::open("/proc/self/pagemap").context("opening /proc/self/pagemap")?;
    let flags = std::fs::File::open("/proc/kpageflags").context("opening /proc/kpageflags")?;
    let mut raw = vec![0u8; pages * 8];
    pagemap
        .read_exact_at(&mut raw, start / PAGE as u64 * 8)
        .context("reading pagemap")?;
    let (mut present, mut idle) = (0, 0);
    for e in raw.chunks_exact(8) {
        let e = u64::from_le_bytes(e.try_into().unwrap_or_default());
        if e & PRESENT == 0 {
            continue;
        }
        present += 1;
        let mut f = [0u8; 8];
        flags
            .read_exact_at(&mut f, (e & PFN_MASK) * 8)
            .context("reading kpageflags")?;
        if u64::from_le_bytes(f) & KPF_IDLE != 0 {
            idle += 1;
        }
    }
    Ok((present, idle))
}

/// Writes `value` to a file under `kdamonds/` while kdamond 0 runs: whether the
/// kernel refuses it, and how.
fn write_while_running(rel: &str, value: &str) -> String {
    let p = Path::new(ADMIN).join("kdamonds").join(rel);
    match RealSysfs.write(&p, value) {
        Ok(()) => "accepted".into(),
        Err(e) => format!("refused: {e}"),
    }
}

fn damon(
    pages: usize,
    hot: usize,
    sample_ms: u64,
    rounds: u32,
) -> anyhow::Result<serde_json::Value> {
    let buf = Buffer::new(pages)?;
    let (present, idle_before) = idle_pages(buf.start(), pages)?;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| -> anyhow::Result<serde_json::Value> {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                for p in 0..hot {
                    buf.touch(p);
                }
                std::thread::sleep(Duration::from_millis(sample_ms / 4 + 1));
            }
        });
        // Whatever happens below, the toucher must stop or the scope never ends.
        let r = age(&buf, pages, sample_ms, rounds, present, idle_before);
        stop.store(true, Ordering::Relaxed);
        r
    })
}

fn age(
    buf: &Buffer,
    pages: usize,
    sample_ms: u64,
    rounds: u32,
    present: u64,
    idle_before: u64,
) -> anyhow::Result<serde_json::Value> {
    {
        let mut k = Kdamonds::take(RealSysfs, Path::new(ADMIN), 1).context("taking DAMON")?;
        // The last quarter gets no region: the control, never aged.
        let covered = pages - pages / 4;
        let regions: Vec<(u64, u64)> = (0..covered as u64)
            .map(|p| {
                (
                    buf.start() + p * PAGE as u64,
                    buf.start() + (p + 1) * PAGE as u64,
                )
            })
            .collect();
        let started = Instant::now();
        let tid = k
            .start(0, std::process::id(), &regions, sample_ms * 1000)
            .context("starting the kdamond")?;
        std::thread::sleep(Duration::from_millis(sample_ms * u64::from(rounds)));
        let (_, idle_covered) = idle_pages(buf.start(), covered)?;
        let (_, idle_uncovered) =
            idle_pages(buf.start() + (covered * PAGE) as u64, pages - covered)?;
        let nr_regions = RealSysfs
            .read(&Path::new(ADMIN).join("kdamonds/0/contexts/0/targets/0/regions/nr_regions"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|e| format!("unreadable: {e}"));
        let nr_kdamonds = write_while_running("nr_kdamonds", "1");
        let nr_regions_write = write_while_running(
            "0/contexts/0/targets/0/regions/nr_regions",
            &covered.to_string(),
        );
        let nr_targets = write_while_running("0/contexts/0/targets/nr_targets", "1");
        let nr_contexts = write_while_running("0/contexts/nr_contexts", "1");
        let regions_back = RealSysfs
            .read(&Path::new(ADMIN).join("kdamonds/0/contexts/0/targets/0/regions/nr_regions"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|e| format!("unreadable: {e}"));
        k.stop(0).context("stopping the kdamond")?;
        drop(k);
        let left = RealSysfs
            .read(&Path::new(ADMIN).join("kdamonds/nr_kdamonds"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        Ok(json!({
            "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
            "pages": pages, "present": present, "nr_regions": nr_regions, "sample_ms": sample_ms, "rounds": rounds,
            "kdamond_tid": tid,
            "idle_before": idle_before, "covered": covered,
            "idle_covered": idle_covered, "idle_uncovered": idle_uncovered,
            "ran_ms": started.elapsed().as_millis() as u64,
            "write_nr_kdamonds_while_on": nr_kdamonds,
            "write_nr_regions_while_on": nr_regions_write,
            "write_nr_targets_while_on": nr_targets,
            "write_nr_contexts_while_on": nr_contexts,
            "nr_regions_after_writes": regions_back,
            "nr_kdamonds_after_drop": left,
        }))
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |k: &str, d: u64| -> anyhow::Result<u64> {
        match args.iter().position(|a| a == k) {
            Some(i) => args
                .get(i + 1)
                .with_context(|| format!("{k} needs a value"))?
                .parse()
                .with_context(|| k.to_string()),
            None => Ok(d),
        }
    };
    match args.first().map(String::as_str) {
        Some("damon") => {
            let pages = usize::try_from(num("--pages", 4096)?)?;
            let hot = usize::try_from(num("--hot", 1024)?)?;
            if hot > pages {
                bail!("--hot {hot} > --pages {pages}");
            }
            let v = damon(
                pages,
                hot,
                num("--sample-ms", 100)?,
                u32::try_from(num("--rounds", 10)?)?,
            )?;
            println!("{v}");
            Ok(())
        }
        Some("touch") => {
            let hot = args.iter().any(|a| a == "--hot-mib");
            touch::run(touch::Touch {
                mib: usize::try_from(num("--mib", 64)?)?,
                hot_mib: if hot {
                    Some(usize::try_from(num("--hot-mib", 0)?)?)
                } else {
                    None
                },
                grow_after: Duration::from_secs(num("--grow-after-s", 0)?),
                pause: Duration::from_millis(num("--pause-ms", 0)?),
                stride: usize::try_from(num("--stride", 4096)?)?,
            })
        }
        _ => {
            bail!(
                "usage: tier-bed-agent damon [--pages N] [--hot N] [--sample-ms N] [--rounds N] | touch [--mib N] [--hot-mib H --grow-after-s T] [--pause-ms N] [--stride BYTES]"
            )
        }
    }
}
