//! working_set mode (docs/working-set.md): what one managed VM wants when the policy
//! keeps its hot working set in DRAM instead of a DRAM-hit ratio at a
//! target. Accessed bits measure recency well ("touched within H seconds"),
//! unlike frequency, so this mode reads the per-tier ages:
//!
//! - **deficit**: hot bytes (both tiers, within the hot horizon) beyond the
//!   DRAM given. Given only as far as the interval's *low* end shows it.
//! - **promotion pressure**: slow-tier bytes per minute turning hot after
//!   being cold, as a share of the working set within the longest horizon,
//!   above `promotion_slo`: more DRAM, sized by the excess per minute.
//! - **reclaim**: DRAM beyond the interval's *high* end of the hot set.
//!   Cold bytes of DRAM (untouched for the longest horizon) go back on
//!   their own; the rest of that surplus (warm) only when another VM is
//!   short (`decide`). Never while promotion may be above the SLO, nor
//!   while it is not measured yet and may still be (the ages have watched
//!   less than the longest horizon). Promotion still not measured once the
//!   longest horizon was watched (hostpte: no page identity) is no breach
//!   and no block: reclaim goes on as with no SLO, and the decision says
//!   the SLO was not checked.
//!
//! The interval is the hold band: nothing moves while it straddles the DRAM
//! given. A VM without usable ages (no ages, not measured, the hot horizon
//! not among its horizons) or with an exact PMU count is decided in ratio
//! mode; `view` says why.

use std::fmt::Write as _;

use tier_proto::human_bytes as hb;

use super::ages::{Est, TierAges};
use super::classify::{Ctx, HotSet, Want, flips_back, limit_want, whole};
use super::config::{Config, PAGE};
use super::hit_interval::HitEvidence;
use super::input::{TierObs, VmObs};
use super::state::{Dir, Move, Why};

/// What working_set mode reads of one VM in one interval.
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    /// The hot horizon used, seconds.
    pub horizon: f64,
    /// Bytes touched within it, both tiers, and per tier.
    pub hot: Est,
    pub hot_dram: Est,
    pub hot_slow: Est,
    /// The longest horizon, seconds, and the working set within it (both
    /// tiers); `None` while not measured.
    pub long_horizon: f64,
    pub long: Option<Est>,
    /// DRAM bytes not touched within the longest horizon.
    pub dram_cold: Option<Est>,
    /// Slow-tier promotion, bytes per minute.
    pub promoted_per_min: Option<Est>,
    /// Seconds the ages have watched the VM (the least of its tiers).
    pub history: f64,
    /// `Some(round)`: this interval did not measure the hot horizon; the
    /// view is the one of that round (`decide::ws_view`).
    pub stale: Option<u64>,
}

fn ages(t: &TierObs) -> Result<&TierAges, String> {
    let a = t
        .ages
        .as_ref()
        .ok_or_else(|| format!("tier {} has no ages (its sampler gives none)", t.name))?;
    if !a.not_measured.is_empty() {
        return Err(format!("tier {}: {}", t.name, a.not_measured));
    }
    Ok(a)
}

fn bytes_at(t: &TierObs, a: &TierAges, h: f64) -> Result<Est, String> {
    let hz = a.at(h).ok_or_else(|| {
        format!(
            "hot horizon {h} s is not among tier {}'s horizons ({})",
            t.name,
            a.horizon_list()
        )
    })?;
    hz.bytes
        .ok_or_else(|| format!("tier {}, horizon {h} s: {}", t.name, hz.why))
}

