//! One test guest under the patched cloud-hypervisor: started here, stopped
//! here by its PID, read through its API socket, serial log and smaps.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tier_controller::actuate::{BalloonZone, ChApi, ResizableZone, Vmm, ZoneRange};
use tier_test_support::ChildGuard;
use tier_testguest::serial::{Line, parse_log};

/// What to boot.
#[derive(Debug, Clone)]
pub struct VmSpec {
    pub name: String,
    /// (zone id, MiB), DRAM first; one guest NUMA node each.
    pub zones: Vec<(String, u64)>,
    /// The guest's command line (checked with its own parser first).
    pub cmdline: String,
    /// Serve the balloon from a vhost-user backend (`tier-balloon`) on
    /// these sockets instead of the VMM's own device.
    pub vhost_user: Option<VhostUser>,
    /// The first zone has a virtio-mem part and the VM no balloon (issue
    /// 33): `--memory size=0,hotplug_method=virtio-mem`.
    pub hotplug: Option<Hotplug>,
}

/// A zone's virtio-mem part, MiB: `hotplug_size`, `hotplugged_size`.
#[derive(Debug, Clone, Copy)]
pub struct Hotplug {
    pub size_mib: u64,
    pub plugged_mib: u64,
}

/// A virtio-mem zone's sizes, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZoneSizes {
    pub boot: u64,
    pub hotplug: u64,
    pub requested: u64,
    /// `None` when neither vm.info (vmm-patch 0009) nor the guest said.
    pub plugged: Option<u64>,
    /// Where it came from: `vm.info` or the guest's serial line.
    pub from_serial: bool,
}

/// The sockets of a vhost-user balloon backend.
#[derive(Debug, Clone)]
pub struct VhostUser {
    pub socket: PathBuf,
    pub control: PathBuf,
}

impl VmSpec {
    /// `tier-balloon --tier` arguments for this VM's zones: x86_64 lays the
    /// zones out from GPA 0 in order (docs/vmm-patch.md), node i each.
    pub fn backend_tiers(&self) -> Vec<String> {
        let mut start = 0u64;
        self.zones
            .iter()
            .enumerate()
            .map(|(i, (id, mib))| {
                let end = start + mib * (1 << 20);
                let arg = format!("name={id},ranges={start:#x}-{end:#x},node={i}");
                start = end;
                arg
            })
            .collect()
    }
}

/// A running VMM process.
#[derive(Debug)]
pub struct ChVm {
    pub name: String,
    child: ChildGuard,
    pub socket: PathBuf,
    pub serial: PathBuf,
    pub api: ChApi,
}

