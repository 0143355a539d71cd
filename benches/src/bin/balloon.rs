//! Balloon inflate speed of `tier-balloon`'s release engine (validate, sort,
//! coalesce, one punch-hole + one madvise per run) against, in the same run,
//! what cloud-hypervisor v53.0 does (punch-hole + madvise per 4 KiB page) and
//! the limit (one punch-hole + one madvise over the whole range).
//!
//! Every case releases a fully populated shared memfd mapping of `SIZE`
//! (2 GiB; `TIER_BALLOON_BENCH_MIB` overrides) and only the release is timed.
//! Engine cases feed descriptor chains as a guest driver would: 256 PFNs per
//! chain (one full SPEC descriptor), contiguous or scattered; the 2 MiB case
//! uses 512-PFN chains (two descriptors) of 2 MiB-aligned runs.

use std::os::fd::AsRawFd;
use std::time::Instant;

use anyhow::{Context, bail};
use tier_balloon::{Backing, Op, PAGE_SIZE, Region, SysReleaser, Tiers, memfd};
use tier_benches::progress::Progress;
use tier_benches::{Row, Summary, print_table, result_line};

const RUNS: usize = 5;
const GIB: f64 = (1u64 << 30) as f64;

fn size() -> u64 {
    std::env::var("TIER_BALLOON_BENCH_MIB")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(2 << 30, |m| m << 20)
}

/// A fresh memfd of `size` bytes mapped as the guest range [0, size), all
/// pages populated (written) through the mapping, as a running guest's would be.
fn fresh(size: u64) -> anyhow::Result<Tiers> {
    let fd = memfd("balloon-bench", size, false).context("memfd")?;
    let region = Region::map(fd, 0, size, 0, Backing::Small).context("map")?;
    // SAFETY: the region's own live read-write shared mapping of `size` bytes;
    // MADV_POPULATE_WRITE only faults pages in (kernel >= 5.14).
    let rc = unsafe {
        libc::madvise(
            region.as_ptr().cast(),
            size as usize,
            libc::MADV_POPULATE_WRITE,
        )
    };
    if rc != 0 {
        bail!("MADV_POPULATE_WRITE: {}", std::io::Error::last_os_error());
    }
    Ok(Tiers::new(vec![vec![region]])?)
}

fn region(t: &Tiers) -> anyhow::Result<&Region> {
    t.tier(0)
        .and_then(|x| x.regions().next())
        .context("no region")
}