/// The VM's working-set view, or why it stays in ratio mode.
pub fn view(vm: &VmObs, cfg: &Config) -> Result<View, String> {
    if let HitEvidence::Counted(_) = vm.hit {
        return Err("its DRAM-hit ratio is PMU-counted (exact)".into());
    }
    let da = ages(&vm.dram)?;
    let has_slow = vm.slow.size > 0;
    let sa = if has_slow {
        Some(ages(&vm.slow)?)
    } else {
        None
    };
    let horizon = match cfg.working_set.hot_horizon {
        h if h > 0.0 => h,
        _ => {
            da.shortest()
                .ok_or_else(|| format!("tier {} reports no horizon", vm.dram.name))?
                .seconds
        }
    };
    let hot_dram = bytes_at(&vm.dram, da, horizon)?;
    let hot_slow = match sa {
        Some(sa) => bytes_at(&vm.slow, sa, horizon)?,
        None => Est::exact(0.0),
    };
    let long_h = da.longest().map_or(horizon, |h| h.seconds);
    let long_of = |t: &TierObs, a: &TierAges| bytes_at(t, a, long_h).ok();
    let long = match sa {
        Some(sa) => long_of(&vm.dram, da).zip(long_of(&vm.slow, sa)),
        None => long_of(&vm.dram, da).map(|d| (d, Est::exact(0.0))),
    }
    .map(|(d, s)| d.plus(s));
    let promoted_per_min = match sa {
        Some(sa) => sa.promoted_per_s.map(|p| p.scale(60.0)),
        None => Some(Est::exact(0.0)),
    };
    let history = sa.map_or(da.history_seconds, |sa| {
        da.history_seconds.min(sa.history_seconds)
    });
    Ok(View {
        horizon,
        hot: hot_dram.plus(hot_slow),
        hot_dram,
        hot_slow,
        long_horizon: long_h,
        long,
        dram_cold: da.cold,
        promoted_per_min,
        history,
        stale: None,
    })
}

/// Slow-tier promotion against the SLO.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pressure {
    /// `promotion_slo` is 0.
    NoLimit,
    /// Promotion or the long working set not measured, and the ages have
    /// watched less than the longest horizon: it may be soon. No breach;
    /// reclaim waits.
    Pending,
    /// Still not measured with the longest horizon watched: the sampler
    /// gives none (hostpte). No breach and no block: the SLO is unchecked.
    Unmeasured,
    /// Known above: the low end of promotion per minute exceeds the SLO
    /// share of the high end of the working set by this many bytes/min.
    Above(f64),
    /// Known at or under: the high end is within the SLO of the low end.
    Under,
    /// The intervals cannot tell.
    Straddles,
}

pub fn pressure(v: &View, slo: f64) -> Pressure {
    if slo <= 0.0 {
        return Pressure::NoLimit;
    }
    let (Some(p), Some(l)) = (v.promoted_per_min, v.long) else {
        return if v.history + 1e-9 < v.long_horizon {
            Pressure::Pending
        } else {
            Pressure::Unmeasured
        };
    };
    if p.low > slo * l.high {
        Pressure::Above(p.low - slo * l.high)
    } else if p.high <= slo * l.low {
        Pressure::Under
    } else {
        Pressure::Straddles
    }
}

fn reclaim_ok(p: Pressure) -> bool {
    matches!(
        p,
        Pressure::NoLimit | Pressure::Under | Pressure::Unmeasured
    )
}

fn pages_up(b: f64) -> u64 {
    (b.max(0.0) / PAGE as f64).ceil() as u64 * PAGE
}

fn pages_down(b: f64) -> u64 {
    (b.max(0.0) / PAGE as f64).floor() as u64 * PAGE
}

/// DRAM given beyond the high end of the hot set, in pages.
fn surplus(g: u64, v: &View) -> u64 {
    g.saturating_sub(pages_up(v.hot.high))
}

/// A hot set whose low end exceeds the DRAM given by at least the minimum
/// step: the `Need` for it (`None`: no deficit), `Hold` where the step,
/// the ceiling or the flip-back guard leave nothing. Decided on the low end
/// (known short), sized on the point (as ratio mode's act_on = interval
/// sizes on the point): sizing on the low end would leave the VM short by
/// the interval's half-width for good, since the interval then straddles
/// the DRAM given.
pub fn deficit(vm: &VmObs, v: &View, ctx: &Ctx, cfg: &Config) -> Option<Want> {
    let g = vm.dram.given();
    if v.hot.low - (g as f64) < cfg.min_step() as f64 {
        return None;
    }
    // A zone moves whole blocks: less than one is asked as one (as in
    // ratio mode), or it would be skipped every interval.
    let raw = whole(pages_up(v.hot.point - g as f64), vm.dram.granule);
    let bytes = raw.min(cfg.max_step).min(ctx.hi.saturating_sub(g));
    if bytes == 0 || flips_back(ctx, Dir::Up) {
        return Some(Want::Hold);
    }
    let why = Why::HotSet;
    Some(Want::Need { why, raw, bytes })
}

/// Ratio mode's reading of the VM's hot set (`classify::HotSet`): none
/// without a view.
pub fn evidence(vm: &VmObs, v: Option<&View>, ctx: &Ctx, cfg: &Config) -> HotSet {
    v.map_or_else(HotSet::default, |v| HotSet {
        beyond: surplus(vm.dram.given(), v),
        deficit: deficit(vm, v, ctx, cfg),
    })
}

