//! Flat per-VM, per-tier rows built from a `StatsUpdate`, and their table,
//! JSON and CSV forms for `tierctl top --once`. The JSON form is described by
//! controller/tierctl/schema/top.schema.json.

use std::fmt::Write as _;

use serde::Serialize;
use tier_proto::human_bytes;
use tier_proto::v1::{Policy, StatsUpdate, TierKind, VmSource, VmStats};

use crate::signal;

/// One tier of one VM in one interval.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TierRow {
    pub vm_id: String,
    pub vm_name: String,
    pub vcpus: u32,
    pub tier: String,
    pub kind: &'static str,
    pub size_bytes: u64,
    pub resident_bytes: u64,
    pub balloon_target_bytes: u64,
    pub balloon_actual_bytes: u64,
    pub young_pages: u64,
    pub sampled_pages: u64,
    pub source: &'static str,
    /// Guest-reported accesses per second in the interval, if the guest reports.
    pub guest_accesses_per_s: Option<f64>,
    /// The VM's host-sampled DRAM-hit ratio (same on every row of a VM);
    /// None without accesses or where it is not measured
    /// (`dram_hit_not_measured`).
    pub dram_hit_ratio: Option<f64>,
    /// The DRAM share of the guest-reported accesses (ground truth where the
    /// guest reports; same on every row of a VM).
    pub guest_hit_ratio: Option<f64>,
    /// Host-sampled access estimate of the tier per second
    /// (`estimated_accesses` / interval); None before the first interval.
    pub accesses_per_s: Option<f64>,
    /// Half-width of the ~95 % interval of `dram_hit_ratio` from page
    /// sampling alone (same on every row); None beside an interval
    /// (`dram_hit_low`/`high` say what the estimate rests on) or where the
    /// ratio is not measured.
    pub dram_hit_error: Option<f64>,
    /// The controller's target for the VM, when it manages it.
    pub dram_hit_target: Option<f64>,
    /// Share of the tier's active pages young in the shortest pass; near
    /// 0.95 `accesses_per_s` counts pages, not touches. None when the passes
    /// cannot tell.
    pub rate_saturation: Option<f64>,
    /// Accesses per second the pmu source counted for the tier (scaled for
    /// multiplexing); None without the source or when not measured.
    pub pmu_events_per_s: Option<f64>,
    /// Why the pmu source does not measure the tier; None when it does or
    /// does not run.
    pub pmu_not_measured: Option<String>,
    /// Share of their enabled time the tier's PMU counters ran (below 1:
    /// multiplexed, counts scaled).
    pub pmu_running_ratio: Option<f64>,
    /// Why the host sampler has no reading of the VM this interval (same on
    /// every row of a VM); None when it was read or no sampler runs.
    pub not_measured: Option<String>,
    /// ~95 % interval of `dram_hit_ratio` (same on every row): model
    /// misfit and pages too hot to count included. None without one (older
    /// tierd, untimed passes, no accesses).
    pub dram_hit_low: Option<f64>,
    pub dram_hit_high: Option<f64>,
    /// That end is 0 (low) or 1 (high) only because a tier's accesses have
    /// no upper bound from accessed bits.
    pub dram_hit_low_open: bool,
    pub dram_hit_high_open: bool,
    /// DRAM-hit ratio the pmu source counted on every tier (exact; the
    /// controller acts on it); None unless every tier was counted.
    pub counted_dram_hit_ratio: Option<f64>,
    /// ~95 % interval of `accesses_per_s`; the high end None when open or
    /// without an interval.
    pub accesses_low_per_s: Option<f64>,
    pub accesses_high_per_s: Option<f64>,
    /// Accessed bits set no upper bound on the tier's accesses.
    pub accesses_high_open: bool,
    /// Pages (scaled to the tier) touched faster than the shortest pass
    /// resolves.
    pub saturated_pages: Option<f64>,
    /// Misfit of the per-page rate mixture in standard errors (below ~2
    /// fits); None without an interval.
    pub fit_misfit: Option<f64>,
    /// The sampler CPU budget's choice for the VM (same on every row; None
    /// from a tierd without a budget-keeping sampler): share of its pages
    /// sampled, passes run and per interval the allowance pays for, its
    /// allowance and spend in % of one core, and why it is limited.
    pub sampler_coverage: Option<f64>,
    pub sampler_passes: Option<u32>,
    pub sampler_passes_allowed: Option<f64>,
    pub sampler_budget_pct: Option<f64>,
    pub sampler_spent_pct: Option<f64>,
    pub sampler_limited: Option<String>,
    /// Working set per horizon (docs/working-set.md), keys
    /// `ws_<h>s_bytes`, `ws_<h>s_bytes_low`, `ws_<h>s_bytes_high`; null
    /// where the horizon is not measured this interval.
    #[serde(flatten)]
    pub ws: std::collections::BTreeMap<String, Option<f64>>,
    /// The horizons of `ws`, ascending (the CSV's column order).
    #[serde(skip)]
    pub ws_horizons: Vec<f64>,
    /// Bytes not touched within the longest horizon, with the interval.
    pub cold_bytes: Option<f64>,
    pub cold_bytes_low: Option<f64>,
    pub cold_bytes_high: Option<f64>,
    /// Promotion pressure, bytes per second, with the interval.
    pub promoted_bytes_per_s: Option<f64>,
    pub promoted_bytes_per_s_low: Option<f64>,
    pub promoted_bytes_per_s_high: Option<f64>,
    /// Seconds of history the ages rest on; None without ages.
    pub ages_history_s: Option<f64>,
    /// Why no horizon is measured; None when one is or without ages.
    pub ages_not_measured: Option<String>,
    /// What moves the VM's memory between tiers (same on every row):
    /// `tier-balloon`, `resize-zone`, `none`; None when no controller runs.
    pub actuator: Option<&'static str>,
    /// Why that actuator and what it cannot do, for humans.
    pub actuator_detail: Option<String>,
    /// The tier's virtio-mem part: region size, requested and plugged now
    /// (plugged None when the VMM does not report it), and whether the
    /// region is attributed to the tier; all None without one.
    pub hotplug_region_bytes: Option<u64>,
    pub hotplug_requested_bytes: Option<u64>,
    pub hotplug_plugged_bytes: Option<u64>,
    pub hotplug_attributed: Option<bool>,
    /// Why the accessed-bit DRAM-hit estimate is not measured (its interval
    /// spans 0-100 %; same on every row); `dram_hit_ratio` and its
    /// interval are then null.
    pub dram_hit_not_measured: Option<String>,
    /// Of the bytes the VM touched within `hot_set_horizon_s`, the share in
    /// DRAM, with its ~95 % interval (same on every row): what accessed
    /// bits measure of the split; null where no horizon is measured on
    /// every tier or the interval spans 0-100 %.
    pub hot_set_dram_share: Option<f64>,
    pub hot_set_dram_share_low: Option<f64>,
    pub hot_set_dram_share_high: Option<f64>,
    pub hot_set_horizon_s: Option<f64>,
    /// True: the horizon is the interval's longest pass, not a working-set
    /// horizon (where those do not bound the share).
    pub hot_set_from_pass: Option<bool>,
    /// Bytes touched within that horizon, all tiers (same on every row).
    pub hot_set_bytes: Option<f64>,
    /// This tier's bytes touched within that horizon.
    pub hot_set_tier_bytes: Option<f64>,
    /// Which signal the controller steers the VM by under the policy in
    /// force: `pmu`, `hot-set`, `bits-ratio` or `none`; null when the
    /// policy could not be read.
    pub signal: Option<&'static str>,
}

