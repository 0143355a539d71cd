//! What one managed VM wants this interval, before the host-level allocator
//! and the budget have their say. Checks in order: tier limits, above
//! target, idle memory, below target. A move under way (`state::Move`)
//! takes its next step instead (`resume`). The ratio is judged by its
//! interval (`hit_interval::Hit`, `Tuning::act_on`): while the interval
//! straddles the band no ratio-driven move starts or continues.

use super::config::{Config, PAGE};
use super::hit_interval::{ActOn, Hit};
use super::input::VmObs;
use super::model::Load;
use super::state::{Dir, Move, Why};

/// A VM's wish for its DRAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    Hold,
    /// Give back `bytes` (after step and limits); `raw` is what the rule said.
    Release {
        why: Why,
        raw: u64,
        bytes: u64,
    },
    /// Receive up to `bytes` (after step and limits) from the pool.
    Need {
        why: Why,
        raw: u64,
        bytes: u64,
    },
}

/// What classify needs besides the observation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ctx {
    pub target: f64,
    /// DRAM floor and ceiling, bytes given.
    pub lo: u64,
    pub hi: u64,
    pub last_dir: Option<Dir>,
    /// The VM reversed direction within the hysteresis window.
    pub reversed_lately: bool,
    /// The last assessment's move in this direction was cut short by the
    /// step: aim at the target, not only at the band (`VmState::short`).
    pub short: Option<Dir>,
    /// The last change reversed the one before it.
    pub last_reversed: bool,
}

/// Idle bytes to reclaim so that at most `threshold` of what the guest
/// holds stays idle: (idle - threshold x held) / (1 - threshold), in pages.
pub fn idle_reclaim(held: u64, idle: u64, threshold: f64) -> u64 {
    let idle = idle.min(held);
    if held == 0 || threshold >= 1.0 || (idle as f64) <= threshold * held as f64 {
        return 0;
    }
    let x = (idle as f64 - threshold * held as f64) / (1.0 - threshold);
    let pages = (x / PAGE as f64).ceil() as u64 * PAGE;
    pages.min(idle / PAGE * PAGE)
}

/// What ratio mode reads of the VM's measured hot set
/// (`working_set::evidence`); the default: none measured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HotSet {
    /// DRAM given beyond the hot set's high end: what an idle reclaim may
    /// take. DRAM cold by age can still be needed: a guest that has not yet
    /// moved its hot pages into DRAM just given (they are touched in the
    /// slow tier) holds cold DRAM and a hot set larger than it.
    pub beyond: u64,
    /// The grow a hot set whose low end exceeds the DRAM given asks for
    /// (`working_set::deficit`).
    pub deficit: Option<Want>,
}

/// Whether a move in `dir` would undo a recent reversal (hysteresis).
pub(super) fn flips_back(ctx: &Ctx, dir: Dir) -> bool {
    ctx.reversed_lately && ctx.last_dir.is_some_and(|d| d != dir)
}

/// DRAM given outside the tier limits: back toward them, whatever the ratio.
pub(super) fn limit_want(g: u64, ctx: &Ctx, step: u64) -> Option<Want> {
    if g > ctx.hi {
        let raw = g - ctx.hi;
        return Some(Want::Release {
            why: Why::Ceiling,
            raw,
            bytes: raw.min(step),
        });
    }
    if g < ctx.lo {
        let raw = ctx.lo - g;
        return Some(Want::Need {
            why: Why::Floor,
            raw,
            bytes: raw.min(step),
        });
    }
    None
}

/// The next step of a move under way, or `None` when it is over: the limits
/// call for something else (`classify` handles them), the sample shows the
/// ratio at or past the target (a sample taken while the balloon moved lies
/// between before and after, so past there is past now), the VM has no
/// accesses, or what is left is below the minimum step. An idle reclaim
/// never takes more than the bytes found idle.
pub fn resume(
    vm: &VmObs,
    load: &Load,
    ctx: &Ctx,
    cfg: &Config,
    mv: &Move,
    hot: HotSet,
) -> Option<Want> {
    let g = vm.dram.given();
    if g > ctx.hi || g < ctx.lo {
        return None;
    }
    let h = Hit::of(vm.hit, load.ratio())?;
    let on = cfg.tuning.act_on;
    let step = cfg.max_step;
    // A rise goes on while the ratio is known below the target, a cut
    // while it is known above.
    let (done, room) = match mv.dir {
        Dir::Up => (!h.below(ctx.target, on), ctx.hi - g),
        // An idle reclaim stops once the VM falls below its band, as it
        // would not start there (`classify`).
        Dir::Down if mv.why == Why::Idle => (
            h.below(ctx.target - cfg.hold_epsilon(), on),
            (g - ctx.lo).min(vm.dram.idle_bytes).min(hot.beyond),
        ),
        Dir::Down => (!h.above(ctx.target, on), g - ctx.lo),
    };
    let bytes = mv.left.min(step).min(room) / PAGE * PAGE;
    if done || bytes < cfg.min_step() {
        return None;
    }
    let (why, raw) = (mv.why, mv.left);
    Some(match mv.dir {
        Dir::Up => Want::Need { why, raw, bytes },
        Dir::Down => Want::Release { why, raw, bytes },
    })
}

