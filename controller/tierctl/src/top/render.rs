//! The `top` screen as a pure function of [`App`]: title, status, the VM
//! table (or the detail pane), footer, and the help overlay. Only the rows
//! on screen are built, so a frame costs the same for 10 or 10,000 VMs
//! beyond the sort done when data arrives.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span, Text};
use ratatui::widgets::{Block, Cell, Clear, Paragraph, Row, Table};
use tier_proto::human_bytes;
use tier_proto::v1::TierKind;

use super::app::{App, Conn, SortColumn, first_visible};
use super::detail;
use super::format::{action, delta, delta_style, pct, spark};
use super::layout::BOTTOM_LINES;
use super::model::{VmView, WINDOW_NS};
use crate::signal::{hot_set, hot_text};
use crate::view::{hit_range, rate};

/// Draws the whole screen.
pub fn render(app: &App, f: &mut Frame<'_>) {
    let [title, status, main, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Fill(1),
        Constraint::Length(BOTTOM_LINES),
    ])
    .areas(f.area());
    f.render_widget(title_line(app), title);
    f.render_widget(status_line(app), status);
    match app.detail.as_deref().and_then(|id| app.shown().vm(id)) {
        Some(vm) => detail::render(app, vm, f, main),
        None => render_table(app, f, main),
    }
    f.render_widget(footer_line(app), footer);
    if app.help {
        render_help(f, f.area());
    }
}

fn title_line(app: &App) -> Line<'static> {
    let fleet = app.shown();
    let mut spans = vec![Span::styled(
        "tierctl top",
        Style::new().add_modifier(Modifier::BOLD),
    )];
    if let Some(i) = &app.info {
        spans.push(Span::raw(format!(
            "  tierd {} on {}  interval {} ms",
            i.daemon_version,
            i.hostname,
            i.interval_ns / 1_000_000
        )));
    }
    spans.push(Span::raw(format!(
        "  update #{}  VMs {} shown of {}  sort: {} {}",
        fleet.sequence,
        app.order.len(),
        fleet.vms.len(),
        app.sort.column.label(),
        if app.sort.descending { "▼" } else { "▲" },
    )));
    if let Some(re) = &app.filter.regex {
        spans.push(Span::raw(format!("  filter: /{}/", re.as_str())));
    }
    if app.paused() {
        spans.push(Span::styled(
            format!("  PAUSED (receiving: #{})", app.live.sequence),
            Style::new().fg(Color::Black).bg(Color::Yellow),
        ));
    }
    Line::from(spans)
}

fn status_line(app: &App) -> Line<'static> {
    let mut spans = match &app.conn {
        Conn::Connecting => vec![Span::styled("● connecting", Style::new().fg(Color::Yellow))],
        Conn::Connected => vec![Span::styled("● connected", Style::new().fg(Color::Green))],
        Conn::Disconnected {
            error,
            attempt,
            retry_at_ns,
        } => {
            let wait = retry_at_ns.saturating_sub(app.now_ns) as f64 / 1e9;
            vec![Span::styled(
                format!(
                    "✖ disconnected, retrying in {wait:.1}s (attempt {attempt}), showing the last picture: {error}"
                ),
                Style::new().fg(Color::White).bg(Color::Red),
            )]
        }
    };
    if let Some(p) = &app.policy {
        spans.push(Span::raw(format!(
            "  policy target {} ±{:.1}  controller {}{}",
            pct(Some(p.default_target)),
            p.epsilon * 100.0,
            if p.enabled { "on" } else { "off" },
            if p.dry_run { " (dry-run)" } else { "" },
        )));
    }
    for h in &app.shown().health {
        let name = h.backend().short_name();
        if h.error.is_empty() {
            spans.push(Span::raw(format!("  sampler {name} ok")));
        } else {
            spans.push(Span::styled(
                format!("  sampler {name}: {}", h.error),
                Style::new().fg(Color::Red),
            ));
        }
    }
    if app.live.lost_updates > 0 {
        spans.push(Span::styled(
            format!("  lost {} updates (too slow)", app.live.lost_updates),
            Style::new().fg(Color::Yellow),
        ));
    }
    Line::from(spans)
}

fn footer_line(app: &App) -> Line<'static> {
    if app.filter.editing {
        let mut spans = vec![
            Span::styled("filter (regex): ", Style::new().fg(Color::Cyan)),
            Span::raw(app.filter.text.clone()),
            Span::styled("█", Style::new().add_modifier(Modifier::SLOW_BLINK)),
            Span::styled(
                "  on name or id; Enter keeps it, Esc clears",
                Style::new().fg(Color::DarkGray),
            ),
        ];
        if let Some(e) = &app.filter.error {
            spans.push(Span::styled(format!("  {e}"), Style::new().fg(Color::Red)));
        }
        return Line::from(spans);
    }
    let hint = if app.detail.is_some() {
        "Esc/Enter back  ↑↓ other VM  p pause  ? help  q quit"
    } else {
        "q quit  ? help  ↑↓ select  Enter detail  / filter  s/S sort  1-7 column  p pause"
    };
    Line::styled(hint, Style::new().fg(Color::DarkGray))
}