/// tierd's default `[sampler] ws_horizons_s`: CSV columns always present.
pub const DEFAULT_WS_HORIZONS: [f64; 4] = [1.0, 10.0, 60.0, 600.0];

/// The `ws_*` keys of a horizon.
pub fn ws_keys(h: f64) -> [String; 3] {
    [
        format!("ws_{h}s_bytes"),
        format!("ws_{h}s_bytes_low"),
        format!("ws_{h}s_bytes_high"),
    ]
}

fn ws_fields(
    a: Option<&tier_proto::v1::TierAges>,
) -> std::collections::BTreeMap<String, Option<f64>> {
    let mut out = std::collections::BTreeMap::new();
    for w in a.map(|a| a.working_set.as_slice()).unwrap_or_default() {
        let m = w.not_measured.is_empty();
        for (k, v) in
            ws_keys(w.horizon_seconds)
                .into_iter()
                .zip([w.bytes, w.bytes_low, w.bytes_high])
        {
            out.insert(k, m.then_some(v));
        }
    }
    out
}

/// The actuator's short name, None when unspecified (no controller).
pub fn actuator_name(a: tier_proto::v1::Actuator) -> Option<&'static str> {
    use tier_proto::v1::Actuator;
    match a {
        Actuator::Unspecified => None,
        Actuator::None => Some("none"),
        Actuator::TierBalloon => Some("tier-balloon"),
        Actuator::ResizeZone => Some("resize-zone"),
    }
}

/// The DRAM-hit ratio as `top` and the table show it: `34-71 %`, `≥34 %`
/// (no upper bound), `≤71 %` (no lower bound), `n/m` (0-100 %: not
/// measured; an older tierd's `0-100 % ?` with both ends open too),
/// `66.7 % pmu` (counted on every tier), `~34.3 %` (a point without an
/// interval: an older tierd; `long` says `34.3 % (no interval)`), `-`
/// without accesses. Never `±0.0`.
pub fn hit_range(s: &VmStats, long: bool) -> String {
    if let Some(c) = s.counted_dram_hit_ratio {
        return format!("{:.1} % pmu", c * 100.0);
    }
    if !s.has_accesses {
        return "-".into();
    }
    if signal::ratio_not_measured(s).is_some() {
        return "n/m".into();
    }
    match (s.dram_hit_low, s.dram_hit_high) {
        (Some(lo), Some(hi)) => range(lo, hi, s.dram_hit_low_open, s.dram_hit_high_open),
        _ if long => format!("{:.1} % (no interval)", s.dram_hit_ratio * 100.0),
        _ => format!("~{:.1} %", s.dram_hit_ratio * 100.0),
    }
}

/// `34-71 %`; one decimal when the ends are within 5 points.
fn range(lo: f64, hi: f64, lo_open: bool, hi_open: bool) -> String {
    let d = if hi - lo < 0.05 { 1 } else { 0 };
    let p = |v: f64| format!("{:.d$}", v * 100.0);
    match (lo_open, hi_open) {
        (true, true) => "0-100 % ?".into(),
        (false, true) => format!("≥{} %", p(lo)),
        (true, false) => format!("≤{} %", p(hi)),
        (false, false) => format!("{}-{} %", p(lo), p(hi)),
    }
}

