//! `Decision` records: why, what moved, the expected effect, and the
//! arithmetic behind it in `detail`.

use std::fmt::Write as _;

use tier_proto::human_bytes as hb;
use tier_proto::v1::{BalloonChange, Decision, DecisionOutcome, DecisionReason};

use super::VmStatus;
use super::classify::Want;
use super::config::{Config, Mode};
use super::hit_interval::{ActOn, Hit};
use super::input::VmObs;
use super::state::{Dir, Move, Why};
use super::work::{Pool, Work, signal_text};
use super::working_set;

/// The ratio as judged: its interval, and what the policy acts on when
/// that is not the interval.
fn hit_text(cfg: &Config, vm: &VmObs, w: &Work) -> String {
    let Some(h) = Hit::of(vm.hit, w.load.ratio()) else {
        return "dram-hit unknown (no accesses)".into();
    };
    let on = match cfg.tuning.act_on {
        ActOn::Interval => "",
        ActOn::Point => " [acting on the point]",
        ActOn::Protective => " [acting on the low end]",
    };
    format!("{}{on}", h.quote())
}

/// A ratio edge in percent.
fn pc(v: f64) -> String {
    format!("{:.1} %", v * 100.0)
}

/// The hold band in percent.
fn band(t: f64, e: f64) -> String {
    format!("{:.1}-{:.1} %", (t - e) * 100.0, (t + e) * 100.0)
}

fn why_text(cfg: &Config, vm: &VmObs, work: &Work, pool: Pool) -> String {
    if let Some(m) = work.resumed {
        return continuing_text(cfg, vm, work, pool, &m);
    }
    let ws_want = match work.want {
        Want::Need { why, .. } | Want::Release { why, .. } => why.is_working_set(),
        Want::Hold => false,
    };
    let mut out = match work.want {
        _ if ws_want => working_set_text(cfg, vm, work, pool),
        Want::Release {
            why: Why::Ceiling,
            raw,
            bytes,
        } => format!(
            "dram given {} above ceiling {}: -{} of {}",
            hb(vm.dram.given()),
            hb(work.hi),
            hb(bytes),
            hb(raw)
        ),
        Want::Need {
            why: Why::Floor,
            raw,
            bytes,
        } => format!(
            "dram given {} below floor {}: +{} of {} (cap {})",
            hb(vm.dram.given()),
            hb(work.lo),
            hb(work.granted),
            hb(raw),
            hb(bytes)
        ),
        Want::Release {
            why: Why::Idle,
            raw,
            bytes,
        } => idle_text(cfg, vm, work, raw, bytes),
        Want::Release { raw, bytes, .. } => cut_text(cfg, vm, work, raw, bytes),
        Want::Need { raw, bytes, .. } => rise_text(cfg, vm, work, pool, raw, bytes),
        Want::Hold => hold_text(cfg, vm, work),
    };
    if work.forced > 0 {
        let _ = write!(
            out,
            "; over budget (committed {} > budget {}): -{} more",
            hb(pool.committed),
            hb(pool.budget),
            hb(work.forced)
        );
    }
    out
}

/// The next step of a move under way, in the words of the rule that
/// planned it.
fn continuing_text(cfg: &Config, vm: &VmObs, work: &Work, pool: Pool, m: &Move) -> String {
    let mut out = String::new();
    if m.why.is_working_set() {
        let (bytes, granted) = match work.want {
            Want::Need { bytes, .. } => (bytes, work.granted),
            Want::Release { bytes, .. } => (bytes, 0),
            Want::Hold => (0, 0),
        };
        out = working_set::continuing_text(work.view_for_want(), m, bytes, granted);
        if let Want::Need { .. } = work.want {
            out.push_str(&pool_text(pool));
        }
    } else {
        continuing(&mut out, cfg, vm, work, pool, m);
    }
    out
}

/// A want of working_set mode's rules (or of ratio mode's hot-set
/// evidence), in its view's words.
fn working_set_text(cfg: &Config, vm: &VmObs, work: &Work, pool: Pool) -> String {
    let Some(v) = work.view_for_want() else {
        return String::new();
    };
    let mut out = working_set::why_text(cfg, vm, v, work.want, work.granted);
    if let Want::Need { .. } = work.want {
        out.push_str(&pool_text(pool));
    }
    out
}

