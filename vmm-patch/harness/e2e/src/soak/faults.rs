//! Injecting one fault and telling when the loop has recovered from it.
//! A fault is a small state machine the soak's tick loop advances:
//! inject, hold (while checks run), undo, then wait for recovery.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use tier_proto::v1::{DecisionOutcome, GetPolicyRequest, WatchStatsRequest};
use tier_proto::{Endpoint, connect};
use tokio_stream::StreamExt;

use crate::schedule::{Kind, Planned};
use crate::watch::{self, Shared};
use crate::world::World;

/// Where a fault is in its life.
#[derive(Debug)]
pub enum Phase {
    /// Injected; undone at `until`.
    Holding {
        until: Instant,
    },
    /// Undone at `since`; recovering.
    Recovering {
        since: Instant,
    },
    Done,
}

/// One injected fault and what was seen of it.
#[derive(Debug)]
pub struct Fault {
    pub plan: Planned,
    pub injected: Instant,
    pub phase: Phase,
    /// Intervals from the undo (or the injection, for instant faults) to
    /// recovery; `None` until recovered.
    pub recovery: Option<u32>,
    pub note: String,
    /// Invariant violations this fault caused, described.
    pub violations: Vec<String>,
    hold: Option<Hold>,
}

/// What a fault keeps while it holds.
#[derive(Debug)]
enum Hold {
    /// Held open until the undo, then dropped.
    Sockets {
        _open: Vec<UnixStream>,
    },
    Watcher(tokio::task::JoinHandle<Result<(u64, u64), String>>),
}

/// How long a fault holds before it is undone.
fn hold_for(kind: Kind) -> Duration {
    match kind {
        Kind::StopVmm => Duration::from_secs(8),
        Kind::KillBackend | Kind::KillVmMidMove => Duration::from_secs(3),
        Kind::ControlFlood | Kind::TierdFlood => Duration::from_secs(5),
        Kind::StalledWatcher => Duration::from_secs(13),
        Kind::KillTierd | Kind::GuestDeaf | Kind::GuestLies => Duration::ZERO,
    }
}

/// A guest window the soak saw open (`tg deaf on`, `tg lie on`): it holds
/// until the guest says it closed.
pub fn observed(p: Planned) -> Fault {
    Fault {
        plan: p,
        injected: Instant::now(),
        phase: Phase::Holding {
            until: Instant::now() + Duration::from_secs(3600),
        },
        recovery: None,
        note: String::new(),
        violations: Vec::new(),
        hold: None,
    }
}

/// Injects `p` now.
pub async fn inject(p: Planned, w: &mut World) -> Fault {
    let now = Instant::now();
    let mut f = Fault {
        plan: p,
        injected: now,
        phase: Phase::Holding {
            until: now + hold_for(p.kind),
        },
        recovery: None,
        note: String::new(),
        violations: Vec::new(),
        hold: None,
    };
    match p.kind {
        Kind::KillTierd => {
            w.tierd.kill9();
            if let Err(e) = w.restart_tierd() {
                f.violations
                    .push(format!("tierd did not start again: {e:#}"));
            }
        }
        Kind::KillBackend => w.kill_backend(),
        Kind::StopVmm => {
            if let Some(vm) = w.vms[p.vm].as_mut() {
                vm.signal(libc::SIGSTOP);
            }
        }
        Kind::KillVmMidMove => {
            let moving = mid_move(w, p.vm).await;
            f.note = if moving {
                "killed mid-move".into()
            } else {
                "no move within 15 s: killed anyway".into()
            };
            if let Some(vm) = w.vms[p.vm].as_mut() {
                vm.kill9();
            }
            w.vms[p.vm] = None;
        }
        Kind::ControlFlood => {
            let ctl = w.spec(1).vhost_user.map(|v| v.control);
            f.hold = ctl.map(|c| Hold::Sockets {
                _open: flood(&c, 64, 16),
            });
        }
        Kind::TierdFlood => {
            f.hold = Some(Hold::Sockets {
                _open: flood(w.tierd.socket(), 100, 100),
            })
        }
        Kind::StalledWatcher => {
            let socket = w.tierd.socket().to_path_buf();
            f.hold = Some(Hold::Watcher(tokio::spawn(stalled_watcher(socket))));
        }
        Kind::GuestDeaf | Kind::GuestLies => {}
    }
    f
}

