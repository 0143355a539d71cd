use super::*;
use std::os::unix::fs::FileExt;

/// A file as tier_truth writes it: ranges of (start, pages).
fn write(file: &File, ranges: &[(u64, u64)]) {
    let pages: u64 = ranges.iter().map(|r| r.1).sum();
    let mut h = vec![0u64; HDR_BYTES / 8];
    h[H_VERSION] = VERSION;
    h[H_HDR] = HDR_BYTES as u64;
    h[H_PAGE] = PAGE;
    h[4] = 64;
    h[H_LLC_BYTES] = 32 << 20;
    h[H_LLC_WAYS] = 16;
    h[H_RANGES] = ranges.len() as u64;
    h[H_PAGES] = pages;
    for (i, (start, n)) in ranges.iter().enumerate() {
        h[H_RANGE0 + 2 * i] = *start;
        h[H_RANGE0 + 2 * i + 1] = n * PAGE;
        h[H_PHYS0 + i] = i64::MIN as u64;
    }
    h[H_MAGIC] = MAGIC;
    file.set_len((HDR_BYTES as u64 / 8 + 2 * pages) * 8)
        .unwrap();
    put(file, 0, &h);
}

fn put(file: &File, word: usize, values: &[u64]) {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    file.write_all_at(&bytes, word as u64 * 8).unwrap();
}

const BASE: usize = HDR_BYTES / 8;

#[test]
fn snapshots_diff_and_sum_per_node() {
    let f = tempfile::NamedTempFile::new().unwrap();
    // Node 0 at 0 (4 pages), node 1 at 1 GiB (2 pages) and its virtio-mem
    // at 4 GiB (2 pages): 8 pages, misses after them.
    write(f.as_file(), &[(0, 4), (1 << 30, 2), (4 << 30, 2)]);
    let t = Truth::open(f.path()).unwrap();
    assert_eq!(t.ranges().len(), 3);
    assert_eq!((t.llc_bytes, t.llc_ways), (32 << 20, 16));
    let a = t.snapshot();
    assert_eq!(a.total(), PageSums::default());
    put(f.as_file(), BASE, &[5, 0, 1, 0, 7, 0, 2, 9]);
    put(f.as_file(), BASE + 8, &[1, 0, 1, 0, 3, 0, 0, 9]);
    put(f.as_file(), H_INSNS, &[1000]);
    let b = t.snapshot();
    put(f.as_file(), BASE, &[6, 0, 1, 0, 7, 4, 2, 9]);
    put(f.as_file(), H_INSNS, &[1500]);
    let c = t.snapshot();

    let ab = b.since(&a).unwrap();
    assert_eq!(ab.counters.instructions, 1000);
    let node0 = ab.sum_in(0, 4 * PAGE);
    assert_eq!(
        (node0.touches, node0.misses, node0.pages_touched),
        (6, 2, 2)
    );
    let node1 = PageSums {
        touches: ab.sum_in(1 << 30, 2 * PAGE).touches + ab.sum_in(4 << 30, 2 * PAGE).touches,
        ..PageSums::default()
    };
    assert_eq!(node1.touches, 18);
    // A span covering a part of a page counts that page.
    assert_eq!(ab.sum_in(PAGE * 2 + 1, 1).touches, 1);
    // Between b and c: one page re-touched, one page newly touched.
    let bc = c.since(&b).unwrap();
    assert_eq!(bc.counters.instructions, 500);
    assert_eq!(bc.total().pages_touched, 2);
    assert_eq!(bc.total().touches, 5);
    assert_eq!(bc.page_gpa(5), Some((1 << 30) + PAGE));
    assert_eq!(bc.page_gpa(6), Some(4 << 30));
    assert_eq!(bc.page_gpa(8), None);
}

#[test]
fn header_errors_are_named() {
    let f = tempfile::NamedTempFile::new().unwrap();
    assert!(matches!(
        Truth::open(f.path()),
        Err(TruthError::NotReady { .. })
    ));
    write(f.as_file(), &[(0, 1)]);
    put(f.as_file(), H_MAGIC, &[0]);
    assert!(matches!(
        Truth::open(f.path()),
        Err(TruthError::NotReady { .. })
    ));
    put(f.as_file(), H_MAGIC, &[7]);
    assert!(matches!(
        Truth::open(f.path()),
        Err(TruthError::Magic { found: 7, .. })
    ));
    put(f.as_file(), H_MAGIC, &[MAGIC]);
    put(f.as_file(), H_VERSION, &[2]);
    assert!(matches!(
        Truth::open(f.path()),
        Err(TruthError::Version { found: 2, .. })
    ));
    put(f.as_file(), H_VERSION, &[VERSION]);
    put(f.as_file(), H_PAGES, &[3]);
    let e = Truth::open(f.path()).unwrap_err();
    assert!(matches!(e, TruthError::Layout { .. }), "{e}");
    assert!(matches!(
        Truth::open(Path::new("/nonexistent/truth")),
        Err(TruthError::Open { .. })
    ));
}

#[test]
fn snapshots_of_other_layouts_do_not_diff() {
    let (f, g) = (
        tempfile::NamedTempFile::new().unwrap(),
        tempfile::NamedTempFile::new().unwrap(),
    );
    write(f.as_file(), &[(0, 2)]);
    write(g.as_file(), &[(0, 1), (PAGE, 1)]);
    let (a, b) = (
        Truth::open(f.path()).unwrap(),
        Truth::open(g.path()).unwrap(),
    );
    assert!(matches!(
        a.snapshot().since(&b.snapshot()),
        Err(TruthError::Mismatch)
    ));
}
