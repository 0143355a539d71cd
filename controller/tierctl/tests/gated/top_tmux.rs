#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose
//! `tierctl top` in a real terminal: tmux runs it against a real tierd with
//! the demo VM; keys go in with `send-keys`, the screen comes back with
//! `capture-pane`.
//!
//! Custom harness (libtest-mimic): without tmux or a usable /dev/kvm the
//! tests are reported as ignored with the reason, never as passed.

use std::time::Duration;

use crate::cli_common::start_tierd;
use libtest_mimic::{Completion, Failed, Trial};
use tier_test_support::{Tmux, kvm_missing, tmux_missing};

/// `tierctl top` in a private tmux server's session (killed on drop);
/// the shell stays after tierctl exits so its exit status is on screen.
struct Top(Tmux);

impl Top {
    fn start(test: &str, endpoint: &str, width: u16, height: u16) -> Top {
        let cmd = format!(
            "{} --endpoint {endpoint} top; echo TIERCTL-EXIT=$?; sleep 600",
            env!("CARGO_BIN_EXE_tierctl")
        );
        let t = Tmux::start(&format!("tierctl-{test}"), width, height, &cmd);
        // Esc reaches tierctl at once instead of after tmux's 500 ms wait.
        t.tmux(&["set-option", "-g", "escape-time", "0"]);
        Top(t)
    }

    fn keys(&self, keys: &[&str]) {
        self.0.keys(keys, Duration::from_millis(120));
    }

    fn screen(&self) -> String {
        self.0.screen()
    }

    /// Waits until the screen satisfies `ok`; fails with the screen if it never does.
    fn wait(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        self.0.wait(what, Duration::from_secs(15), ok)
    }

    fn resize(&self, width: u16, height: u16) {
        self.0.resize(width, height);
    }
}

/// Lines of the table that belong to the demo VM's row.
fn demo_row(screen: &str) -> Option<&str> {
    screen.lines().find(|l| l.starts_with("demo "))
}

fn has_all(s: &str, parts: &[&str]) -> bool {
    parts.iter().all(|p| s.contains(p))
}

fn sort_filter_detail_help_pause_resize_quit() {
    // Every interval sampled, so the detail pane always shows the tiers'
    // source (the default sampler budget would skip most of them).
    let tierd = start_tierd(&["--demo-vm", "--interval-ms", "500", "--cpu-budget-pct", "0"]);
    let tmux = Top::start("keys", &tierd.endpoint(), 160, 40);

    // The demo VM's row with both tiers, once host samples have arrived.
    // Its headline is the hot set's DRAM share, steered by the hot set
    // (policy mode auto, no PMU here); the 0-100 % ratio is no number.
    let s = tmux.wait("the demo VM with hostpte samples", |s| {
        demo_row(s).is_some_and(|r| has_all(r, &["dram", "hostpte", "hot ", "hot-set", "%"]))
            && has_all(s, &["slow:cxl", "● connected", "VMs 1 shown of 1"])
    });
    assert!(!s.contains("0-100 % ?"), "{s}");
    assert!(s.contains("sort: delta ▲") && s.contains("DELTA▲"), "{s}");
    let row = demo_row(&s).unwrap();
    // Balloon target/actual, target from the policy default.
    assert!(has_all(row, &["0B/0B", "90.0%"]), "{row}");
    assert!(
        s.lines()
            .nth(4)
            .is_some_and(|l| l.contains("slow:cxl") && l.contains("hostpte")),
        "second tier on the row's second line:\n{s}"
    );

    // Sort: `s` cycles the column, `S` flips it, `1` sorts by name.
    tmux.keys(&["s"]);
    tmux.wait("sort by last action", |s| {
        s.contains("sort: last action ▼") && s.contains("LAST ACTION▼")
    });
    tmux.keys(&["S"]);
    tmux.wait("sort flipped", |s| s.contains("sort: last action ▲"));
    tmux.keys(&["1"]);
    let s = tmux.wait("sort by name", |s| {
        s.contains("sort: name ▲") && s.contains("VM▲")
    });
    assert!(demo_row(&s).is_some(), "{s}");

    // Filter: the prompt, a regex that hides the VM, Esc brings it back.
    tmux.keys(&["/"]);
    tmux.wait("the filter prompt", |s| s.contains("filter (regex): "));
    tmux.keys(&["z", "z", "z"]);
    let s = tmux.wait("the VM hidden", |s| {
        s.contains("VMs 0 shown of 1") && s.contains("no VM matches the filter")
    });
    assert!(demo_row(&s).is_none(), "{s}");
    tmux.keys(&["Enter"]);
    let s = tmux.wait("the filter kept", |s| {
        s.contains("filter: /zzz/") && !s.contains("filter (regex): ")
    });
    assert!(demo_row(&s).is_none(), "{s}");
    tmux.keys(&["Escape"]);
    tmux.wait("the filter cleared", |s| {
        s.contains("VMs 1 shown of 1") && demo_row(s).is_some() && !s.contains("filter: /")
    });
    tmux.keys(&["/", "D", "E", "M", "Enter"]);
    tmux.wait("demo matched by /DEM/ (case-insensitive)", |s| {
        s.contains("filter: /DEM/") && demo_row(s).is_some()
    });

    // Detail pane of the selected (only) VM.
    tmux.keys(&["Enter"]);
    let s = tmux.wait("the detail pane", |s| {
        has_all(
            s,
            &[
                "demo (demo:",
                ") detail",
                "heat histogram: unavailable",
                "over the last minute",
                "dram acc/s",
                "slow resident",
            ],
        )
    });
    assert!(
        has_all(&s, &["source demo", "target 90.0% (policy default)"]),
        "{s}"
    );
    assert!(
        s.lines()
            .any(|l| l.contains("slow") && l.contains("cxl") && l.contains("hostpte")),
        "the tier table: {s}"
    );
    tmux.keys(&["Escape"]);
    tmux.wait("back to the table", |s| {
        !s.contains(") detail") && s.lines().any(|l| l.starts_with("VM") && l.contains("DRAM"))
    });

    // Help overlay; any key closes it.
    tmux.keys(&["?"]);
    tmux.wait("the help overlay", |s| {
        has_all(s, &["Keys", "pause the picture"])
    });
    tmux.keys(&["x"]);
    tmux.wait("help closed", |s| !s.contains("pause the picture"));

    // Pause keeps the picture while updates keep arriving.
    tmux.keys(&["p"]);
    let s = tmux.wait("paused", |s| s.contains("PAUSED (receiving: #"));
    let shown = s.lines().next().unwrap().to_string();
    std::thread::sleep(Duration::from_millis(1200));
    let later = tmux.screen();
    let first = later.lines().next().unwrap();
    let seq = |l: &str| {
        l.split("update #")
            .nth(1)
            .map(|r| r.split(' ').next().unwrap().to_string())
    };
    assert_eq!(seq(first), seq(&shown), "the picture stays: {later}");
    assert_ne!(first, shown, "the receiving counter moves: {later}");
    tmux.keys(&["p"]);
    tmux.wait("running again", |s| !s.contains("PAUSED"));

    // A narrower terminal: the table gives up its widest columns.
    tmux.resize(100, 24);
    let s = tmux.wait("the narrow layout", |s| {
        s.lines().all(|l| l.chars().count() <= 100)
            && s.lines().any(|l| l.starts_with("VM") && l.contains("DRAM"))
            && !s.contains("LAST ACTION")
    });
    assert!(demo_row(&s).is_some(), "{s}");

    tmux.keys(&["q"]);
    tmux.wait("tierctl to exit cleanly", |s| s.contains("TIERCTL-EXIT=0"));
}

