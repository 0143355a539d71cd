//! One round of the decision function: look at every VM, let each managed
//! one state its want, enforce the budget, split the pool, mirror DRAM
//! changes on the slow tier, and write decisions.

use tier_proto::v1::SteeringSignal;

use super::allocate::{Claim, water_fill};
use super::classify::{Ctx, Want, classify, limit_want, resume, unplaced};
use super::config::{Config, Limits, Mode, PAGE, Reclaim};
use super::decision;
use super::input::{TierObs, VmObs};
use super::model::Load;
use super::state::{Balloons, Dir, Fill, Move, VmState, Why};
use super::work::{Pool, Work};
use super::working_set;
use super::{BudgetSummary, Controller, Plan, Targets, VmStatus};

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
            let counted = matches!(vm.hit, super::interval::HitEvidence::Counted(_));
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
    let counted = matches!(vm.hit, super::interval::HitEvidence::Counted(_));
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

/// Sum of byte counts; absurd inputs saturate instead of overflowing.
fn sum(it: impl Iterator<Item = u64>) -> u64 {
    it.fold(0, u64::saturating_add)
}

/// DRAM the VM holds against the budget.
fn committed(vm: &VmObs, w: &Work, delta: i64) -> u64 {
    if w.status == VmStatus::Uncooperative {
        let b = vm.dram.balloon_target.min(vm.dram.balloon_actual);
        return vm.dram.size.saturating_sub(b);
    }
    vm.dram.given().saturating_add_signed(delta)
}

/// Takes `excess` more from managed VMs, in proportion to what each can
/// still give this round (step and floor). Their needs go unmet.
fn force_release(vms: &[VmObs], works: &mut [Work], cfg: &Config, excess: u64) {
    let room: Vec<u64> = vms
        .iter()
        .zip(works.iter())
        .map(|(vm, w)| {
            if w.status != VmStatus::Managed {
                return 0;
            }
            let g = vm.dram.given();
            let taken = match w.want {
                Want::Release { bytes, .. } => bytes,
                _ => 0,
            };
            g.saturating_sub(w.lo)
                .min(cfg.max_step)
                .saturating_sub(taken)
        })
        .collect();
    let total = sum(room.iter().copied());
    if total == 0 {
        return;
    }
    for (w, r) in works.iter_mut().zip(room) {
        let share = (excess as f64 * r as f64 / total as f64 / PAGE as f64).ceil() as u64 * PAGE;
        w.forced = share.min(r);
    }
}

/// A release no rule of the budget or the limits forces: DRAM a VM holds
/// but does not need by its own measure (idle, cold, above its target).
fn discretionary(w: &Want) -> Option<u64> {
    match *w {
        Want::Release {
            why: Why::Idle | Why::Above | Why::Cold | Why::Warm,
            bytes,
            ..
        } => Some(bytes),
        _ => None,
    }
}

/// `Reclaim::OnDemand`: of the discretionary releases, takes only `short`
/// bytes (what VMs short of DRAM need beyond the free pool), from each in
/// proportion to what it offers; the rest stays with its VM (`Work::kept`).
/// Pages the guest moves off DRAM that is taken come back only at its
/// promotion rate when they heat up again: DRAM no one asks for is worth
/// more where it is than in the pool.
fn keep_unneeded(works: &mut [Work], short: u64) {
    let offered = sum(works.iter().filter_map(|w| discretionary(&w.want)));
    if offered <= short {
        return;
    }
    for w in works.iter_mut() {
        let Some(bytes) = discretionary(&w.want) else {
            continue;
        };
        let share = short as f64 * bytes as f64 / offered as f64;
        let take = ((share / PAGE as f64).ceil() as u64 * PAGE).min(bytes);
        if take == bytes {
            continue;
        }
        w.kept = Some(w.want);
        w.want = match w.want {
            Want::Release { why, raw, .. } if take > 0 => Want::Release {
                why,
                raw,
                bytes: take,
            },
            _ => Want::Hold,
        };
    }
}

/// working_set mode: takes up to `short` bytes of the spare DRAM (beyond
/// their hot sets) of VMs that hold, for VMs short of DRAM this round, in
/// proportion to each one's spare.
fn take_spare(works: &mut [Work], short: u64) {
    let total = sum(works
        .iter()
        .filter(|w| w.want == Want::Hold)
        .map(|w| w.spare));
    if total == 0 {
        return;
    }
    for w in works
        .iter_mut()
        .filter(|w| w.want == Want::Hold && w.spare > 0)
    {
        let share = short as f64 * w.spare as f64 / total as f64;
        let bytes = ((share / PAGE as f64).ceil() as u64 * PAGE).min(w.spare);
        if bytes > 0 {
            w.want = Want::Release {
                why: Why::Warm,
                raw: w.spare,
                bytes,
            };
        }
    }
}

/// Splits the pool: floors first, then VMs below target weighted by
/// deficit x access rate. Returns what was granted.
fn grant(works: &mut [Work], pool: u64) -> u64 {
    let mut left = pool;
    for floor_pass in [true, false] {
        let idx: Vec<usize> = (0..works.len())
            .filter(|&i| match works[i].want {
                Want::Need { why, .. } => (why == Why::Floor) == floor_pass,
                _ => false,
            })
            .collect();
        let claims: Vec<Claim> = idx
            .iter()
            .map(|&i| {
                let w = &works[i];
                let cap = match w.want {
                    Want::Need { bytes, .. } => bytes,
                    _ => 0,
                };
                let deficit = w.load.ratio().map_or(0.0, |r| (w.target - r).max(0.0));
                let weight = match (w.view_for_want(), floor_pass) {
                    (_, true) => 1.0,
                    (Some(v), false) => working_set::weight(v, cap, w.load.total()),
                    (None, false) => deficit * w.load.total(),
                };
                Claim { weight, cap }
            })
            .collect();
        for (&i, got) in idx.iter().zip(water_fill(left, &claims)) {
            works[i].granted = got;
            left -= got;
        }
    }
    pool - left
}