/// DRAM share of guest-reported accesses, if the guest reported any.
pub fn guest_hit(vm: &tier_proto::v1::Vm, reported: &[u64]) -> Option<f64> {
    let total: u64 = reported.iter().sum();
    if total == 0 || reported.len() != vm.tiers.len() {
        return None;
    }
    let dram: u64 = vm
        .tiers
        .iter()
        .zip(reported)
        .filter(|(t, _)| t.kind() == TierKind::Dram)
        .map(|(_, a)| a)
        .sum();
    Some(dram as f64 / total as f64)
}

/// Rows of every VM in the update, in VM order then tier order, without
/// the policy (`signal` null).
pub fn rows(update: &StatsUpdate) -> Vec<TierRow> {
    rows_for(update, None)
}

/// Rows of every VM in the update, with the signal each is steered by
/// under `policy`.
pub fn rows_for(update: &StatsUpdate, policy: Option<&Policy>) -> Vec<TierRow> {
    let secs = update.interval_ns as f64 / 1e9;
    let mut out = Vec::new();
    for vm in &update.vms {
        let stats = update.stats.iter().find(|s| s.vm_id == vm.id);
        let guest_hit_ratio = stats.and_then(|s| guest_hit(vm, &s.guest_reported_accesses));
        let ratio_nm = stats.and_then(signal::ratio_not_measured);
        let hot = stats.and_then(signal::hot_set);
        let steer = stats
            .zip(policy)
            .and_then(|(s, p)| signal::mode_of(p, &vm.id, &vm.name).map(|m| signal::steer(s, m)));
        let interval = stats
            .filter(|s| s.has_accesses && ratio_nm.is_none())
            .and_then(|s| {
                let (lo, hi) = (s.dram_hit_low?, s.dram_hit_high?);
                Some((lo, hi, s.dram_hit_low_open, s.dram_hit_high_open))
            });
        let budget = stats.and_then(|s| s.sampler_budget.as_ref());
        for (i, tier) in vm.tiers.iter().enumerate() {
            let sample = stats.and_then(|s| s.tiers.iter().find(|t| t.tier == tier.name));
            let pmu = sample.and_then(pmu_source);
            let ages = sample.and_then(|s| s.ages.as_ref());
            let guest = stats
                .and_then(|s| s.guest_reported_accesses.get(i))
                .filter(|_| secs > 0.0)
                .map(|&a| a as f64 / secs);
            out.push(TierRow {
                vm_id: vm.id.clone(),
                vm_name: vm.name.clone(),
                vcpus: vm.vcpus,
                tier: tier.name.clone(),
                kind: TierKind::try_from(tier.kind)
                    .unwrap_or(TierKind::Unknown)
                    .short_name(),
                size_bytes: tier.size_bytes,
                resident_bytes: sample.map_or(0, |s| s.resident_bytes),
                balloon_target_bytes: sample.map_or(0, |s| s.balloon_target_bytes),
                balloon_actual_bytes: sample.map_or(0, |s| s.balloon_actual_bytes),
                young_pages: sample.map_or(0, |s| s.young_pages),
                sampled_pages: sample.map_or(0, |s| s.sampled_pages),
                source: sample.map_or("-", |s| s.source().short_name()),
                guest_accesses_per_s: guest,
                dram_hit_ratio: stats
                    .filter(|s| s.has_accesses && ratio_nm.is_none())
                    .map(|s| s.dram_hit_ratio),
                guest_hit_ratio,
                accesses_per_s: sample
                    .filter(|_| secs > 0.0)
                    .map(|s| s.estimated_accesses / secs),
                dram_hit_error: stats
                    .filter(|s| s.has_accesses && ratio_nm.is_none() && s.dram_hit_low.is_none())
                    .map(|s| s.dram_hit_error),
                dram_hit_target: stats.and_then(|s| s.dram_hit_target),
                rate_saturation: sample.and_then(|s| s.saturation),
                pmu_events_per_s: pmu
                    .filter(|p| p.not_measured.is_empty())
                    .and_then(|p| pmu_rate(p, secs)),
                pmu_not_measured: pmu
                    .filter(|p| !p.not_measured.is_empty())
                    .map(|p| p.not_measured.clone()),
                pmu_running_ratio: pmu
                    .filter(|p| p.not_measured.is_empty())
                    .map(|p| p.running_ratio),
                not_measured: stats
                    .filter(|s| !s.not_measured.is_empty())
                    .map(|s| s.not_measured.clone()),
                dram_hit_low: interval.map(|s| s.0),
                dram_hit_high: interval.map(|s| s.1),
                dram_hit_low_open: interval.is_some_and(|s| s.2),
                dram_hit_high_open: interval.is_some_and(|s| s.3),
                counted_dram_hit_ratio: stats.and_then(|s| s.counted_dram_hit_ratio),
                accesses_low_per_s: sample
                    .filter(|_| secs > 0.0)
                    .and_then(|s| s.accesses_low)
                    .map(|v| v / secs),
                accesses_high_per_s: sample
                    .filter(|s| secs > 0.0 && s.accesses_low.is_some() && !s.accesses_high_open)
                    .and_then(|s| s.accesses_high)
                    .map(|v| v / secs),
                accesses_high_open: sample
                    .is_some_and(|s| s.accesses_low.is_some() && s.accesses_high_open),
                saturated_pages: sample.map(|s| s.saturated_pages),
                fit_misfit: sample.and_then(|s| s.fit_misfit),
                sampler_coverage: budget.map(|b| b.coverage),
                sampler_passes: budget.map(|b| b.passes),
                sampler_passes_allowed: budget.map(|b| b.passes_allowed),
                sampler_budget_pct: budget.map(|b| b.budget_pct),
                sampler_spent_pct: budget.map(|b| b.spent_pct),
                sampler_limited: budget
                    .filter(|b| !b.limited.is_empty())
                    .map(|b| b.limited.clone()),
                ws: ws_fields(ages),
                ws_horizons: ages.map_or_else(Vec::new, |a| {
                    a.working_set.iter().map(|w| w.horizon_seconds).collect()
                }),
                cold_bytes: ages.and_then(|a| a.cold_bytes),
                cold_bytes_low: ages.and_then(|a| a.cold_bytes_low),
                cold_bytes_high: ages.and_then(|a| a.cold_bytes_high),
                promoted_bytes_per_s: ages.and_then(|a| a.promoted_bytes_per_s),
                promoted_bytes_per_s_low: ages.and_then(|a| a.promoted_bytes_per_s_low),
                promoted_bytes_per_s_high: ages.and_then(|a| a.promoted_bytes_per_s_high),
                ages_history_s: ages.map(|a| a.history_seconds),
                ages_not_measured: ages
                    .filter(|a| !a.not_measured.is_empty())
                    .map(|a| a.not_measured.clone()),
                actuator: stats.and_then(|s| actuator_name(s.actuator())),
                actuator_detail: stats
                    .filter(|s| !s.actuator_detail.is_empty())
                    .map(|s| s.actuator_detail.clone()),
                hotplug_region_bytes: tier.hotplug.map(|h| h.region_bytes),
                hotplug_requested_bytes: sample.and_then(|s| s.hotplug_requested_bytes),
                hotplug_plugged_bytes: sample.and_then(|s| s.hotplug_plugged_bytes),
                hotplug_attributed: tier.hotplug.map(|h| h.region_attributed),
                dram_hit_not_measured: ratio_nm.clone(),
                hot_set_dram_share: hot.map(|h| h.share),
                hot_set_dram_share_low: hot.map(|h| h.share_low),
                hot_set_dram_share_high: hot.map(|h| h.share_high),
                hot_set_horizon_s: hot.map(|h| h.horizon_seconds),
                hot_set_from_pass: hot.map(|h| h.from_pass),
                hot_set_bytes: hot.map(|h| h.hot_bytes),
                hot_set_tier_bytes: hot.zip(stats).and_then(|(h, s)| {
                    let at = s.tiers.iter().position(|t| t.tier == tier.name)?;
                    h.tier_bytes.get(at).copied()
                }),
                signal: steer,
            });
        }
    }
    out
}

