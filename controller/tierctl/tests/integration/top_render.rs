#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose
//! The `top` renderer as a pure function: state in, frame out, on
//! ratatui's TestBackend. Text and colours are read back from the buffer.

use tierctl::top::app::Conn;
use tierctl::top::input::handle_key;
use tierctl::top::ratatui::Terminal;
use tierctl::top::ratatui::backend::TestBackend;
use tierctl::top::ratatui::buffer::Buffer;
use tierctl::top::ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use tierctl::top::ratatui::style::Color;
use tierctl::top::{App, render, synthetic};

fn draw(app: &App, w: u16, h: u16) -> Buffer {
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    t.draw(|f| render(app, f)).unwrap();
    t.backend().buffer().clone()
}

fn lines(b: &Buffer) -> Vec<String> {
    (0..b.area.height)
        .map(|y| {
            (0..b.area.width)
                .map(|x| b[(x, y)].symbol())
                .collect::<String>()
        })
        .collect()
}

fn text(b: &Buffer) -> String {
    lines(b).join("\n")
}

/// Foreground colour of the first cell of `needle` on line `y`.
fn fg_at(b: &Buffer, y: u16, needle: &str) -> Color {
    let line = &lines(b)[y as usize];
    let col = line[..line.find(needle).unwrap()].chars().count() as u16;
    b[(col, y)].fg
}

fn key(app: &mut App, c: KeyCode) {
    handle_key(app, KeyEvent::new(c, KeyModifiers::NONE));
}

#[test]
fn one_row_per_vm_with_a_line_per_tier() {
    let mut app = synthetic::app(3, 70);
    app.resize(160, 40);
    key(&mut app, KeyCode::Char('1')); // by name
    let b = draw(&app, 160, 40);
    let l = lines(&b);
    assert!(
        l[0].starts_with("tierctl top  tierd 0.1.0 on synthetic"),
        "{}",
        l[0]
    );
    assert!(
        l[0].contains("update #70  VMs 3 shown of 3  sort: name ▲"),
        "{}",
        l[0]
    );
    assert!(l[1].contains("● connected") && l[1].contains("policy target 90.0% ±2.0"));
    assert!(
        l[2].starts_with("VM▲") && l[2].contains("LAST MINUTE"),
        "{}",
        l[2]
    );
    // vm-0000: 2 tiers, vm-0001: 3 tiers, vm-0002: 4 tiers.
    assert!(l[3].starts_with("vm-0000") && l[3].contains("dram") && l[3].contains("hostpte"));
    assert!(l[4].trim_start().starts_with("cxl") && l[4].contains("256.0M/200.0M"));
    assert!(l[5].starts_with("vm-0001") && l[7].trim_start().starts_with("pmem"));
    assert!(l[8].starts_with("vm-0002") && l[11].trim_start().starts_with("remote"));
    // vm-0000 has its own target (0.8), vm-0001 the policy default.
    assert!(
        l[3].contains("80.0%") && l[5].contains("90.0%"),
        "{}\n{}",
        l[3],
        l[5]
    );
    // A decision: the guest got 64M of DRAM back, 3 s ago.
    assert!(l[3].contains("3s below dram+64.0M applied"), "{}", l[3]);
    assert!(l[5].trim_end().ends_with('-'), "no decision: {}", l[5]);
    // A minute of history is a full sparkline (what the 160 columns leave).
    let spark: String = l[3].chars().filter(|c| ('▁'..='█').contains(c)).collect();
    assert_eq!(spark.chars().count(), 16, "{}", l[3]);
    // Which signal steers it: the synthetic policy is ratio mode, no PMU.
    assert!(l[3].contains("bits-ratio"), "{}", l[3]);
    // The ratio as a range: closed (vm-0000), open above (vm-0001), a
    // point without an interval from an older tierd (vm-0002).
    assert!(l[3].contains("38-62 %"), "{}", l[3]);
    assert!(l[5].contains("≥"), "{}", l[5]);
    assert!(l[8].contains("~"), "{}", l[8]);
    assert!(!l.iter().any(|x| x.contains("±0.0")));
    assert!(l[39].starts_with("q quit  ? help"));
}

