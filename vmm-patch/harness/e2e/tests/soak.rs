//! The 90-second soak (docs/soak.md): `tier-soak` against the patched
//! cloud-hypervisor (TIERD_CH_BIN), with tierd and tier-balloon from this
//! build; every fault kind injected, no invariant violated. Ignored, with
//! the reason, where the VMM, /dev/kvm or those binaries are missing.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::path::PathBuf;
use std::process::Command;

use libtest_mimic::{Arguments, Completion, Failed, Trial};

/// tierd and tier-balloon beside this test's own binary (`cargo test
/// --workspace` builds every binary of the workspace there).
fn sibling(name: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .ok_or("no target directory")?;
    let p = dir.join(name);
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "{} not built (cargo build -p {})",
            p.display(),
            if name == "tierd" {
                "tier-profiler"
            } else {
                "tier-balloon"
            }
        ))
    }
}

fn soak() -> Result<Completion, Failed> {
    let ready = tier_test_support::ch_kvm()
        .and_then(|ch| Ok((ch, sibling("tierd")?, sibling("tier-balloon")?)));
    let (ch, tierd, balloon) = match ready {
        Ok(r) => r,
        Err(reason) => return Ok(Completion::ignored_with(reason)),
    };
    let out = Command::new(env!("CARGO_BIN_EXE_tier-soak"))
        .arg("--ch-bin")
        .arg(&ch)
        .arg("--tierd")
        .arg(&tierd)
        .arg("--balloon")
        .arg(&balloon)
        .args(["--minutes", "1.5", "--seed", "1"])
        .output()
        .map_err(|e| Failed::from(e.to_string()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let result = text
        .lines()
        .find(|l| l.starts_with("RESULT "))
        .ok_or_else(|| {
            format!(
                "no RESULT line:\n{text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    let field = |k: &str| {
        result
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse::<u64>().ok())
    };
    let faults = field("faults").ok_or(format!("no faults= in {result}"))?;
    let ok = out.status.success()
        && field("violations") == Some(0)
        && field("survived") == Some(faults)
        && faults >= 5;
    if !ok {
        return Err(format!("{result}\n{text}").into());
    }
    Ok(Completion::Completed)
}

fn main() {
    let args = Arguments::from_args();
    let trial = Trial::ignorable_test("soak_90s_every_fault_survived_no_violation", soak);
    libtest_mimic::run(&args, vec![trial]).exit();
}