/// The pmu source's count of a tier, if it ran for the VM.
pub fn pmu_source(s: &tier_proto::v1::TierSample) -> Option<&tier_proto::v1::SourceCount> {
    s.sources
        .iter()
        .find(|c| c.source() == tier_proto::v1::Backend::Pmu)
}

/// Events per second of a pmu count over the span it covers (the
/// update's interval when the source does not say).
pub fn pmu_rate(p: &tier_proto::v1::SourceCount, interval_s: f64) -> Option<f64> {
    let span = if p.seconds > 0.0 {
        p.seconds
    } else {
        interval_s
    };
    (span > 0.0).then(|| p.events as f64 / span)
}

/// Rates as 188.2k, 3.1M, 950.
pub fn rate(r: Option<f64>) -> String {
    match r {
        Some(r) if r >= 1e6 => format!("{:.1}M", r / 1e6),
        Some(r) if r >= 1e3 => format!("{:.1}k", r / 1e3),
        Some(r) => format!("{r:.0}"),
        None => "-".into(),
    }
}

const HEADER: [&str; 15] = [
    "VM",
    "VCPU",
    "TIER",
    "KIND",
    "SIZE",
    "RESIDENT",
    "BALLOON T/A",
    "YOUNG/SAMPLED",
    "SOURCE",
    "GUEST ACC/s",
    "HOT SET",
    "DRAM SHARE",
    "STEER",
    "DRAM-HIT",
    "GUEST-HIT",
];

/// The VM's headline: the PMU's count where it counted every tier, else
/// the hot-set share accessed bits measure, else `n/m`.
fn headline(r: &TierRow) -> String {
    match (
        r.counted_dram_hit_ratio,
        r.hot_set_dram_share_low,
        r.hot_set_dram_share_high,
    ) {
        (Some(c), _, _) => format!("{:.1} % pmu", c * 100.0),
        (None, Some(lo), Some(hi)) => format!(
            "{} ({})",
            signal::hot_text(&tier_proto::v1::HotSetShare {
                share: r.hot_set_dram_share.unwrap_or(lo),
                share_low: lo,
                share_high: hi,
                ..Default::default()
            }),
            signal::horizon(
                r.hot_set_horizon_s.unwrap_or_default(),
                r.hot_set_from_pass.unwrap_or(false)
            )
        ),
        _ => "n/m".into(),
    }
}

