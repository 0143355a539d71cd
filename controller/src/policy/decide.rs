//! One round of the decision function: look at every VM, let each managed
//! one state its want, enforce the budget, split the pool, mirror DRAM
//! changes on the slow tier, and write decisions.

use tier_proto::v1::SteeringSignal;

use super::budget;
use super::classify::{Ctx, Want, classify, limit_want, resume, unplaced};
use super::config::{Config, Limits, Mode, PAGE};
use super::decision;
use super::input::{TierObs, VmObs};
use super::model::Load;
use super::state::{Balloons, Dir, Fill, Move, VmState, Why};
use super::work::Work;
use super::working_set;
use super::{Controller, Plan, Targets, VmStatus};

/// The tier's (floor, ceiling) of DRAM given: the policy's limits, both
/// raised to what the actuator can never take (`TierObs::reach`).
fn limits(cfg: &Config, vm: &VmObs, tier: &TierObs) -> (u64, u64) {
    let (lo, hi) = cfg
        .vm(&vm.id, &vm.name)
        .and_then(|o| o.limits.get(&tier.name))
        .copied()
        .unwrap_or(Limits {
            floor: 0,
            ceiling: None,
        })
        .resolve(tier.size);
    let fixed = tier.unreachable();
    (lo.max(fixed), hi.max(fixed))
}

fn status(cfg: &Config, vm: &VmObs, st: &mut VmState, round: u64) -> (VmStatus, bool) {
    if !cfg.enabled {
        return (VmStatus::Disabled, false);
    }
    if cfg.vm(&vm.id, &vm.name).is_some_and(|o| o.excluded) {
        return (VmStatus::Excluded, false);
    }
    // A balloon that stopped following may catch up (a guest that was busy
    // or paused): once it has reached its target it is managed again. A VM
    // whose balloon is not drivable waits for that, untracked.
    if st.uncooperative && !(st.stuck && vm.balloon_ok) {
        return (VmStatus::Uncooperative, false);
    }
    let balloons = st.track(vm, round, &cfg.tuning);
    if st.uncooperative {
        if balloons != Balloons::Arrived {
            return (VmStatus::Uncooperative, false);
        }
        st.uncooperative = false;
        st.stuck = false;
    }
    if !vm.balloon_ok || balloons == Balloons::Stuck {
        st.uncooperative = true;
        st.stuck = vm.balloon_ok;
        return (VmStatus::Uncooperative, true);
    }
    if balloons == Balloons::Moving {
        // This interval's sample mixes before and after: the cooldown
        // counts from the arrival, not from the change.
        st.cooldown_until = st
            .cooldown_until
            .max(round + u64::from(cfg.cooldown_intervals));
        st.mixed_until = round + 1;
        return (VmStatus::Settling, false);
    }
    // A sample taken while a balloon moved is never assessed, whatever the
    // cooldown; a move under way takes its next step as soon as the
    // balloons arrived.
    if (round <= st.cooldown_until || round <= st.mixed_until) && st.moving.is_none() {
        return (VmStatus::Cooldown, false);
    }
    (VmStatus::Managed, false)
}

/// Whether the guest is still moving into DRAM given by the last grow
/// (`state::Fill`); the sample in which that stops still mixes before and
/// after, so it is not assessed.
fn fill(cfg: &Config, vm: &VmObs, st: &mut VmState, round: u64) -> bool {
    let Some(f) = st.fill.as_mut() else {
        return false;
    };
    // Unknown residency proves nothing either way: held as still filling.
    let filling = match vm.dram.resident {
        Some(r) => f.filling(round, r, cfg.tuning.fill_max_intervals),
        None => f.within(round, cfg.tuning.fill_max_intervals),
    };
    if filling {
        f.held = true;
        return true;
    }
    if f.held {
        st.mixed_until = st.mixed_until.max(round);
    }
    st.fill = None;
    false
}

/// Whether this sample's hot set differs by more than `Tuning::new_load`
/// from `before`. Only settled samples count: one taken while a balloon
/// moved counts pages touched on both sides of the move.
fn new_load(cfg: &Config, before: Option<u64>, settled: bool, load: &Load) -> bool {
    let Some(before) = before.filter(|_| settled) else {
        return false;
    };
    let now = load.hot_set();
    now.abs_diff(before) as f64 > cfg.tuning.new_load.max(0.0) * before as f64
}