/// The VM's want in working_set mode, and its *spare*: warm DRAM beyond
/// the hot set's high end that may go to a VM short of DRAM this round
/// (after step and floor), 0 unless the want is `Hold`.
pub fn classify(vm: &VmObs, v: &View, ctx: &Ctx, cfg: &Config) -> (Want, u64) {
    let g = vm.dram.given();
    let step = cfg.max_step;
    if let Some(w) = limit_want(g, ctx, step) {
        return (w, 0);
    }
    let min = cfg.min_step();
    let deficit = v.hot.low - g as f64;
    let granule = vm.dram.granule;
    if deficit >= min as f64 {
        return (self::deficit(vm, v, ctx, cfg).unwrap_or(Want::Hold), 0);
    }
    let p = pressure(v, cfg.working_set.promotion_slo);
    if let Pressure::Above(excess) = p {
        // Each minute `excess` more bytes turn hot in the slow tier than
        // the SLO allows: DRAM to hold that much more.
        let raw = whole(pages_up(excess).max(min), granule);
        let bytes = raw.min(step).min(ctx.hi - g);
        if bytes == 0 || flips_back(ctx, Dir::Up) || deficit > 0.0 {
            return (Want::Hold, 0);
        }
        let why = Why::Promotion;
        return (Want::Need { why, raw, bytes }, 0);
    }
    let room = (g - ctx.lo).min(step);
    let extra = surplus(g, v).min(g - ctx.lo);
    // A give sized on the point may overshoot the truth by up to the
    // point's error, which leaves a surplus beyond the high end smaller
    // than the interval's width: not taken back (a reversal on noise).
    let width = pages_up(v.hot.high - v.hot.low);
    if !reclaim_ok(p) || extra < min.max(width) || flips_back(ctx, Dir::Down) {
        return (Want::Hold, 0);
    }
    let cold = v.dram_cold.map_or(0, |c| pages_down(c.low)).min(extra);
    if cold >= min {
        let why = Why::Cold;
        let bytes = whole(cold, granule).min(room);
        return (
            Want::Release {
                why,
                raw: cold,
                bytes,
            },
            0,
        );
    }
    (Want::Hold, extra.min(room))
}

/// The next step of a working_set move under way, or `None` when it is
/// over: limits, no view, the sample (taken during the last step, so
/// between before and after) shows no deficit left (a rise) or no cold
/// surplus left (a cut), or less than the minimum step is left.
pub fn resume(vm: &VmObs, v: Option<&View>, ctx: &Ctx, cfg: &Config, mv: &Move) -> Option<Want> {
    let g = vm.dram.given();
    if g > ctx.hi || g < ctx.lo {
        return None;
    }
    let v = v?;
    let (done, room) = match (mv.dir, mv.why) {
        // No further than the latest point: the planning sample's error
        // is not carried to the end of a long move.
        (Dir::Up, Why::HotSet) => (
            v.hot.low <= g as f64,
            (ctx.hi - g).min(pages_up(v.hot.point - g as f64)),
        ),
        (Dir::Down, Why::Cold) => (
            !reclaim_ok(pressure(v, cfg.working_set.promotion_slo)),
            (g - ctx.lo).min(surplus(g, v)),
        ),
        _ => return None,
    };
    let bytes = mv.left.min(cfg.max_step).min(room) / PAGE * PAGE;
    if done || bytes < cfg.min_step() {
        return None;
    }
    let (why, raw) = (mv.why, mv.left);
    Some(match mv.dir {
        Dir::Up => Want::Need { why, raw, bytes },
        Dir::Down => Want::Release { why, raw, bytes },
    })
}

/// Weight of a working_set claim on the pool, comparable with the ratio
/// mode's (target - ratio) x accesses: the share of the hot set missing
/// from DRAM, times the VM's accesses.
pub fn weight(v: &View, raw: u64, accesses: f64) -> f64 {
    let share = (raw as f64 / v.hot.point.max(PAGE as f64)).min(1.0);
    share * if accesses > 0.0 { accesses } else { 1.0 }
}

fn est(e: Est) -> String {
    format!(
        "{} ({}-{})",
        hb(e.point as u64),
        hb(e.low as u64),
        hb(e.high as u64)
    )
}

fn pct(v: f64) -> String {
    format!("{:.2} %", v * 100.0)
}