/// Waits up to 15 s for VM `i`'s balloon to be moving (a target its
/// device has not reached).
async fn mid_move(w: &World, i: usize) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(15) {
        if let Some(vm) = &w.vms[i]
            && let Ok(zones) = vm.zones().await
            && zones.iter().any(|z| z.target != z.host_ballooned)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// `idle` connections that send nothing and `noisy` that send garbage.
fn flood(socket: &std::path::Path, idle: usize, noisy: usize) -> Vec<UnixStream> {
    let mut out = Vec::new();
    for i in 0..idle + noisy {
        let Ok(mut s) = UnixStream::connect(socket) else {
            continue;
        };
        if i >= idle {
            let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
            let junk: Vec<u8> = (0..4096u32).map(|k| (k * 131 + i as u32) as u8).collect();
            let _ = s.write_all(&junk);
            let _ = s.write_all(b"{\"op\":\"set_targets\",\"zones\":{\"dram\":1e300}}\n");
        }
        out.push(s);
    }
    out
}

/// Reads one update, stops reading for 10 s, then reads for 3 s: returns
/// (updates after the stall, the sequence gap), or what was wrong.
async fn stalled_watcher(socket: std::path::PathBuf) -> Result<(u64, u64), String> {
    let mut c = connect(&Endpoint::Unix(socket))
        .await
        .map_err(|e| e.to_string())?;
    let mut s = c
        .watch_stats(WatchStatsRequest::default())
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    let first = s
        .next()
        .await
        .ok_or("stream ended")?
        .map_err(|e| e.to_string())?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut last = first.sequence;
    let mut gap = 0;
    let mut n = 0;
    let end = Instant::now() + Duration::from_secs(3);
    while let Ok(Some(u)) = tokio::time::timeout_at(end.into(), s.next()).await {
        let u = u.map_err(|e| e.to_string())?;
        if u.sequence <= last {
            return Err(format!("sequence {} after {last}", u.sequence));
        }
        if let Some(v) = u.stats.iter().find_map(watch::insane) {
            return Err(v);
        }
        gap = gap.max(u.sequence - last - 1);
        last = u.sequence;
        n += 1;
    }
    if n == 0 {
        return Err("no update after the stall".into());
    }
    Ok((n, gap))
}

/// Undoes a holding fault whose time is up.
pub async fn undo(f: &mut Fault, w: &mut World) {
    match f.plan.kind {
        Kind::KillBackend => {
            if let Err(e) = w.restart_backend() {
                f.violations
                    .push(format!("backend did not start again: {e:#}"));
            }
        }
        Kind::StopVmm => {
            if let Some(vm) = w.vms[f.plan.vm].as_mut() {
                vm.signal(libc::SIGCONT);
            }
        }
        Kind::KillVmMidMove => {
            if let Err(e) = w.reboot_vm(f.plan.vm).await {
                f.violations.push(format!("VM did not boot again: {e:#}"));
            }
        }
        Kind::StalledWatcher => {
            if let Some(Hold::Watcher(h)) = f.hold.take() {
                match h.await {
                    Ok(Ok((n, gap))) => {
                        f.note = format!("{n} updates after the stall, gap of {gap}");
                    }
                    Ok(Err(e)) => f.violations.push(format!("stalled watcher: {e}")),
                    Err(e) => f.violations.push(format!("stalled watcher task: {e}")),
                }
            }
        }
        Kind::ControlFlood
        | Kind::TierdFlood
        | Kind::KillTierd
        | Kind::GuestDeaf
        | Kind::GuestLies => {}
    }
    f.hold = None;
}

/// While a fault holds: what must keep working does.
pub async fn during(f: &mut Fault, w: &World, log: &Shared, tick: Duration) {
    match f.plan.kind {
        Kind::ControlFlood => {
            let Some(v) = w.spec(1).vhost_user else {
                return;
            };
            let t = Instant::now();
            match control_state(v.control, Duration::from_secs(3)).await {
                Ok(_) => {}
                Err(e) => f.violations.push(format!(
                    "control socket did not answer during the flood ({e}, {:.1?})",
                    t.elapsed()
                )),
            }
        }
        Kind::TierdFlood | Kind::StopVmm => {
            // Updates keep coming: at most 3 intervals without one.
            let last = watch::lock(log).seen.last().map(|s| s.at);
            let quiet = last.map_or(Duration::MAX, |l| l.elapsed());
            let allowed = tick * 3 + Duration::from_secs(1);
            if quiet > allowed && f.injected.elapsed() > allowed {
                let v = format!(
                    "no stats update for {quiet:.1?} during {}",
                    f.plan.kind.name()
                );
                if !f.violations.contains(&v) {
                    f.violations.push(v);
                }
            }
        }
        _ => {}
    }
}

/// One `{"op":"state"}` on a backend control socket, off the runtime's
/// threads (the socket is blocking).
pub async fn control_state(
    path: std::path::PathBuf,
    timeout: Duration,
) -> Result<serde_json::Value, String> {
    tokio::task::spawn_blocking(move || control_state_blocking(&path, timeout))
        .await
        .map_err(|e| e.to_string())?
}

fn control_state_blocking(
    path: &std::path::Path,
    timeout: Duration,
) -> Result<serde_json::Value, String> {
    let mut s = UnixStream::connect(path).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.write_all(b"{\"op\":\"state\"}\n")
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let mut byte = [0u8; 4096];
    while !buf.ends_with(b"\n") {
        let n = s.read(&mut byte).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&byte[..n]);
    }
    serde_json::from_slice(&buf).map_err(|e| e.to_string())
}