/// The VM's working-set view: this interval's, or, where this interval
/// does not measure the hot horizon (hostpte measures short horizons only
/// in its long pass, one interval in a few), the last one within the
/// hysteresis window, marked stale, rather than flapping between modes.
/// `Err`: why the VM is decided in ratio mode.
fn ws_view(
    cfg: &Config,
    vm: &VmObs,
    last: &mut Option<(u64, working_set::View)>,
    round: u64,
) -> Result<working_set::View, String> {
    match working_set::view(vm, cfg) {
        Ok(v) => {
            *last = Some((round, v.clone()));
            Ok(v)
        }
        Err(e) => {
            let window = u64::from(cfg.tuning.hysteresis_window);
            let counted = matches!(vm.hit, super::hit_interval::HitEvidence::Counted(_));
            match last.as_ref() {
                Some((r, v)) if !counted && round - r <= window => Ok(working_set::View {
                    stale: Some(*r),
                    ..v.clone()
                }),
                _ => Err(e),
            }
        }
    }
}

fn look(
    cfg: &Config,
    vm: &VmObs,
    st: &mut VmState,
    last_view: &mut Option<(u64, working_set::View)>,
    round: u64,
) -> Work {
    let target = cfg
        .vm(&vm.id, &vm.name)
        .and_then(|o| o.target)
        .unwrap_or(cfg.default_target);
    // working_set mode where the VM's ages allow it; ratio mode on an exact
    // PMU count (the decision says why); with neither, nothing is measured
    // and the VM is held (`unmeasured`), never decided on a vacuous ratio.
    // In ratio mode the view is evidence for what the ratio cannot place.
    let counted = matches!(vm.hit, super::hit_interval::HitEvidence::Counted(_));
    let mode = cfg.mode_of(&vm.id, &vm.name);
    let (ws, fallback, unmeasured, evidence) =
        match (mode.resolve(counted), ws_view(cfg, vm, last_view, round)) {
            (Mode::WorkingSet, Ok(v)) => (Some(v), None, None, None),
            (Mode::WorkingSet, Err(e)) if counted => (None, Some(e), None, None),
            (Mode::WorkingSet, Err(e)) => (None, None, Some(e), None),
            (_, v) => (None, None, None, v.ok()),
        };
    let signal = match (&ws, &unmeasured) {
        (Some(_), _) => SteeringSignal::HotSet,
        (None, Some(_)) => SteeringSignal::None,
        _ if counted => SteeringSignal::CountedRatio,
        _ => SteeringSignal::AccessedBitRatio,
    };
    let view = ws.as_ref().or(evidence.as_ref());
    // A move planned for another target, or one whose evidence is gone
    // (the policy or the VM's ages changed), is over.
    st.moving = st.moving.filter(|m| {
        m.target == target
            && if m.why.is_working_set() {
                view.is_some()
            } else {
                ws.is_none() && unmeasured.is_none()
            }
    });
    let filling = fill(cfg, vm, st, round);
    let (status, newly_uncooperative) = status(cfg, vm, st, round);
    if matches!(
        status,
        VmStatus::Disabled | VmStatus::Excluded | VmStatus::Uncooperative
    ) {
        st.moving = None;
    }
    let (lo, hi) = limits(cfg, vm, &vm.dram);
    let (slow_lo, slow_hi) = limits(cfg, vm, &vm.slow);
    let load = Load::of(vm);
    if round > st.mixed_until && status != VmStatus::Uncooperative {
        st.settled_hot = Some(load.hot_set());
    }
    let mut status = status;
    let mut resumed = None;
    let mut spare = 0;
    let want = if status == VmStatus::Managed {
        let ctx = Ctx {
            target,
            lo,
            hi,
            last_dir: st.last_dir,
            reversed_lately: st
                .last_reversal
                .is_some_and(|r| round - r < u64::from(cfg.tuning.hysteresis_window))
                && !new_load(cfg, st.hot_at_reversal, round > st.mixed_until, &load),
            short: st.short,
            last_reversed: st.last_reversed,
        };
        let hot = working_set::evidence(vm, evidence.as_ref(), &ctx, cfg);
        let mut assess = || match (&ws, &unmeasured) {
            (Some(v), _) => {
                let (w, s) = working_set::classify(vm, v, &ctx, cfg);
                spare = s;
                w
            }
            (None, Some(_)) => {
                limit_want(vm.dram.given(), &ctx, cfg.max_step).unwrap_or(Want::Hold)
            }
            (None, None) => classify(vm, &load, &ctx, cfg, hot),
        };
        let next = st.moving.map(|m| {
            let w = if m.why.is_working_set() {
                working_set::resume(vm, view, &ctx, cfg, &m)
            } else {
                resume(vm, &load, &ctx, cfg, &m, hot)
            };
            (m, w)
        });
        match next {
            Some((m, Some(w))) => {
                resumed = Some(m);
                w
            }
            Some((_, None)) => {
                st.moving = None;
                let g = vm.dram.given();
                if (round <= st.cooldown_until || round <= st.mixed_until) && lo <= g && g <= hi {
                    // The move is over; this sample still mixes before and
                    // after its last step: no assessment.
                    status = VmStatus::Cooldown;
                    Want::Hold
                } else {
                    assess()
                }
            }
            None => assess(),
        }
    } else {
        Want::Hold
    };
    // DRAM just given is not taken back while the guest still moves into
    // it: until then it reads as idle and the ratio as before.
    let want = match want {
        Want::Release {
            why: Why::Idle | Why::Above | Why::Cold | Why::Warm,
            ..
        } if filling => Want::Hold,
        w => w,
    };
    let held = status == VmStatus::Managed && want == Want::Hold && resumed.is_none();
    let unmeasured = unmeasured.filter(|_| held);
    let unplaced = if held && ws.is_none() && unmeasured.is_none() {
        unplaced(vm, &load, target, cfg)
    } else {
        None
    };
    Work {
        status,
        newly_uncooperative,
        target,
        lo,
        hi,
        slow_lo,
        slow_hi,
        load,
        want,
        forced: 0,
        granted: 0,
        delta: 0,
        slow_delta: 0,
        was_budget_limited: st.budget_limited,
        unplaced,
        was_unplaced: st.unplaced,
        resumed,
        ws,
        evidence,
        fallback,
        unmeasured,
        was_unmeasured: st.unmeasured,
        kept: None,
        was_kept: st.kept,
        spare,
        mode,
        signal,
    }
}

