//! What a timeline says: when the fleet converged, how often a VM's DRAM
//! flipped back and forth, how much of the budget was handed out.

use crate::Step;
use crate::guest::{Guest, SimVm};

/// VMs whose balloons move: only they can be expected to converge.
pub fn cooperative(vms: &[SimVm]) -> Vec<bool> {
    vms.iter().map(|v| v.guest == Guest::Cooperative).collect()
}

/// Whether a VM is at its target: in ratio mode its true ratio within
/// `eps` of its target (no accesses counts as within: there is nothing to
/// steer); in working_set mode the DRAM it holds covers its true hot set
/// but for a share `eps` of it.
pub fn within(s: &crate::VmStep, eps: f64) -> bool {
    within_slack(s, eps, 0)
}

/// `within`, a working_set VM also when it is short by at most `slack`
/// bytes (the controller's minimum step: it moves nothing smaller).
pub fn within_slack(s: &crate::VmStep, eps: f64, slack: u64) -> bool {
    match s.hot {
        Some(hot) => s.dram_held.saturating_add(slack) as f64 >= hot as f64 * (1.0 - eps),
        None => s.ratio.is_none_or(|r| (r - s.target).abs() <= eps + 1e-9),
    }
}

/// Whether a VM needs more DRAM (`Some(true)`), has more than it needs
/// (`Some(false)`), or neither (within `eps`), by the truth.
fn needs(s: &crate::VmStep, eps: f64) -> Option<bool> {
    match (s.hot, s.ratio) {
        (Some(hot), _) => {
            let h = hot as f64;
            if (s.dram_held as f64) < h * (1.0 - eps) {
                Some(true)
            } else if s.dram_held as f64 > h * (1.0 + eps) {
                Some(false)
            } else {
                None
            }
        }
        (None, Some(r)) if r < s.target - eps => Some(true),
        (None, Some(r)) if r > s.target + eps => Some(false),
        _ => None,
    }
}

/// DRAM-target changes against the truth of the interval they were
/// decided on, all VMs over `[from, to)`: more DRAM to a VM that had more
/// than it needed, or DRAM taken from one that needed more. (A grant to a
/// VM above its need can be right in working_set mode for promotion
/// pressure; the bench's fleets have none.)
pub fn wrong_way(steps: &[Step], from: usize, to: usize, eps: f64) -> usize {
    let n = steps.first().map_or(0, |s| s.vms.len());
    (0..n)
        .map(|i| {
            changes(steps, i, from, to)
                .into_iter()
                .filter(|&(k, d)| {
                    let s = &steps[k].vms[i];
                    matches!((d, needs(s, eps)), (1, Some(false)) | (-1, Some(true)))
                })
                .count()
        })
        .sum()
}

/// DRAM moved (sum of |change of the DRAM balloon target|) over
/// `[from, to)`, all VMs, bytes.
pub fn dram_moved(steps: &[Step], from: usize, to: usize) -> u64 {
    let to = to.min(steps.len());
    (from.max(1)..to)
        .map(|k| {
            steps[k]
                .vms
                .iter()
                .zip(&steps[k - 1].vms)
                .map(|(b, a)| a.dram_target.abs_diff(b.dram_target))
                .sum::<u64>()
        })
        .sum()
}

/// Intervals from `from` until every counted VM is within `eps` and stays
/// so up to `to` (exclusive); `None` if that never happens. A VM with more
/// DRAM than it needs counts as within while no counted VM needs more:
/// reclaim on demand (docs/controller.md) leaves it that DRAM, and taking
/// it would help no one.
pub fn converge(
    steps: &[Step],
    from: usize,
    to: usize,
    eps: f64,
    counted: &[bool],
) -> Option<usize> {
    converge_slack(steps, from, to, eps, 0, counted)
}

/// `converge` with `within_slack`.
pub fn converge_slack(
    steps: &[Step],
    from: usize,
    to: usize,
    eps: f64,
    slack: u64,
    counted: &[bool],
) -> Option<usize> {
    let to = to.min(steps.len());
    let ok = |k: usize| {
        let vms = || steps[k].vms.iter().zip(counted).filter(|(_, c)| **c);
        let short = vms().any(|(s, _)| needs(s, eps) == Some(true));
        vms().all(|(s, _)| within_slack(s, eps, slack) || (!short && needs(s, eps) == Some(false)))
    };
    let mut first = None;
    for k in (from..to).rev() {
        if !ok(k) {
            break;
        }
        first = Some(k - from);
    }
    first
}

/// The DRAM-given changes of VM `i` in `[from, to)` as (interval, sign):
/// +1 more DRAM, -1 less.
pub fn changes(steps: &[Step], i: usize, from: usize, to: usize) -> Vec<(usize, i8)> {
    let mut out = Vec::new();
    let to = to.min(steps.len());
    for k in from.max(1)..to {
        let (a, b) = (steps[k - 1].vms[i].dram_target, steps[k].vms[i].dram_target);
        // A larger balloon target means less DRAM.
        if b < a {
            out.push((k, 1));
        } else if b > a {
            out.push((k, -1));
        }
    }
    out
}

