//! CPU per pass per GiB of guest memory, from per-event costs measured on
//! this machine:
//! - pagemap: measured here, in-process (`measure_pagemap`): reading the
//!   PFNs of a resident buffer from `/proc/self/pagemap`, in 4 KiB chunks
//!   (stride <= 32) and one 8-byte `pread` per page (larger strides), as
//!   `sampler/page_idle.rs` reads them.
//! - BPF program per young SPTE: `cargo xtask bench bpf-cost`, docs/ept.md
//!   ("ageing, owned" median 66.5 ns, worst case unattributed 75.7 ns).
//! - hostpte: `cargo xtask bench overhead` (benches/results/2026-11-21/
//!   overhead.txt): 29.2 ms of CPU per GiB scanned per pass.
//! - The page_idle bitmap write and its rmap walk (`page_idle_clear_pte_refs`
//!   per folio, with `kvm_age_gfn` under it) cannot be measured here
//!   (CONFIG_IDLE_PAGE_TRACKING off): the ept column is a lower bound
//!   without it, and says so.
//! - pmu counting: one `read()` per counter per interval; measured here
//!   as the cost of a small `read()` syscall (eventfd), since this machine
//!   has no PMU. Sampling: one overflow NMI and guest exit per sample,
//!   not measurable here; reported as samples per second.

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::time::Instant;

/// BPF run time per owned ageing event, ns (docs/ept.md, bpf-cost).
pub const BPF_NS_PER_YOUNG: f64 = 66.5;
/// hostpte CPU per GiB per pass, ns (overhead bench, 2026-11-21).
pub const HOSTPTE_NS_PER_GIB: f64 = 29.2e6;
const GIB_PAGES: f64 = (1u64 << 18) as f64;

/// Measured per-page and per-syscall costs.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    pub pagemap_chunked_ns: f64,
    pub pagemap_single_ns: f64,
    pub read_syscall_ns: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times pagemap reads of a resident 64 MiB buffer (5 runs, median).
pub fn measure() -> std::io::Result<Measured> {
    let pages = 16_384usize;
    let buf: Vec<u8> = vec![1u8; pages * 4096];
    let base = buf.as_ptr() as u64 / 4096;
    let f = std::fs::File::open("/proc/self/pagemap")?;
    let mut chunk = vec![0u8; 512 * 8];
    let (mut chunked, mut single) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let t = Instant::now();
        for c in (0..pages).step_by(512) {
            f.read_exact_at(&mut chunk, (base + c as u64) * 8)?;
        }
        chunked.push(t.elapsed().as_nanos() as f64 / pages as f64);
        let mut one = [0u8; 8];
        let t = Instant::now();
        for p in (0..pages).step_by(4) {
            f.read_exact_at(&mut one, (base + p as u64) * 8)?;
        }
        single.push(t.elapsed().as_nanos() as f64 / (pages / 4) as f64);
    }
    std::hint::black_box(&buf);
    // SAFETY: eventfd takes no pointers; the fd is owned by the File below.
    let fd = unsafe { libc::eventfd(1, libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor nobody else owns.
    let mut ev = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let mut b = [0u8; 8];
    let mut reads = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..20_000 {
            // EAGAIN after the first read: still one syscall each.
            let _ = ev.read(&mut b);
        }
        reads.push(t.elapsed().as_nanos() as f64 / 20_000.0);
    }
    Ok(Measured {
        pagemap_chunked_ns: median(chunked),
        pagemap_single_ns: median(single),
        read_syscall_ns: median(reads),
    })
}

/// One row of the cost table: ms of CPU per pass for `gib` of guest memory.
#[derive(Debug, Clone, Copy)]
pub struct CostRow {
    pub gib: f64,
    /// ept (page_idle driver): pagemap walk + BPF per young page; lower
    /// bound (no rmap walk), at the stride.
    pub ept_ms: f64,
    pub hostpte_ms: f64,
    /// pmu counting: reads per interval, one vCPU per 4 GiB, 4 events.
    pub pmu_count_ms: f64,
    /// pmu sampling: overflow samples per second at the period.
    pub pmu_samples_per_s: f64,
}

/// Cost at `gib`, with the young share per pass, LLC misses per second
/// per GiB and the sampling period observed by the twin.
pub fn row(
    m: &Measured,
    gib: f64,
    stride: usize,
    young_share: f64,
    misses_per_gib_s: f64,
    period: f64,
) -> CostRow {
    let examined = gib * GIB_PAGES / stride as f64;
    let per_page = if stride > 32 {
        m.pagemap_single_ns
    } else {
        m.pagemap_chunked_ns
    };
    let vcpus = (gib / 4.0).ceil().max(1.0);
    CostRow {
        gib,
        ept_ms: examined * (per_page + young_share * BPF_NS_PER_YOUNG) / 1e6,
        hostpte_ms: gib * HOSTPTE_NS_PER_GIB / 1e6,
        pmu_count_ms: vcpus * 4.0 * m.read_syscall_ns / 1e6,
        pmu_samples_per_s: gib * misses_per_gib_s / period,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pagemap_costs_are_measured_and_rows_scale() {
        let m = measure().unwrap();
        assert!(
            m.pagemap_chunked_ns > 0.0 && m.pagemap_single_ns > m.pagemap_chunked_ns,
            "{m:?}"
        );
        let a = row(&m, 1.0, 1, 0.5, 1e7, 1e5);
        let b = row(&m, 1024.0, 1, 0.5, 1e7, 1e5);
        assert!((b.ept_ms / a.ept_ms - 1024.0).abs() < 1e-6);
        assert!((b.hostpte_ms - 1024.0 * 29.2).abs() < 1e-6);
    }
}
