//! The `tier-balloon` command line: bad arguments exit non-zero with the
//! reason on stderr and leave no socket behind.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::process::Command;

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tier-balloon"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_arguments_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let vu = dir.path().join("vu.sock");
    let ctl = dir.path().join("ctl.sock");
    let (vu_s, ctl_s) = (vu.to_str().unwrap(), ctl.to_str().unwrap());
    let base = ["--socket", vu_s, "--control", ctl_s];
    let cases: &[(&[&str], i32, &str)] = &[
        (&[], 2, "--tier"),
        (
            &["--tier", "name=dram,ranges=0x800-0x2000"],
            2,
            "not 4 KiB aligned",
        ),
        (&["--tier", "name=dram"], 2, "ranges= missing"),
        (&["--tier", "ranges=0-0x1000"], 2, "name= missing"),
        (
            &["--tier", "name=dram,ranges=0-0x1000,size=1G"],
            2,
            "unknown key",
        ),
        (
            &[
                "--tier",
                "name=dram,ranges=0x0-0x2000",
                "--tier",
                "name=slow,ranges=0x1000-0x3000",
            ],
            1,
            "overlaps",
        ),
        (
            &[
                "--tier",
                "name=a,ranges=0x0-0x1000",
                "--tier",
                "name=a,ranges=0x1000-0x2000",
            ],
            1,
            "given twice",
        ),
        (
            &[
                "--tier",
                "name=a,ranges=0-0x1000",
                "--stats-interval-ms",
                "1",
            ],
            2,
            "stats-interval-ms",
        ),
    ];
    for (extra, code, needle) in cases {
        let args: Vec<&str> = base.iter().chain(extra.iter()).copied().collect();
        let (got, err) = run(&args);
        assert_eq!(got, *code, "{extra:?}: {err}");
        assert!(err.contains(needle), "{extra:?}: {err}");
    }
    let tier = ["--tier", "name=a,ranges=0-0x1000"];
    let (got, err) = run(&[&["--socket", ctl_s, "--control", ctl_s][..], &tier[..]].concat());
    assert_eq!(got, 1, "{err}");
    assert!(err.contains("different paths"), "{err}");
    // A socket in a directory that does not exist: named, and the control
    // socket created just before is removed again.
    let missing = dir.path().join("nodir/vu.sock");
    let (got, err) = run(&[
        &["--socket", missing.to_str().unwrap(), "--control", ctl_s][..],
        &tier[..],
    ]
    .concat());
    assert_eq!(got, 1, "{err}");
    assert!(
        err.contains("cannot bind") && err.contains("nodir/vu.sock"),
        "{err}"
    );
    assert!(!ctl.exists());
    // A regular file where the socket should go is never replaced.
    std::fs::write(&vu, b"precious").unwrap();
    let (got, err) = run(&[&base[..], &tier[..]].concat());
    assert_eq!(got, 1, "{err}");
    assert!(err.contains("not a socket"), "{err}");
    assert_eq!(std::fs::read(&vu).unwrap(), b"precious");
    assert!(!ctl.exists());
}
