//! Working set from whole-tier readings (hostpte): a pass of exposure `e`
//! that read every page of the tier says exactly how many were touched
//! within `e` before its read, but nothing about which. A horizon H is
//! given by the reading whose exposure is closest to it; the gap `d =
//! |H - e|` is bounded by a pass of exposure at least `d` (the pages a
//! window of length d can add or remove are at most those young in a
//! window at least as long, under a steady workload), and the point follows
//! the growth from the next shorter reading to this one over the gap.

use super::{Bounded, horizon_label};

/// One whole-tier reading: pages young over `exposure` seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Whole {
    pub young: f64,
    pub exposure: f64,
}

/// The working set within `h`, in pages of a tier of `pages` pages, from
/// `readings` (this interval's, long pass included); the gap is bounded by
/// one of `recent` or `readings`. Err says why not measured.
pub fn working_set(
    h: f64,
    readings: &[Whole],
    recent: &[Whole],
    pages: f64,
) -> Result<Bounded, String> {
    let longest = readings.iter().map(|r| r.exposure).fold(0.0, f64::max);
    let Some(near) = readings
        .iter()
        .filter(|r| r.exposure > 0.0)
        .min_by(|a, b| (a.exposure - h).abs().total_cmp(&(b.exposure - h).abs()))
    else {
        return Err("no timed pass this interval".into());
    };
    let d = (h - near.exposure).abs();
    // A reading's count is exact for the span it was timed over, but the
    // span's edges are not: pages touched during the re-arm or the walk
    // may count or not. The shortest reading (a pass at least as long as
    // those edges) bounds what they hold, both ways, as a gap is bounded
    // below; at least a page.
    let edge = readings
        .iter()
        .chain(recent)
        .filter(|r| r.exposure > 0.0)
        .min_by(|a, b| a.exposure.total_cmp(&b.exposure))
        .map_or(near.young, |r| r.young)
        .max(1.0);
    if d <= 1e-9 {
        return Ok(Bounded {
            point: near.young,
            low: (near.young - edge).max(0.0),
            high: (near.young + edge).min(pages.max(near.young)),
        });
    }
    // The shortest reading that spans the gap bounds what it holds.
    let Some(gap) = readings
        .iter()
        .chain(recent)
        .filter(|r| r.exposure >= d)
        .min_by(|a, b| a.exposure.total_cmp(&b.exposure))
    else {
        return Err(format!(
            "hostpte re-arms the whole process every pass: its longest pass was {longest:.2} s; \
             {} is beyond it",
            horizon_label(h)
        ));
    };
    // A reading is stretched to a horizon by at most a quarter of itself.
    if d > near.exposure / 4.0 {
        return Err(format!(
            "hostpte re-arms the whole process every pass: its longest pass was {longest:.2} s; \
             {} is beyond it",
            horizon_label(h)
        ));
    }
    // At least one page of slack: the gap pass ran at another time.
    let bound = gap.young.max(1.0);
    // The point follows the working set's growth from a shorter reading
    // to this one (0 when saturated: the same pages again), within the
    // bound: the smaller of the growth over at least the gap, where a
    // reading reaches that far, and over the last step (the next shorter
    // reading). A 0.1 s step times a 3 s gap is mostly the edges' noise;
    // a chord from a short pass takes a saturating set's early growth for
    // its late one, and from a pass that saw nothing (a starved vCPU) any
    // growth at all. Within a sweep its readings of the intervals before
    // are in `recent`.
    let shorter = || {
        readings
            .iter()
            .chain(recent)
            .filter(|r| r.exposure > 0.0 && r.exposure < near.exposure)
    };
    let growth = |s: &Whole| ((near.young - s.young) / (near.exposure - s.exposure)).max(0.0);
    let longest = |it: &mut dyn Iterator<Item = &Whole>| {
        it.max_by(|a, b| a.exposure.total_cmp(&b.exposure)).copied()
    };
    let over_gap = longest(&mut shorter().filter(|r| r.exposure <= near.exposure - d + 1e-9));
    let last_step = longest(&mut shorter());
    let slope = over_gap
        .iter()
        .chain(last_step.iter())
        .map(growth)
        .reduce(f64::min)
        .unwrap_or(0.0);
    let part = (slope * d).min(bound);
    // A window holds at least the pages of any shorter one (the workload
    // steady, as assumed throughout): a stretched-down point never drops
    // below a reading of at most `h`, whatever one slow pass did to the
    // slope.
    let floor = readings
        .iter()
        .chain(recent)
        .filter(|r| r.exposure > 0.0 && r.exposure <= h)
        .map(|r| r.young)
        .fold(0.0, f64::max)
        .min(near.young);
    Ok(if near.exposure < h {
        Bounded {
            point: (near.young + part).min(pages),
            low: (near.young - edge).max(0.0),
            high: (near.young + edge + bound).min(pages.max(near.young)),
        }
    } else {
        Bounded {
            point: (near.young - part).max(floor),
            low: (near.young - edge - bound).max(0.0),
            high: (near.young + edge).min(pages.max(near.young)),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_closest_reading_with_a_gap_bounded_by_a_short_pass() {
        let r = [
            Whole {
                young: 10.0,
                exposure: 0.025,
            },
            Whole {
                young: 500.0,
                exposure: 0.99,
            },
        ];
        let b = working_set(1.0, &r, &[], 4096.0).unwrap();
        // The reading's own edges (the short pass's 10 pages) both ways,
        // and the gap's above.
        assert_eq!(b.low, 490.0);
        assert_eq!(b.high, 520.0);
        // Growth 490 pages over 0.965 s, for 0.01 s.
        let grown = 490.0 / 0.965 * 0.01;
        assert!((b.point - (500.0 + grown)).abs() < 1e-6, "{b:?}");
        // A horizon shorter than the long pass: the long pass is the top.
        let b = working_set(0.98, &r, &[], 4096.0).unwrap();
        assert_eq!((b.low, b.high), (480.0, 510.0));
        assert!((b.point - (500.0 - grown)).abs() < 1e-6, "{b:?}");
        // Saturated (the short pass saw as many): the point stays put.
        let flat = [
            Whole {
                young: 66.0,
                exposure: 0.025,
            },
            Whole {
                young: 66.0,
                exposure: 0.99,
            },
        ];
        let b = working_set(1.0, &flat, &[], 4096.0).unwrap();
        assert_eq!((b.low, b.point, b.high), (0.0, 66.0, 198.0));
        // On a reading's exposure: its count, with the edges bounded by
        // the shortest reading both ways (never a point).
        let b = working_set(0.025, &r, &[], 4096.0).unwrap();
        assert_eq!((b.low, b.point, b.high), (0.0, 10.0, 20.0));
        let b = working_set(0.99, &r, &[], 4096.0).unwrap();
        assert_eq!((b.low, b.point, b.high), (490.0, 500.0, 510.0));
        // Nothing young on the edge still leaves a page open above.
        let none = [Whole {
            young: 0.0,
            exposure: 1.0,
        }];
        let b = working_set(1.0, &none, &[], 4096.0).unwrap();
        assert_eq!((b.low, b.point, b.high), (0.0, 0.0, 1.0));
        // Every page young: capped at the tier.
        let all = [Whole {
            young: 64.0,
            exposure: 1.0,
        }];
        let b = working_set(1.0, &all, &[], 64.0).unwrap();
        assert_eq!((b.low, b.point, b.high), (0.0, 64.0, 64.0));
        // Far beyond every pass.
        let e = working_set(10.0, &r, &[], 4096.0).unwrap_err();
        assert!(e.contains("10s") && e.contains("0.99"), "{e}");
        assert!(working_set(1.0, &[], &[], 1.0).is_err());
        // Only the long pass this interval: the gap bound comes from the
        // recent short passes.
        let b = working_set(1.0, &r[1..], &r[..1], 4096.0).unwrap();
        assert_eq!((b.low, b.high), (490.0, 520.0));
        // A sweep 12 s in, read at 11.1 s (its earlier readings in
        // `recent`): 10 s follows the growth over the gap, from the 10 s
        // reading, not the chord from a short pass or the 0.2 s step.
        let sweep = [Whole {
            young: 2047.0,
            exposure: 11.1,
        }];
        let prev = [
            Whole {
                young: 300.0,
                exposure: 0.1,
            },
            Whole {
                young: 2030.0,
                exposure: 10.0,
            },
            Whole {
                young: 2040.0,
                exposure: 10.9,
            },
        ];
        let b = working_set(10.0, &sweep, &prev, 2048.0).unwrap();
        assert!((b.point - 2030.0).abs() < 1e-6, "{b:?}");
        assert!(b.low <= 2030.0 && b.high >= 2047.0, "{b:?}");
        // Saturated, with a pass that saw nothing (its vCPU starved) the
        // only reading as far back as the gap: the last step says no
        // growth, and the smaller growth wins.
        let nested = [
            Whole {
                young: 202.0,
                exposure: 0.37,
            },
            Whole {
                young: 202.0,
                exposure: 0.38,
            },
        ];
        let starved = [Whole {
            young: 0.0,
            exposure: 0.02,
        }];
        let b = working_set(0.4, &nested, &starved, 4096.0).unwrap();
        assert_eq!(b.point, 202.0, "{b:?}");
        // Stretched down from 2.2 s to 2 s, the reading just below the
        // gap starved (30 pages in 1.9 s): the point keeps what a full
        // second of the same workload saw.
        let long = [Whole {
            young: 152.0,
            exposure: 2.2,
        }];
        let before = [
            Whole {
                young: 152.0,
                exposure: 1.0,
            },
            Whole {
                young: 30.0,
                exposure: 1.9,
            },
        ];
        let b = working_set(2.0, &long, &before, 4096.0).unwrap();
        assert_eq!(b.point, 152.0, "{b:?}");
        assert!(b.low <= 152.0 && b.high >= 152.0, "{b:?}");
    }
}