#[test]
fn delta_is_coloured_by_distance_to_target() {
    let mut app = synthetic::app(40, 5);
    app.resize(200, 60);
    key(&mut app, KeyCode::Char('1'));
    let b = draw(&app, 200, 60);
    let l = lines(&b);
    let (eps, default) = (0.02, 0.9);
    let mut seen = [false; 3];
    for (y, line) in l.iter().enumerate().skip(3) {
        let Some(name) = line
            .split_whitespace()
            .next()
            .filter(|n| n.starts_with("vm-"))
        else {
            continue;
        };
        let v = app.shown().vms.iter().find(|v| v.vm.name == name).unwrap();
        let Some(d) = v.delta(Some(default)) else {
            continue;
        };
        let shown = format!("{:+.1}", d * 100.0);
        let want = if d < -eps {
            Color::Red
        } else if d > eps {
            Color::Blue
        } else {
            Color::Green
        };
        assert_eq!(fg_at(&b, y as u16, &shown), want, "{line}");
        seen[if d < -eps {
            0
        } else if d > eps {
            2
        } else {
            1
        }] = true;
    }
    assert!(
        seen[0] && seen[2],
        "both starved and spare VMs drawn: {seen:?}"
    );
}

#[test]
fn thousand_vms_scroll_to_the_selection() {
    let mut app = synthetic::app(1000, 3);
    app.resize(200, 60);
    key(&mut app, KeyCode::Char('1'));
    let b = draw(&app, 200, 60);
    assert!(text(&b).contains("VMs 1000 shown of 1000"));
    key(&mut app, KeyCode::End);
    let l = lines(&draw(&app, 200, 60));
    let last = l.iter().rposition(|x| x.starts_with("vm-")).unwrap();
    assert!(l[last].starts_with("vm-0999"), "{}", l[last]);
    assert!(!l.iter().any(|x| x.starts_with("vm-0000")));
    key(&mut app, KeyCode::Home);
    let l = lines(&draw(&app, 200, 60));
    assert!(l[3].starts_with("vm-0000"));
    // Moving within the page does not scroll; a page down does, and the
    // selection stays on screen.
    key(&mut app, KeyCode::Down);
    assert!(lines(&draw(&app, 200, 60))[3].starts_with("vm-0000"));
    for _ in 0..3 {
        key(&mut app, KeyCode::PageDown);
        let l = lines(&draw(&app, 200, 60));
        let sel = &app.selected_vm().unwrap().vm.name;
        assert!(l.iter().any(|x| x.starts_with(sel.as_str())), "{sel}");
        assert!(!l[3].starts_with("vm-0000"));
    }
}

#[test]
fn filter_prompt_and_no_match() {
    let mut app = synthetic::app(20, 2);
    app.resize(160, 30);
    key(&mut app, KeyCode::Char('/'));
    for c in "vm-001[".chars() {
        key(&mut app, KeyCode::Char(c));
    }
    let t = text(&draw(&app, 160, 30));
    assert!(t.contains("filter (regex): vm-001["), "{t}");
    assert!(
        t.contains("unclosed character class"),
        "regex error shown: {t}"
    );
    assert!(
        t.contains("VMs 10 shown of 20"),
        "the last good regex applies: {t}"
    );
    key(&mut app, KeyCode::Backspace);
    key(&mut app, KeyCode::Char('9'));
    key(&mut app, KeyCode::Enter);
    let t = text(&draw(&app, 160, 30));
    assert!(
        t.contains("VMs 1 shown of 20  sort: delta ▲  filter: /vm-0019/"),
        "{t}"
    );
    key(&mut app, KeyCode::Char('/'));
    key(&mut app, KeyCode::Char('x'));
    key(&mut app, KeyCode::Enter);
    let t = text(&draw(&app, 160, 30));
    assert!(
        t.contains("no VM matches the filter (Esc clears it)"),
        "{t}"
    );
}

