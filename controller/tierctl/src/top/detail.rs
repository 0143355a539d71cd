//! The detail pane of one VM: identity, hit ratio against target, the last
//! decision, the latest numbers per tier, a minute of them as sparklines,
//! and the heat histogram when a backend gives one.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};
use tier_proto::human_bytes;
use tier_proto::v1::{DecisionOutcome, TierKind};

use super::age_bars::age_line;
use super::app::App;
use super::evidence::{estimate_line, hot_set_line, tier_estimate};
use super::format::{action, ago, delta, delta_style, pct, spark};
use super::model::{VmView, WINDOW_NS};

/// Saturation at tierd's fit cap (1 - e^-3, docs/estimate.md): the tier's
/// touches are no longer counted, only its pages.
const SATURATED: f64 = 0.95;
use crate::view::{guest_hit, hit_range, pmu_rate, pmu_source, rate, source_name};

/// Widths of the label and of the now/min/max columns of the sparklines.
const LABEL: usize = 16;
const STATS: usize = 42;

pub fn render(app: &App, v: &VmView, f: &mut Frame<'_>, area: Rect) {
    let block = Block::bordered()
        .title(Span::styled(
            format!(" {} ({}) detail ", v.vm.name, v.vm.id),
            Style::new().add_modifier(Modifier::BOLD),
        ))
        .title_bottom(" Esc/Enter back ");
    let inner = block.inner(area);
    f.render_widget(block, area);
    let mut lines = header_lines(app, v, inner.width as usize);
    lines.push(Line::raw(""));
    lines.extend(tier_table(app, v, inner.width as usize));
    lines.push(Line::raw(""));
    lines.extend(history_lines(app, v, inner.width as usize));
    lines.push(Line::raw(""));
    // No tier.v1 backend reports a heat histogram yet (the BPF maps exist,
    // the protocol field does not).
    lines.push(Line::from(vec![
        Span::styled(
            "heat histogram: ",
            Style::new().add_modifier(Modifier::BOLD),
        ),
        Span::styled(
            "unavailable: no sampler backend of this tierd reports one",
            Style::new().fg(Color::DarkGray),
        ),
    ]));
    f.render_widget(Paragraph::new(lines), inner);
}

fn header_lines(app: &App, v: &VmView, width: usize) -> Vec<Line<'static>> {
    let default = app.default_target();
    let discovered = if v.vm.discovered_unix_ns > 0 && app.now_ns >= v.vm.discovered_unix_ns {
        format!("{} ago", ago(app.now_ns - v.vm.discovered_unix_ns))
    } else {
        "-".into()
    };
    let mut out = vec![Line::raw(format!(
        "id {}  pid {}  vcpus {}  source {}  discovered {}{}",
        v.vm.id,
        v.vm.vmm_pid,
        v.vm.vcpus,
        source_name(v.vm.source()),
        discovered,
        if v.vm.api_socket.is_empty() {
            String::new()
        } else {
            format!("  api {}", v.vm.api_socket)
        }
    ))];
    let hit = v.stats.as_ref().map_or("-".into(), |s| hit_range(s, true));
    let own = v.stats.as_ref().and_then(|s| s.dram_hit_target).is_some();
    let guest = v
        .stats
        .as_ref()
        .and_then(|s| guest_hit(&v.vm, &s.guest_reported_accesses));
    let d = v.delta(default);
    out.push(Line::from(vec![
        Span::raw(format!(
            "DRAM-hit {hit}  target {} ",
            pct(v.target(default))
        )),
        Span::raw(if own {
            "(controller) "
        } else {
            "(policy default) "
        }),
        Span::raw("delta "),
        Span::styled(delta(d), delta_style(d, app.epsilon())),
        Span::raw(format!("  guest-reported hit {}", pct(guest))),
    ]));
    if let Some(s) = &v.stats {
        out.push(Line::styled(
            estimate_line(s),
            Style::new().fg(Color::DarkGray),
        ));
        if let Some(h) = hot_set_line(s) {
            out.push(Line::raw(h));
        }
        out.push(Line::raw(format!(
            "steered by: {}",
            v.steer(app.policy.as_ref())
        )));
    }
    if let Some(s) = &v.stats {
        for l in actuator_lines(&v.vm, s, width) {
            out.push(Line::raw(l));
        }
    }
    match &v.last_decision {
        None => out.push(Line::raw(
            "last action: - (no controller decision for this VM yet)",
        )),
        Some(d) => {
            let moved = matches!(
                d.outcome(),
                DecisionOutcome::Applied | DecisionOutcome::DryRun
            );
            out.push(Line::raw(format!(
                "last action: {}{}",
                action(d, app.now_ns),
                if moved {
                    format!(
                        "  (observed {}, expected {})",
                        pct(Some(d.observed_ratio)),
                        pct(Some(d.expected_ratio))
                    )
                } else {
                    String::new()
                }
            )));
            for l in wrap("  why: ", &d.detail, width, 3) {
                out.push(Line::styled(l, Style::new().fg(Color::DarkGray)));
            }
        }
    }
    out
}

