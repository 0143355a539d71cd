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
/// `population`: pages cold is counted over; None (unknown): no cold.
fn finish(mut a: TierAges, population: Option<f64>) -> TierAges {
    if let Some(w) = a.working_set.last().filter(|w| w.not_measured.is_empty())
        && let Some(population) = population
    {
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
/// pages; takes the promotion counted since the last call. `unseen`: pages
/// that may have been touched with no accessed bit set (translations the
/// TLB kept across an ageing, [`tlb_unseen_pages`]), added to each high end.
pub fn from_recency(rec: &mut Recency, horizons: &[f64], population: f64, unseen: f64) -> TierAges {
    let n = rec.sample_pages();
    if n <= 0.0 || rec.units() == 0 {
        return not_measured(horizons, "no pages sampled");
    }
    let units = rec.units();
    let working_set = horizons
        .iter()
        .zip(rec.counts(horizons))
        .map(|(&h, c)| {
            let b = c.map(|c| scale(c, n, units, population));
            entry(
                h,
                b.map(|b| Bounded {
                    high: (b.high + unseen).min(population.max(b.high)),
                    ..b
                }),
            )
        })
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
    finish(a, Some(population))
}

/// Translations one vCPU's TLBs can hold: the largest second-level data
/// TLB of current x86 server cores (AMD Zen 4: 3072 entries) plus its first
/// level (72). Intel Golden Cove holds 2048 + 96.
pub const TLB_ENTRIES_PER_VCPU: f64 = 3144.0;

/// Pages of a tier touched within a horizon that the accessed bits may
/// not show: KVM clears them without a TLB flush (`kvm_age_gfn` through
/// `kvm_handle_hva_range_no_flush`), and the CPU sets one only on a page
/// walk, so a page touched only through a translation cached since before
/// the horizon began reads idle. At that instant each vCPU cached at most
/// `TLB_ENTRIES_PER_VCPU` translations, each of at most `unit_pages` pages
/// (a huge mapping's folio), and no more than the tier holds.
pub fn tlb_unseen_pages(vcpus: u32, unit_pages: f64, tier_pages: f64) -> f64 {
    (f64::from(vcpus.max(1)) * TLB_ENTRIES_PER_VCPU * unit_pages.max(1.0)).min(tier_pages)
}

/// Ages of a tier read whole (every page, no identity): `current` are this
/// interval's readings, `recent` those the edges may be bounded by;
/// `missing` says why a horizon no reading reaches is not measured. Cold
/// is counted over the `resident` pages the readings could see, of the
/// tier's `pages` (None: unknown, and so is cold).
pub fn from_whole(
    horizons: &[f64],
    current: &[Whole],
    recent: &[Whole],
    pages: f64,
    resident: Option<f64>,
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
        let a = from_whole(&[1.0], &r, &[], 1000.0, Some(300.0), 5.0, |_| None);
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
        // Resident unknown: the working set stands, cold is unknown, not 0.
        let a = from_whole(&[1.0], &r, &[], 1000.0, None, 5.0, |_| None);
        assert_eq!(a.working_set[0].bytes, 100.0 * PAGE);
        assert_eq!((a.cold_bytes, a.cold_bytes_high), (None, None));
    }

    /// Every page read, every horizon on pass edges: the sample is exact,
    /// but the TLB may hide touches, so the high end is never the point.
    #[test]
    fn an_exact_sample_still_leaves_room_for_tlb_hidden_touches() {
        let epoch = std::time::Instant::now();
        let at = |s: f64| epoch + std::time::Duration::from_secs_f64(s);
        let mut rec = Recency::new(epoch, 1.0);
        let keys: Vec<u64> = (0..100).collect();
        rec.set_units(&keys, &vec![1; 100]);
        rec.observe(at(0.0), at(0.5), &[false; 100]);
        let young: Vec<bool> = (0..100).map(|k| k < 30).collect();
        rec.observe(at(0.5), at(1.5), &young);
        let unseen = tlb_unseen_pages(2, 1.0, 100.0);
        assert_eq!(unseen, 100.0, "capped at the tier");
        assert_eq!(
            tlb_unseen_pages(2, 512.0, 1e9),
            2.0 * TLB_ENTRIES_PER_VCPU * 512.0
        );
        let a = from_recency(&mut rec, &[1.0], 100.0, 5.0);
        let w = &a.working_set[0];
        assert!(w.not_measured.is_empty(), "{w:?}");
        assert_eq!((w.bytes, w.bytes_low), (30.0 * PAGE, 30.0 * PAGE));
        assert_eq!(w.bytes_high, 35.0 * PAGE);
        assert_eq!(a.cold_bytes_low, Some(65.0 * PAGE));
    }
}