/// A table column: title, fixed width (0 = flexible), sort key, and the
/// order in which columns give way on a narrow terminal (higher goes first).
struct Col {
    title: &'static str,
    width: u16,
    sort: Option<SortColumn>,
    drop: u8,
}

const COLS: [Col; 13] = [
    col("VM", 16, Some(SortColumn::Name), 0),
    col("VCPU", 4, Some(SortColumn::Vcpus), 5),
    col("TIER", 10, None, 0),
    col("RESIDENT", 9, Some(SortColumn::Resident), 2),
    col("BALLOON T/A", 13, None, 4),
    col("ACC/s", 8, Some(SortColumn::Access), 1),
    col("SOURCE", 8, None, 6),
    col("STEER", 10, None, 3),
    col("DRAM", 12, Some(SortColumn::Hit), 0),
    col("TARGET", 7, None, 3),
    col("DELTA", 7, Some(SortColumn::Delta), 0),
    col("LAST MINUTE", 0, None, 7),
    col("LAST ACTION", 28, Some(SortColumn::Action), 8),
];

const fn col(title: &'static str, width: u16, sort: Option<SortColumn>, drop: u8) -> Col {
    Col {
        title,
        width,
        sort,
        drop,
    }
}

/// Sparkline width bounds.
const SPARK_MIN: u16 = 10;
const SPARK_MAX: u16 = 60;

/// Widths of the columns that fit in `width` (0 = column dropped).
fn column_widths(width: u16) -> [u16; 13] {
    let mut w: [u16; 13] = std::array::from_fn(|i| match COLS[i].width {
        0 => SPARK_MIN,
        n => n,
    });
    let total = |w: &[u16; 13]| -> u16 {
        let shown = w.iter().filter(|&&x| x > 0).count() as u16;
        w.iter().sum::<u16>() + shown.saturating_sub(1)
    };
    let mut drop_order: Vec<usize> = (0..COLS.len()).filter(|&i| COLS[i].drop > 0).collect();
    drop_order.sort_by_key(|&i| std::cmp::Reverse(COLS[i].drop));
    for i in drop_order {
        if total(&w) <= width {
            break;
        }
        w[i] = 0;
    }
    // The sparkline takes what is left, within bounds.
    if let Some(s) = COLS.iter().position(|c| c.width == 0).filter(|&s| w[s] > 0) {
        let spare = width.saturating_sub(total(&w));
        w[s] = (w[s] + spare).min(SPARK_MAX);
    }
    w
}

fn render_table(app: &App, f: &mut Frame<'_>, area: Rect) {
    let fleet = app.shown();
    if app.order.is_empty() {
        let msg = if fleet.vms.is_empty() {
            "no VMs: tierd knows none (yet)".to_string()
        } else {
            "no VM matches the filter (Esc clears it)".to_string()
        };
        f.render_widget(Paragraph::new(msg), area);
        return;
    }
    let widths = column_widths(area.width);
    let keep: Vec<usize> = (0..COLS.len()).filter(|&i| widths[i] > 0).collect();
    let header = Row::new(keep.iter().map(|&i| {
        let c = &COLS[i];
        let mut t = c.title.to_string();
        if c.sort.is_some_and(|s| s == app.sort.column) {
            t.push(if app.sort.descending { '▼' } else { '▲' });
        }
        Cell::from(t)
    }))
    .style(Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED));

    let body = area.height.saturating_sub(1) as usize;
    let start = first_visible(app, app.offset, body);
    let default = app.default_target();
    let spark_w = COLS
        .iter()
        .position(|c| c.width == 0)
        .map_or(0, |s| widths[s] as usize);
    let mut rows = Vec::new();
    let mut used = 0;
    for (k, &i) in app.order.iter().enumerate().skip(start) {
        let v = &fleet.vms[i];
        let h = v.vm.tiers.len().max(1);
        if used + h > body && used > 0 {
            break;
        }
        used += h;
        let cells = vm_cells(app, v, default, spark_w);
        let mut row = Row::new(keep.iter().map(|&c| cells[c].clone())).height(h as u16);
        if k == app.selected {
            row = row.style(
                Style::new()
                    .bg(Color::DarkGray)
                    .add_modifier(Modifier::BOLD),
            );
        }
        rows.push(row);
    }
    let constraints: Vec<Constraint> = keep
        .iter()
        .map(|&i| Constraint::Length(widths[i]))
        .collect();
    f.render_widget(
        Table::new(rows, constraints)
            .header(header)
            .column_spacing(1),
        area,
    );
}