/// The view in one phrase, for every decision in this mode.
pub fn quote(v: &View) -> String {
    let stale = v.stale.map_or_else(String::new, |r| {
        format!(" [measured in round {r}; not measured since]")
    });
    format!(
        "working set ({} s) {} = dram {} + slow {}{stale}",
        v.horizon,
        est(v.hot),
        hb(v.hot_dram.point as u64),
        hb(v.hot_slow.point as u64)
    )
}

fn pressure_text(v: &View, slo: f64) -> String {
    match (v.promoted_per_min, v.long, slo > 0.0) {
        (Some(p), Some(l), true) => format!(
            "slow promotion {}/min ({}-{}) of working set ({} s) {} = {}-{}/min against slo {}",
            hb(p.point as u64),
            hb(p.low as u64),
            hb(p.high as u64),
            v.long_horizon,
            est(l),
            pct(p.low / l.high.max(1.0)),
            pct(p.high / l.low.max(1.0)),
            pct(slo)
        ),
        (_, _, true) if pressure(v, slo) == Pressure::Pending => format!(
            "slow promotion not measured yet (watched {:.0} s of {} s; no reclaim under slo {} \
             until then)",
            v.history,
            v.long_horizon,
            pct(slo)
        ),
        (_, _, true) => format!(
            "slow promotion not measured (watched {:.0} s, the longest horizon {} s: the \
             sampler gives none): slo {} unchecked, reclaim as with no slo",
            v.history,
            v.long_horizon,
            pct(slo)
        ),
        (Some(p), _, false) => format!("slow promotion {}/min, no slo", hb(p.point as u64)),
        (None, _, false) => "no slo".into(),
    }
}

/// The arithmetic of a working_set want.
pub fn why_text(cfg: &Config, vm: &VmObs, v: &View, want: Want, granted: u64) -> String {
    let g = vm.dram.given();
    let slo = cfg.working_set.promotion_slo;
    let mut s = String::new();
    let _ = match want {
        Want::Need {
            why: Why::HotSet,
            raw,
            bytes,
        } => write!(
            s,
            "{} > dram given {}: low end short by {} (min step {}); need {} - {} = {} cap {} -> granted {}",
            quote(v),
            hb(g),
            hb((v.hot.low - g as f64) as u64),
            hb(cfg.min_step()),
            hb(v.hot.point as u64),
            hb(g),
            hb(raw),
            hb(bytes),
            hb(granted)
        ),
        Want::Need {
            why: Why::Promotion,
            raw,
            bytes,
        } => write!(
            s,
            "{}; {}: above it by {}/min (low end): need {} cap {} -> granted {}",
            quote(v),
            pressure_text(v, slo),
            hb(raw),
            hb(raw),
            hb(bytes),
            hb(granted)
        ),
        Want::Release {
            why: Why::Cold,
            raw,
            bytes,
        } => write!(
            s,
            "{}; dram given {} - high end {} = {} beyond the hot set; dram cold (> {} s) {}; {}: reclaim the cold {} -> {}",
            quote(v),
            hb(g),
            hb(pages_up(v.hot.high)),
            hb(surplus(g, v)),
            v.long_horizon,
            v.dram_cold.map_or_else(|| "not measured".into(), est),
            pressure_text(v, slo),
            hb(raw),
            hb(bytes)
        ),
        Want::Release {
            why: Why::Warm,
            raw,
            bytes,
        } => write!(
            s,
            "{}; dram given {} - high end {} = {} beyond the hot set (spare {} this round); {}; another VM is short of DRAM: -{}",
            quote(v),
            hb(g),
            hb(pages_up(v.hot.high)),
            hb(surplus(g, v)),
            hb(raw),
            pressure_text(v, slo),
            hb(bytes)
        ),
        _ => Ok(()),
    };
    s
}

