//! What one managed VM wants this interval, before the host-level allocator
//! and the budget have their say. Checks in order: tier limits, above
//! target, idle memory, below target.

use super::config::{Config, PAGE};
use super::input::VmObs;
use super::model::Load;
use super::state::Dir;

/// Which rule produced a want.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// DRAM given above the tier ceiling.
    Ceiling,
    /// DRAM given below the tier floor.
    Floor,
    /// Idle DRAM above the idle threshold.
    Idle,
    /// Ratio above target + epsilon.
    Above,
    /// Ratio below target - epsilon.
    Below,
}

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

/// Whether a move in `dir` would undo a recent reversal (hysteresis).
fn flips_back(ctx: &Ctx, dir: Dir) -> bool {
    ctx.reversed_lately && ctx.last_dir.is_some_and(|d| d != dir)
}

pub fn classify(vm: &VmObs, load: &Load, ctx: &Ctx, cfg: &Config) -> Want {
    let g = vm.dram.given();
    let step = cfg.max_step;
    if g > ctx.hi {
        let raw = g - ctx.hi;
        return Want::Release {
            why: Why::Ceiling,
            raw,
            bytes: raw.min(step),
        };
    }
    if g < ctx.lo {
        let raw = ctx.lo - g;
        return Want::Need {
            why: Why::Floor,
            raw,
            bytes: raw.min(step),
        };
    }
    let room_down = if flips_back(ctx, Dir::Down) {
        0
    } else {
        (g - ctx.lo).min(step)
    };
    let ratio = load.ratio();
    if ratio.is_some_and(|r| r > ctx.target + cfg.epsilon) {
        let raw = load.shrink_for(ctx.target);
        let bytes = raw.min(room_down);
        if bytes >= cfg.min_step() {
            return Want::Release {
                why: Why::Above,
                raw,
                bytes,
            };
        }
        return Want::Hold;
    }
    let raw = idle_reclaim(vm.dram.held(), vm.dram.idle_bytes, cfg.idle_threshold);
    let bytes = raw.min(room_down);
    if bytes >= cfg.min_step() {
        return Want::Release {
            why: Why::Idle,
            raw,
            bytes,
        };
    }
    match ratio {
        Some(r) if r < ctx.target - cfg.epsilon && !flips_back(ctx, Dir::Up) => {
            let raw = load.grow_for(ctx.target).max(cfg.min_step());
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
        }
    }

    fn want(v: &VmObs, c: &Ctx) -> Want {
        classify(v, &Load::of(v), c, &cfg())
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
        assert_eq!(
            want(&v, &ctx()),
            Want::Release {
                why: Why::Idle,
                raw: 240 * M,
                bytes: 64 * M
            }
        );
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
