//! Invariants checked every interval from outside tierd: the VMMs' API
//! (balloon targets against zone sizes and the host DRAM budget), the
//! guests' serial logs (canary pages lost), and /proc (fds, threads and
//! RSS of tierd and the backend, per process lifetime).

use std::collections::BTreeMap;

use crate::world::World;

/// One process lifetime's resource samples.
#[derive(Debug, Default, Clone)]
pub struct Usage {
    pub what: String,
    pub samples: Vec<(u64, u64, u64)>,
}

/// What the checks keep between intervals.
#[derive(Debug, Default)]
pub struct Checker {
    pub usage: BTreeMap<u32, Usage>,
    pub ticks_checked: u64,
    pub budget_skipped: u64,
    pub canary_seen: bool,
    /// Each VM's DRAM target as last read, with its VMM PID: a VMM that
    /// does not answer this interval keeps the target it had.
    last_target: [Option<(u32, u64)>; 2],
}

impl Checker {
    /// Checks one interval; violations described.
    pub async fn tick(&mut self, w: &World, excluded: &[bool; 2]) -> Vec<String> {
        let mut out = Vec::new();
        self.ticks_checked += 1;
        let budget = w.plan.budget();
        let zone = w.plan.dram_mib << 20;
        let mut held = 0u64;
        let mut complete = true;
        for (i, slot) in w.vms.iter().enumerate() {
            let Some(vm) = slot else {
                continue;
            };
            let last = self.last_target[i].filter(|(pid, _)| *pid == vm.pid());
            if excluded[i] {
                match last {
                    Some((_, t)) => held += zone.saturating_sub(t),
                    None => complete = false,
                }
                continue;
            }
            let zones =
                match tokio::time::timeout(std::time::Duration::from_secs(2), vm.zones()).await {
                    Ok(Ok(z)) => z,
                    _ => {
                        match last {
                            Some((_, t)) => held += zone.saturating_sub(t),
                            None => complete = false,
                        }
                        continue;
                    }
                };
            for z in &zones {
                if z.id == "dram" && (z.target > zone || z.host_ballooned > zone) {
                    out.push(format!(
                        "{}: dram balloon target {} / held {} beyond the zone ({zone})",
                        vm.name, z.target, z.host_ballooned
                    ));
                }
            }
            match zones.iter().find(|z| z.id == "dram") {
                Some(d) => {
                    held += zone.saturating_sub(d.target);
                    self.last_target[i] = Some((vm.pid(), d.target));
                }
                None => complete = false,
            }
            // The guest's canary: pages it uses that read back wrong.
            for l in vm.lines().iter().rev().filter(|l| l.kind == "tick").take(1) {
                if let Some(lost) = l.fields.get("lost") {
                    self.canary_seen = true;
                    let total: u64 = lost.split(',').filter_map(|v| v.parse::<u64>().ok()).sum();
                    if total > 0 {
                        out.push(format!(
                            "{}: guest lost {total} in-use pages (canary)",
                            vm.name
                        ));
                    }
                }
            }
        }
        if complete && w.vms.iter().all(Option::is_some) {
            if held > budget {
                out.push(format!(
                    "DRAM held by the VMs' targets {held} beyond the host budget {budget}"
                ));
            }
        } else {
            self.budget_skipped += 1;
        }
        let tierd = w.tierd.pid();
        self.sample(tierd, "tierd");
        if let Some(b) = w.backend_pid() {
            self.sample(b, "tier-balloon");
        }
        out
    }

    fn sample(&mut self, pid: u32, what: &str) {
        let Some(s) = usage(pid) else { return };
        let u = self.usage.entry(pid).or_default();
        u.what = what.into();
        u.samples.push(s);
    }

    /// Growth of fds, threads or RSS over a process lifetime of at least
    /// 30 samples: the median of its last third against its first third
    /// (after 5 samples of warm-up).
    pub fn growth(&self) -> Vec<(String, String, bool)> {
        let mut out = Vec::new();
        for (pid, u) in &self.usage {
            let s = &u.samples;
            if s.len() < 30 {
                continue;
            }
            let body = &s[5..];
            let third = body.len() / 3;
            let med = |v: &[(u64, u64, u64)], f: fn(&(u64, u64, u64)) -> u64| {
                let mut x: Vec<u64> = v.iter().map(f).collect();
                x.sort_unstable();
                x[x.len() / 2]
            };
            let (a, b) = (&body[..third], &body[body.len() - third..]);
            let fds = (med(a, |t| t.0), med(b, |t| t.0));
            let thr = (med(a, |t| t.1), med(b, |t| t.1));
            let rss = (med(a, |t| t.2), med(b, |t| t.2));
            let grew = fds.1 > fds.0 + 8
                || thr.1 > thr.0 + 4
                || (rss.1 > rss.0 + (16 << 20) && rss.1 * 10 > rss.0 * 13);
            out.push((
                format!("{} pid {pid} ({} samples)", u.what, s.len()),
                format!(
                    "fds {}->{} threads {}->{} rss {}->{} MiB",
                    fds.0,
                    fds.1,
                    thr.0,
                    thr.1,
                    rss.0 >> 20,
                    rss.1 >> 20
                ),
                grew,
            ));
        }
        out
    }
}

/// (open fds, threads, RSS bytes) of `pid`.
fn usage(pid: u32) -> Option<(u64, u64, u64)> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some((fds, field("Threads:")?, field("VmRSS:")? * 1024))
}