/// A working_set move's next step, for its decision.
pub fn continuing_text(v: Option<&View>, m: &Move, bytes: u64, granted: u64) -> String {
    let what = match m.dir {
        Dir::Up => "rise for the hot set",
        Dir::Down => "cold reclaim",
    };
    let q = v.map_or_else(|| "no working set".into(), quote);
    format!(
        "continuing the {what} planned in round {}: {} in all, {} left; sampled during the last step, {q}: step {} -> {}",
        m.planned,
        hb(m.total),
        hb(m.left),
        hb(bytes),
        hb(granted.max(if m.dir == Dir::Down { bytes } else { 0 }))
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ages::Horizon;
    use crate::policy::config::{Tuning, WorkingSet};
    use std::collections::HashMap;

    const M: u64 = 1 << 20;

    fn cfg(slo: f64) -> Config {
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
            mode: crate::policy::Mode::WorkingSet,
            working_set: WorkingSet {
                hot_horizon: 0.0,
                promotion_slo: slo,
            },
            reclaim: crate::policy::Reclaim::Eager,
        }
    }

    /// Horizons 1 s and 60 s: `hot` and `long` bytes (+-5 %), `cold`.
    fn ages(hot: f64, long: f64, cold: f64, promo: Option<f64>) -> TierAges {
        let h = |s: f64, b: f64| Horizon {
            seconds: s,
            bytes: Est::new(b, b * 0.95, b * 1.05),
            why: String::new(),
        };
        TierAges {
            horizons: vec![h(1.0, hot), h(60.0, long)],
            cold: Est::new(cold, cold * 0.95, cold * 1.05),
            promoted_per_s: promo.and_then(|p| Est::new(p, p * 0.9, p * 1.1)),
            history_seconds: 600.0,
            not_measured: String::new(),
        }
    }

    fn vm(given: u64, dram: TierAges, slow: TierAges) -> VmObs {
        VmObs {
            dram: TierObs {
                name: "dram".into(),
                size: 1024 * M,
                balloon_target: 1024 * M - given,
                balloon_actual: 1024 * M - given,
                ages: Some(dram),
                ..Default::default()
            },
            slow: TierObs {
                name: "slow".into(),
                size: 1024 * M,
                ages: Some(slow),
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

    fn want(v: &VmObs, slo: f64) -> (Want, u64) {
        let c = cfg(slo);
        classify(v, &view(v, &c).unwrap(), &ctx(), &c)
    }

    #[test]
    fn deficit_is_decided_by_the_low_end_and_sized_on_the_point() {
        // 200M hot in DRAM + 100M in slow, given 200M: low end 285M, short:
        // need 300M - 200M.
        let v = vm(
            200 * M,
            ages((200 * M) as f64, (200 * M) as f64, 0.0, None),
            ages((100 * M) as f64, (150 * M) as f64, 0.0, Some(0.0)),
        );
        let (w, spare) = want(&v, 0.0);
        let Want::Need {
            why: Why::HotSet,
            raw,
            bytes,
        } = w
        else {
            panic!("{w:?}");
        };
        assert_eq!(raw, 100 * M);
        assert_eq!((bytes, spare), (raw.min(64 * M), 0));
    }

    #[test]
    fn a_straddling_interval_holds() {
        // Hot 200M +-5 % against 200M given: neither known short nor
        // known beyond.
        let v = vm(
            200 * M,
            ages((200 * M) as f64, (300 * M) as f64, (100 * M) as f64, None),
            ages(0.0, 0.0, 0.0, Some(0.0)),
        );
        assert_eq!(want(&v, 0.0), (Want::Hold, 0));
    }

    #[test]
    fn cold_dram_goes_back_first_and_warm_waits_for_demand() {
        // Given 600M, hot 200M (high 210M), 300M cold (low 285M): 285M of
        // the 390M beyond the hot set are cold; released within the step.
        let v = vm(
            600 * M,
            ages((200 * M) as f64, (300 * M) as f64, (300 * M) as f64, None),
            ages(0.0, 0.0, 0.0, Some(0.0)),
        );
        let (w, _) = want(&v, 0.0);
        assert_eq!(
            w,
            Want::Release {
                why: Why::Cold,
                raw: pages_down(0.95 * (300 * M) as f64),
                bytes: 64 * M
            }
        );
        // Nothing cold: the surplus is spare for others, one step of it.
        let warm = vm(
            600 * M,
            ages((200 * M) as f64, (600 * M) as f64, 0.0, None),
            ages(0.0, 0.0, 0.0, Some(0.0)),
        );
        assert_eq!(want(&warm, 0.0), (Want::Hold, 64 * M));
        // Promotion above the SLO: no reclaim, more DRAM instead. Long
        // working set 600M (high 630M), slo 0.2 %: 1.26M/min allowed;
        // promotion 1M/s (low 0.9M/s = 54M/min) is far above.
        let (w, _) = want(
            &vm(
                600 * M,
                ages((200 * M) as f64, (600 * M) as f64, (300 * M) as f64, None),
                ages(0.0, 0.0, 0.0, Some(M as f64)),
            ),
            0.002,
        );
        assert!(
            matches!(
                w,
                Want::Need {
                    why: Why::Promotion,
                    ..
                }
            ),
            "{w:?}"
        );
    }

    /// Promotion not measured: while the ages have watched less than the
    /// longest horizon, reclaim waits (it may be measured soon); once they
    /// have, no SLO can be checked (hostpte gives no promotion): no breach
    /// (no DRAM asked) and no block (reclaim as with no SLO), and the
    /// detail says so.
    #[test]
    fn unmeasured_promotion_neither_breaches_nor_blocks_for_good() {
        let slo = 0.002;
        // Cold DRAM measured, slow promotion not (ept-like at first).
        let mut v = vm(
            600 * M,
            ages((200 * M) as f64, (300 * M) as f64, (300 * M) as f64, None),
            ages(0.0, 0.0, 0.0, None),
        );
        if let Some(a) = v.slow.ages.as_mut() {
            a.history_seconds = 30.0;
        }
        let c = cfg(slo);
        let wv = view(&v, &c).unwrap();
        assert_eq!(pressure(&wv, slo), Pressure::Pending);
        assert_eq!(want(&v, slo), (Want::Hold, 0));
        if let Some(a) = v.slow.ages.as_mut() {
            a.history_seconds = 600.0;
        }
        let wv = view(&v, &c).unwrap();
        assert_eq!(pressure(&wv, slo), Pressure::Unmeasured);
        let (w, _) = want(&v, slo);
        let Want::Release {
            why: Why::Cold,
            bytes,
            ..
        } = w
        else {
            panic!("{w:?}");
        };
        assert_eq!(bytes, 64 * M);
        let text = why_text(&c, &v, &wv, w, 0);
        assert!(
            text.contains("slow promotion not measured (watched 600 s")
                && text.contains("slo 0.20 % unchecked"),
            "{text}"
        );
        // hostpte-like: only the hot horizon measured, no cold, no
        // promotion, watched for longer than the longest horizon. The warm
        // surplus is spare for a VM short of DRAM (before: held for good).
        let hostpte = |hot: f64| {
            let mut a = ages(hot, 0.0, 0.0, None);
            a.horizons[1].bytes = None;
            a.horizons[1].why = "hostpte re-arms the whole process every pass".into();
            a.cold = None;
            a
        };
        let v = vm(600 * M, hostpte((200 * M) as f64), hostpte(0.0));
        let wv = view(&v, &c).unwrap();
        assert_eq!(pressure(&wv, slo), Pressure::Unmeasured);
        assert_eq!(want(&v, slo), (Want::Hold, 64 * M));
        // A hot set beyond the DRAM given is still asked for; promotion
        // not measured asks for nothing.
        let v = vm(100 * M, hostpte((200 * M) as f64), hostpte(0.0));
        let (w, _) = want(&v, slo);
        assert!(
            matches!(
                w,
                Want::Need {
                    why: Why::HotSet,
                    ..
                }
            ),
            "{w:?}"
        );
        let v = vm(200 * M, hostpte((200 * M) as f64), hostpte(0.0));
        assert_eq!(want(&v, slo).0, Want::Hold);
    }

    #[test]
    fn falls_back_with_a_reason() {
        let c = cfg(0.0);
        let mut v = vm(
            200 * M,
            ages(1.0, 1.0, 0.0, None),
            ages(1.0, 1.0, 0.0, None),
        );
        v.slow.ages = None;
        assert!(view(&v, &c).unwrap_err().contains("tier slow has no ages"));
        v.slow.ages = Some(ages(1.0, 1.0, 0.0, None));
        let mut c10 = cfg(0.0);
        c10.working_set.hot_horizon = 10.0;
        let e = view(&v, &c10).unwrap_err();
        assert!(
            e.contains("10 s is not among tier dram's horizons (1 s, 60 s)"),
            "{e}"
        );
        v.hit = HitEvidence::Counted(0.5);
        assert!(view(&v, &c).unwrap_err().contains("PMU-counted"));
        v.hit = HitEvidence::default();
        if let Some(a) = v.dram.ages.as_mut() {
            a.horizons[0].bytes = None;
            a.horizons[0].why = "watched for 0 s".into();
        }
        let e = view(&v, &c).unwrap_err();
        assert!(e.contains("watched for 0 s"), "{e}");
    }
}