/// Slow-tier change mirroring a DRAM change so total guest memory stays
/// constant where the slow tier's step and limits allow; a slow tier
/// outside its limits is first brought back toward them.
fn slow_delta(vm: &VmObs, w: &Work, step: u64) -> i64 {
    let s = vm.slow.given();
    let signed = |up: bool, b: u64| {
        let b = i64::try_from(b).unwrap_or(i64::MAX);
        if up { b } else { -b }
    };
    if s > w.slow_hi {
        return signed(false, (s - w.slow_hi).min(step));
    }
    if s < w.slow_lo {
        return signed(true, (w.slow_lo - s).min(step));
    }
    let d = w.delta.unsigned_abs().min(step);
    if w.delta > 0 {
        signed(false, d.min(s - w.slow_lo))
    } else {
        signed(true, d.min(w.slow_hi - s))
    }
}

pub(super) fn run(c: &mut Controller, vms: &[VmObs], now_unix_ns: u64) -> Plan {
    c.round += 1;
    let round = c.round;
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

    let budget = cfg
        .budget
        .unwrap_or_else(|| sum(vms.iter().map(|v| v.dram.size)));
    let before = sum(vms.iter().zip(&works).map(|(v, w)| committed(v, w, 0)));
    let releasing = |works: &[Work]| {
        sum(works.iter().map(|w| match w.want {
            Want::Release { bytes, .. } => bytes,
            _ => 0,
        }))
    };
    // DRAM a settling VM still holds beyond its target (a balloon still
    // inflating, a virtio-mem zone not yet unplugged): not granted to
    // anyone until it is given back, so the host holds no more than the
    // budget while moves are under way (docs/virtio-mem.md). Not a reason to force
    // releases: it is on its way out.
    let in_flight = sum(vms.iter().zip(&works).map(|(v, w)| {
        if w.status == VmStatus::Settling {
            v.dram.held().saturating_sub(v.dram.given())
        } else {
            0
        }
    }));
    if before <= budget {
        let needs = sum(works.iter().map(|w| match w.want {
            Want::Need { bytes, .. } => bytes,
            _ => 0,
        }));
        if cfg.reclaim == Reclaim::OnDemand {
            // Needs left unmet lately by VMs that ask nothing this round.
            let window = u64::from(cfg.tuning.hysteresis_window);
            let remembered = sum(vms.iter().zip(&works).map(|(v, w)| {
                match (w.want, c.state.get(v.id.as_str()).and_then(|s| s.unmet)) {
                    (Want::Need { .. }, _) => 0,
                    (_, Some((bytes, r))) if round - r <= window => bytes,
                    _ => 0,
                }
            }));
            let needs = needs.saturating_add(remembered);
            let forced = releasing(&works)
                .saturating_sub(sum(works.iter().filter_map(|w| discretionary(&w.want))));
            let free = (budget - before)
                .saturating_add(forced)
                .saturating_sub(in_flight);
            keep_unneeded(&mut works, needs.saturating_sub(free));
        }
        let pool = (budget - before)
            .saturating_add(releasing(&works))
            .saturating_sub(in_flight);
        if needs > pool {
            take_spare(&mut works, needs - pool);
        }
    }
    let releasing = releasing(&works);
    let pool = if before > budget {
        let still = (before - budget).saturating_sub(releasing);
        if still > 0 {
            force_release(vms, &mut works, cfg, still);
        }
        0
    } else {
        (budget - before)
            .saturating_add(releasing)
            .saturating_sub(in_flight)
    };
    let granted = grant(&mut works, pool);
    let mut released = 0;
    for (vm, w) in vms.iter().zip(works.iter_mut()) {
        let down = match w.want {
            Want::Release { bytes, .. } => bytes,
            _ => 0,
        } + w.forced;
        released = down.saturating_add(released);
        let to_i = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
        w.delta = to_i(w.granted) - to_i(down);
        if w.status == VmStatus::Managed {
            w.slow_delta = slow_delta(vm, w, cfg.max_step);
        }
    }
    let after = sum(vms
        .iter()
        .zip(&works)
        .map(|(v, w)| committed(v, w, w.delta)));
    let pool_info = Pool {
        budget,
        committed: before,
        size: pool,
    };

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
        if let Some(mut d) = decision::record(cfg, vm, w, pool_info, dram, slow) {
            c.sequence += 1;
            d.sequence = c.sequence;
            d.timestamp_unix_ns = now_unix_ns;
            decisions.push(d);
        }
        if let Some(st) = c.state.get_mut(&vm.id) {
            if w.status == VmStatus::Managed && !cfg.dry_run {
                (st.moving, st.short) = follow_up(cfg, w, round);
            }
            if w.status == VmStatus::Managed {
                st.unplaced = w.unplaced.is_some();
                st.unmeasured = w.unmeasured.is_some();
                st.kept = w.kept.is_some();
                st.unmet = match w.want {
                    Want::Need { bytes, .. } if w.granted < bytes => {
                        Some((bytes - w.granted, round))
                    }
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
        budget: BudgetSummary {
            budget,
            committed_before: before,
            committed_after: after,
            released,
            granted,
        },
    }
}
