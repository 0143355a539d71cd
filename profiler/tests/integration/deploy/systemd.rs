//! profiler/deploy/systemd/tierd.service through `systemd-analyze verify`.
//! It needs no running systemd (it loads the unit in a throw-away manager),
//! but checks that ExecStart is executable: the unit is verified with the
//! built tierd in place of /usr/local/bin/tierd.

use std::path::Path;
use std::process::Command;

use super::{deploy_file, read};

const INSTALLED: &str = "ExecStart=/usr/local/bin/tierd ";

/// The unit as installed, ExecStart pointing at the tierd under test.
fn unit_for_test() -> String {
    let unit = read(&deploy_file("systemd/tierd.service"));
    assert_eq!(
        unit.matches(INSTALLED).count(),
        1,
        "expected one `{INSTALLED}` line in the unit:\n{unit}"
    );
    unit.replace(
        INSTALLED,
        &format!("ExecStart={} ", env!("CARGO_BIN_EXE_tierd")),
    )
}

/// Runs `systemd-analyze verify` on `unit` saved as tierd.service in an
/// empty directory; returns (success, stderr lines about the unit, stderr).
fn verify(unit: &str) -> (bool, Vec<String>, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tierd.service");
    std::fs::write(&file, unit).unwrap();
    let out = analyze(&file);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    // Messages about our unit name it ("tierd.service: ...") or its file
    // ("/tmp/.../tierd.service:12: ..."); anything else is the host's own
    // units, which --recursive-errors=no keeps out of the exit status.
    let about_unit = stderr
        .lines()
        .filter(|l| l.contains("tierd.service"))
        .map(str::to_string)
        .collect();
    (out.status.success(), about_unit, stderr)
}

fn analyze(file: &Path) -> std::process::Output {
    match Command::new("systemd-analyze")
        .args(["verify", "--man=no", "--recursive-errors=no"])
        .arg(file)
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "systemd-analyze not found: install the test dependencies with `cargo xtask deps` (Debian package systemd)"
        ),
        Err(e) => panic!("systemd-analyze: {e}"),
    }
}

#[test]
fn systemd_unit_verifies() {
    let (ok, about_unit, stderr) = verify(&unit_for_test());
    assert!(
        ok && about_unit.is_empty(),
        "systemd-analyze verify failed or warned about tierd.service (ok={ok}):\n{stderr}"
    );
}

/// The check above is only worth something if verify really reads the
/// unit here: a misspelled key and a missing binary must both be reported.
#[test]
fn systemd_verify_reports_a_bad_unit() {
    let good = unit_for_test();
    let misspelled = good.replace("TimeoutStopSec=", "TimeoutStopSecs=");
    assert_ne!(misspelled, good);
    let (_, about_unit, stderr) = verify(&misspelled);
    assert!(
        about_unit.iter().any(|l| l.contains("TimeoutStopSecs")),
        "no warning about the misspelled key:\n{stderr}"
    );
    let missing = good.replace(env!("CARGO_BIN_EXE_tierd"), "/nonexistent/tierd");
    let (ok, about_unit, stderr) = verify(&missing);
    assert!(
        !ok && about_unit.iter().any(|l| l.contains("/nonexistent/tierd")),
        "a missing ExecStart binary passed (ok={ok}):\n{stderr}"
    );
}

/// The .deb's commented default /etc/tierd/tierd.toml loads and equals the
/// defaults: every line of it is a comment or a section header.
#[test]
fn debian_default_config_is_the_defaults() {
    let file = deploy_file("debian/tierd.toml");
    let loaded = tier_profiler::config::Config::load(&file, true)
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert_eq!(loaded, tier_profiler::config::Config::default());
    // Each commented `key = value` line, uncommented alone, is valid.
    let text = read(&file);
    let mut section = String::new();
    for line in text.lines() {
        let Some(l) = line.strip_prefix('#') else {
            continue;
        };
        if l.starts_with('[') {
            section = l.to_string();
        } else if l.contains(" = ") && !l.starts_with(' ') {
            let one = format!("{section}\n{l}\n");
            let dir = tempfile::tempdir().unwrap();
            let f = dir.path().join("t.toml");
            std::fs::write(&f, &one).unwrap();
            let c = tier_profiler::config::Config::load(&f, true)
                .unwrap_or_else(|e| panic!("{one}: {e}"));
            // TLS needs its files, the group must exist on the host; every
            // other key validates alone.
            if !section.starts_with("[tcp]") && !l.starts_with("socket_group") {
                c.validate().unwrap_or_else(|e| panic!("{one}: {e}"));
            }
        }
    }
}