/// Aligned plain-text table; VM columns only on a VM's first row. VMs
/// whose DRAM-HIT is `n/m` get the reason below the table.
pub fn table(rows: &[TierRow]) -> String {
    let mut cells: Vec<[String; 15]> = Vec::with_capacity(rows.len());
    let mut notes = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let first = i == 0 || rows[i - 1].vm_id != r.vm_id;
        let vm = if first {
            r.vm_name.clone()
        } else {
            String::new()
        };
        let vcpu = if first {
            r.vcpus.to_string()
        } else {
            String::new()
        };
        let pct = |v: Option<f64>| match (first, v) {
            (true, Some(h)) => format!("{:.1}%", h * 100.0),
            (true, None) => "-".into(),
            (false, _) => String::new(),
        };
        let hit = match (first, stats_of(r)) {
            (true, Some(s)) => hit_range(&s, true),
            (true, None) if r.dram_hit_not_measured.is_some() => "n/m".into(),
            (true, None) => "-".into(),
            (false, _) => String::new(),
        };
        if let Some(why) = r.dram_hit_not_measured.as_ref().filter(|_| first) {
            notes.push(format!("{}: DRAM-HIT not measured: {why}", r.vm_name));
        }
        let vm_only = |s: String| if first { s } else { String::new() };
        let guest_hit = pct(r.guest_hit_ratio);
        let young = if r.sampled_pages == 0 {
            "-".into()
        } else {
            format!("{}/{}", r.young_pages, r.sampled_pages)
        };
        cells.push([
            vm,
            vcpu,
            r.tier.clone(),
            r.kind.into(),
            human_bytes(r.size_bytes),
            human_bytes(r.resident_bytes),
            format!(
                "{}/{}",
                human_bytes(r.balloon_target_bytes),
                human_bytes(r.balloon_actual_bytes)
            ),
            young,
            r.source.into(),
            rate(r.guest_accesses_per_s),
            r.hot_set_tier_bytes
                .map_or("-".into(), |b| human_bytes(b.max(0.0) as u64)),
            vm_only(headline(r)),
            vm_only(r.signal.unwrap_or("?").into()),
            hit,
            guest_hit,
        ]);
    }
    let mut width = HEADER.map(str::len);
    for row in &cells {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cols: &[String]| {
        let joined: Vec<String> = cols
            .iter()
            .zip(width)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", joined.join("  ").trim_end());
    };
    line(&mut out, &HEADER.map(String::from));
    for row in &cells {
        line(&mut out, row);
    }
    for n in notes {
        let _ = writeln!(out, "{n}");
    }
    out
}

/// The VM-level fields of a row, as `hit_range` reads them.
fn stats_of(r: &TierRow) -> Option<VmStats> {
    let any = r.dram_hit_ratio.is_some() || r.counted_dram_hit_ratio.is_some();
    any.then(|| VmStats {
        has_accesses: r.dram_hit_ratio.is_some(),
        dram_hit_ratio: r.dram_hit_ratio.unwrap_or(0.0),
        dram_hit_low: r.dram_hit_low,
        dram_hit_high: r.dram_hit_high,
        dram_hit_low_open: r.dram_hit_low_open,
        dram_hit_high_open: r.dram_hit_high_open,
        counted_dram_hit_ratio: r.counted_dram_hit_ratio,
        ..Default::default()
    })
}

/// CSV with a header row; numbers unformatted.
pub fn csv(rows: &[TierRow]) -> String {
    let mut out = String::from(
        "vm_id,vm_name,vcpus,tier,kind,size_bytes,resident_bytes,balloon_target_bytes,balloon_actual_bytes,young_pages,sampled_pages,source,guest_accesses_per_s,dram_hit_ratio,guest_hit_ratio,accesses_per_s,dram_hit_error,dram_hit_target,rate_saturation,pmu_events_per_s,pmu_not_measured,pmu_running_ratio,not_measured,dram_hit_low,dram_hit_high,dram_hit_low_open,dram_hit_high_open,counted_dram_hit_ratio,accesses_low_per_s,accesses_high_per_s,accesses_high_open,saturated_pages,fit_misfit,sampler_coverage,sampler_passes,sampler_passes_allowed,sampler_budget_pct,sampler_spent_pct,sampler_limited,actuator,actuator_detail,hotplug_region_bytes,hotplug_requested_bytes,hotplug_plugged_bytes,hotplug_attributed,cold_bytes,cold_bytes_low,cold_bytes_high,promoted_bytes_per_s,promoted_bytes_per_s_low,promoted_bytes_per_s_high,ages_history_s,ages_not_measured,dram_hit_not_measured,hot_set_dram_share,hot_set_dram_share_low,hot_set_dram_share_high,hot_set_horizon_s,hot_set_from_pass,hot_set_bytes,hot_set_tier_bytes,signal",
    );
    // One column triple per horizon, ascending: tierd's default horizons
    // always (a stream prints one header, before any VM may have ages),
    // and any other a row has.
    let mut horizons: Vec<f64> = DEFAULT_WS_HORIZONS
        .iter()
        .copied()
        .chain(rows.iter().flat_map(|r| r.ws_horizons.iter().copied()))
        .collect();
    horizons.sort_by(f64::total_cmp);
    horizons.dedup();
    for h in &horizons {
        for k in ws_keys(*h) {
            out.push(',');
            out.push_str(&k);
        }
    }
    out.push('\n');
    let opt = |v: Option<f64>| v.map(|x| format!("{x}")).unwrap_or_default();
    let int = |v: Option<u64>| v.map(|x| x.to_string()).unwrap_or_default();
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            csv_field(&r.vm_id),
            csv_field(&r.vm_name),
            r.vcpus,
            csv_field(&r.tier),
            r.kind,
            r.size_bytes,
            r.resident_bytes,
            r.balloon_target_bytes,
            r.balloon_actual_bytes,
            r.young_pages,
            r.sampled_pages,
            r.source,
            opt(r.guest_accesses_per_s),
            opt(r.dram_hit_ratio),
            opt(r.guest_hit_ratio),
            opt(r.accesses_per_s),
            opt(r.dram_hit_error),
            opt(r.dram_hit_target),
            opt(r.rate_saturation),
            opt(r.pmu_events_per_s),
            csv_field(r.pmu_not_measured.as_deref().unwrap_or_default()),
            opt(r.pmu_running_ratio),
            csv_field(r.not_measured.as_deref().unwrap_or_default()),
            opt(r.dram_hit_low),
            opt(r.dram_hit_high),
            r.dram_hit_low_open,
            r.dram_hit_high_open,
            opt(r.counted_dram_hit_ratio),
            opt(r.accesses_low_per_s),
            opt(r.accesses_high_per_s),
            r.accesses_high_open,
            opt(r.saturated_pages),
            opt(r.fit_misfit),
            opt(r.sampler_coverage),
            r.sampler_passes.map(|p| p.to_string()).unwrap_or_default(),
            opt(r.sampler_passes_allowed),
            opt(r.sampler_budget_pct),
            opt(r.sampler_spent_pct),
            csv_field(r.sampler_limited.as_deref().unwrap_or_default()),
            r.actuator.unwrap_or_default(),
            csv_field(r.actuator_detail.as_deref().unwrap_or_default()),
            int(r.hotplug_region_bytes),
            int(r.hotplug_requested_bytes),
            int(r.hotplug_plugged_bytes),
            r.hotplug_attributed
                .map(|b| b.to_string())
                .unwrap_or_default(),
        );
        // The line's newline goes after the ages.
        out.pop();
        let _ = write!(
            out,
            ",{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            opt(r.cold_bytes),
            opt(r.cold_bytes_low),
            opt(r.cold_bytes_high),
            opt(r.promoted_bytes_per_s),
            opt(r.promoted_bytes_per_s_low),
            opt(r.promoted_bytes_per_s_high),
            opt(r.ages_history_s),
            csv_field(r.ages_not_measured.as_deref().unwrap_or_default()),
            csv_field(r.dram_hit_not_measured.as_deref().unwrap_or_default()),
            opt(r.hot_set_dram_share),
            opt(r.hot_set_dram_share_low),
            opt(r.hot_set_dram_share_high),
            opt(r.hot_set_horizon_s),
            r.hot_set_from_pass
                .map(|b| b.to_string())
                .unwrap_or_default(),
            opt(r.hot_set_bytes),
            opt(r.hot_set_tier_bytes),
            r.signal.unwrap_or_default(),
        );
        for h in &horizons {
            for k in ws_keys(*h) {
                let _ = write!(out, ",{}", opt(r.ws.get(&k).copied().flatten()));
            }
        }
        out.push('\n');
    }
    out
}