/// Lower bound for `converge` from interval `from`: an oracle that knows
/// each VM's DRAM for target +- `eps` and moves every VM that needs more
/// there by at most `step` per change, one change every `cooldown + 1`
/// intervals (a VM with more than it needs may keep it, as `converge`
/// allows). Budget ignored.
/// The controller carries a move planned in one assessment on at one step
/// per interval, so its bound is `cooldown` 0; a controller that waits out
/// a cooldown after every change is bound by the policy's cooldown.
pub fn oracle_converge(
    vms: &[SimVm],
    steps: &[Step],
    from: usize,
    eps: f64,
    step: u64,
    cooldown: u32,
    counted: &[bool],
) -> Option<usize> {
    let s = steps.get(from)?;
    let mut worst = 0;
    for ((vm, v), &c) in vms.iter().zip(&s.vms).zip(counted) {
        let Some(p) = vm.phase(s.interval) else {
            continue;
        };
        if !c || within(v, eps) || needs(v, eps) == Some(false) {
            continue;
        }
        let (lo, hi) = match v.hot {
            Some(hot) => ((hot as f64 * (1.0 - eps)) as u64, u64::MAX),
            None => (p.dram_for(v.target - eps), p.dram_for(v.target + eps)),
        };
        let dist = lo.saturating_sub(v.dram_held) + v.dram_held.saturating_sub(hi);
        let changes = dist.div_ceil(step.max(1)).max(1) as usize;
        worst = worst.max((changes - 1) * (cooldown as usize + 1) + 1);
    }
    Some(worst)
}

/// Signs of the DRAM-given changes of VM `i` in `[from, to)`.
pub fn directions(steps: &[Step], i: usize, from: usize, to: usize) -> Vec<i8> {
    changes(steps, i, from, to)
        .into_iter()
        .map(|(_, d)| d)
        .collect()
}

/// Flip-backs of VM `i` that come less than `window` intervals after the
/// reversal they undo.
pub fn flip_backs_within(steps: &[Step], i: usize, window: usize) -> usize {
    changes(steps, i, 0, steps.len())
        .windows(3)
        .filter(|w| w[0].1 == w[2].1 && w[0].1 != w[1].1 && w[2].0 - w[1].0 < window)
        .count()
}

/// Reversals of VM DRAM changes over `[from, to)`, all VMs: a change in the
/// other direction than the VM's previous one (+ - or - +).
pub fn reversals(steps: &[Step], from: usize, to: usize) -> usize {
    let n = steps.first().map_or(0, |s| s.vms.len());
    (0..n)
        .map(|i| {
            directions(steps, i, from, to)
                .windows(2)
                .filter(|w| w[0] != w[1])
                .count()
        })
        .sum()
}

/// Flip-backs: a change that undoes a reversal (+ - + or - + -).
pub fn flip_backs(dirs: &[i8]) -> usize {
    dirs.windows(3)
        .filter(|w| w[0] == w[2] && w[0] != w[1])
        .count()
}

/// Flip-backs of every VM over `[from, to)`.
pub fn oscillations(steps: &[Step], from: usize, to: usize) -> usize {
    let n = steps.first().map_or(0, |s| s.vms.len());
    (0..n)
        .map(|i| flip_backs(&directions(steps, i, from, to)))
        .sum()
}

/// Decisions that moved a balloon on a fresh assessment of a sample taken
/// while one of the VM's balloons moved by more than `tolerance` (what the
/// controller counts as arrived), as (interval, VM id); the next step of a
/// move under way ("continuing ...") needs no assessment and is allowed.
pub fn assessed_while_moving(vms: &[SimVm], steps: &[Step], tolerance: u64) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    for k in 1..steps.len() {
        for (i, vm) in vms.iter().enumerate() {
            let (a, b) = (&steps[k - 1].vms[i], &steps[k].vms[i]);
            if a.dram_held.abs_diff(b.dram_held) <= tolerance
                && a.slow_held.abs_diff(b.slow_held) <= tolerance
            {
                continue;
            }
            let fresh = steps[k].decisions.iter().any(|d| {
                d.vm_id == vm.id && !d.changes.is_empty() && !d.detail.starts_with("continuing")
            });
            if fresh {
                out.push((steps[k].interval, vm.id.clone()));
            }
        }
    }
    out
}

/// DRAM the guests hold over the budget, at interval `k`.
pub fn utilisation(steps: &[Step], k: usize) -> Option<f64> {
    let s = steps.get(k)?;
    let held: u64 = s.vms.iter().map(|v| v.dram_held).sum();
    (s.budget > 0).then(|| held as f64 / s.budget as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flip_backs_count_undone_reversals() {
        assert_eq!(flip_backs(&[1, 1, -1, -1]), 0);
        assert_eq!(flip_backs(&[1, -1, 1]), 1);
        assert_eq!(flip_backs(&[1, -1, 1, -1]), 2);
        assert_eq!(flip_backs(&[]), 0);
    }
}
