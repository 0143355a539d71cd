//! Keys of `tierctl top` (docs/tierctl.md lists them; so does `?`).

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::app::{App, SortColumn};

/// Applies one key press to the state.
pub fn handle_key(app: &mut App, key: KeyEvent) {
    if key.kind == KeyEventKind::Release {
        return;
    }
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    if ctrl && matches!(key.code, KeyCode::Char('c')) {
        app.quit = true;
        return;
    }
    if app.filter.editing {
        edit_filter(app, key.code);
        return;
    }
    if app.help {
        // Any key closes the overlay; q still quits.
        app.help = false;
        if key.code == KeyCode::Char('q') {
            app.quit = true;
        }
        return;
    }
    match key.code {
        KeyCode::Char('q') => app.quit = true,
        KeyCode::Char('?') | KeyCode::F(1) => app.help = true,
        KeyCode::Char('p') | KeyCode::Char(' ') => app.toggle_pause(),
        KeyCode::Char('/') => {
            app.filter.editing = true;
        }
        KeyCode::Char('s') => app.next_sort_column(),
        KeyCode::Char('S') => app.flip_sort(),
        KeyCode::Char(c @ '1'..='7') => {
            let i = (c as u8 - b'1') as usize;
            app.sort_by(SortColumn::ALL[i]);
        }
        KeyCode::Enter => {
            if app.detail.is_some() {
                app.detail = None;
            } else {
                app.open_detail();
            }
        }
        KeyCode::Esc => {
            if app.detail.is_some() {
                app.detail = None;
            } else {
                app.clear_filter();
            }
        }
        KeyCode::Up | KeyCode::Char('k') => app.move_selection(-1),
        KeyCode::Down | KeyCode::Char('j') => app.move_selection(1),
        KeyCode::PageUp => app.move_selection(-(app.page_vms() as isize)),
        KeyCode::PageDown => app.move_selection(app.page_vms() as isize),
        KeyCode::Home | KeyCode::Char('g') => app.move_selection(isize::MIN / 2),
        KeyCode::End | KeyCode::Char('G') => app.select_last(),
        _ => {}
    }
    // The detail pane follows the selection.
    if app.detail.is_some() {
        app.open_detail();
    }
}

/// Typing a filter: applied as typed, Enter keeps it, Esc clears it.
fn edit_filter(app: &mut App, code: KeyCode) {
    match code {
        KeyCode::Enter => app.filter.editing = false,
        KeyCode::Esc => app.clear_filter(),
        KeyCode::Backspace => {
            let mut t = app.filter.text.clone();
            t.pop();
            app.set_filter_text(t);
        }
        KeyCode::Char(c) => {
            let mut t = app.filter.text.clone();
            t.push(c);
            app.set_filter_text(t);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::top::app::Sort;
    use tier_proto::v1::{StatsUpdate, Vm, VmStats};

    fn key(c: KeyCode) -> KeyEvent {
        KeyEvent::new(c, KeyModifiers::NONE)
    }

    fn app_with(names: &[(&str, f64)]) -> App {
        let mut app = App::new();
        app.on_update(
            StatsUpdate {
                sequence: 1,
                interval_ns: 1_000_000_000,
                vms: names
                    .iter()
                    .map(|(n, _)| Vm {
                        id: format!("kvm:{n}"),
                        name: (*n).into(),
                        ..Default::default()
                    })
                    .collect(),
                stats: names
                    .iter()
                    .map(|(n, h)| VmStats {
                        vm_id: format!("kvm:{n}"),
                        dram_hit_ratio: *h,
                        has_accesses: true,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
            true,
        );
        app
    }

    fn names(app: &App) -> Vec<&str> {
        app.order
            .iter()
            .map(|&i| app.shown().vms[i].vm.name.as_str())
            .collect()
    }

    #[test]
    fn sort_keys() {
        let mut app = app_with(&[("b", 0.9), ("a", 0.2), ("c", 0.5)]);
        // Default: lowest hit - target first (no policy: no target, so by name).
        assert_eq!(app.sort.column, SortColumn::Delta);
        handle_key(&mut app, key(KeyCode::Char('5')));
        assert_eq!(names(&app), ["a", "c", "b"], "dram-hit ascending");
        handle_key(&mut app, key(KeyCode::Char('5')));
        assert_eq!(names(&app), ["b", "c", "a"], "same key flips");
        handle_key(&mut app, key(KeyCode::Char('S')));
        assert_eq!(names(&app), ["a", "c", "b"]);
        handle_key(&mut app, key(KeyCode::Char('s')));
        assert_eq!(
            app.sort,
            Sort {
                column: SortColumn::Delta,
                descending: false
            }
        );
    }

    #[test]
    fn filter_typing_enter_and_esc() {
        let mut app = app_with(&[("web-1", 0.9), ("db-1", 0.2), ("web-2", 0.5)]);
        handle_key(&mut app, key(KeyCode::Char('/')));
        for c in "WEB".chars() {
            handle_key(&mut app, key(KeyCode::Char(c)));
        }
        assert_eq!(names(&app).len(), 2, "case-insensitive, applied as typed");
        handle_key(&mut app, key(KeyCode::Char('(')));
        assert!(app.filter.error.is_some());
        assert_eq!(
            names(&app).len(),
            2,
            "a broken regex keeps the last good one"
        );
        handle_key(&mut app, key(KeyCode::Backspace));
        handle_key(&mut app, key(KeyCode::Enter));
        assert!(!app.filter.editing);
        // `q` is a key again, not filter text.
        handle_key(&mut app, key(KeyCode::Esc));
        assert_eq!(names(&app).len(), 3);
        handle_key(&mut app, key(KeyCode::Char('q')));
        assert!(app.quit);
    }

    #[test]
    fn pause_keeps_the_picture() {
        let mut app = app_with(&[("a", 0.5)]);
        handle_key(&mut app, key(KeyCode::Char('p')));
        app.on_update(
            StatsUpdate {
                sequence: 2,
                vms: vec![],
                ..Default::default()
            },
            false,
        );
        assert_eq!(app.shown().vms.len(), 1, "frozen");
        assert_eq!(app.live.vms.len(), 0, "still receiving");
        handle_key(&mut app, key(KeyCode::Char('p')));
        assert_eq!(app.shown().vms.len(), 0);
    }

    #[test]
    fn detail_and_help() {
        let mut app = app_with(&[("a", 0.5), ("b", 0.6)]);
        handle_key(&mut app, key(KeyCode::Down));
        handle_key(&mut app, key(KeyCode::Enter));
        assert_eq!(app.detail.as_deref(), Some("kvm:b"));
        handle_key(&mut app, key(KeyCode::Up));
        assert_eq!(
            app.detail.as_deref(),
            Some("kvm:a"),
            "follows the selection"
        );
        handle_key(&mut app, key(KeyCode::Esc));
        assert_eq!(app.detail, None);
        handle_key(&mut app, key(KeyCode::Char('?')));
        assert!(app.help);
        handle_key(&mut app, key(KeyCode::Char('x')));
        assert!(!app.help && !app.quit);
    }
}
