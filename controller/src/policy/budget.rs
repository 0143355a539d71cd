//! The host DRAM budget over one round: what the VMs' wants add up to,
//! what on-demand reclaim keeps, what the budget forces, and how the pool
//! is split; then each VM's change of DRAM and the mirrored slow-tier
//! change.

use std::collections::HashMap;

use super::allocate::{Claim, water_fill};
use super::classify::Want;
use super::config::{Config, PAGE, Reclaim};
use super::input::VmObs;
use super::state::{VmState, Why};
use super::work::{Pool, Work};
use super::working_set;
use super::{BudgetSummary, VmStatus};

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

/// Needs left unmet within the last `hysteresis_window` rounds by VMs
/// that ask nothing this round (`VmState::unmet`).
fn unmet(
    cfg: &Config,
    state: &HashMap<String, VmState>,
    vms: &[VmObs],
    works: &[Work],
    round: u64,
) -> u64 {
    let window = u64::from(cfg.tuning.hysteresis_window);
    sum(vms.iter().zip(works).map(|(v, w)| {
        match (w.want, state.get(v.id.as_str()).and_then(|s| s.unmet)) {
            (Want::Need { .. }, _) => 0,
            (_, Some((bytes, r))) if round - r <= window => bytes,
            _ => 0,
        }
    }))
}

/// Enforces the budget over `works` and splits the pool; sets each VM's
/// `granted`, `forced`, `delta` and `slow_delta`.
pub(super) fn split(
    cfg: &Config,
    state: &HashMap<String, VmState>,
    vms: &[VmObs],
    works: &mut [Work],
    round: u64,
) -> (BudgetSummary, Pool) {
    let budget = cfg
        .budget
        .unwrap_or_else(|| sum(vms.iter().map(|v| v.dram.size)));
    let before = sum(vms
        .iter()
        .zip(works.iter())
        .map(|(v, w)| committed(v, w, 0)));
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
    let in_flight = sum(vms.iter().zip(works.iter()).map(|(v, w)| {
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
            let needs = needs.saturating_add(unmet(cfg, state, vms, works, round));
            let forced = releasing(works)
                .saturating_sub(sum(works.iter().filter_map(|w| discretionary(&w.want))));
            let free = (budget - before)
                .saturating_add(forced)
                .saturating_sub(in_flight);
            keep_unneeded(works, needs.saturating_sub(free));
        }
        let pool = (budget - before)
            .saturating_add(releasing(works))
            .saturating_sub(in_flight);
        if needs > pool {
            take_spare(works, needs - pool);
        }
    }
    let releasing = releasing(works);
    let pool = if before > budget {
        let still = (before - budget).saturating_sub(releasing);
        if still > 0 {
            force_release(vms, works, cfg, still);
        }
        0
    } else {
        (budget - before)
            .saturating_add(releasing)
            .saturating_sub(in_flight)
    };
    let granted = grant(works, pool);
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
        .zip(works.iter())
        .map(|(v, w)| committed(v, w, w.delta)));
    let pool_info = Pool {
        budget,
        committed: before,
        size: pool,
    };
    let summary = BudgetSummary {
        budget,
        committed_before: before,
        committed_after: after,
        released,
        granted,
    };
    (summary, pool_info)
}