/// What follows a managed VM's round: the rest of a move larger than one
/// step, carried on without a new assessment, or else the direction in
/// which the VM was left short of its target (the next assessment then
/// aims at the target, not the band). Not carried on blindly: the share
/// `move_reserve` of a fitted estimate (the model extrapolates), and all of
/// a growth estimated without a fit (the even-spread fallback overshoots
/// for a guest that keeps its hottest pages in DRAM). A cut estimated
/// without a fit errs low and an idle reclaim is measured: carried on whole.
fn follow_up(cfg: &Config, w: &Work, round: u64) -> (Option<Move>, Option<Dir>) {
    let (dir, why, raw) = match w.want {
        Want::Need {
            why: why @ (Why::Below | Why::HotSet),
            raw,
            ..
        } => (Dir::Up, why, raw),
        Want::Release {
            why: why @ (Why::Above | Why::Idle | Why::Cold),
            raw,
            ..
        } => (Dir::Down, why, raw),
        _ => return (None, None),
    };
    let moved = match dir {
        Dir::Up => w.delta.max(0).unsigned_abs(),
        Dir::Down => w.delta.min(0).unsigned_abs(),
    };
    if moved == 0 || w.forced > 0 {
        return (None, None);
    }
    let fitted = w.load.exponent().is_some();
    let (blind, reserve, planned, total, expected) = match w.resumed {
        Some(m) => (m.left, m.reserve, m.planned, m.total, m.expected),
        None if dir == Dir::Up && !fitted && !why.measured() => (0, raw, round, raw, w.target),
        None => {
            let share = if why.measured() || !fitted {
                0.0
            } else {
                cfg.tuning.move_reserve.clamp(0.0, 1.0)
            };
            let reserve = ((raw as f64 * share / PAGE as f64).ceil() as u64 * PAGE).min(raw);
            let blind = raw - reserve;
            let signed = i64::try_from(blind).unwrap_or(i64::MAX);
            let signed = if dir == Dir::Up { signed } else { -signed };
            let expected = w.load.expected_ratio(signed).unwrap_or(w.target);
            (blind, reserve, round, raw, expected)
        }
    };
    let left = blind.saturating_sub(moved);
    // A last blind step shorter than the step is not worth its interval
    // when the assessment that follows can take it along with the reserve.
    let worth = reserve == 0 || left >= cfg.max_step || left + reserve > cfg.max_step;
    if left >= cfg.min_step() && worth {
        let mv = Move {
            dir,
            left,
            reserve,
            why,
            planned,
            total,
            target: w.target,
            expected,
        };
        return (Some(mv), None);
    }
    let short = (blind + reserve).saturating_sub(moved) >= cfg.min_step();
    (None, short.then_some(dir))
}