/// How tierd found a VM, short.
pub fn source_name(s: VmSource) -> &'static str {
    match s {
        VmSource::Unspecified => "-",
        VmSource::CloudHypervisor => "cloud-hypervisor",
        VmSource::KvmFd => "kvm-fd",
        VmSource::Demo => "demo",
        VmSource::Qemu => "qemu",
    }
}

/// One update as the JSON object `top --output json` prints per line.
pub fn update_json(update: &StatsUpdate) -> serde_json::Value {
    update_json_for(update, None)
}

/// `update_json` with each row's `signal` under `policy`.
pub fn update_json_for(update: &StatsUpdate, policy: Option<&Policy>) -> serde_json::Value {
    serde_json::json!({
        "sequence": update.sequence,
        "timestamp_unix_ns": update.timestamp_unix_ns,
        "interval_ns": update.interval_ns,
        "vm_count": update.vms.len(),
        "rows": rows_for(update, policy),
        "departed_vm_ids": update.departed_vm_ids,
    })
}

/// A VM's identity and tier map as JSON (`tierctl vm`, `vms --output json`).
pub fn vm_json(vm: &tier_proto::v1::Vm) -> serde_json::Value {
    let tiers: Vec<serde_json::Value> = vm
        .tiers
        .iter()
        .map(|t| {
            serde_json::json!({
                "name": t.name,
                "kind": TierKind::try_from(t.kind).unwrap_or(TierKind::Unknown).short_name(),
                "host_numa_nodes": t.host_numa_nodes,
                "size_bytes": t.size_bytes,
                "ranges": t.ranges.iter().map(|r| serde_json::json!({
                    "gpa_start": format!("{:#x}", r.gpa_start),
                    "length": r.length,
                    "hva_start": format!("{:#x}", r.hva_start),
                })).collect::<Vec<_>>(),
                "derivation": t.derivation,
            })
        })
        .collect();
    serde_json::json!({
        "id": vm.id, "name": vm.name, "vmm_pid": vm.vmm_pid, "api_socket": vm.api_socket,
        "vcpus": vm.vcpus, "source": source_name(vm.source()), "tiers": tiers,
    })
}