/// The direction the point alone would move a VM whose interval (as
/// `act_on` reads it) cannot be placed outside the band; None when both
/// agree. Such a hold is reported once per episode (`decision`).
pub fn unplaced(vm: &VmObs, load: &Load, target: f64, cfg: &Config) -> Option<Dir> {
    let h = Hit::of(vm.hit, load.ratio())?;
    let (e, on) = (cfg.hold_epsilon(), cfg.tuning.act_on);
    if h.below(target - e, ActOn::Point) && !h.below(target - e, on) {
        return Some(Dir::Up);
    }
    if h.above(target + e, ActOn::Point) && !h.above(target + e, on) {
        return Some(Dir::Down);
    }
    None
}

/// `raw` bytes, at least one actuator granule when any (`TierObs::granule`).
pub(super) fn whole(raw: u64, granule: u64) -> u64 {
    if raw == 0 { 0 } else { raw.max(granule) }
}

/// Ratio mode: `hot` is what the VM's measured hot set says. Releases are
/// only made on what is measured (a ratio known above the band; idle bytes
/// cold beyond the longest horizon, never into the hot set), and so are
/// grows: a ratio known below the band, or, where the ratio is not known
/// to be at least the band's low edge, a hot set whose low end exceeds the
/// DRAM given. Nothing measured: hold.
pub fn classify(vm: &VmObs, load: &Load, ctx: &Ctx, cfg: &Config, hot: HotSet) -> Want {
    let g = vm.dram.given();
    let granule = vm.dram.granule;
    let step = cfg.max_step;
    if let Some(w) = limit_want(g, ctx, step) {
        return w;
    }
    let room_down = if flips_back(ctx, Dir::Down) {
        0
    } else {
        (g - ctx.lo).min(step)
    };
    let hit = Hit::of(vm.hit, load.ratio());
    let on = cfg.tuning.act_on;
    // After a move cut short by the step, the band does not stop the next
    // one in the same direction short of the target: landing just inside
    // the band's edge, sampling noise would otherwise decide.
    // Within the hold band nothing moves; undoing a reversal takes a ratio
    // outside epsilon itself (no flip-back for sampling noise's margin).
    let band = |dir: Dir| {
        if ctx.last_reversed && ctx.last_dir.is_some_and(|d| d != dir) {
            cfg.epsilon
        } else {
            cfg.hold_epsilon()
        }
    };
    let (above, below) = match ctx.short {
        Some(Dir::Down) => (ctx.target, ctx.target - band(Dir::Up)),
        Some(Dir::Up) => (ctx.target + band(Dir::Down), ctx.target),
        None => (ctx.target + band(Dir::Down), ctx.target - band(Dir::Up)),
    };
    if let Some(h) = hit.filter(|h| h.above(above, on)) {
        let raw = load.shrink_for(ctx.target);
        let bytes = whole(raw, granule).min(room_down);
        if bytes >= cfg.min_step() {
            return Want::Release {
                why: Why::Above,
                raw,
                bytes,
            };
        }
        if h.above(ctx.target + band(Dir::Down), on) {
            return Want::Hold;
        }
    }
    // No idle reclaim from a VM below its band: its ratio says the DRAM it
    // holds is not enough, so what looks idle is memory it still touches,
    // only less often than one ageing pass sees (accessed bits cannot tell).
    // An idle reclaim is measured, not a reading of the ratio: it goes on
    // while the interval straddles the band.
    let below_band = hit.is_some_and(|h| h.below(below, on));
    let raw = if below_band {
        0
    } else {
        idle_reclaim(vm.dram.held(), vm.dram.idle_bytes, cfg.idle_threshold).min(hot.beyond)
    };
    let bytes = whole(raw, granule).min(room_down);
    if bytes >= cfg.min_step() {
        return Want::Release {
            why: Why::Idle,
            raw,
            bytes,
        };
    }
    // The ratio cannot say the VM has enough: a hot set measured beyond
    // the DRAM given can.
    let enough = hit.is_some_and(|h| h.low >= below && !h.low_open);
    if let Some(w) = hot
        .deficit
        .filter(|_| !enough && !hit.is_some_and(|h| h.below(below, on)))
    {
        return w;
    }
    match hit {
        Some(h) if h.below(below, on) && !flips_back(ctx, Dir::Up) => {
            let grow = load.grow_for(ctx.target);
            // Inside the band (after a short move) only a worthwhile step.
            if !h.below(ctx.target - band(Dir::Up), on) && grow < cfg.min_step() {
                return Want::Hold;
            }
            let raw = grow.max(cfg.min_step()).max(granule);
            let bytes = raw.min(step).min(ctx.hi - g);
            if bytes == 0 {
                return Want::Hold;
            }
            Want::Need {
                why: Why::Below,
                raw,
                bytes,
            }
        }
        _ => Want::Hold,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::config::Tuning;
    use crate::policy::input::TierObs;
    use std::collections::HashMap;

    const M: u64 = 1 << 20;

    fn cfg() -> Config {
        Config {
            enabled: true,
            dry_run: false,
            default_target: 0.9,
            epsilon: 0.02,
            budget: None,
            max_step: 64 * M,
            cooldown_intervals: 0,
            idle_threshold: 0.5,
            vms: HashMap::new(),
            tuning: Tuning::default(),
            mode: Default::default(),
            working_set: Default::default(),
            reclaim: super::super::config::Reclaim::Eager,
        }
    }

    /// 1G DRAM tier with `given` left to the guest, `hot` of it accessed
    /// `dram_acc` times; slow accessed `slow_acc` times over `slow_hot`.
    fn vm(given: u64, hot: u64, dram_acc: f64, slow_hot: u64, slow_acc: f64) -> VmObs {
        VmObs {
            dram: TierObs {
                size: 1024 * M,
                balloon_target: 1024 * M - given,
                balloon_actual: 1024 * M - given,
                accesses: dram_acc,
                accessed_bytes: hot,
                idle_bytes: given - hot,
                ..Default::default()
            },
            slow: TierObs {
                size: 1024 * M,
                accesses: slow_acc,
                accessed_bytes: slow_hot,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn ctx() -> Ctx {
        Ctx {
            target: 0.9,
            lo: 0,
            hi: 1024 * M,
            last_dir: None,
            reversed_lately: false,
            short: None,
            last_reversed: false,
        }
    }

    fn want(v: &VmObs, c: &Ctx) -> Want {
        classify(v, &Load::of(v), c, &cfg(), HotSet::default())
    }

    /// A measured hot set that leaves `beyond` of the DRAM given beyond it.
    fn seen(beyond: u64) -> HotSet {
        HotSet {
            beyond,
            deficit: None,
        }
    }

    /// A `Need`/`Release` of `why` for about `raw` bytes (within a page:
    /// the model's fit goes through ln and powf), capped at `cap`.
    fn is(w: Want, want_why: Why, want_raw: u64, cap: u64, release: bool) -> bool {
        let (why, raw, bytes, rel) = match w {
            Want::Need { why, raw, bytes } => (why, raw, bytes, false),
            Want::Release { why, raw, bytes } => (why, raw, bytes, true),
            Want::Hold => return false,
        };
        why == want_why && rel == release && raw.abs_diff(want_raw) <= PAGE && bytes == raw.min(cap)
    }

    #[test]
    fn below_target_needs_the_model_amount() {
        // 70M hot in DRAM take 700 of 1000 accesses, 30M in slow 300:
        // x = r = 0.7, uniform; 0.9 needs 90M hot in DRAM, 20M more.
        let v = vm(100 * M, 70 * M, 700.0, 30 * M, 300.0);
        assert!(is(want(&v, &ctx()), Why::Below, 20 * M, 64 * M, false));
        // Up after a cut that itself reversed an earlier rise would flip
        // back: held within the hysteresis window.
        let after_cut = Ctx {
            last_dir: Some(Dir::Down),
            reversed_lately: true,
            ..ctx()
        };
        assert_eq!(want(&v, &after_cut), Want::Hold);
        let cut_long_ago = Ctx {
            reversed_lately: false,
            ..after_cut
        };
        assert!(matches!(want(&v, &cut_long_ago), Want::Need { .. }));
        let rose = Ctx {
            last_dir: Some(Dir::Up),
            ..after_cut
        };
        assert!(matches!(want(&v, &rose), Want::Need { .. }));
    }

    #[test]
    fn above_target_releases_down_to_target_within_step() {
        // 990 of 1000 in DRAM over 99M of 100M hot, 1M idle: 0.9 keeps
        // 90M hot, so 9M hot + 1M idle go.
        let v = vm(100 * M, 99 * M, 990.0, M, 10.0);
        assert!(is(want(&v, &ctx()), Why::Above, 10 * M, 64 * M, true));
        // Within the band: nothing.
        let w = vm(100 * M, 91 * M, 910.0, 9 * M, 90.0);
        assert_eq!(want(&w, &ctx()), Want::Hold);
        // A cut right after reversing to a rise would flip back: held.
        let c = Ctx {
            last_dir: Some(Dir::Up),
            reversed_lately: true,
            ..ctx()
        };
        assert_eq!(want(&v, &c), Want::Hold);
    }

    #[test]
    fn idle_reclaim_leaves_the_threshold_idle() {
        assert_eq!(idle_reclaim(100 * M, 80 * M, 0.5), 60 * M);
        assert_eq!(idle_reclaim(100 * M, 50 * M, 0.5), 0);
        assert_eq!(idle_reclaim(100 * M, 80 * M, 1.0), 0);
        assert_eq!(idle_reclaim(100 * M, 80 * M, 0.0), 80 * M);
        // Within the band, 320M of 400M idle: reclaim (320 - 200) / 0.5 = 240M,
        // capped by the 64M step.
        let v = vm(400 * M, 80 * M, 900.0, 10 * M, 100.0);
        let with = |hot: u64| classify(&v, &Load::of(&v), &ctx(), &cfg(), seen(400 * M - hot));
        assert_eq!(
            with(90 * M),
            Want::Release {
                why: Why::Idle,
                raw: 240 * M,
                bytes: 64 * M
            }
        );
        // Never below the measured hot set's high end (cold DRAM a guest
        // has not moved its hot pages into yet): 350M hot leaves 50M.
        assert_eq!(
            with(350 * M),
            Want::Release {
                why: Why::Idle,
                raw: 50 * M,
                bytes: 50 * M
            }
        );
        // No hot set measured: no idle reclaim.
        assert_eq!(want(&v, &ctx()), Want::Hold);
    }

    #[test]
    fn no_idle_reclaim_below_the_band() {
        // 100M held, 20M seen young in the pass (80M "idle"), yet only 0.5
        // of the accesses hit DRAM: the pages look idle because they are
        // touched less often than one pass, not because they are unused.
        // The VM needs DRAM, it does not give any.
        let v = vm(100 * M, 20 * M, 500.0, 30 * M, 500.0);
        assert!(matches!(
            want(&v, &ctx()),
            Want::Need {
                why: Why::Below,
                ..
            }
        ));
    }

    #[test]
    fn hold_band_and_reversals() {
        // Band 0.75 x 0.02 = 0.015: 0.88 (within epsilon) is already acted
        // on, 2M more reach 0.9 (uniform fit).
        let v = vm(100 * M, 88 * M, 880.0, 12 * M, 120.0);
        assert!(is(want(&v, &ctx()), Why::Below, 2 * M, 64 * M, false));
        // Undoing a reversal takes a ratio outside epsilon itself, however
        // long ago the reversal was.
        let reversed = Ctx {
            last_dir: Some(Dir::Down),
            last_reversed: true,
            ..ctx()
        };
        assert_eq!(want(&v, &reversed), Want::Hold);
        let w = vm(100 * M, 87 * M, 870.0, 13 * M, 130.0);
        assert!(is(want(&w, &reversed), Why::Below, 3 * M, 64 * M, false));
        // The same direction as the reversal is not held.
        let again = Ctx {
            last_dir: Some(Dir::Up),
            ..reversed
        };
        assert!(matches!(want(&v, &again), Want::Need { .. }));
        // Inside the band: nothing.
        let x = vm(100 * M, 89 * M, 890.0, 11 * M, 110.0);
        assert_eq!(want(&x, &ctx()), Want::Hold);
    }

    #[test]
    fn after_a_short_move_the_target_not_the_band() {
        let short = |d| Ctx {
            short: Some(d),
            last_dir: Some(d),
            ..ctx()
        };
        // 0.89 is inside the band; after a rise cut short by the step the
        // next assessment goes on to the target: 1M more.
        let v = vm(100 * M, 89 * M, 890.0, 11 * M, 110.0);
        assert_eq!(want(&v, &ctx()), Want::Hold);
        assert!(is(want(&v, &short(Dir::Up)), Why::Below, M, 64 * M, false));
        // Never the other way round: a short cut does not make it rise.
        assert_eq!(want(&v, &short(Dir::Down)), Want::Hold);
        // 0.91 after a short cut: 9M idle and 1M hot go.
        let w = vm(100 * M, 91 * M, 910.0, 9 * M, 90.0);
        assert_eq!(want(&w, &ctx()), Want::Hold);
        assert!(is(
            want(&w, &short(Dir::Down)),
            Why::Above,
            10 * M,
            64 * M,
            true
        ));
        assert_eq!(want(&w, &short(Dir::Up)), Want::Hold);
    }

    #[test]
    fn resume_takes_the_next_step_until_the_sample_shows_the_target() {
        let c = cfg();
        let up = Move {
            dir: Dir::Up,
            left: 100 * M,
            reserve: 20 * M,
            why: Why::Below,
            planned: 1,
            total: 184 * M,
            target: 0.9,
            expected: 0.85,
        };
        let next =
            |v: &VmObs, cx: &Ctx, m: &Move| resume(v, &Load::of(v), cx, &c, m, HotSet::default());
        let v = vm(100 * M, 70 * M, 700.0, 30 * M, 300.0);
        assert_eq!(
            next(&v, &ctx(), &up),
            Some(Want::Need {
                why: Why::Below,
                raw: 100 * M,
                bytes: 64 * M
            })
        );
        // The sample (taken during the last step) is at the target: over.
        let at = vm(100 * M, 90 * M, 900.0, 10 * M, 100.0);
        assert_eq!(next(&at, &ctx(), &up), None);
        // Less than the minimum step left, no accesses, outside the limits:
        // over.
        let crumbs = Move { left: M / 2, ..up };
        assert_eq!(next(&v, &ctx(), &crumbs), None);
        let quiet = vm(100 * M, 70 * M, 0.0, 30 * M, 0.0);
        assert_eq!(next(&quiet, &ctx(), &up), None);
        let capped = Ctx {
            hi: 50 * M,
            ..ctx()
        };
        assert_eq!(next(&v, &capped, &up), None);
        // Up to the ceiling.
        let near = Ctx {
            hi: 110 * M,
            ..ctx()
        };
        assert_eq!(
            next(&v, &near, &up),
            Some(Want::Need {
                why: Why::Below,
                raw: 100 * M,
                bytes: 10 * M
            })
        );
        // An idle reclaim never takes more than the bytes found idle.
        let idle = Move {
            dir: Dir::Down,
            why: Why::Idle,
            ..up
        };
        let w = vm(90 * M, 80 * M, 900.0, 10 * M, 100.0);
        // 90M given, 80M hot: 10M beyond it.
        let next_seen =
            |v: &VmObs, cx: &Ctx, m: &Move| resume(v, &Load::of(v), cx, &c, m, seen(10 * M));
        // (Nor beyond the measured hot set, nor without one.)
        assert_eq!(next(&w, &ctx(), &idle), None);
        assert_eq!(
            next_seen(&w, &ctx(), &idle),
            Some(Want::Release {
                why: Why::Idle,
                raw: 100 * M,
                bytes: 10 * M
            })
        );
        // ... and stops once the VM has fallen below its band (0.5 here).
        let fallen = vm(90 * M, 80 * M, 500.0, 10 * M, 500.0);
        assert_eq!(next_seen(&fallen, &ctx(), &idle), None);
        // A cut stops once the sample is at or below the target.
        let cut = Move {
            dir: Dir::Down,
            why: Why::Above,
            ..up
        };
        assert_eq!(next(&at, &ctx(), &cut), None);
        let high = vm(100 * M, 99 * M, 990.0, M, 10.0);
        assert!(matches!(
            next(&high, &ctx(), &cut),
            Some(Want::Release {
                why: Why::Above,
                bytes,
                ..
            }) if bytes == 64 * M
        ));
    }

    #[test]
    fn limits_come_first() {
        let v = vm(100 * M, 100 * M, 990.0, M, 10.0);
        let c = Ctx {
            hi: 40 * M,
            ..ctx()
        };
        assert_eq!(
            want(&v, &c),
            Want::Release {
                why: Why::Ceiling,
                raw: 60 * M,
                bytes: 60 * M
            }
        );
        let c = Ctx {
            lo: 200 * M,
            ..ctx()
        };
        assert!(is(want(&v, &c), Why::Floor, 100 * M, 64 * M, false));
        // Above target but already at the floor: nothing can go.
        let c = Ctx {
            lo: 100 * M,
            ..ctx()
        };
        assert_eq!(want(&v, &c), Want::Hold);
    }
}