#[test]
fn detail_pane_help_and_disconnect() {
    let mut app = synthetic::app(5, 20);
    app.resize(160, 40);
    key(&mut app, KeyCode::Char('1'));
    // The selection followed its VM through the sort: go to the top.
    key(&mut app, KeyCode::Home);
    key(&mut app, KeyCode::Enter);
    let t = text(&draw(&app, 160, 40));
    for want in [
        "vm-0000 (kvm-fd:10000) detail",
        "source kvm-fd",
        "target 80.0% (controller)",
        "last action: 3s below dram+64.0M applied  (observed 60.0%, expected 70.0%)",
        "why: synthetic",
        // The interval, what it rests on, and each tier's accesses.
        "accessed bits: ",
        "page sampling alone ±1.0",
        "dram: acc/s ",
        "saturated pages 0  misfit 1.2",
        "over the last minute (20 points, oldest left)",
        "dram acc/s",
        "cxl resident",
        "heat histogram: unavailable",
        "Esc/Enter back",
    ] {
        assert!(t.contains(want), "{want:?} missing:\n{t}");
    }
    key(&mut app, KeyCode::Esc);
    key(&mut app, KeyCode::Char('?'));
    let t = text(&draw(&app, 160, 40));
    assert!(t.contains("Keys") && t.contains("pause the picture"), "{t}");
    key(&mut app, KeyCode::Char('?'));
    app.on_disconnected(
        "tierd is not running: no socket at /x".into(),
        3,
        app.now_ns + 2_000_000_000,
    );
    assert!(matches!(app.conn, Conn::Disconnected { .. }));
    let t = text(&draw(&app, 160, 40));
    assert!(
        t.contains("disconnected, retrying in 2.0s (attempt 3), showing the last picture: tierd is not running"),
        "{t}"
    );
    assert!(t.contains("vm-0000"), "rows stay: {t}");
}

/// The pmu source's column in the detail pane: a rate where it counts
/// (`*` when multiplexed and scaled), `n/m` and the reason where it cannot
/// measure a tier, never a 0.
#[test]
fn detail_pane_shows_pmu_counts_and_what_is_not_measured() {
    let mut app = synthetic::app(2, 5);
    app.resize(170, 40);
    key(&mut app, KeyCode::Char('1'));
    key(&mut app, KeyCode::End); // vm-0001: pmu, multiplexed
    key(&mut app, KeyCode::Enter);
    let b = draw(&app, 170, 40);
    let l = lines(&b);
    let head = l
        .iter()
        .position(|x| x.contains("PMU/s"))
        .expect("PMU/s column");
    let row = |y: usize| l[y].trim_start_matches('│').trim_start().to_string();
    let (dram, cxl) = (row(head + 1), row(head + 2));
    assert!(
        dram.trim_start().starts_with("dram") && dram.contains("M*"),
        "{dram}"
    );
    assert!(
        cxl.trim_start().starts_with("cxl") && cxl.contains("n/m"),
        "{cxl}"
    );
    let t = text(&b);
    for want in [
        "cxl: pmu not measured: no event on GenuineIntel family 0x6 model 0x8f counts cxl memory",
        "* PMU counters multiplexed: counts scaled by enabled/running time",
    ] {
        assert!(t.contains(want), "{want:?} missing:\n{t}");
    }
    // vm-0000 has no pmu source: a dash, no notes.
    key(&mut app, KeyCode::Home);
    let t = text(&draw(&app, 170, 40));
    assert!(t.contains("vm-0000 (kvm-fd:10000) detail"), "{t}");
    // The age bars' `n/m` (a horizon not watched yet) is not the PMU's.
    let pmu_part: String = t.lines().filter(|x| !x.contains(" ages ")).collect();
    assert!(
        !pmu_part.contains("pmu not measured") && !pmu_part.contains("n/m"),
        "{t}"
    );
}

#[test]
fn tiny_and_empty_terminals_do_not_panic() {
    let app = synthetic::app(50, 2);
    for (w, h) in [(1, 1), (20, 5), (40, 3), (80, 4)] {
        draw(&app, w, h);
    }
    let empty = App::new();
    assert!(text(&draw(&empty, 80, 10)).contains("no VMs: tierd knows none (yet)"));
}

#[test]
fn a_vm_the_sampler_cannot_read_shows_n_m_and_why() {
    let mut app = synthetic::app(2, 5);
    app.resize(170, 40);
    key(&mut app, KeyCode::Char('1'));
    let mut u = synthetic::update(2, 6);
    u.vms.clear();
    u.vms_unchanged = true;
    let why = "ept-tracepoint: guest memory is hugetlbfs-backed: page_idle ages LRU folios only";
    u.stats[1].not_measured = why.into();
    app.on_update(u, false);
    let l = lines(&draw(&app, 170, 40));
    let row = |name: &str| l.iter().find(|x| x.contains(name)).unwrap().clone();
    assert!(row("vm-0001").contains("n/m"), "{}", row("vm-0001"));
    assert!(!row("vm-0000").contains("n/m"), "{}", row("vm-0000"));
    key(&mut app, KeyCode::End);
    key(&mut app, KeyCode::Enter);
    let t = text(&draw(&app, 170, 40));
    assert!(t.contains(&format!("not measured: {why}")), "{t}");
}