/// An idle reclaim: the measured idle share against the threshold.
fn idle_text(cfg: &Config, vm: &VmObs, work: &Work, raw: u64, bytes: u64) -> String {
    let (held, idle) = (vm.dram.held(), vm.dram.idle_bytes);
    let th = cfg.idle_threshold;
    let quoted = hit_text(cfg, vm, work);
    format!(
        "dram idle (cold beyond the longest horizon, low end) {} of {} held = {:.3} > {th:.3} ({quoted}, not below the band): reclaim ({} - {th:.3} x {}) / (1 - {th:.3}), at most what the dram given holds beyond the hot set: {} -> {}",
        hb(idle),
        hb(held),
        idle as f64 / held.max(1) as f64,
        hb(idle),
        hb(held),
        hb(raw),
        hb(bytes)
    )
}

/// A cut on a ratio above the band (or above the target after a cut the
/// step cut short): what the model says can go.
fn cut_text(cfg: &Config, vm: &VmObs, work: &Work, raw: u64, bytes: u64) -> String {
    let (target, eps) = (work.target, cfg.hold_epsilon());
    let quoted = hit_text(cfg, vm, work);
    let above = Hit::of(vm.hit, work.load.ratio())
        .is_some_and(|h| h.above(target + eps, cfg.tuning.act_on));
    format!(
        "{}: {}; {} can go (idle {} first) -> {}",
        if above {
            format!("{quoted} above the band {}", band(target, eps))
        } else {
            format!(
                "{quoted} above the target {}, the last cut was cut short by the step",
                pc(target)
            )
        },
        work.load.explain(target),
        hb(raw),
        hb(work.load.dram_idle),
        hb(bytes)
    )
}

/// A rise on a ratio below the band (or below the target after a rise
/// the step cut short): what the model says reaches the target, and what
/// the pool gave.
fn rise_text(cfg: &Config, vm: &VmObs, work: &Work, pool: Pool, raw: u64, bytes: u64) -> String {
    let (target, eps) = (work.target, cfg.hold_epsilon());
    let quoted = hit_text(cfg, vm, work);
    let below = Hit::of(vm.hit, work.load.ratio())
        .is_some_and(|h| h.below(target - eps, cfg.tuning.act_on));
    format!(
        "{}: {}; need {} (min step {}) cap {} -> granted {} of pool {} (budget {}, committed {})",
        if below {
            format!("{quoted} below the band {}", band(target, eps))
        } else {
            format!(
                "{quoted} below the target {}, the last rise was cut short by the step",
                pc(target)
            )
        },
        work.load.explain(target),
        hb(raw),
        hb(cfg.min_step()),
        hb(bytes),
        hb(work.granted),
        hb(pool.size),
        hb(pool.budget),
        hb(pool.committed)
    )
}

/// A hold worth a word: an interval that cannot place the ratio outside
/// the band, a slow tier outside its limits.
fn hold_text(cfg: &Config, vm: &VmObs, work: &Work) -> String {
    let mut out = String::new();
    if let Some(dir) = work.unplaced {
        let side = match dir {
            Dir::Up => "below",
            Dir::Down => "above",
        };
        let _ = write!(
            out,
            "{} straddles the band {}: the point alone says {side}, the interval cannot place it {side} the band; held (a PMU count, or act_on protective, would decide)",
            hit_text(cfg, vm, work),
            band(work.target, cfg.hold_epsilon())
        );
    }
    let slow = vm.slow.given();
    if slow < work.slow_lo || slow > work.slow_hi {
        let sep = if out.is_empty() { "" } else { "; " };
        let _ = write!(
            out,
            "{sep}slow given {} outside [{}, {}]",
            hb(slow),
            hb(work.slow_lo),
            hb(work.slow_hi)
        );
    }
    out
}

/// Why a release was kept in part or whole (`Reclaim::OnDemand`).
fn kept_text(asked: Want, w: &Work, all: bool) -> String {
    let (Want::Release { bytes, .. }, Want::Release { bytes: taken, .. }) = (asked, w.want) else {
        return String::new();
    };
    if all {
        format!(
            "; kept: no VM is short of DRAM beyond the free pool (reclaim on_demand: DRAM is \
             taken back only for a VM that needs it; eager would return {} to the pool now)",
            hb(bytes)
        )
    } else {
        format!(
            "; {} of {} taken: what VMs short of DRAM need beyond the free pool, the rest kept \
             (reclaim on_demand)",
            hb(taken),
            hb(bytes)
        )
    }
}

/// The pool a grant came from.
fn pool_text(pool: Pool) -> String {
    format!(
        " of pool {} (budget {}, committed {})",
        hb(pool.size),
        hb(pool.budget),
        hb(pool.committed)
    )
}

