//! A compact age bar per tier for the detail pane (docs/working-set.md):
//! the tier's bytes split by how recently they were touched, shortest
//! horizon first, cold last, then the numbers with their intervals.

use tier_proto::human_bytes;
use tier_proto::v1::TierAges;

/// Fill characters of the nested working sets, shortest horizon first;
/// beyond the longest measured one: `·` (cold or unmeasured).
const FILL: [char; 4] = ['█', '▓', '▒', '░'];
/// Width of the bar in characters.
pub const BAR: usize = 20;

fn bytes(b: f64) -> String {
    human_bytes(b.max(0.0) as u64)
}

/// The bar over `total` bytes: each measured horizon fills up to its
/// working set's share.
pub fn bar(a: &TierAges, total: f64) -> String {
    let mut cells = vec!['·'; BAR];
    if total > 0.0 {
        let mut from = 0;
        for (i, w) in a.working_set.iter().enumerate() {
            if !w.not_measured.is_empty() {
                break;
            }
            let to = ((w.bytes / total) * BAR as f64)
                .round()
                .clamp(0.0, BAR as f64) as usize;
            let c = FILL.get(i).copied().unwrap_or('░');
            for cell in cells.iter_mut().take(to).skip(from) {
                *cell = c;
            }
            from = from.max(to);
        }
    }
    cells.into_iter().collect()
}

/// `dram ages ▕███▓▓······▏ 1s 12.0 MiB (10.0 MiB-14.0 MiB) 10s n/m cold
/// 1.2 GiB promo 3.4 MiB/s`, or why nothing is measured.
pub fn age_line(tier: &str, a: &TierAges, total: f64) -> String {
    if !a.not_measured.is_empty() {
        return format!("{tier} ages: n/m: {}", a.not_measured);
    }
    let mut out = format!("{tier} ages ▕{}▏", bar(a, total));
    for w in &a.working_set {
        if w.not_measured.is_empty() {
            out += &format!(
                " {}s {} ({}-{})",
                w.horizon_seconds,
                bytes(w.bytes),
                bytes(w.bytes_low),
                bytes(w.bytes_high)
            );
        } else {
            out += &format!(" {}s n/m", w.horizon_seconds);
        }
    }
    if let Some(c) = a.cold_bytes {
        out += &format!(" cold {}", bytes(c));
    }
    if let Some(p) = a.promoted_bytes_per_s {
        out += &format!(" promo {}/s", bytes(p));
    }
    out += &format!("  [{:.0} s watched]", a.history_seconds);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tier_proto::v1::WorkingSet;

    fn ws(h: f64, b: f64, why: &str) -> WorkingSet {
        WorkingSet {
            horizon_seconds: h,
            bytes: b,
            bytes_low: b * 0.9,
            bytes_high: b * 1.1,
            not_measured: why.into(),
        }
    }

    #[test]
    fn the_bar_nests_horizons_and_says_what_is_not_measured() {
        let a = TierAges {
            working_set: vec![
                ws(1.0, 10.0 * 1024.0 * 1024.0, ""),
                ws(10.0, 50.0 * 1024.0 * 1024.0, ""),
                ws(60.0, 0.0, "watched for 12 s of 60s"),
            ],
            history_seconds: 12.0,
            ..Default::default()
        };
        let total = 100.0 * 1024.0 * 1024.0;
        assert_eq!(bar(&a, total), "██▓▓▓▓▓▓▓▓··········");
        let l = age_line("dram", &a, total);
        assert!(l.starts_with("dram ages ▕██▓"), "{l}");
        assert!(
            l.contains(" 60s n/m") && l.contains("[12 s watched]"),
            "{l}"
        );
        assert!(!l.contains("cold"), "{l}");
        let none = TierAges {
            not_measured: "hostpte: no pass read this VM yet".into(),
            ..Default::default()
        };
        assert_eq!(
            age_line("slow", &none, total),
            "slow ages: n/m: hostpte: no pass read this VM yet"
        );
    }
}