/// `prefix` and `body` in at most `max` lines of `width` characters,
/// broken at spaces, continuations indented under the body; what does
/// not fit in `max` lines is left out.
fn wrap(prefix: &str, body: &str, width: usize, max: usize) -> Vec<String> {
    let indent = " ".repeat(prefix.chars().count());
    let width = width.max(indent.len() + 8);
    let mut out = Vec::new();
    let mut line = prefix.to_string();
    let mut empty = true;
    for word in body.split_whitespace() {
        if !empty && line.chars().count() + 1 + word.chars().count() > width {
            out.push(std::mem::replace(&mut line, indent.clone()));
            empty = true;
            if out.len() == max {
                return out;
            }
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    if !empty {
        out.push(line);
    }
    out
}

/// The pmu source's rate of a tier: `n/m` when it cannot measure it, a
/// `*` when the counters were multiplexed and the count scaled.
fn pmu_cell(s: Option<&tier_proto::v1::TierSample>, secs: f64) -> String {
    match s.and_then(pmu_source) {
        None => "-".into(),
        Some(p) if !p.not_measured.is_empty() => "n/m".into(),
        Some(p) => format!(
            "{}{}",
            rate(pmu_rate(p, secs)),
            if p.running_ratio > 0.0 && p.running_ratio < 0.999 {
                "*"
            } else {
                ""
            }
        ),
    }
}

fn tier_table(app: &App, v: &VmView, width: usize) -> Vec<Line<'static>> {
    let secs = app.shown().interval_ns as f64 / 1e9;
    let head = format!(
        "{:<10} {:<7} {:>8} {:>9} {:>15} {:>13} {:>6} {:>6} {:>5} {:>8} {:>8} {:>11}  {}",
        "TIER",
        "KIND",
        "SIZE",
        "RESIDENT",
        "BALLOON T/A",
        "YOUNG/SAMPLED",
        "COVER",
        "PASSES",
        "SAT",
        "ACC/s",
        "PMU/s",
        "GUEST ACC/s",
        "SOURCE"
    );
    let mut out = vec![Line::styled(
        head,
        Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED),
    )];
    for (i, t) in v.vm.tiers.iter().enumerate() {
        let kind = TierKind::try_from(t.kind).unwrap_or(TierKind::Unknown);
        let s = v.sample(i);
        let guest = v
            .stats
            .as_ref()
            .and_then(|st| st.guest_reported_accesses.get(i))
            .filter(|_| secs > 0.0)
            .map(|&a| a as f64 / secs);
        out.push(Line::raw(format!(
            "{:<10} {:<7} {:>8} {:>9} {:>15} {:>13} {:>6} {:>6} {:>5} {:>8} {:>8} {:>11}  {}",
            t.name,
            kind.short_name(),
            human_bytes(t.size_bytes),
            s.map_or("-".into(), |s| human_bytes(s.resident_bytes)),
            s.map_or("-".into(), |s| format!(
                "{}/{}",
                human_bytes(s.balloon_target_bytes),
                human_bytes(s.balloon_actual_bytes)
            )),
            s.map_or("-".into(), |s| format!(
                "{}/{}",
                s.young_pages, s.sampled_pages
            )),
            s.map_or("-".into(), |s| format!("{:.0}%", s.coverage * 100.0)),
            s.map_or("-".into(), |s| s.passes.to_string()),
            // `!` marks a tier too hot to count touches: ACC/s counts pages.
            s.and_then(|s| s.saturation).map_or("-".into(), |x| format!(
                "{:.0}%{}",
                x * 100.0,
                if x >= SATURATED { "!" } else { "" }
            )),
            rate(v.now.get(i).and_then(|p| p.accesses_per_s)),
            pmu_cell(s, secs),
            rate(guest),
            s.map_or("-", |s| s.source().short_name()),
        )));
    }
    // The accesses' ~95 % intervals (docs/estimate.md), where the sampler sent them.
    for (i, t) in v.vm.tiers.iter().enumerate() {
        if let Some(l) = v.sample(i).and_then(|s| tier_estimate(&t.name, s, secs)) {
            out.push(Line::raw(l));
        }
    }
    // Working-set ages (docs/working-set.md): a bar per tier over its resident bytes
    // (its size when residency is unknown).
    for (i, t) in v.vm.tiers.iter().enumerate() {
        if let Some((s, a)) = v.sample(i).and_then(|s| Some((s, s.ages.as_ref()?))) {
            let total = if s.resident_bytes > 0 {
                s.resident_bytes
            } else {
                t.size_bytes
            };
            for l in wrap("", &age_line(&t.name, a, total as f64), width, 2) {
                out.push(Line::raw(l));
            }
        }
    }
    // What the sampler CPU budget chose and spent (docs/hostpte.md, "Sampler CPU budget").
    if let Some(b) = v.stats.as_ref().and_then(|s| s.sampler_budget.as_ref()) {
        out.push(Line::raw(budget_line(b)));
        if !b.limited.is_empty() {
            for l in wrap("budget limits: ", &b.limited, width, 2) {
                out.push(Line::styled(l, Style::new().fg(Color::Yellow)));
            }
        }
    }
    // Why a VM or a tier reads n/m, and what a count rests on: never a
    // silent 0.
    if let Some(why) = v.not_measured() {
        for l in wrap("not measured: ", why, width, 2) {
            out.push(Line::styled(l, Style::new().fg(Color::Yellow)));
        }
    }
    for (i, t) in v.vm.tiers.iter().enumerate() {
        let Some(p) = v.sample(i).and_then(pmu_source) else {
            continue;
        };
        let (what, body) = if !p.not_measured.is_empty() {
            ("pmu not measured", p.not_measured.as_str())
        } else if !p.attribution.is_empty() {
            ("pmu attribution", p.attribution.as_str())
        } else {
            continue;
        };
        let prefix = format!("{}: {what}: ", t.name);
        for l in wrap(&prefix, body, width, 2) {
            out.push(Line::styled(l, Style::new().fg(Color::Yellow)));
        }
    }
    if v.vm.tiers.iter().enumerate().any(|(i, _)| {
        v.sample(i)
            .and_then(pmu_source)
            .is_some_and(|p| p.running_ratio > 0.0 && p.running_ratio < 0.999)
    }) {
        out.push(Line::raw(
            "* PMU counters multiplexed: counts scaled by enabled/running time",
        ));
    }
    out
}