impl ChVm {
    /// Starts the VMM with `spec`; its API socket goes into `sock_dir`, its
    /// serial and stderr into `dir`. Every zone is prefaulted, so the host
    /// resident size of a zone drops exactly when the balloon frees pages,
    /// and shared (memfd-backed): anonymous zones on one host node end up in
    /// one merged mapping, which per-mapping sampling (hostpte) cannot split
    /// by tier (docs/discovery.md).
    pub fn boot(
        spec: &VmSpec,
        ch_bin: &Path,
        guest: &Path,
        sock_dir: &Path,
        dir: &Path,
    ) -> anyhow::Result<ChVm> {
        tier_testguest::params::Params::parse(&spec.cmdline)
            .with_context(|| format!("{}: guest command line", spec.name))?;
        let socket = sock_dir.join(format!("{}.sock", spec.name));
        let serial = dir.join(format!("{}.serial", spec.name));
        // Appended: a VM booted again keeps the earlier run's log.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{}.log", spec.name)))
            .with_context(|| format!("{}: creating its log", spec.name))?;
        let mut cmd = Command::new(ch_bin);
        cmd.arg("--api-socket")
            .arg(format!("path={}", socket.display()))
            .arg("--kernel")
            .arg(guest)
            .args(["--cmdline", &spec.cmdline])
            .args(["--cpus", "boot=1", "--memory"]);
        cmd.arg(if spec.hotplug.is_some() {
            "size=0,hotplug_method=virtio-mem"
        } else {
            "size=0"
        });
        for (i, (id, mib)) in spec.zones.iter().enumerate() {
            let mut zone = format!("id={id},size={mib}M,shared=on,prefault=on");
            if let (0, Some(h)) = (i, spec.hotplug) {
                zone.push_str(&format!(
                    ",hotplug_size={}M,hotplugged_size={}M",
                    h.size_mib, h.plugged_mib
                ));
            }
            cmd.args(["--memory-zone", &zone]);
            cmd.args(["--numa", &format!("guest_numa_id={i},memory_zones={id}")]);
        }
        match &spec.vhost_user {
            // Zone resize: no balloon at all (an upstream VMM has no
            // per-tier one); the guest's truth comes from its serial ticks.
            None if spec.hotplug.is_some() => &mut cmd,
            None => cmd.args(["--balloon", "size=0,tiers=on,stats=on"]),
            Some(v) => cmd.args([
                "--balloon",
                &format!(
                    "vhost_user=on,socket={},control={},tiers=on,stats=on",
                    v.socket.display(),
                    v.control.display()
                ),
            ]),
        };
        cmd.arg("--serial")
            .arg(format!("file={}", serial.display()))
            .args(["--console", "off"])
            .stdout(Stdio::null())
            .stderr(log);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", ch_bin.display()))?;
        let child = ChildGuard::with_grace(child, STOP_GRACE);
        Ok(ChVm {
            name: spec.name.clone(),
            child,
            api: ChApi::new(&socket).with_timeout(Duration::from_secs(5)),
            socket,
            serial,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the API socket to answer and the guest driver to be ready.
    pub async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<Duration> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().context("waiting for the VMM")? {
                bail!(
                    "{}: the VMM exited ({status}) before the guest was ready",
                    self.name
                );
            }
            if let Some(e) = self.lines().iter().find(|l| l.kind == "error") {
                bail!("{}: guest error: {e:?}", self.name);
            }
            let ready = self.lines().iter().any(|l| l.kind == "ready");
            if ready && self.api.ping().await.is_ok() {
                return Ok(start.elapsed());
            }
            if start.elapsed() > timeout {
                bail!("{}: guest not ready after {timeout:?}", self.name);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The guest's complete serial lines so far.
    pub fn lines(&self) -> Vec<Line> {
        parse_log(&std::fs::read_to_string(&self.serial).unwrap_or_default())
    }

    /// Per-zone balloon state from `vm.info`.
    pub async fn zones(&self) -> anyhow::Result<Vec<BalloonZone>> {
        let info = self.api.vm_info().await.context("vm.info")?;
        Ok(info.balloon.map(|b| b.zones).unwrap_or_default())
    }

    /// The guest's own cumulative accesses per tier (stats queue, through
    /// `vm.counters`): `tier<i>_guest_accesses`.
    pub async fn guest_accesses(&self) -> anyhow::Result<Vec<u64>> {
        let counters = self.api.counters().await.context("vm.counters")?;
        let mut out = Vec::new();
        for dev in counters.values() {
            for i in 0.. {
                match dev.get(&format!("tier{i}_guest_accesses")) {
                    Some(v) => out.push(*v),
                    None => break,
                }
            }
            if !out.is_empty() {
                break;
            }
        }
        Ok(out)
    }

    /// The guest's cumulative accesses per tier from its last `tg tick`
    /// line (when the VM has no stats queue).
    pub fn serial_accesses(&self) -> Vec<u64> {
        self.lines()
            .iter()
            .rev()
            .find_map(|l| l.tick())
            .map(|t| t.acc)
            .unwrap_or_default()
    }

    /// Zone `zone`'s virtio-mem sizes: requested from `vm.info` (0009's
    /// `virtio_mem`, else upstream's `config.memory.zones[].hotplugged_size`),
    /// plugged from 0009, else from the guest's last `tg vmem ...
    /// plugged=N` serial line.
    pub async fn zone_sizes(&self, zone: &str) -> anyhow::Result<ZoneSizes> {
        let info = self.api.vm_info().await.context("vm.info")?;
        let z = ResizableZone::of(&info, zone)
            .with_context(|| format!("{}: zone {zone} has no virtio-mem part", self.name))?;
        let (plugged, from_serial) = match z.plugged {
            Some(p) => (Some(p), false),
            None => (
                self.lines()
                    .iter()
                    .rev()
                    .filter(|l| l.kind == "vmem")
                    .find_map(|l| l.u64("plugged")),
                true,
            ),
        };
        Ok(ZoneSizes {
            boot: z.boot,
            hotplug: z.hotplug,
            requested: z.requested,
            plugged,
            from_serial,
        })
    }

    /// Resizes zone `zone` to `desired_ram` in all and waits until the
    /// guest has plugged exactly the hot-plugged part.
    pub async fn resize_to(
        &self,
        zone: &str,
        desired_ram: u64,
        timeout: Duration,
    ) -> anyhow::Result<Duration> {
        let now = self.zone_sizes(zone).await?;
        if now.boot + now.requested != desired_ram {
            self.api
                .resize_zone(zone, desired_ram)
                .await
                .context("vm.resize-zone")?;
        }
        let start = Instant::now();
        loop {
            let z = self.zone_sizes(zone).await?;
            if z.boot + z.requested == desired_ram && z.plugged == Some(z.requested) {
                return Ok(start.elapsed());
            }
            if start.elapsed() > timeout {
                bail!(
                    "{}: zone {zone} did not reach {desired_ram} bytes in {timeout:?}: {z:?}",
                    self.name
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sets DRAM/slow balloon targets and waits until the device counted
    /// exactly that many pages (`host_ballooned`).
    pub async fn balloon_to(
        &self,
        targets: &[(String, u64)],
        timeout: Duration,
    ) -> anyhow::Result<Duration> {
        self.api
            .set_tier_targets(targets)
            .await
            .context("vm.resize")?;
        let start = Instant::now();
        loop {
            let zones = self.zones().await?;
            let done = targets.iter().all(|(id, t)| {
                zones
                    .iter()
                    .any(|z| &z.id == id && z.host_ballooned == *t && z.target == *t)
            });
            if done {
                return Ok(start.elapsed());
            }
            if start.elapsed() > timeout {
                bail!(
                    "{}: balloon did not reach {targets:?} in {timeout:?}: {zones:?}",
                    self.name
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Host resident bytes of each zone: the smaps `Rss` of the VMM's
    /// mappings that hold the zone's ranges (`vm.info` host addresses).
    pub async fn zone_rss(&self) -> anyhow::Result<BTreeMap<String, u64>> {
        let info = self.api.vm_info().await.context("vm.info")?;
        let smaps = std::fs::read_to_string(format!("/proc/{}/smaps", self.pid()))
            .with_context(|| format!("{}: reading smaps", self.name))?;
        let maps = parse_smaps(&smaps);
        let mut out = BTreeMap::new();
        for z in info.memory_zones.unwrap_or_default() {
            let mut rss = 0;
            // The virtio-mem region (0009) is the zone's memory too.
            let region = z.virtio_mem.map(|v| ZoneRange {
                start: v.start,
                size: v.size,
                host_address: Some(v.host_address),
            });
            for r in z.ranges.iter().chain(region.iter()) {
                let Some(start) = r.host_address else {
                    bail!(
                        "{}: vm.info gives no host address for zone {} (needs vmm-patch 0005)",
                        self.name,
                        z.id
                    );
                };
                let end = start + r.size;
                rss += maps
                    .iter()
                    .filter(|m| m.start < end && start < m.end)
                    .map(|m| m.rss)
                    .sum::<u64>();
            }
            out.insert(z.id, rss);
        }
        Ok(out)
    }

    /// SIGTERM by PID, then SIGKILL after [`STOP_GRACE`] (also on drop).
    pub fn stop(&mut self) {
        self.child.terminate();
    }

    /// Its exit status if the VMM has exited, without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGKILL by PID, and reaped: a VMM that dies, for the soak.
    pub fn kill9(&mut self) {
        let c = self.child.child_mut();
        let _ = c.kill();
        let _ = c.wait();
    }

    /// Sends `sig` (SIGSTOP, SIGCONT) to the VMM, if it still runs.
    pub fn signal(&mut self, sig: libc::c_int) {
        if matches!(self.child.try_wait(), Ok(None)) {
            // SAFETY: kill(2) on the PID of our own child, not yet reaped
            // (try_wait said so), so the PID cannot have been reused.
            unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        }
    }
}

/// How long a process this program started gets between SIGTERM and
/// SIGKILL when it is stopped.
pub const STOP_GRACE: Duration = Duration::from_secs(3);

#[derive(Debug, PartialEq, Eq)]
struct Mapping {
    start: u64,
    end: u64,
    rss: u64,
}

/// Address range and `Rss` of every mapping in an smaps text.
fn parse_smaps(text: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = Vec::new();
    for line in text.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-')
            && let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16))
        {
            out.push(Mapping { start, end, rss: 0 });
        } else if let Some(kb) = line.strip_prefix("Rss:")
            && let Some(m) = out.last_mut()
        {
            let kb = kb.trim().trim_end_matches("kB").trim();
            m.rss = kb.parse::<u64>().unwrap_or(0) * 1024;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaps_gives_ranges_and_rss() {
        let text = "\
7f0000000000-7f0002000000 rw-p 00000000 00:00 0 
Size:              32768 kB
Rss:               16384 kB
Pss:               16384 kB
7f0002000000-7f0002001000 r--p 00000000 fd:00 123                        /usr/lib/x
Size:                  4 kB
Rss:                   4 kB
";
        assert_eq!(
            parse_smaps(text),
            vec![
                Mapping {
                    start: 0x7f00_0000_0000,
                    end: 0x7f00_0200_0000,
                    rss: 16 << 20
                },
                Mapping {
                    start: 0x7f00_0200_0000,
                    end: 0x7f00_0200_1000,
                    rss: 4096
                },
            ]
        );
    }
}