/// The cells of one VM's row, one line per tier where a column is per tier.
fn vm_cells(app: &App, v: &VmView, default: Option<f64>, spark_w: usize) -> [Cell<'static>; 13] {
    let n = v.vm.tiers.len();
    let per_tier = |f: &dyn Fn(usize) -> String| -> Cell<'static> {
        Cell::from(Text::from(
            (0..n).map(|i| Line::from(f(i))).collect::<Vec<_>>(),
        ))
    };
    let tier = per_tier(&|i| {
        let t = &v.vm.tiers[i];
        let kind = TierKind::try_from(t.kind).unwrap_or(TierKind::Unknown);
        if kind.short_name() == t.name {
            t.name.clone()
        } else {
            format!("{}:{}", t.name, kind.short_name())
        }
    });
    let resident = per_tier(&|i| {
        v.now
            .get(i)
            .map_or("-".into(), |p| human_bytes(p.resident_bytes))
    });
    let balloon = per_tier(&|i| {
        v.sample(i).map_or("-".into(), |s| {
            format!(
                "{}/{}",
                human_bytes(s.balloon_target_bytes),
                human_bytes(s.balloon_actual_bytes)
            )
        })
    });
    let acc = per_tier(&|i| rate(v.now.get(i).and_then(|p| p.accesses_per_s)));
    let source = per_tier(&|i| {
        v.sample(i)
            .map_or("-", |s| s.source().short_name())
            .to_string()
    });
    let d = v.delta(default);
    let trend = spark(
        v.history.iter().map(|p| (p.t_ns, p.headline)),
        app.shown().timestamp_ns,
        WINDOW_NS,
        spark_w,
        1.0,
    );
    let last = v
        .last_decision
        .as_ref()
        .map_or("-".into(), |d| action(d, app.now_ns));
    [
        Cell::from(v.vm.name.clone()),
        Cell::from(v.vm.vcpus.to_string()),
        tier,
        resident,
        balloon,
        acc,
        source,
        Cell::from(v.steer(app.policy.as_ref())),
        // A PMU count stands even when the sampler could not read the VM;
        // where none counted, the hot-set share accessed bits measure.
        Cell::from(match &v.stats {
            Some(s) if s.counted_dram_hit_ratio.is_some() => hit_range(s, false),
            Some(s) if hot_set(s).is_some() => hot_set(s).map(hot_text).unwrap_or_default(),
            _ if v.not_measured().is_some() => "n/m".to_string(),
            Some(s) => hit_range(s, false),
            None => "-".into(),
        }),
        Cell::from(pct(v.target(default))),
        Cell::from(Span::styled(delta(d), delta_style(d, app.epsilon()))),
        Cell::from(Span::styled(trend, Style::new().fg(Color::Cyan))),
        Cell::from(last),
    ]
}

const HELP: &[(&str, &str)] = &[
    ("q, Ctrl-C", "quit"),
    ("?", "this help (any key closes it)"),
    ("Up/Down, j/k", "select a VM; PgUp/PgDn, Home/End"),
    ("Enter", "detail pane of the selected VM (Enter/Esc back)"),
    ("/", "filter by regex on name or id; Enter keeps it"),
    ("Esc", "clear the filter / close the detail pane"),
    ("s / S", "sort by the next column / flip direction"),
    (
        "1-7",
        "sort: name vcpu resident acc/s dram-hit delta action",
    ),
    ("p, Space", "pause the picture (updates keep arriving)"),
];

fn render_help(f: &mut Frame<'_>, area: Rect) {
    let w = area.width.min(72);
    let h = (HELP.len() as u16 + 9).min(area.height);
    let r = Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    };
    let mut lines: Vec<Line<'_>> = HELP
        .iter()
        .map(|(k, what)| {
            Line::from(vec![
                Span::styled(format!("{k:<14}"), Style::new().fg(Color::Cyan)),
                Span::raw(*what),
            ])
        })
        .collect();
    lines.push(Line::raw(""));
    lines.push(Line::raw(
        "DRAM: PMU-counted hit ratio, else the hot set's DRAM",
    ));
    lines.push(Line::raw(
        "share (accessed bits), else n/m. STEER: what the",
    ));
    lines.push(Line::raw(
        "controller acts on (pmu, hot-set, bits-ratio, none).",
    ));
    lines.push(Line::raw(
        "DELTA = DRAM-HIT - TARGET, in points: red starved,",
    ));
    lines.push(Line::raw(
        "green within epsilon, blue DRAM to spare. TARGET is",
    ));
    lines.push(Line::raw("the VM's own target, else the policy default."));
    f.render_widget(Clear, r);
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" Keys ")),
        r,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_give_way_on_narrow_terminals() {
        let wide = column_widths(200);
        assert!(wide.iter().all(|&w| w > 0));
        assert!((SPARK_MIN..=SPARK_MAX).contains(&wide[11]));
        let narrow = column_widths(100);
        assert_eq!(narrow[12], 0, "last action goes first");
        assert!(
            narrow[0] > 0 && narrow[8] > 0 && narrow[10] > 0,
            "VM, hit, delta stay"
        );
        let total: u16 =
            narrow.iter().sum::<u16>() + narrow.iter().filter(|&&w| w > 0).count() as u16 - 1;
        assert!(total <= 100, "{narrow:?}");
    }
}
