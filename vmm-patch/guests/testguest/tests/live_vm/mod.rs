//! The running VM of the live tests (`live.rs`, `live_zipf.rs`): a patched
//! cloud-hypervisor process with the test guest, its API socket and serial log.

#![allow(dead_code)] // each test binary uses a part of it

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use libtest_mimic::{Completion, Trial};
use serde_json::Value;
use tier_test_support::ChildGuard;
use tier_testguest::serial::{Line, parse_log};

pub const MIB: u64 = 1 << 20;
pub const PAGE: u64 = 4096;
/// Generous: guest code is emulated here, and other work shares the 2 cores.
pub const WAIT: Duration = Duration::from_secs(90);

/// A cloud-hypervisor process running the test guest; ended by PID on drop
/// (SIGTERM, then SIGKILL).
pub struct Vm {
    child: ChildGuard,
    socket: PathBuf,
    serial: PathBuf,
    _dir: tempfile::TempDir,
}

impl Vm {
    /// Boot with zones `(id, size)` (one guest NUMA node each) and the
    /// per-tier balloon with stats.
    pub fn boot(bin: &Path, zones: &[(&str, &str)], cmdline: &str) -> Vm {
        let mut args: Vec<String> = vec!["--memory".into(), "size=0".into()];
        for (i, (id, size)) in zones.iter().enumerate() {
            args.push("--memory-zone".into());
            args.push(format!("id={id},size={size}"));
            args.push("--numa".into());
            args.push(format!("guest_numa_id={i},memory_zones={id}"));
        }
        args.extend(["--balloon".into(), "size=0,tiers=on,stats=on".into()]);
        Vm::spawn(bin, &args, cmdline)
    }