/// When the loop recovered from `f` (after its undo), if it has, given
/// the VMM PIDs running now: the time of the first update that shows it
/// (the watcher's clock, not this once-an-interval poll), or now for what
/// is polled.
pub async fn recovered(
    f: &mut Fault,
    w: &World,
    log: &Shared,
    pids: &[Option<u32>; 2],
) -> Option<Instant> {
    let Phase::Recovering { since } = f.phase else {
        return None;
    };
    let first = |ok: &dyn Fn(&watch::Seen) -> bool| first_seen(log, since, ok);
    match f.plan.kind {
        Kind::KillTierd => {
            let both = first(&|s| pids.iter().all(|p| p.is_some_and(|p| s.vms.contains(&p))));
            if both.is_some() {
                check_policy(f, w).await;
            }
            both
        }
        Kind::StopVmm | Kind::KillVmMidMove => {
            let pid = pids[f.plan.vm];
            first(&|s| pid.is_some_and(|p| s.vms.contains(&p)))
        }
        Kind::KillBackend => {
            let reported = first_decision(log, f.injected, pids[1], false).is_some();
            let connected = match w.spec(1).vhost_user {
                Some(v) => control_state(v.control, Duration::from_secs(2))
                    .await
                    .is_ok_and(|s| s["state"]["frontend"]["connected"] == true),
                None => false,
            };
            if connected {
                f.note = "the VMM reconnected".into();
            } else if reported {
                f.note = "not reconnected; tierd reports the VM not drivable".into();
            }
            (connected || reported).then(Instant::now)
        }
        Kind::GuestDeaf => {
            // tierd moves its balloon again (APPLIED after the window), or
            // the balloon has caught up with the target tierd keeps.
            if let Some(at) = first_decision(log, since, pids[f.plan.vm], true) {
                f.note = "managed again after the window".into();
                return Some(at);
            }
            let vm = w.vms[f.plan.vm].as_ref()?;
            let caught_up = vm.zones().await.is_ok_and(|z| {
                z.iter()
                    .all(|z| z.target.abs_diff(z.host_ballooned) <= 4 << 20)
            });
            caught_up.then(Instant::now)
        }
        Kind::ControlFlood | Kind::TierdFlood | Kind::StalledWatcher | Kind::GuestLies => {
            // Updates flow again.
            first(&|_| true)
        }
    }
}

/// The first update at or after `since` for which `ok` holds.
fn first_seen(log: &Shared, since: Instant, ok: &dyn Fn(&watch::Seen) -> bool) -> Option<Instant> {
    let l = watch::lock(log);
    l.seen
        .iter()
        .rev()
        .take_while(|s| s.at >= since)
        .filter(|s| ok(s))
        .map(|s| s.at)
        .min()
}

/// The first decision at or after `since` for the VM of VMM `pid`:
/// APPLIED ones if `applied`, else the others (not drivable, refused).
fn first_decision(
    log: &Shared,
    since: Instant,
    pid: Option<u32>,
    applied: bool,
) -> Option<Instant> {
    let l = watch::lock(log);
    let id = vm_id_of(&l, pid)?;
    l.decisions
        .iter()
        .filter(|(at, d)| {
            *at >= since
                && d.vm_id == id
                && (d.outcome == DecisionOutcome::Applied as i32) == applied
        })
        .map(|(at, _)| *at)
        .min()
}

/// tierd's id of the VM with this VMM PID: not kept by the watcher, so
/// matched through decisions' detail-free id; None if unknown.
fn vm_id_of(l: &watch::Log, pid: Option<u32>) -> Option<&str> {
    let pid = pid?;
    l.ids.get(&pid).map(String::as_str)
}

/// After a restart tierd must act on the policy it was given, not the
/// default one.
async fn check_policy(f: &mut Fault, w: &World) {
    let Ok(mut c) = connect(&Endpoint::Unix(w.tierd.socket().to_path_buf())).await else {
        f.violations.push("tierd socket gone after restart".into());
        return;
    };
    match c.get_policy(GetPolicyRequest {}).await {
        Ok(p) if p.get_ref() == &w.plan.policy() => {}
        Ok(p) => f.violations.push(format!(
            "policy after restart is not the one set: {:?}",
            p.into_inner()
        )),
        Err(e) => f.violations.push(format!("GetPolicy after restart: {e}")),
    }
}
