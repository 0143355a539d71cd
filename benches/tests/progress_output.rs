//! Progress output of a real bench binary (`schedule`, the cheapest: no VM,
//! no root): piped, its output is plain text ending in the RESULT line; in a
//! real terminal (tmux), a progress bar is on screen while it runs and gone
//! when the tables are printed.
//!
//! Custom harness (libtest-mimic): without tmux the terminal test is
//! reported as ignored with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::process::Command;
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use tier_test_support::{Tmux, tmux_missing};

const BENCH: &str = env!("CARGO_BIN_EXE_schedule");
/// The RESULT keys of `schedule`, in order.
const KEYS: [&str; 8] = [
    "shapes",
    "coverage_min",
    "width_pp_default",
    "width_pp_four",
    "width_pp_lead5ms",
    "width_pp_seven",
    "fraction",
    "refit_every",
];

/// The RESULT line is the last line, with every key and a number for each.
fn check_result_line(stdout: &str) {
    let last = stdout.lines().last().unwrap_or_default();
    let fields: Vec<&str> = last
        .strip_prefix("RESULT ")
        .unwrap_or_else(|| panic!("last line is not RESULT: {last:?}"))
        .split(' ')
        .collect();
    let keys: Vec<&str> = fields
        .iter()
        .map(|f| f.split_once('=').map_or("", |(k, _)| k))
        .collect();
    assert_eq!(keys, KEYS, "{last:?}");
    for f in fields {
        let (_, v) = f.split_once('=').unwrap();
        v.parse::<f64>()
            .unwrap_or_else(|e| panic!("{f:?} in {last:?}: {e}"));
    }
}

fn piped_output_is_plain() {
    let out = Command::new(BENCH)
        .args(["--intervals", "2"])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    );
    assert!(out.status.success(), "{}: {stderr}", out.status);
    for (name, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        assert!(
            !text.contains('\x1b') && !text.contains('\r'),
            "{name} has ESC or CR: {text:?}"
        );
    }
    // The bench writes nothing else to stderr: no bar, no blank line.
    assert_eq!(stderr, "", "stderr");
    // Title, header, 7 shapes x 4 schedules, summary header + 4, RESULT.
    assert_eq!(stdout.lines().count(), 2 + 28 + 5 + 1, "{stdout}");
    check_result_line(&stdout);
}

fn terminal_shows_a_bar() {
    // The shell stays after the bench so the final screen can be read.
    let cmd = format!("{BENCH} --intervals 15; echo BENCH-EXIT=$?; sleep 600");
    let t = Tmux::start("bench-progress", 170, 50, &cmd);
    let is_bar = |l: &str| l.starts_with("schedule: [") && l.contains("/28");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut bar = None;
    let screen = loop {
        let s = t.screen();
        if bar.is_none() {
            bar = s.lines().find(|l| is_bar(l)).map(str::to_string);
        }
        if s.contains("BENCH-EXIT=") {
            break s;
        }
        assert!(Instant::now() < deadline, "bench still running:\n{s}");
        std::thread::sleep(Duration::from_millis(40));
    };
    let bar = bar.unwrap_or_else(|| panic!("no progress line seen; final screen:\n{screen}"));
    // The bar names the current shape and schedule.
    assert!(bar.contains("passes"), "{bar:?}");
    assert!(screen.contains("BENCH-EXIT=0"), "{screen}");
    // Cleared before the summary: the table and RESULT are as when piped.
    assert!(!screen.lines().any(is_bar), "bar left on screen:\n{screen}");
    let out: String = screen
        .lines()
        .take_while(|l| !l.starts_with("BENCH-EXIT="))
        .map(|l| format!("{}\n", l.trim_end()))
        .collect();
    assert_eq!(out.lines().count(), 2 + 28 + 5 + 1, "{screen}");
    check_result_line(&out);
}

fn main() {
    let args = Arguments::from_args();
    let missing = tmux_missing();
    let tests = vec![
        Trial::test("piped_output_is_plain", || {
            piped_output_is_plain();
            Ok(())
        }),
        Trial::ignorable_test(
            "terminal_shows_a_bar",
            move || -> Result<Completion, Failed> {
                if let Some(reason) = missing {
                    return Ok(Completion::ignored_with(reason));
                }
                terminal_shows_a_bar();
                Ok(Completion::Completed)
            },
        ),
    ];
    libtest_mimic::run(&args, tests).exit();
}
