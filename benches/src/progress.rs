//! Progress of a long bench on stderr, only when stderr is a terminal.
//!
//! Scripts read the benches' stdout tables and `RESULT` line, often with
//! stderr captured too: when stderr is not a terminal the bar is hidden
//! (indicatif's hidden target writes nothing at all), so piped output stays
//! byte for byte what it was. On a terminal, print through
//! [`Progress::suspend`] while the bar is live so lines are not garbled, and
//! [`Progress::finish`] (or drop) clears the bar before the final tables.

use std::borrow::Cow;
use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle, TermLike};

/// A bar (known length) or spinner, prefixed with the bench's name.
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar of `len` steps on stderr; hidden unless stderr is a terminal.
    pub fn bar(bench: &str, len: u64) -> Progress {
        Progress::new(bench, Some(len), stderr_target())
    }

    /// A spinner (no known length) on stderr; hidden unless a terminal.
    pub fn spinner(bench: &str) -> Progress {
        Progress::new(bench, None, stderr_target())
    }

    /// Draws on `term` when `terminal`, else nowhere (for tests).
    pub fn to(bench: &str, len: Option<u64>, terminal: bool, term: Box<dyn TermLike>) -> Progress {
        let target = if terminal {
            ProgressDrawTarget::term_like(term)
        } else {
            ProgressDrawTarget::hidden()
        };
        Progress::new(bench, len, target)
    }

    fn new(bench: &str, len: Option<u64>, target: ProgressDrawTarget) -> Progress {
        let (bar, template) = match len {
            Some(n) => (
                ProgressBar::with_draw_target(Some(n), target),
                "{prefix}: [{bar:24}] {pos}/{len} {wide_msg} {elapsed}",
            ),
            None => (
                ProgressBar::with_draw_target(None, target),
                "{prefix}: {spinner} {wide_msg} {elapsed}",
            ),
        };
        // A constant template: the fallback is only there to avoid a panic.
        let style = ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(bench.to_string());
        if !bar.is_hidden() {
            // Redraw (elapsed, spinner) while one item takes seconds.
            bar.enable_steady_tick(Duration::from_millis(250));
        }
        Progress { bar }
    }

    /// Names the item now being worked on.
    pub fn item(&self, what: impl Into<Cow<'static, str>>) {
        self.bar.set_message(what);
    }

    /// One step done.
    pub fn inc(&self) {
        self.bar.inc(1);
    }

    /// Names the item, runs it, counts it done.
    pub fn step<R>(&self, what: impl Into<Cow<'static, str>>, f: impl FnOnce() -> R) -> R {
        self.item(what);
        let r = f();
        self.inc();
        r
    }

    /// Runs `f` (which prints) with the bar cleared, then redraws it.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }

    /// Clears the bar for good (before the final tables).
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }

    /// Whether nothing is drawn (stderr is not a terminal).
    pub fn is_hidden(&self) -> bool {
        self.bar.is_hidden()
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        // An early return (error) must not leave a bar on the terminal.
        if !self.bar.is_finished() {
            self.bar.finish_and_clear();
        }
    }
}

fn stderr_target() -> ProgressDrawTarget {
    if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A terminal that records everything drawn on it.
    #[derive(Debug, Clone, Default)]
    struct Recorder(Arc<Mutex<String>>);

    impl Recorder {
        fn push(&self, s: &str) -> io::Result<()> {
            self.0.lock().unwrap().push_str(s);
            Ok(())
        }
        fn text(&self) -> String {
            self.0.lock().unwrap().clone()
        }
    }

    impl TermLike for Recorder {
        fn width(&self) -> u16 {
            100
        }
        fn move_cursor_up(&self, n: usize) -> io::Result<()> {
            self.push(&format!("<up {n}>"))
        }
        fn move_cursor_down(&self, n: usize) -> io::Result<()> {
            self.push(&format!("<down {n}>"))
        }
        fn move_cursor_right(&self, n: usize) -> io::Result<()> {
            self.push(&format!("<right {n}>"))
        }
        fn move_cursor_left(&self, n: usize) -> io::Result<()> {
            self.push(&format!("<left {n}>"))
        }
        fn write_line(&self, s: &str) -> io::Result<()> {
            self.push(&format!("{s}\n"))
        }
        fn write_str(&self, s: &str) -> io::Result<()> {
            self.push(s)
        }
        fn clear_line(&self) -> io::Result<()> {
            self.push("<clear>")
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Everything a bench does with a bar, then the drop.
    fn exercise(p: Progress) {
        p.item("row 1: 64 pages");
        p.inc();
        let printed = p.suspend(|| 42);
        assert_eq!(printed, 42, "suspend runs the closure");
        assert_eq!(p.step("row 2: 512 pages", || 7), 7, "step runs the closure");
        p.finish();
    }

    #[test]
    fn not_a_terminal_draws_nothing() {
        for len in [Some(2), None] {
            let rec = Recorder::default();
            let p = Progress::to("bench", len, false, Box::new(rec.clone()));
            assert!(p.is_hidden());
            exercise(p);
            assert_eq!(rec.text(), "", "len {len:?}");
        }
    }

    #[test]
    fn a_terminal_shows_the_bench_and_item() {
        // The same calls on a terminal do draw: the test above can fail.
        let rec = Recorder::default();
        let p = Progress::to("bench", Some(2), true, Box::new(rec.clone()));
        assert!(!p.is_hidden());
        p.item("row 1: 64 pages");
        p.inc();
        let text = rec.text();
        // Draws are rate-limited: the position shown may lag one step.
        assert!(text.contains("bench: [") && text.contains("/2"), "{text:?}");
        assert!(text.contains("row 1: 64 pages"), "{text:?}");
        p.finish();
        let cleared = rec.text();
        assert!(cleared.len() > text.len(), "finish clears the bar");
        drop(p);
        assert_eq!(rec.text(), cleared, "nothing drawn after finish");
    }

    #[test]
    fn dropping_a_live_bar_clears_it() {
        let rec = Recorder::default();
        let p = Progress::to("bench", Some(2), true, Box::new(rec.clone()));
        p.item("row 1");
        let drawn = rec.text();
        drop(p);
        assert!(rec.text().len() > drawn.len(), "{:?}", rec.text());
    }
}