/// Quotes a field when it holds a comma, quote or newline (RFC 4180).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tier_proto::v1::{GpaRange, Tier, TierSample, Vm, VmStats};

    fn update() -> StatsUpdate {
        let tier = |name: &str, kind: TierKind| Tier {
            name: name.into(),
            kind: kind as i32,
            size_bytes: 16 << 20,
            ranges: vec![GpaRange {
                gpa_start: 0,
                length: 16 << 20,
                hva_start: 0,
            }],
            ..Default::default()
        };
        StatsUpdate {
            sequence: 3,
            interval_ns: 500_000_000,
            vms: vec![Vm {
                id: "demo:1".into(),
                name: "demo, one".into(),
                vcpus: 1,
                tiers: vec![tier("dram", TierKind::Dram), tier("slow", TierKind::Cxl)],
                ..Default::default()
            }],
            stats: vec![VmStats {
                vm_id: "demo:1".into(),
                tiers: vec![
                    TierSample {
                        tier: "dram".into(),
                        resident_bytes: 2 << 20,
                        ..Default::default()
                    },
                    TierSample {
                        tier: "slow".into(),
                        resident_bytes: 1 << 20,
                        ..Default::default()
                    },
                ],
                guest_reported_accesses: vec![1000, 250],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn rows_join_vm_tiers_and_stats() {
        let r = rows(&update());
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].tier.as_str(), r[0].kind), ("dram", "dram"));
        assert_eq!((r[1].tier.as_str(), r[1].kind), ("slow", "cxl"));
        assert_eq!(r[1].resident_bytes, 1 << 20);
        // 250 accesses in 0.5 s.
        assert_eq!(r[1].guest_accesses_per_s, Some(500.0));
        assert_eq!(r[0].dram_hit_ratio, None);
        // 1000 of 1250 guest-reported accesses hit the dram tier.
        assert_eq!(r[0].guest_hit_ratio, Some(0.8));
        assert_eq!(r[1].guest_hit_ratio, Some(0.8));
    }

    #[test]
    fn table_shows_vm_once_and_aligns() {
        let t = table(&rows(&update()));
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("VM"));
        assert!(
            lines[1].starts_with("demo, one")
                && lines[1].contains("dram")
                && lines[1].contains("2.0M")
        );
        assert!(lines[2].starts_with(' ') && lines[2].contains("slow") && lines[2].contains("cxl"));
        let col = |l: &str| l.find("dram").or_else(|| l.find("slow")).unwrap();
        assert_eq!(col(lines[1]), col(lines[2]));
    }

    #[test]
    fn csv_has_header_and_quotes() {
        let c = csv(&rows(&update()));
        let mut lines = c.lines();
        assert!(
            lines
                .next()
                .unwrap()
                .starts_with("vm_id,vm_name,vcpus,tier")
        );
        let first = lines.next().unwrap();
        assert!(
            first.starts_with("demo:1,\"demo, one\",1,dram,dram,16777216,2097152"),
            "{first}"
        );
        assert_eq!(c.lines().count(), 3);
    }

    #[test]
    fn hit_ranges_mark_open_ends_and_never_say_plus_minus_zero() {
        let s = |lo: Option<f64>, hi: Option<f64>, lo_open, hi_open| VmStats {
            has_accesses: true,
            dram_hit_ratio: 0.343,
            dram_hit_low: lo,
            dram_hit_high: hi,
            dram_hit_low_open: lo_open,
            dram_hit_high_open: hi_open,
            ..Default::default()
        };
        let r = |st: &VmStats| hit_range(st, false);
        assert_eq!(r(&s(Some(0.34), Some(0.71), false, false)), "34-71 %");
        assert_eq!(r(&s(Some(0.34), Some(1.0), false, true)), "≥34 %");
        assert_eq!(r(&s(Some(0.0), Some(0.71), true, false)), "≤71 %");
        // 0-100 %: not measured, never a number.
        assert_eq!(r(&s(Some(0.0), Some(1.0), true, true)), "n/m");
        assert_eq!(r(&s(Some(0.0), Some(1.0), false, false)), "n/m");
        assert_eq!(r(&s(Some(0.892), Some(0.901), false, false)), "89.2-90.1 %");
        // An older tierd: a point, marked, never "±0.0".
        let old = s(None, None, false, false);
        assert_eq!(r(&old), "~34.3 %");
        assert_eq!(hit_range(&old, true), "34.3 % (no interval)");
        let counted = VmStats {
            counted_dram_hit_ratio: Some(0.667),
            ..old.clone()
        };
        assert_eq!(r(&counted), "66.7 % pmu");
        let quiet = VmStats {
            has_accesses: false,
            ..old
        };
        assert_eq!(r(&quiet), "-");
    }

    #[test]
    fn ws_fields_per_horizon_in_json_and_csv() {
        let mut u = update();
        let ws = |h: f64, b: f64, why: &str| tier_proto::v1::WorkingSet {
            horizon_seconds: h,
            bytes: b,
            bytes_low: b - 1.0,
            bytes_high: b + 1.0,
            not_measured: why.into(),
        };
        u.stats[0].tiers[0].ages = Some(tier_proto::v1::TierAges {
            working_set: vec![ws(1.0, 4096.0, ""), ws(10.0, 0.0, "watched for 3 s of 10s")],
            cold_bytes: None,
            history_seconds: 3.0,
            ..Default::default()
        });
        let r = rows(&u);
        assert_eq!(r[0].ws.get("ws_1s_bytes_low"), Some(&Some(4095.0)));
        assert_eq!(r[0].ws.get("ws_10s_bytes"), Some(&None));
        assert!(r[1].ws.is_empty());
        let j = serde_json::to_value(&r[0]).unwrap();
        assert_eq!(j["ws_1s_bytes_high"], 4097.0);
        assert!(j["ws_10s_bytes"].is_null());
        assert_eq!(j["ages_history_s"], 3.0);
        let c = csv(&r);
        let header: Vec<&str> = c.lines().next().unwrap().split(',').collect();
        let at = header.iter().position(|h| *h == "ws_1s_bytes").unwrap();
        assert_eq!(header.len() - at, 12, "{header:?}");
        assert_eq!(
            &header[at..at + 6],
            [
                "ws_1s_bytes",
                "ws_1s_bytes_low",
                "ws_1s_bytes_high",
                "ws_10s_bytes",
                "ws_10s_bytes_low",
                "ws_10s_bytes_high"
            ]
        );
        let first: Vec<&str> = c.lines().nth(1).unwrap().split(',').collect();
        // The VM name's quoted comma splits once more.
        assert_eq!(first.len(), header.len() + 1);
        assert_eq!(&first[at + 1..at + 7], ["4096", "4095", "4097", "", "", ""]);
    }

    #[test]
    fn rows_carry_the_intervals() {
        let mut u = update();
        let st = &mut u.stats[0];
        st.has_accesses = true;
        st.dram_hit_ratio = 0.343;
        (st.dram_hit_low, st.dram_hit_high) = (Some(0.34), Some(1.0));
        st.dram_hit_high_open = true;
        st.tiers[0].accesses_low = Some(100.0);
        st.tiers[0].accesses_high = Some(500.0);
        st.tiers[0].accesses_high_open = true;
        st.tiers[0].saturated_pages = 12.0;
        st.tiers[0].fit_misfit = Some(1.5);
        st.tiers[1].accesses_low = Some(40.0);
        st.tiers[1].accesses_high = Some(90.0);
        let r = rows(&u);
        assert_eq!(
            (r[0].dram_hit_low, r[0].dram_hit_high),
            (Some(0.34), Some(1.0))
        );
        assert!(r[1].dram_hit_high_open && !r[1].dram_hit_low_open);
        // Per second over 0.5 s; an open end is null, never a number.
        assert_eq!(r[0].accesses_low_per_s, Some(200.0));
        assert_eq!(r[0].accesses_high_per_s, None);
        assert!(r[0].accesses_high_open);
        assert_eq!(r[1].accesses_high_per_s, Some(180.0));
        assert_eq!(
            (r[0].saturated_pages, r[0].fit_misfit),
            (Some(12.0), Some(1.5))
        );
        let t = table(&r);
        assert!(t.lines().nth(1).unwrap().contains("≥34 %"), "{t}");
        let c = csv(&r);
        let fields = |l: &str| l.split(',').count();
        let header = c.lines().next().unwrap();
        assert!(header.contains(
            "saturated_pages,fit_misfit,sampler_coverage,sampler_passes,sampler_passes_allowed,sampler_budget_pct,sampler_spent_pct,sampler_limited,actuator,actuator_detail,hotplug_region_bytes,hotplug_requested_bytes,hotplug_plugged_bytes,hotplug_attributed"
        ));
        // Without ages: the ages' columns, the default horizons' empty.
        assert!(
            header.ends_with("ages_not_measured,dram_hit_not_measured,hot_set_dram_share,hot_set_dram_share_low,hot_set_dram_share_high,hot_set_horizon_s,hot_set_from_pass,hot_set_bytes,hot_set_tier_bytes,signal,ws_1s_bytes,ws_1s_bytes_low,ws_1s_bytes_high,ws_10s_bytes,ws_10s_bytes_low,ws_10s_bytes_high,ws_60s_bytes,ws_60s_bytes_low,ws_60s_bytes_high,ws_600s_bytes,ws_600s_bytes_low,ws_600s_bytes_high"),
            "{header}"
        );
        // Row 1 has a quoted comma in the VM name: one more split.
        assert_eq!(fields(c.lines().nth(2).unwrap()), fields(header) + 1);
        assert!(
            c.lines()
                .nth(1)
                .unwrap()
                .contains(",true,,200,,true,12,1.5,,,,,,,,,,,,"),
            "{c}"
        );
        // The sampler budget's choice, the VM's on every row of it.
        u.stats[0].sampler_budget = Some(tier_proto::v1::SamplerBudget {
            coverage: 0.25,
            stride: 4,
            passes: 3,
            slots: 5,
            passes_allowed: 3.5,
            budget_pct: 0.5,
            spent_pct: 0.4,
            limited: "stride 4, to fit".into(),
        });
        let r = rows(&u);
        for row in &r[..2] {
            assert_eq!(
                (
                    row.sampler_coverage,
                    row.sampler_passes,
                    row.sampler_passes_allowed
                ),
                (Some(0.25), Some(3), Some(3.5))
            );
            assert_eq!(
                (row.sampler_budget_pct, row.sampler_spent_pct),
                (Some(0.5), Some(0.4))
            );
            assert_eq!(row.sampler_limited.as_deref(), Some("stride 4, to fit"));
        }
        let c = csv(&r);
        assert!(
            c.lines()
                .nth(1)
                .unwrap()
                .contains(",0.25,3,3.5,0.5,0.4,\"stride 4, to fit\",,,,,,"),
            "{c}"
        );
        // The actuator (the VM's) and a virtio-mem tier's sizes (docs/virtio-mem.md).
        u.stats[0].actuator = tier_proto::v1::Actuator::ResizeZone as i32;
        u.stats[0].actuator_detail = "zone resize, plugged unknown".into();
        u.vms[0].tiers[0].hotplug = Some(tier_proto::v1::TierHotplug {
            boot_bytes: 8,
            region_bytes: 24,
            block_bytes: 2,
            region_attributed: false,
        });
        u.stats[0].tiers[0].hotplug_requested_bytes = Some(16);
        let r = rows(&u);
        assert_eq!(r[0].actuator, Some("resize-zone"));
        assert_eq!(r[1].actuator, Some("resize-zone"));
        assert_eq!(
            (
                r[0].hotplug_region_bytes,
                r[0].hotplug_requested_bytes,
                r[0].hotplug_plugged_bytes,
                r[0].hotplug_attributed
            ),
            (Some(24), Some(16), None, Some(false))
        );
        assert_eq!(r[1].hotplug_region_bytes, None);
        let c = csv(&r);
        assert!(
            c.lines()
                .nth(1)
                .unwrap()
                .contains(",resize-zone,\"zone resize, plugged unknown\",24,16,,false"),
            "{c}"
        );
    }
}