/// The next step of a move under way: what was planned, what is left, and
/// why this interval's sample only serves to stop it.
fn continuing(s: &mut String, cfg: &Config, vm: &VmObs, w: &Work, pool: Pool, m: &Move) {
    let q = hit_text(cfg, vm, w);
    let what = match (m.dir, m.why) {
        (_, Why::Idle) => "idle reclaim",
        (Dir::Up, _) => "rise",
        (Dir::Down, _) => "cut",
    };
    let _ = write!(
        s,
        "continuing the {what} planned in round {}: {} in all, {} left to take unassessed ({} kept for the next assessment), expected {:.3} after it",
        m.planned,
        hb(m.total),
        hb(m.left),
        hb(m.reserve),
        m.expected
    );
    let _ = match w.want {
        Want::Need { bytes, .. } => write!(
            s,
            "; sampled during the last step, {q} still below {}: step {} -> granted {} of pool {} (budget {}, committed {})",
            pc(w.target),
            hb(bytes),
            hb(w.granted),
            hb(pool.size),
            hb(pool.budget),
            hb(pool.committed)
        ),
        Want::Release {
            why: Why::Idle,
            bytes,
            ..
        } => write!(
            s,
            "; {} idle now, {q} -> {}",
            hb(vm.dram.idle_bytes),
            hb(bytes)
        ),
        Want::Release { bytes, .. } => write!(
            s,
            "; sampled during the last step, {q} still above {}: step {}",
            pc(w.target),
            hb(bytes)
        ),
        Want::Hold => Ok(()),
    };
}

fn reason(w: &Work) -> DecisionReason {
    if w.forced > 0 {
        return DecisionReason::Budget;
    }
    match w.want {
        Want::Release { why: Why::Idle, .. } => DecisionReason::IdleReclaim,
        Want::Release {
            why: Why::Cold | Why::Warm,
            ..
        } => DecisionReason::ColdReclaim,
        Want::Need {
            why: Why::HotSet,
            bytes,
            ..
        } if w.granted >= bytes => DecisionReason::HotSetDeficit,
        Want::Need {
            why: Why::Promotion,
            bytes,
            ..
        } if w.granted >= bytes => DecisionReason::PromotionPressure,
        Want::Release {
            why: Why::Above, ..
        } => DecisionReason::AboveTarget,
        Want::Need {
            why: Why::Below,
            bytes,
            ..
        } if w.granted >= bytes => DecisionReason::BelowTarget,
        // Limits and a short pool: a configured bound shaped the move.
        _ => DecisionReason::Budget,
    }
}

fn guest_note(vm: &VmObs, r: Option<f64>) -> String {
    match (vm.guest_ratio(), r) {
        (Some(g), Some(r)) if (g - r).abs() > 0.1 => {
            format!("; guest claims {g:.3}, host sees {r:.3}: host used")
        }
        (Some(g), _) => format!("; guest claims {g:.3}"),
        _ => String::new(),
    }
}

/// The decision's last words: the signal it rests on and the mode that
/// chose it.
fn signal_note(w: &Work) -> String {
    let mode = match w.mode {
        Mode::Auto => "auto: ratio on a PMU count, else working_set",
        m => m.name(),
    };
    format!("; signal: {} (mode {mode})", signal_text(w.signal))
}

