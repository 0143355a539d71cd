#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose
//! Linux's own virtio_balloon driver (Debian's user-mode-linux 6.1, a real
//! Linux guest run as a process) against tier-balloon over vhost-user:
//! inflate, deflate, deflate-on-OOM, stats, and pages really given back to
//! the host. Ignored, with the reason, where linux.uml is missing.

use std::time::Duration;

mod uml_common;

use libtest_mimic::{Completion, Failed};
use serde_json::{Value, json};
use tier_uml::{Options, Uml, hog};

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(30);

fn opts(deflate_on_oom: bool) -> Options {
    let mut o = Options::new(env!("CARGO_BIN_EXE_tier-balloon"));
    o.deflate_on_oom = deflate_on_oom;
    o
}

fn legacy(uml: &Uml, bytes: u64) {
    uml.control(&json!({"op": "set_targets", "legacy": bytes}))
        .unwrap();
}

fn actual(st: &Value) -> u64 {
    st["legacy_actual"].as_u64().unwrap()
}

fn mem_total_kib(uml: &mut Uml) -> u64 {
    let out = uml
        .sh("grep MemTotal /proc/meminfo", Duration::from_secs(10))
        .unwrap();
    out.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Inflate 32 MiB, then deflate it all: the guest loses and regains the
/// memory, the host file gives the pages back, stats arrive.
fn inflate_and_deflate() -> Result<Completion, Failed> {
    let mut uml = Uml::start(&opts(false))?;
    // Touch most of the guest's free memory once, so the pages the balloon
    // takes are resident on the host before it takes them.
    uml.sh(&hog(64), WAIT)?;
    let host_before = uml.host_bytes()?;
    let total_before = mem_total_kib(&mut uml);
    legacy(&uml, 32 * MIB);
    let st = uml.wait_state("inflate to 32 MiB", WAIT, |s| actual(s) == 32 * MIB)?;
    assert_eq!(st["legacy"]["inflated_pfns"], 8192, "{st}");
    assert_eq!(st["legacy"]["rejected_pfns"], 0, "{st}");
    // Without DEFLATE_ON_OOM the driver takes the pages from the guest's
    // total (adjust_managed_page_count in virtio_balloon.c).
    assert_eq!(total_before - mem_total_kib(&mut uml), 32 * 1024);
    let host_after = uml.host_bytes()?;
    assert!(
        host_before - host_after >= 24 * MIB,
        "host held {host_before} bytes before, {host_after} after inflating 32 MiB"
    );
    // Linux's own stats arrive on the stats queue.
    let st = uml.wait_state("stats", WAIT, |s| {
        s["stats"]["updates"].as_u64() > Some(0)
            && s["stats"]["values"]["stat_total_memory"].as_u64() > Some(0)
    })?;
    let total_stat = st["stats"]["values"]["stat_total_memory"].as_u64().unwrap();
    assert!(total_stat < 128 * MIB, "{st}");
    legacy(&uml, 0);
    let st = uml.wait_state("deflate to 0", WAIT, |s| actual(s) == 0)?;
    assert_eq!(st["legacy"]["deflated_pfns"], 8192, "{st}");
    assert_eq!(mem_total_kib(&mut uml), total_before);
    // The guest uses the returned memory again.
    uml.sh(&hog(48), WAIT)?;
    Ok(Completion::Completed)
}

/// With DEFLATE_ON_OOM, a guest that runs out of memory takes pages back
/// from the balloon instead of killing: the device sees deflates it never
/// asked for, and the allocation succeeds.
fn deflate_on_oom() -> Result<Completion, Failed> {
    let mut uml = Uml::start(&opts(true))?;
    legacy(&uml, 80 * MIB);
    let st = uml.wait_state("inflate to 80 MiB", WAIT, |s| actual(s) == 80 * MIB)?;
    // Inflating that far may itself run the guest out of memory once (a
    // CI run saw 1492 pages given back on the way): count from here.
    let before = st["legacy"]["deflated_pfns"].as_u64().unwrap();
    // About 20 MiB are free in the guest: 40 MiB of tmpfs (no swap, so it
    // cannot be reclaimed) do not fit without the balloon's pages.
    let (rc, out) = uml.sh_rc(&hog(40), Duration::from_secs(90))?;
    let st = uml.state()?;
    let deflated = st["legacy"]["deflated_pfns"].as_u64().unwrap();
    assert!(deflated > before, "no deflate on OOM: {st}\n{out}");
    assert!(actual(&st) < 80 * MIB, "{st}");
    assert_eq!(
        rc, 0,
        "the allocation should succeed from the balloon: {out}"
    );
    assert_eq!(out.trim(), (40 * MIB).to_string(), "all of it written");
    // The guest lives on.
    uml.sh("true", WAIT)?;
    Ok(Completion::Completed)
}

fn main() {
    uml_common::run(
        tier_uml::missing(),
        &[
            (
                "stock_virtio_balloon_inflates_deflates_and_gives_pages_back",
                inflate_and_deflate,
            ),
            ("stock_virtio_balloon_deflates_on_oom", deflate_on_oom),
        ],
    )
}