fn daemon_goes_away_and_comes_back() {
    let mut tierd = start_tierd(&["--demo-vm", "--interval-ms", "300"]);
    let tmux = Top::start("restart", &tierd.endpoint(), 160, 30);
    tmux.wait("the demo VM", |s| {
        demo_row(s).is_some() && s.contains("● connected")
    });
    let id = |s: &str| {
        s.split("demo:").nth(1).map(|r| {
            r.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
    };
    tmux.keys(&["Enter"]);
    let before = tmux.wait("the detail pane", |s| s.contains(") detail"));
    tmux.keys(&["Escape"]);
    let old_id = id(&before).unwrap();
    // The restarted tierd numbers its updates from 1 again: a lower number
    // on screen means the picture is the new daemon's, not the last one.
    let update_no = |s: &str| {
        s.split("update #").nth(1).and_then(|r| {
            r.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse::<u64>()
                .ok()
        })
    };
    let last =
        update_no(&tmux.wait("five updates", |s| update_no(s).is_some_and(|n| n >= 5))).unwrap();

    tierd.terminate();
    let s = tmux.wait("the disconnect", |s| {
        s.contains("disconnected, retrying in") && s.contains("tierd is not running")
    });
    assert!(demo_row(&s).is_some(), "the last picture stays:\n{s}");

    tierd.restart();
    tmux.wait("the reconnect", |s| {
        s.contains("● connected")
            && !s.contains("disconnected")
            && demo_row(s).is_some()
            && update_no(s).is_some_and(|n| n < last)
    });
    tmux.keys(&["Enter"]);
    let after = tmux.wait("the new demo VM", |s| {
        s.contains(") detail") && id(s).is_some_and(|i| i != old_id)
    });
    assert!(after.contains("demo (demo:"), "{after}");
    tmux.keys(&["q"]);
    tmux.wait("tierctl to exit cleanly", |s| s.contains("TIERCTL-EXIT=0"));
}

/// This file's trials, named `top_tmux::NAME`.
pub fn trials() -> Vec<Trial> {
    let missing = tmux_missing().or_else(kvm_missing);
    let trial = |name: &'static str, f: fn()| {
        let missing = missing.clone();
        Trial::ignorable_test(name, move || -> Result<Completion, Failed> {
            if let Some(reason) = missing {
                return Ok(Completion::ignored_with(reason));
            }
            f();
            Ok(Completion::Completed)
        })
    };
    let tests = vec![
        trial(
            "top_tmux::top_sort_filter_detail_help_pause_resize_quit",
            sort_filter_detail_help_pause_resize_quit,
        ),
        trial(
            "top_tmux::top_daemon_goes_away_and_comes_back",
            daemon_goes_away_and_comes_back,
        ),
    ];
    tests
}