/// Punch + DONTNEED of [off, off + len) of the bench region: the baselines.
fn punch_madvise(r: &Region, off: u64, len: u64) -> anyhow::Result<()> {
    // SAFETY: the range lies inside the region's file range (callers pass
    // offsets below its length).
    let rc = unsafe {
        libc::fallocate(
            r.fd().as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as libc::off_t,
            len as libc::off_t,
        )
    };
    if rc != 0 {
        bail!("fallocate: {}", std::io::Error::last_os_error());
    }
    // SAFETY: inside the region's live mapping; the bench owns its contents.
    let rc = unsafe {
        libc::madvise(
            r.as_ptr().add(off as usize).cast(),
            len as usize,
            libc::MADV_DONTNEED,
        )
    };
    if rc != 0 {
        bail!("madvise: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Checks the memfd has no block left, so every case really freed it all.
fn assert_empty(r: &Region) -> anyhow::Result<()> {
    // SAFETY: zeroed POD out buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out pointer.
    if unsafe { libc::fstat(r.fd().as_raw_fd(), &mut st) } != 0 || st.st_blocks != 0 {
        bail!("memfd not empty after release: {} blocks", st.st_blocks);
    }
    Ok(())
}

/// Chains of PFNs, `per` at a time, as little-endian bytes.
fn chains(pfns: &[u32], per: usize) -> Vec<Vec<u8>> {
    pfns.chunks(per)
        .map(|c| c.iter().flat_map(|p| p.to_le_bytes()).collect())
        .collect()
}

/// GiB/s of feeding `chains` to the engine.
fn engine(size: u64, chains: &[Vec<u8>]) -> anyhow::Result<f64> {
    let mut t = fresh(size)?;
    let tier = t.tier_mut(0).context("tier 0")?;
    let mut rel = SysReleaser::default();
    let start = Instant::now();
    for c in chains {
        let out = tier
            .process_chain(Op::Inflate, &[c], &mut rel)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        if out.errors != 0 {
            bail!("release errors");
        }
    }
    let secs = start.elapsed().as_secs_f64();
    if tier.stats().ballooned_pages != size / PAGE_SIZE {
        bail!("not all pages ballooned");
    }
    assert_empty(region(&t)?)?;
    Ok(size as f64 / GIB / secs)
}

fn per_page(size: u64) -> anyhow::Result<f64> {
    let t = fresh(size)?;
    let r = region(&t)?;
    let start = Instant::now();
    for off in (0..size).step_by(PAGE_SIZE as usize) {
        punch_madvise(r, off, PAGE_SIZE)?;
    }
    let secs = start.elapsed().as_secs_f64();
    assert_empty(r)?;
    Ok(size as f64 / GIB / secs)
}

fn one_call(size: u64) -> anyhow::Result<f64> {
    let t = fresh(size)?;
    let r = region(&t)?;
    let start = Instant::now();
    punch_madvise(r, 0, size)?;
    let secs = start.elapsed().as_secs_f64();
    assert_empty(r)?;
    Ok(size as f64 / GIB / secs)
}

fn main() -> anyhow::Result<()> {
    let size = size();
    let pages = u32::try_from(size / PAGE_SIZE).context("size")?;
    let seq: Vec<u32> = (0..pages).collect();
    // Scattered: a seeded random permutation (xorshift64* Fisher-Yates).
    let mut shuffled = seq.clone();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for i in (1..shuffled.len()).rev() {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let j = (x.wrapping_mul(0x2545_f491_4f6c_dd1d) % (i as u64 + 1)) as usize;
        shuffled.swap(i, j);
    }
    let contiguous = chains(&seq, 256);
    let huge = chains(&seq, 512);
    let scattered = chains(&shuffled, 256);

    let names = [
        "per 4 KiB page (CH v53), baseline",
        "one call over the range (limit)",
        "engine contiguous (256-PFN chains)",
        "engine 2 MiB runs (512-PFN chains)",
        "engine scattered 4 KiB (256-PFN)",
    ];
    let mut v: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let progress = Progress::bar("balloon", (RUNS * names.len()) as u64);
    for run in 1..=RUNS {
        let what = |i: usize| format!("run {run}/{RUNS}: {}", names[i]);
        // Interleaved so drift on a shared machine hits every case alike.
        v[0].push(progress.step(what(0), || per_page(size))?);
        v[1].push(progress.step(what(1), || one_call(size))?);
        v[2].push(progress.step(what(2), || engine(size, &contiguous))?);
        v[3].push(progress.step(what(3), || engine(size, &huge))?);
        v[4].push(progress.step(what(4), || engine(size, &scattered))?);
    }
    progress.finish();
    let s: Vec<Summary> = v
        .iter()
        .map(|x| Summary::of(x).context("empty sample"))
        .collect::<anyhow::Result<_>>()?;
    let base = s[0].median;
    let rows: Vec<Row> = names
        .iter()
        .zip(&s)
        .map(|(n, s)| Row {
            name: (*n).to_string(),
            unit: "GiB/s",
            summary: *s,
            ratio: Some(s.median / base),
        })
        .collect();
    print_table(
        &format!(
            "balloon inflate of a populated {} MiB shared memfd, {RUNS} runs (ratio: median / per-page median)",
            size >> 20
        ),
        &rows,
    );
    println!(
        "contiguous / one-call limit: {:.3} (median)",
        s[2].median / s[1].median
    );
    println!(
        "{}",
        result_line(&[
            ("vs_per_page", format!("{:.2}", s[2].median / base)),
            ("vs_limit", format!("{:.2}", s[2].median / s[1].median)),
        ])
    );
    Ok(())
}
