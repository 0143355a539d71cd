//! A tier's ages in the protocol's form, from a recency record or from
//! whole-tier readings.

use tier_proto::v1::{TierAges, WorkingSet};

use super::exposure::{Whole, working_set};
use super::recency::{Recency, scale};
use super::{Bounded, not_measured};

const PAGE: f64 = 4096.0;

fn entry(h: f64, r: Result<Bounded, String>) -> WorkingSet {
    match r {
        Ok(b) => WorkingSet {
            horizon_seconds: h,
            bytes: b.point * PAGE,
            bytes_low: b.low * PAGE,
            bytes_high: b.high * PAGE,
            not_measured: String::new(),
        },
        Err(why) => WorkingSet {
            horizon_seconds: h,
            not_measured: why,
            ..Default::default()
        },
    }
}

/// Fills cold bytes from the longest horizon's entry (when measured) and
/// the top-level reason when no horizon is measured.
fn finish(mut a: TierAges, population: f64) -> TierAges {
    if let Some(w) = a.working_set.last().filter(|w| w.not_measured.is_empty()) {
        let total = population * PAGE;
        a.cold_bytes = Some((total - w.bytes).max(0.0));
        a.cold_bytes_low = Some((total - w.bytes_high).max(0.0));
        a.cold_bytes_high = Some((total - w.bytes_low).max(0.0));
    }
    if a.working_set.iter().all(|w| !w.not_measured.is_empty()) {
        a.not_measured = a
            .working_set
            .first()
            .map(|w| w.not_measured.clone())
            .unwrap_or_else(|| "no horizons configured".into());
    }
    a
}

/// Ages of a tier whose sample of `rec`'s units stands for `population`
/// pages; takes the promotion counted since the last call.
pub fn from_recency(rec: &mut Recency, horizons: &[f64], population: f64) -> TierAges {
    let n = rec.sample_pages();
    if n <= 0.0 || rec.units() == 0 {
        return not_measured(horizons, "no pages sampled");
    }
    let units = rec.units();
    let working_set = horizons
        .iter()
        .zip(rec.counts(horizons))
        .map(|(&h, c)| entry(h, c.map(|c| scale(c, n, units, population))))
        .collect();
    let mut a = TierAges {
        working_set,
        history_seconds: rec.history(),
        ..Default::default()
    };
    if let Some((definite, possible, secs)) = rec.take_promoted() {
        let b = scale((definite, definite, possible), n, units, population);
        let k = PAGE / secs;
        a.promoted_bytes_per_s = Some(b.point * k);
        a.promoted_bytes_per_s_low = Some(b.low * k);
        a.promoted_bytes_per_s_high = Some(b.high * k);
    }
    finish(a, population)
}

/// Ages of a tier read whole (every page, no identity): `current` are this
/// interval's readings, `recent` those the edges may be bounded by;
/// `missing` says why a horizon no reading reaches is not measured. Cold
/// is counted over the `resident` pages the readings could see, of the
/// tier's `pages`.
pub fn from_whole(
    horizons: &[f64],
    current: &[Whole],
    recent: &[Whole],
    pages: f64,
    resident: f64,
    history: f64,
    missing: impl Fn(f64) -> Option<String>,
) -> TierAges {
    let working_set = horizons
        .iter()
        .map(|&h| {
            if history + 1e-9 < h {
                return entry(h, Err(format!("watched for {history:.1} s of {h}s")));
            }
            let r = working_set(h, current, recent, pages);
            entry(h, r.map_err(|e| missing(h).unwrap_or(e)))
        })
        .collect();
    let a = TierAges {
        working_set,
        history_seconds: history,
        ..Default::default()
    };
    finish(a, resident)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// hostpte: cold is the resident pages the readings could see minus
    /// the working set, not the tier's whole size (memory never mapped is
    /// no page the sampler watched).
    #[test]
    fn whole_readings_count_cold_over_resident_pages() {
        let r = [
            Whole {
                young: 10.0,
                exposure: 0.025,
            },
            Whole {
                young: 100.0,
                exposure: 1.0,
            },
        ];
        // A tier of 1000 pages, 300 resident; history 5 s.
        let a = from_whole(&[1.0], &r, &[], 1000.0, 300.0, 5.0, |_| None);
        let w = &a.working_set[0];
        assert!(w.not_measured.is_empty(), "{w:?}");
        assert_eq!(w.bytes, 100.0 * PAGE);
        let cold = a.cold_bytes.unwrap();
        assert_eq!(cold, 200.0 * PAGE);
        let (lo, hi) = (a.cold_bytes_low.unwrap(), a.cold_bytes_high.unwrap());
        assert!(lo < cold && cold < hi, "{lo} {cold} {hi}");
        assert!(hi <= 300.0 * PAGE, "{hi}");
        assert_eq!(
            (lo, hi),
            (300.0 * PAGE - w.bytes_high, 300.0 * PAGE - w.bytes_low)
        );
    }
}