/// The record for one VM, if the round is worth one.
pub(super) fn record(
    cfg: &Config,
    vm: &VmObs,
    w: &Work,
    pool: Pool,
    dram: u64,
    slow: u64,
) -> Option<Decision> {
    let observed = w.load.ratio();
    let mut d = Decision {
        vm_id: vm.id.clone(),
        observed_ratio: observed.unwrap_or(0.0),
        target_ratio: w.target,
        expected_ratio: observed.unwrap_or(0.0),
        ..Default::default()
    };
    if w.newly_uncooperative {
        d.reason = DecisionReason::Uncooperative as i32;
        d.outcome = DecisionOutcome::Skipped as i32;
        d.detail = if vm.balloon_ok {
            format!(
                "balloon targets dram {} slow {}, actual dram {} slow {}: off by more than {} for {} intervals without progress; no further pushes",
                hb(vm.dram.balloon_target),
                hb(vm.slow.balloon_target),
                hb(vm.dram.balloon_actual),
                hb(vm.slow.balloon_actual),
                hb(cfg.tuning.balloon_tolerance),
                cfg.tuning.grace_intervals
            )
        } else {
            "actuation reports the balloon cannot follow; no further pushes".into()
        };
        d.detail.push_str(&signal_note(w));
        d.signal = w.signal as i32;
        return Some(d);
    }
    if w.status != VmStatus::Managed {
        return None;
    }
    let mut changes = Vec::new();
    for (t, new) in [(&vm.dram, dram), (&vm.slow, slow)] {
        if new != t.balloon_target {
            changes.push(BalloonChange {
                tier: t.name.clone(),
                old_target_bytes: t.balloon_target,
                new_target_bytes: new,
            });
        }
    }
    // A VM left short by an empty pool is reported once per episode.
    let newly_short = matches!(
        w.want,
        Want::Need {
            why: Why::Below | Why::HotSet | Why::Promotion,
            ..
        }
    ) && w.granted == 0
        && !w.was_budget_limited;
    // So is a VM held on an interval the point alone would have moved.
    let newly_unplaced = w.unplaced.filter(|_| !w.was_unplaced);
    // And one held because nothing is measured.
    if let Some(why) = w
        .unmeasured
        .as_ref()
        .filter(|_| !w.was_unmeasured && changes.is_empty())
    {
        d.reason = DecisionReason::NotMeasured as i32;
        d.outcome = DecisionOutcome::Skipped as i32;
        d.detail = format!(
            "working_set mode, not measured: {why}; held (no DRAM given or taken on a ratio \
             accessed bits cannot place); dram given {}{}",
            hb(vm.dram.given()),
            signal_note(w)
        );
        d.signal = w.signal as i32;
        return Some(d);
    }
    // And one keeping DRAM a rule would release (`Reclaim::OnDemand`).
    let newly_kept = w.kept.is_some() && !w.was_kept && changes.is_empty();
    if changes.is_empty() && !newly_short && newly_unplaced.is_none() && !newly_kept {
        return None;
    }
    let kept = w.kept;
    // Fully kept: reported as the release the rule asked for, skipped.
    let shown = match kept {
        Some(k) if changes.is_empty() => Some(Work {
            want: k,
            ..w.clone()
        }),
        _ => None,
    };
    let w = shown.as_ref().unwrap_or(w);
    d.reason = match (changes.is_empty(), newly_unplaced) {
        (true, Some(Dir::Up)) => DecisionReason::BelowTarget,
        (true, Some(Dir::Down)) => DecisionReason::AboveTarget,
        _ => reason(w),
    } as i32;
    d.outcome = if changes.is_empty() {
        DecisionOutcome::Skipped
    } else if cfg.dry_run {
        DecisionOutcome::DryRun
    } else {
        DecisionOutcome::Applied
    } as i32;
    // A continuing step's sample mixes before and after: the expectation is
    // the one of the assessment that planned the move.
    d.expected_ratio = match w.resumed {
        Some(m) => m.expected,
        None => w.load.expected_ratio(w.delta).unwrap_or(d.observed_ratio),
    };
    let mut detail = String::new();
    if let Some(f) = &w.fallback {
        let _ = write!(detail, "working_set mode, decided in ratio mode: {f}; ");
    }
    detail.push_str(&why_text(cfg, vm, w, pool));
    if let Some(k) = kept {
        detail.push_str(&kept_text(k, w, changes.is_empty()));
    }
    // Limits and the slow tier's bounds read neither the ratio nor the
    // working set: quoted all the same, so every decision says what the
    // VM's state was.
    let read_ws = w.resumed.is_some()
        || matches!(
            w.want,
            Want::Release { why, .. } | Want::Need { why, .. } if why.is_working_set()
        );
    if let Some(v) = w.ws.as_ref().filter(|_| !read_ws) {
        let _ = write!(detail, "; {}", working_set::quote(v));
    }
    let read_ratio = w.ws.is_some()
        || w.resumed.is_some_and(|m| !m.why.is_working_set())
        || w.unplaced.is_some()
        || matches!(
            w.want,
            Want::Release {
                why: Why::Idle | Why::Above,
                ..
            } | Want::Need {
                why: Why::Below,
                ..
            }
        );
    if !read_ratio {
        let _ = write!(detail, "; {}", hit_text(cfg, vm, w));
    }
    let _ = write!(
        detail,
        "; dram given {} -> {}, slow given {} -> {}; expected {:.3}",
        hb(vm.dram.given()),
        hb(vm.dram.size.saturating_sub(dram)),
        hb(vm.slow.given()),
        hb(vm.slow.size.saturating_sub(slow)),
        d.expected_ratio
    );
    detail.push_str(&guest_note(vm, observed));
    detail.push_str(&signal_note(w));
    d.detail = detail;
    d.signal = w.signal as i32;
    d.changes = changes;
    Some(d)
}
