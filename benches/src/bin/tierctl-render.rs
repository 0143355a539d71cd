//! `tierctl top`'s frame time: the pure renderer (state -> frame) drawing
//! a synthetic fleet of 1000 VMs (2-4 tiers each, a minute of history, a
//! decision for every third VM) on a 200x60 ratatui TestBackend, through
//! Terminal::draw (widgets, buffer, diff). Baselines from the same run: the
//! same screen with 10 VMs, and the plain batch table (`top --once`) of
//! the same 1000 VMs. Also: the detail pane, a filter, and applying one
//! update (sort included), which is not per frame but per interval.

use std::time::Instant;

use anyhow::Context;
use tier_benches::progress::Progress;
use tier_benches::{Row, Summary, print_table, result_line};
use tierctl::top::ratatui::Terminal;
use tierctl::top::ratatui::backend::TestBackend;
use tierctl::top::ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use tierctl::top::{App, input, render, synthetic};
use tierctl::view;

const WIDTH: u16 = 200;
const HEIGHT: u16 = 60;
/// Runs per case; each run is timed frame by frame.
const RUNS: usize = 5;
const FRAMES: usize = 100;
/// A minute of history at the default 1 s interval.
const HISTORY: u64 = 60;

fn key(app: &mut App, c: KeyCode) {
    input::handle_key(app, KeyEvent::new(c, KeyModifiers::NONE));
}

/// Per-frame times in ms; the selection moves between frames (untimed) so
/// that every frame differs from the one before.
fn frames(app: &mut App, progress: &Progress, screen: &str) -> anyhow::Result<Vec<f64>> {
    let mut term = Terminal::new(TestBackend::new(WIDTH, HEIGHT)).context("test terminal")?;
    app.resize(WIDTH, HEIGHT);
    let mut out = Vec::with_capacity(RUNS * FRAMES);
    for run in 0..RUNS {
        progress.item(format!("{screen}: run {}/{RUNS}", run + 1));
        for f in 0..FRAMES {
            let down = (run * FRAMES + f) % 40 < 20;
            key(app, if down { KeyCode::Down } else { KeyCode::Up });
            let t = Instant::now();
            term.draw(|fr| render(app, fr)).context("draw")?;
            out.push(t.elapsed().as_secs_f64() * 1e3);
        }
        progress.inc();
    }
    Ok(out)
}

fn summary(v: &[f64]) -> anyhow::Result<Summary> {
    Summary::of(v).context("empty sample")
}

fn main() -> anyhow::Result<()> {
    let mut big = synthetic::app(1000, HISTORY);
    let mut small = synthetic::app(10, HISTORY);

    // 4 screens of RUNS runs, then the plain table and the updates.
    let progress = Progress::bar("tierctl-render", 4 * RUNS as u64 + 2);
    let base = summary(&frames(&mut small, &progress, "10 VMs")?)?;
    let table = summary(&frames(&mut big, &progress, "1000 VMs")?)?;

    let mut detail = big.clone();
    key(&mut detail, KeyCode::Enter);
    let detail = summary(&frames(&mut detail, &progress, "1000 VMs, detail pane")?)?;

    let mut filtered = big.clone();
    key(&mut filtered, KeyCode::Char('/'));
    for c in "vm-0[0-4]".chars() {
        key(&mut filtered, KeyCode::Char(c));
    }
    key(&mut filtered, KeyCode::Enter);
    let filtered = summary(&frames(&mut filtered, &progress, "1000 VMs, filtered")?)?;

    // The plain table of `top --once` for the same 1000 VMs.
    let update = {
        let mut u = synthetic::update(1000, HISTORY);
        u.vms = (0..1000).map(synthetic::vm).collect();
        u.vms_unchanged = false;
        u
    };
    let mut plain = Vec::new();
    progress.item("plain table (top --once)");
    for _ in 0..RUNS * 10 {
        let t = Instant::now();
        let s = view::table(&view::rows(&update));
        plain.push(t.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(s);
    }
    progress.inc();
    let plain = summary(&plain)?;

    // One interval's update into the state, with the re-sort.
    let mut apply = Vec::new();
    let mut seq = HISTORY;
    progress.item("applying updates");
    for _ in 0..RUNS * 4 {
        seq += 1;
        let u = synthetic::update(1000, seq);
        let t = Instant::now();
        big.on_update(u, false);
        apply.push(t.elapsed().as_secs_f64() * 1e3);
    }
    progress.inc();
    progress.finish();
    let apply = summary(&apply)?;

    let ratio = |s: Summary| Some(s.median / base.median);
    print_table(
        &format!(
            "tierctl top render, {WIDTH}x{HEIGHT} TestBackend, {RUNS} runs x {FRAMES} frames, {HISTORY} s of history"
        ),
        &[
            Row {
                name: "frame, 10 VMs (baseline)".into(),
                unit: "ms",
                summary: base,
                ratio: None,
            },
            Row {
                name: "frame, 1000 VMs".into(),
                unit: "ms",
                summary: table,
                ratio: ratio(table),
            },
            Row {
                name: "frame, 1000 VMs, detail pane".into(),
                unit: "ms",
                summary: detail,
                ratio: ratio(detail),
            },
            Row {
                name: "frame, 1000 VMs, regex filter".into(),
                unit: "ms",
                summary: filtered,
                ratio: ratio(filtered),
            },
            Row {
                name: "plain table, 1000 VMs (baseline)".into(),
                unit: "ms",
                summary: plain,
                ratio: ratio(plain),
            },
            Row {
                name: "apply one update, 1000 VMs".into(),
                unit: "ms",
                summary: apply,
                ratio: ratio(apply),
            },
        ],
    );
    println!("ratio: median / median of the 10-VM frame; goal: 1000-VM frame < 5 ms");
    println!(
        "{}",
        result_line(&[("frame_ms_1000", format!("{:.3}", table.median))])
    );
    Ok(())
}
