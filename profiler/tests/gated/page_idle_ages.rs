//! The page_idle path of the working-set ages on this process's own pages:
//! pages touched at known times between real idle-bitmap passes, read back
//! per folio into a recency record, give the exact working set per horizon.
//! Needs root and CONFIG_IDLE_PAGE_TRACKING; elsewhere it is reported
//! ignored with the reason.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::collections::HashSet;
use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant};

use libtest_mimic::{Completion, Failed, Trial};

use tier_profiler::ages::recency::Recency;
use tier_profiler::sampler::folio::PageFlags;
use tier_profiler::sampler::page_idle::{self, Bitmap};

const PAGE: usize = 4096;

/// This file's trials, named `page_idle_ages::NAME`.
pub fn trials() -> Vec<Trial> {
    let trial = Trial::ignorable_test(
        "page_idle_ages::idle_bitmap_passes_give_the_exact_working_set_per_horizon",
        || -> Result<Completion, Failed> {
            match Bitmap::open(Path::new(page_idle::BITMAP)) {
                Ok(bitmap) => {
                    exact_working_set_per_horizon(bitmap);
                    Ok(Completion::Completed)
                }
                Err(e) => Ok(Completion::ignored_with(format!(
                    "no page_idle bitmap here ({e}); needs root and CONFIG_IDLE_PAGE_TRACKING"
                ))),
            }
        },
    );
    vec![trial]
}

fn exact_working_set_per_horizon(bitmap: Bitmap) {
    let flags = PageFlags::open().expect("kpageflags (root)");
    let pages = 64;
    // SAFETY: a fresh private anonymous mapping, checked below, unmapped
    // at the end; nothing else refers to it.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            pages * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    let touch = |range: std::ops::Range<usize>| {
        for p in range {
            // SAFETY: p < pages: inside the mapping, readable and writable.
            unsafe { (map as *mut u8).add(p * PAGE).write_volatile(1) };
        }
    };
    touch(0..pages);
    let pagemap = File::open("/proc/self/pagemap").unwrap();
    let mut seen = HashSet::new();
    let s = page_idle::sample_range(
        &pagemap,
        &flags,
        map as u64,
        (pages * PAGE) as u64,
        1,
        &mut seen,
    )
    .unwrap();
    assert_eq!(s.heads.len(), pages, "one small folio per page");
    let weights = vec![1; pages];
    let epoch = Instant::now();
    let mut rec = Recency::new(epoch, 10.0);
    rec.set_units(&s.heads, &weights);
    let mut last = Instant::now();
    let mut pass = |rec: &mut Recency| {
        let idle = bitmap.idle(&s.heads).unwrap();
        let young: Vec<bool> = idle.iter().map(|i| !i).collect();
        let now = Instant::now();
        rec.observe(last, now, &young);
        bitmap
            .mark_idle(&page_idle::words(s.heads.clone()))
            .unwrap();
        last = now;
    };
    pass(&mut rec); // arms
    std::thread::sleep(Duration::from_millis(300));
    touch(0..16);
    std::thread::sleep(Duration::from_millis(300));
    pass(&mut rec);
    touch(16..24);
    std::thread::sleep(Duration::from_millis(200));
    pass(&mut rec);
    let t = rec.history();
    // Inside the last pass: at most its 8 pages; from the first pass's
    // start: all 24 (the first 16 only in the high end if rounding puts
    // the cut a hair after that start).
    let c = rec.counts(&[0.15, t]);
    let (_, lo, hi) = c[0].clone().unwrap();
    assert!(lo <= 8.0 && (8.0..=8.0 + 1e-9).contains(&hi), "{c:?}");
    let (_, lo, hi) = c[1].clone().unwrap();
    assert!(lo >= 8.0 && hi == 24.0, "{c:?}");
    // SAFETY: the mapping made above, no longer used.
    unsafe { libc::munmap(map, pages * PAGE) };
}