pub(super) fn run(c: &mut Controller, vms: &[VmObs], now_unix_ns: u64) -> Plan {
    c.round += 1;
    let round = c.round;
    let mut works = assess(c, vms, round);
    let (summary, pool) = budget::split(&c.config, &c.state, vms, &mut works, round);
    let cfg = &c.config;
    let mut targets = Vec::with_capacity(vms.len());
    let mut decisions = Vec::new();
    for (vm, w) in vms.iter().zip(&works) {
        let planned = |t: &super::TierObs, d: i64| {
            if d == 0 {
                t.balloon_target
            } else {
                t.size.saturating_sub(t.given().saturating_add_signed(d))
            }
        };
        let (dram, slow) = (planned(&vm.dram, w.delta), planned(&vm.slow, w.slow_delta));
        let changed = dram != vm.dram.balloon_target || slow != vm.slow.balloon_target;
        if let Some(mut d) = decision::record(cfg, vm, w, pool, dram, slow) {
            c.sequence += 1;
            d.sequence = c.sequence;
            d.timestamp_unix_ns = now_unix_ns;
            decisions.push(d);
        }
        if let Some(st) = c.state.get_mut(&vm.id) {
            remember(cfg, st, vm, w, changed, round);
        }
        targets.push(if cfg.dry_run {
            Targets {
                dram: vm.dram.balloon_target,
                slow: vm.slow.balloon_target,
                status: w.status,
            }
        } else {
            Targets {
                dram,
                slow,
                status: w.status,
            }
        });
    }
    Plan {
        round,
        targets,
        decisions,
        budget: summary,
    }
}

/// Every VM's look at this round, in input order; VMs not seen are
/// forgotten.
fn assess(c: &mut Controller, vms: &[VmObs], round: u64) -> Vec<Work> {
    let cfg = &c.config;
    let mut works: Vec<Work> = Vec::with_capacity(vms.len());
    for vm in vms {
        if !c.state.contains_key(vm.id.as_str()) {
            c.state.insert(vm.id.clone(), VmState::default());
        }
        let mut scratch = VmState::default();
        let st = c.state.get_mut(vm.id.as_str()).unwrap_or(&mut scratch);
        st.seen = round;
        // Looked up before inserting: no key copied per VM and round.
        if !c.views.contains_key(vm.id.as_str()) {
            c.views.insert(vm.id.clone(), None);
        }
        let mut no_view = None;
        let last_view = c.views.get_mut(vm.id.as_str()).unwrap_or(&mut no_view);
        works.push(look(cfg, vm, st, last_view, round));
    }
    c.state.retain(|_, s| s.seen == round);
    let state = &c.state;
    c.views.retain(|id, _| state.contains_key(id));
    works
}

/// What the VM's state keeps of this round: a move to carry on, the
/// episodes reported once, an unmet need, and after a change its
/// cooldown, fill and direction (hysteresis).
fn remember(cfg: &Config, st: &mut VmState, vm: &VmObs, w: &Work, changed: bool, round: u64) {
    if w.status == VmStatus::Managed && !cfg.dry_run {
        (st.moving, st.short) = follow_up(cfg, w, round);
    }
    if w.status == VmStatus::Managed {
        st.unplaced = w.unplaced.is_some();
        st.unmeasured = w.unmeasured.is_some();
        st.kept = w.kept.is_some();
        st.unmet = match w.want {
            Want::Need { bytes, .. } if w.granted < bytes => Some((bytes - w.granted, round)),
            Want::Hold => st.unmet,
            _ => None,
        };
        st.budget_limited = matches!(
            w.want,
            Want::Need {
                why: Why::Below | Why::HotSet | Why::Promotion,
                ..
            }
        ) && w.granted == 0;
    }
    if changed && !cfg.dry_run {
        st.cooldown_until = round + u64::from(cfg.cooldown_intervals);
        st.mixed_until = round + 1;
        // A DRAM cut ends a fill, a grow starts one or adds to it; a
        // slow-tier change alone leaves it.
        st.fill = match (w.delta.signum(), st.fill) {
            (-1, _) => None,
            (1, Some(f)) => Some(f.more(w.delta.unsigned_abs())),
            (1, None) => Some(Fill::new(round, vm.dram.resident, w.delta.unsigned_abs())),
            (_, f) => f,
        };
        if w.delta != 0 {
            let dir = if w.delta > 0 { Dir::Up } else { Dir::Down };
            st.last_reversed = st.last_dir.is_some_and(|d| d != dir);
            if st.last_reversed {
                st.last_reversal = Some(round);
                st.hot_at_reversal = st.settled_hot;
            }
            st.last_dir = Some(dir);
        }
    }
}