/// One labelled sparkline with its latest, lowest and highest value.
fn spark_line(
    label: String,
    points: Vec<(u64, Option<f64>)>,
    end_ns: u64,
    width: usize,
    max: Option<f64>,
    fmt: &dyn Fn(Option<f64>) -> String,
) -> Line<'static> {
    let vals = || points.iter().filter_map(|p| p.1);
    let hi = vals().reduce(f64::max);
    let lo = vals().reduce(f64::min);
    let now = points.last().and_then(|p| p.1);
    let stats = format!(
        "  now {:>8}  min {:>8}  max {:>8}",
        fmt(now),
        fmt(lo),
        fmt(hi)
    );
    let w = width.saturating_sub(LABEL + STATS).max(8);
    let line = spark(
        points.iter().copied(),
        end_ns,
        WINDOW_NS,
        w,
        max.or(hi).unwrap_or(0.0),
    );
    Line::from(vec![
        Span::raw(format!("{label:<LABEL$}")),
        Span::styled(line, Style::new().fg(Color::Cyan)),
        Span::raw(stats),
    ])
}

fn history_lines(app: &App, v: &VmView, width: usize) -> Vec<Line<'static>> {
    let end = app.shown().timestamp_ns;
    let mut out = vec![Line::styled(
        format!(
            "over the last minute ({} points, oldest left)",
            v.history.len()
        ),
        Style::new().add_modifier(Modifier::BOLD),
    )];
    out.push(spark_line(
        "DRAM-hit".into(),
        v.history.iter().map(|p| (p.t_ns, p.hit)).collect(),
        end,
        width,
        Some(1.0),
        &pct,
    ));
    out.push(spark_line(
        "hot set DRAM".into(),
        v.history.iter().map(|p| (p.t_ns, p.hot)).collect(),
        end,
        width,
        Some(1.0),
        &pct,
    ));
    for (i, t) in v.vm.tiers.iter().enumerate() {
        let at = |f: fn(&super::model::TierPoint) -> Option<f64>| -> Vec<(u64, Option<f64>)> {
            v.history
                .iter()
                .map(|p| (p.t_ns, p.tiers.get(i).and_then(f)))
                .collect()
        };
        out.push(spark_line(
            format!("{} acc/s", t.name),
            at(|p| p.accesses_per_s),
            end,
            width,
            None,
            &rate,
        ));
        out.push(spark_line(
            format!("{} resident", t.name),
            at(|p| Some(p.resident_bytes as f64)),
            end,
            width,
            None,
            &|b| b.map_or("-".into(), |b| human_bytes(b as u64)),
        ));
    }
    out
}