    /// Boot with one vCPU and `vmm_args` (memory, zones, NUMA, devices).
    pub fn spawn(bin: &Path, vmm_args: &[String], cmdline: &str) -> Vm {
        tier_testguest::params::Params::parse(cmdline).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("ch.sock");
        let serial = dir.path().join("serial.log");
        let mut cmd = Command::new(bin);
        cmd.arg("--api-socket")
            .arg(format!("path={}", socket.display()))
            .arg("--kernel")
            .arg(tier_testguest::elf_path())
            .args(["--cmdline", cmdline])
            .args(["--cpus", "boot=1"])
            .args(vmm_args)
            .arg("--serial")
            .arg(format!("file={}", serial.display()))
            .args(["--console", "off"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child = ChildGuard::new(cmd.spawn().unwrap());
        Vm {
            child,
            socket,
            serial,
            _dir: dir,
        }
    }

    /// One HTTP/1.1 request on the API socket: (status, body).
    pub fn api(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let mut s = UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let body = body.unwrap_or("");
        let req = format!(
            "{method} /api/v1/{path} HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let (head_end, len) = loop {
            let n = s.read(&mut chunk).unwrap();
            assert!(
                n > 0,
                "API closed the connection: {:?}",
                String::from_utf8_lossy(&buf)
            );
            buf.extend_from_slice(&chunk[..n]);
            if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..pos]).to_lowercase();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                break (pos + 4, len);
            }
        };
        while buf.len() < head_end + len {
            let n = s.read(&mut chunk).unwrap();
            assert!(n > 0, "API closed the connection mid-body");
            buf.extend_from_slice(&chunk[..n]);
        }
        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
        let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        (
            status,
            String::from_utf8_lossy(&buf[head_end..head_end + len]).into_owned(),
        )
    }

    pub fn get(&self, path: &str) -> Value {
        let (status, body) = self.api("GET", path, None);
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    pub fn wait_api(&self) -> Duration {
        let start = Instant::now();
        while !self.socket.exists() || UnixStream::connect(&self.socket).is_err() {
            assert!(start.elapsed() < WAIT, "VMM never opened its API socket");
            std::thread::sleep(Duration::from_millis(20));
        }
        start.elapsed()
    }

    pub fn lines(&self) -> Vec<Line> {
        parse_log(&std::fs::read_to_string(&self.serial).unwrap_or_default())
    }

    /// Wait until some serial line satisfies `pred`; all lines so far.
    pub fn wait_line(&self, what: &str, pred: impl Fn(&Line) -> bool) -> Vec<Line> {
        let start = Instant::now();
        loop {
            let lines = self.lines();
            if let Some(err) = lines.iter().find(|l| l.kind == "error") {
                panic!("guest error: {err:?}");
            }
            if lines.iter().any(&pred) {
                return lines;
            }
            assert!(
                start.elapsed() < WAIT,
                "no serial line {what} after {WAIT:?}; log:\n{}",
                std::fs::read_to_string(&self.serial).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn set_targets(&self, targets: &[(&str, u64)]) {
        let map: BTreeMap<&str, u64> = targets.iter().copied().collect();
        let body = serde_json::json!({ "desired_balloon_zones": map }).to_string();
        let (status, resp) = self.api("PUT", "vm.resize", Some(&body));
        assert_eq!(status, 204, "vm.resize {body}: {resp}");
    }

    /// Wait until each zone's driver-written `actual` and device-counted
    /// `host_ballooned` equal its target; returns the time it took.
    pub fn wait_zones(&self, targets: &[(&str, u64)]) -> Duration {
        let start = Instant::now();
        loop {
            let info = self.get("vm.info");
            let zones = info["balloon"]["zones"].as_array().unwrap().clone();
            let done = targets.iter().all(|(id, bytes)| {
                zones.iter().any(|z| {
                    z["id"] == *id
                        && z["target"] == *bytes
                        && z["actual"] == *bytes
                        && z["host_ballooned"] == *bytes
                })
            });
            if done {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < WAIT,
                "zones never reached {targets:?}: {zones:#?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Every range of every memory zone: (zone id, guest address, size,
    /// host address in the VMM), from `vm.info` (host address: vmm-patch 0005).
    pub fn ranges(&self) -> Vec<(String, u64, u64, u64)> {
        let info = self.get("vm.info");
        let mut out = Vec::new();
        for z in info["memory_zones"].as_array().unwrap() {
            for r in z["ranges"].as_array().unwrap() {
                out.push((
                    z["id"].as_str().unwrap().to_string(),
                    r["start"].as_u64().unwrap(),
                    r["size"].as_u64().unwrap(),
                    r["host_address"]
                        .as_u64()
                        .unwrap_or_else(|| panic!("no host_address in vm.info: {r}")),
                ));
            }
        }
        out
    }

    /// Host address of guest-physical `[gpa, gpa + len)`.
    pub fn hva(&self, gpa: u64, len: u64) -> u64 {
        let (_, start, _, hva) = self
            .ranges()
            .into_iter()
            .find(|r| gpa >= r.1 && gpa + len <= r.1 + r.2)
            .unwrap_or_else(|| panic!("guest address {gpa:#x} is in no zone range"));
        hva + (gpa - start)
    }

    /// Guest memory read from outside, through `/proc/PID/mem` of the VMM.
    pub fn read_guest(&self, gpa: u64, len: u64) -> Vec<u8> {
        let mem = std::fs::File::open(format!("/proc/{}/mem", self.pid())).unwrap();
        let mut buf = vec![0u8; len as usize];
        mem.read_exact_at(&mut buf, self.hva(gpa, len)).unwrap();
        buf
    }

    /// Guest memory written from outside, through `/proc/PID/mem`.
    pub fn write_guest(&self, gpa: u64, bytes: &[u8]) {
        let mem = OpenOptions::new()
            .write(true)
            .open(format!("/proc/{}/mem", self.pid()))
            .unwrap();
        mem.write_all_at(bytes, self.hva(gpa, bytes.len() as u64))
            .unwrap();
    }

    /// Pages carrying their canary, per zone id, read from outside.
    pub fn stamped_pages(&self) -> BTreeMap<String, Vec<u64>> {
        let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for (id, start, size, _) in self.ranges() {
            let mem = self.read_guest(start, size);
            out.entry(id)
                .or_default()
                .extend(tier_testguest::canary::stamped_pages(&mem, start));
        }
        out
    }

    /// Stop the VMM by its PID.
    pub fn stop(mut self) {
        self.child.terminate();
    }
}

/// A trial that needs the patched VMM (`TIERD_CH_BIN`) and /dev/kvm:
/// ignored with the reason when either is missing.
pub fn vm_trial(name: &'static str, f: fn(&Path)) -> Trial {
    Trial::ignorable_test(name, move || match tier_test_support::ch_kvm() {
        Err(reason) => Ok(Completion::ignored_with(reason)),
        Ok(bin) => {
            f(&bin);
            Ok(Completion::Completed)
        }
    })
}
