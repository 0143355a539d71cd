//! Short text forms of numbers for the `top` screen: percentages, deltas
//! (and their colour), text sparklines (so a table cell can hold one), ages,
//! decisions. Shared by the table and the detail pane.

use ratatui::style::{Color, Modifier, Style};
use tier_proto::human_bytes;
use tier_proto::v1::{Decision, DecisionOutcome, DecisionReason};

const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// A sparkline `width` characters wide over the window ending at `end_ns`:
/// each character is the mean of the points in its slice of time, scaled
/// to `[0, max]`. A slice between two points that holds none repeats the
/// one before (sample and hold); a slice of only `None`s (nothing
/// measured) and the time before the first point stay blank.
pub fn spark(
    points: impl Iterator<Item = (u64, Option<f64>)>,
    end_ns: u64,
    window_ns: u64,
    width: usize,
    max: f64,
) -> String {
    if width == 0 || window_ns == 0 {
        return String::new();
    }
    let start = end_ns.saturating_sub(window_ns);
    // (sum, values, points) per slice.
    let mut slots = vec![(0.0f64, 0u32, 0u32); width];
    for (t, v) in points {
        if t <= start || t > end_ns {
            continue;
        }
        // Slice of (start, end]: the newest point lands in the last one.
        let k = (((t - start - 1) as u128 * width as u128) / window_ns as u128) as usize;
        let slot = &mut slots[k.min(width - 1)];
        slot.2 += 1;
        if let Some(v) = v {
            slot.0 += v;
            slot.1 += 1;
        }
    }
    let last = slots.iter().rposition(|s| s.2 > 0);
    let mut held = ' ';
    let mut out = String::with_capacity(width * 3);
    for (k, &(sum, n, pts)) in slots.iter().enumerate() {
        let c = if n > 0 {
            let frac = if max > 0.0 {
                (sum / n as f64 / max).clamp(0.0, 1.0)
            } else {
                0.0
            };
            BARS[((frac * (BARS.len() - 1) as f64).round() as usize).min(BARS.len() - 1)]
        } else if pts == 0 && last.is_some_and(|l| k < l) {
            held
        } else {
            ' '
        };
        held = c;
        out.push(c);
    }
    out
}

/// A ratio as a percentage, "-" when absent.
pub fn pct(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{:.1}%", r * 100.0))
}

/// A ratio difference in percentage points, signed: "+3.2", "-55.8".
pub fn delta(d: Option<f64>) -> String {
    d.map_or("-".into(), |d| format!("{:+.1}", d * 100.0))
}

/// Red: below target by more than epsilon (starved); green: within
/// epsilon; blue: above by more than epsilon (DRAM to spare).
pub fn delta_style(d: Option<f64>, epsilon: f64) -> Style {
    match d {
        Some(d) if d < -epsilon => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        Some(d) if d > epsilon => Style::new().fg(Color::Blue),
        Some(_) => Style::new().fg(Color::Green),
        None => Style::new(),
    }
}

/// A duration as its largest unit: "12s", "3m", "5h", "2d".
pub fn ago(ns: u64) -> String {
    let s = ns / 1_000_000_000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

pub fn reason(r: DecisionReason) -> &'static str {
    match r {
        DecisionReason::Unspecified => "?",
        DecisionReason::BelowTarget => "below",
        DecisionReason::AboveTarget => "above",
        DecisionReason::IdleReclaim => "idle",
        DecisionReason::Budget => "budget",
        DecisionReason::Uncooperative => "uncoop",
        DecisionReason::HotSetDeficit => "hotdef",
        DecisionReason::PromotionPressure => "promo",
        DecisionReason::ColdReclaim => "cold",
        DecisionReason::NotMeasured => "n/m",
    }
}

pub fn outcome(o: DecisionOutcome) -> &'static str {
    match o {
        DecisionOutcome::Unspecified => "?",
        DecisionOutcome::Applied => "applied",
        DecisionOutcome::DryRun => "dry-run",
        DecisionOutcome::Failed => "FAILED",
        DecisionOutcome::Skipped => "skipped",
    }
}

/// A decision in a few words: age, why, what the guest gained or lost per
/// tier (the opposite of the balloon change), outcome.
pub fn action(d: &Decision, now_ns: u64) -> String {
    let mut s = String::new();
    if now_ns >= d.timestamp_unix_ns && d.timestamp_unix_ns > 0 {
        s.push_str(&ago(now_ns - d.timestamp_unix_ns));
        s.push(' ');
    }
    s.push_str(reason(d.reason()));
    for c in &d.changes {
        let (sign, n) = if c.new_target_bytes <= c.old_target_bytes {
            ('+', c.old_target_bytes - c.new_target_bytes)
        } else {
            ('-', c.new_target_bytes - c.old_target_bytes)
        };
        s.push_str(&format!(" {}{sign}{}", c.tier, human_bytes(n)));
    }
    s.push(' ');
    s.push_str(outcome(d.outcome()));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use tier_proto::v1::BalloonChange;

    const S: u64 = 1_000_000_000;

    #[test]
    fn sparkline_buckets_the_window() {
        let pts = [(S, Some(0.0)), (2 * S, Some(1.0)), (4 * S, Some(0.5))];
        // Window (0, 4 s], 4 slices of 1 s.
        assert_eq!(spark(pts.into_iter(), 4 * S, 4 * S, 4, 1.0), "▁██▅", "held");
        let gap = [(S, Some(1.0)), (2 * S, None), (4 * S, Some(0.5))];
        assert_eq!(
            spark(gap.into_iter(), 4 * S, 4 * S, 4, 1.0),
            "█  ▅",
            "None: no hold"
        );
        // Nothing is held past the newest point.
        assert_eq!(spark(pts.into_iter(), 8 * S, 8 * S, 8, 1.0), "▁██▅    ");
        assert_eq!(spark(pts.into_iter(), 4 * S, 4 * S, 2, 1.0), "▅▅");
        assert_eq!(spark([(S, None)].into_iter(), S, S, 3, 1.0), "   ");
        assert_eq!(spark(pts.into_iter(), 4 * S, 4 * S, 0, 1.0), "");
    }

    #[test]
    fn numbers() {
        assert_eq!(pct(Some(0.342)), "34.2%");
        assert_eq!(pct(None), "-");
        assert_eq!(delta(Some(-0.558)), "-55.8");
        assert_eq!(delta(Some(0.03)), "+3.0");
        assert_eq!(ago(75 * S), "1m");
    }

    #[test]
    fn action_says_what_the_guest_got() {
        let d = Decision {
            timestamp_unix_ns: 10 * S,
            reason: DecisionReason::BelowTarget as i32,
            outcome: DecisionOutcome::Applied as i32,
            changes: vec![BalloonChange {
                tier: "dram".into(),
                old_target_bytes: 64 << 20,
                new_target_bytes: 0,
            }],
            ..Default::default()
        };
        assert_eq!(action(&d, 22 * S), "12s below dram+64.0M applied");
    }
}