/// `sampler: coverage 1/64 (1.6 %), passes 3/5 (budget pays 3.5), cpu 0.20 % of 0.25 % of a core`.
pub fn budget_line(b: &tier_proto::v1::SamplerBudget) -> String {
    let budget = if b.budget_pct > 0.0 {
        format!("{:.2} % of {:.2} % of a core", b.spent_pct, b.budget_pct)
    } else {
        format!("{:.2} % of a core (no budget)", b.spent_pct)
    };
    format!(
        "sampler: coverage 1/{} ({:.1} %), passes {}/{} (budget pays {:.1}), cpu {budget}",
        b.stride.max(1),
        b.coverage * 100.0,
        b.passes,
        b.slots,
        b.passes_allowed,
    )
}

/// What moves the VM's memory (docs/virtio-mem.md): `actuator resize-zone: why`,
/// then one line per tier with a virtio-mem part: requested against
/// plugged, and whether plugged memory is attributed to the tier.
pub fn actuator_lines(
    vm: &tier_proto::v1::Vm,
    s: &tier_proto::v1::VmStats,
    width: usize,
) -> Vec<String> {
    let Some(name) = crate::view::actuator_name(s.actuator()) else {
        return Vec::new();
    };
    let mut out = wrap(&format!("actuator {name}: "), &s.actuator_detail, width, 3);
    if out.is_empty() {
        out.push(format!("actuator {name}"));
    }
    for t in &vm.tiers {
        let Some(h) = t.hotplug else {
            continue;
        };
        let sample = s.tiers.iter().find(|x| x.tier == t.name);
        let req = sample
            .and_then(|x| x.hotplug_requested_bytes)
            .map_or("-".into(), human_bytes);
        let plugged = sample
            .and_then(|x| x.hotplug_plugged_bytes)
            .map_or("unknown".into(), human_bytes);
        out.push(format!(
            "  {} hot-plug: requested {req}, plugged {plugged} of {} (boot {}; {})",
            t.name,
            human_bytes(h.region_bytes),
            human_bytes(h.boot_bytes),
            if h.region_attributed {
                "plugged memory counted in this tier"
            } else {
                "region not reported by the VMM: plugged memory not attributed to a tier"
            }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{actuator_lines, budget_line, wrap};

    #[test]
    fn the_actuator_lines_say_requested_against_plugged_and_the_gap() {
        use tier_proto::v1::{Actuator, Tier, TierHotplug, TierSample, Vm, VmStats};
        let vm = Vm {
            tiers: vec![
                Tier {
                    name: "dram".into(),
                    hotplug: Some(TierHotplug {
                        boot_bytes: 64 << 20,
                        region_bytes: 256 << 20,
                        block_bytes: 2 << 20,
                        region_attributed: false,
                    }),
                    ..Default::default()
                },
                Tier {
                    name: "slow".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let s = VmStats {
            actuator: Actuator::ResizeZone as i32,
            actuator_detail: "zone resize (vm.resize-zone)".into(),
            tiers: vec![TierSample {
                tier: "dram".into(),
                hotplug_requested_bytes: Some(128 << 20),
                ..Default::default()
            }],
            ..Default::default()
        };
        let l = actuator_lines(&vm, &s, 200);
        assert_eq!(l[0], "actuator resize-zone: zone resize (vm.resize-zone)");
        assert_eq!(
            l[1],
            "  dram hot-plug: requested 128.0M, plugged unknown of 256.0M (boot 64.0M; region not reported by the VMM: plugged memory not attributed to a tier)"
        );
        assert_eq!(l.len(), 2);
        assert!(actuator_lines(&vm, &VmStats::default(), 200).is_empty());
    }

    #[test]
    fn the_budget_line_says_coverage_passes_and_cpu() {
        let b = tier_proto::v1::SamplerBudget {
            coverage: 1.0 / 64.0,
            stride: 64,
            passes: 3,
            slots: 5,
            passes_allowed: 3.5,
            budget_pct: 0.25,
            spent_pct: 0.2,
            limited: String::new(),
        };
        assert_eq!(
            budget_line(&b),
            "sampler: coverage 1/64 (1.6 %), passes 3/5 (budget pays 3.5), cpu 0.20 % of 0.25 % of a core"
        );
        let off = tier_proto::v1::SamplerBudget {
            budget_pct: 0.0,
            ..b
        };
        assert!(
            budget_line(&off).ends_with("(no budget)"),
            "{}",
            budget_line(&off)
        );
    }

    #[test]
    fn wraps_at_spaces_under_the_body() {
        assert_eq!(
            wrap("why: ", "aaa bbb ccc ddd", 13, 3),
            ["why: aaa bbb", "     ccc ddd"]
        );
        assert_eq!(wrap("why: ", "aaa bbb ccc ddd eee", 13, 2).len(), 2);
        assert!(wrap("why: ", "", 13, 2).is_empty());
    }
}
