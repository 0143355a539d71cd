//! The driver against a stand-in of DAMON's sysfs: a model of what the
//! kernel's files do on write, from mm/damon/sysfs.c (6.12). This machine's
//! real DAMON runs a kdamond tierd does not own, so tests never touch it.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use super::*;

/// Files by path relative to the admin root.
#[derive(Debug, Default)]
struct StandIn {
    files: BTreeMap<String, String>,
    root: PathBuf,
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

impl StandIn {
    fn new(root: &Path) -> StandIn {
        let mut s = StandIn {
            root: root.to_path_buf(),
            ..StandIn::default()
        };
        s.set("kdamonds/nr_kdamonds", "0");
        s
    }
    fn set(&mut self, rel: &str, v: &str) {
        self.files.insert(rel.to_string(), format!("{v}\n"));
    }
    fn get(&self, rel: &str) -> Option<String> {
        self.files.get(rel).map(|v| v.trim().to_string())
    }
    /// Removes `dir/*` (children of a directory), as kobject teardown does.
    fn clear_under(&mut self, dir: &str) {
        let prefix = format!("{dir}/");
        self.files
            .retain(|k, _| !k.starts_with(&prefix) || k.ends_with("/nr_kdamonds"));
    }
    fn running(&self) -> bool {
        self.files
            .iter()
            .any(|(k, v)| k.ends_with("/state") && v.trim() == "on")
    }
    fn rel(&self, p: &Path) -> io::Result<String> {
        p.strip_prefix(&self.root)
            .map(|r| r.to_string_lossy().into_owned())
            .map_err(|_| errno(libc::ENOENT))
    }
    /// A kdamond started by someone else.
    fn foreign_kdamond(&mut self) {
        self.write(&self.root.join("kdamonds/nr_kdamonds"), "1")
            .unwrap();
        self.set("kdamonds/0/state", "on");
        self.set("kdamonds/0/pid", "77");
    }
}

impl Sysfs for StandIn {
    fn read(&self, p: &Path) -> io::Result<String> {
        let rel = self.rel(p)?;
        self.files
            .get(&rel)
            .cloned()
            .ok_or_else(|| errno(libc::ENOENT))
    }

    fn write(&mut self, p: &Path, value: &str) -> io::Result<()> {
        let rel = self.rel(p)?;
        if !self.files.contains_key(&rel) {
            return Err(errno(libc::ENOENT));
        }
        let v = value.trim();
        let n = |v: &str| v.parse::<usize>().map_err(|_| errno(libc::EINVAL));
        let dir = rel.rsplit_once('/').map_or("", |(d, _)| d).to_string();
        // The kdamond a path belongs to: "kdamonds/N/...".
        let kd = rel.split('/').nth(1).unwrap_or("").to_string();
        match rel.rsplit('/').next().unwrap_or("") {
            // damon_sysfs_kdamonds_add_dirs: EBUSY while any runs, else
            // every kdamond directory is torn down and made anew.
            "nr_kdamonds" => {
                let count = n(v)?;
                if self.running() {
                    return Err(errno(libc::EBUSY));
                }
                self.clear_under("kdamonds");
                for i in 0..count {
                    self.set(&format!("kdamonds/{i}/state"), "off");
                    self.set(&format!("kdamonds/{i}/pid"), "-1");
                    self.set(&format!("kdamonds/{i}/contexts/nr_contexts"), "0");
                }
            }
            // Real 6.12 (the Linux bed, tier-bed-agent damon) accepts these
            // while the kdamond runs: the directories are rebuilt empty and
            // the kdamond keeps what it was started with.
            "nr_contexts" => {
                self.clear_under(&dir);
                for i in 0..n(v)? {
                    let c = format!("{dir}/{i}");
                    self.set(&format!("{c}/operations"), "vaddr");
                    for (f, d) in [
                        ("sample_us", "5000"),
                        ("aggr_us", "100000"),
                        ("update_us", "60000000"),
                    ] {
                        self.set(&format!("{c}/monitoring_attrs/intervals/{f}"), d);
                    }
                    self.set(&format!("{c}/monitoring_attrs/nr_regions/min"), "10");
                    self.set(&format!("{c}/monitoring_attrs/nr_regions/max"), "1000");
                    self.set(&format!("{c}/targets/nr_targets"), "0");
                }
            }
            "nr_targets" => {
                self.clear_under(&dir);
                for i in 0..n(v)? {
                    self.set(&format!("{dir}/{i}/pid_target"), "0");
                    self.set(&format!("{dir}/{i}/regions/nr_regions"), "0");
                }
            }
            "nr_regions" if dir.ends_with("/regions") => {
                self.clear_under(&dir);
                for i in 0..n(v)? {
                    self.set(&format!("{dir}/{i}/start"), "0");
                    self.set(&format!("{dir}/{i}/end"), "0");
                }
            }
            "state" => return self.state(&kd, v),
            _ => {}
        }
        if !rel.ends_with("/state") {
            self.set(&rel, v);
        }
        Ok(())
    }
}

impl StandIn {
    /// damon_sysfs_turn_damon_on/off and the checks DAMON makes on start.
    fn state(&mut self, kd: &str, v: &str) -> io::Result<()> {
        let k = format!("kdamonds/{kd}");
        let on = self.get(&format!("{k}/state")).as_deref() == Some("on");
        match v {
            "on" if on => Err(errno(libc::EBUSY)),
            "on" => {
                if self.get(&format!("{k}/contexts/nr_contexts")).as_deref() != Some("1") {
                    return Err(errno(libc::EINVAL));
                }
                let a = format!("{k}/contexts/0/monitoring_attrs");
                let num = |s: &Self, f: &str| -> u64 {
                    s.get(&format!("{a}/{f}"))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0)
                };
                let (min, max) = (num(self, "nr_regions/min"), num(self, "nr_regions/max"));
                if min < 3
                    || max < min
                    || num(self, "intervals/aggr_us") < num(self, "intervals/sample_us")
                {
                    return Err(errno(libc::EINVAL));
                }
                // Regions sorted and disjoint (damon_sysfs_set_regions).
                let t = format!("{k}/contexts/0/targets/0/regions");
                let nr: usize = self
                    .get(&format!("{t}/nr_regions"))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let mut last = 0u64;
                for j in 0..nr {
                    let r = |f: &str| -> u64 {
                        self.get(&format!("{t}/{j}/{f}"))
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0)
                    };
                    if r("start") >= r("end") || r("start") < last {
                        return Err(errno(libc::EINVAL));
                    }
                    last = r("end");
                }
                self.set(&format!("{k}/state"), "on");
                self.set(
                    &format!("{k}/pid"),
                    &(4242 + kd.parse::<u32>().unwrap_or(0)).to_string(),
                );
                Ok(())
            }
            "off" if !on => Err(errno(libc::EINVAL)),
            "off" => {
                self.set(&format!("{k}/state"), "off");
                self.set(&format!("{k}/pid"), "-1");
                Ok(())
            }
            _ => Err(errno(libc::EINVAL)),
        }
    }
}

fn root() -> PathBuf {
    PathBuf::from("/stand-in/sys/kernel/mm/damon/admin")
}

fn regions(n: u64) -> Vec<(u64, u64)> {
    (0..n)
        .map(|i| (0x7f00_0000_0000 + i * 0x2000, 0x7f00_0000_1000 + i * 0x2000))
        .collect()
}

#[test]
fn takes_unused_damon_and_starts_one_kdamond_per_vm_stand_in_sysfs() {
    let mut k = Kdamonds::take(StandIn::new(&root()), &root(), 2).unwrap();
    assert_eq!(k.fs.get("kdamonds/nr_kdamonds").as_deref(), Some("2"));
    let pid = k.start(1, 1234, &regions(4), 100_000).unwrap();
    assert_eq!(pid, 4243);
    let c = "kdamonds/1/contexts/0";
    assert_eq!(
        k.fs.get(&format!("{c}/operations")).as_deref(),
        Some("vaddr")
    );
    assert_eq!(
        k.fs.get(&format!("{c}/targets/0/pid_target")).as_deref(),
        Some("1234")
    );
    assert_eq!(
        k.fs.get(&format!("{c}/targets/0/regions/nr_regions"))
            .as_deref(),
        Some("4")
    );
    assert_eq!(
        k.fs.get(&format!("{c}/monitoring_attrs/intervals/sample_us"))
            .as_deref(),
        Some("100000")
    );
    // min = max = the regions: DAMON neither splits below nor merges above.
    assert_eq!(
        k.fs.get(&format!("{c}/monitoring_attrs/nr_regions/min"))
            .as_deref(),
        Some("4")
    );
    assert_eq!(k.fs.get("kdamonds/0/state").as_deref(), Some("off"));
    // Restarting with new regions turns it off first: a running kdamond
    // keeps the regions it started with, whatever sysfs says since.
    assert_eq!(k.start(1, 1234, &regions(6), 100_000).unwrap(), 4243);
    assert_eq!(
        k.fs.get(&format!("{c}/targets/0/regions/nr_regions"))
            .as_deref(),
        Some("6")
    );
}

#[test]
fn refuses_damon_someone_else_uses_and_writes_nothing_stand_in_sysfs() {
    let mut fs = StandIn::new(&root());
    fs.foreign_kdamond();
    let fs = std::sync::Arc::new(std::sync::Mutex::new(fs));
    let before = fs.lock().unwrap().files.clone();
    let e = Kdamonds::take(Shared(fs.clone()), &root(), 2).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("kdamond 0 on (pid 77)"), "{text}");
    assert!(
        text.contains("never changes kdamonds it did not create"),
        "{text}"
    );
    // A configured but stopped kdamond is refused too: nr_kdamonds would
    // destroy its settings.
    let mut idle = StandIn::new(&root());
    idle.write(&root().join("kdamonds/nr_kdamonds"), "1")
        .unwrap();
    let e = Kdamonds::take(idle, &root(), 1).unwrap_err();
    assert!(matches!(e, DamonError::InUse(_)), "{e}");
    assert_eq!(fs.lock().unwrap().files, before, "nothing written");
}

#[test]
fn absent_damon_names_the_kernel_options() {
    struct Empty;
    impl Sysfs for Empty {
        fn read(&self, _: &Path) -> io::Result<String> {
            Err(errno(libc::ENOENT))
        }
        fn write(&mut self, _: &Path, _: &str) -> io::Result<()> {
            Err(errno(libc::ENOENT))
        }
    }
    let e = Kdamonds::take(Empty, &root(), 1).unwrap_err();
    assert!(e.to_string().contains("CONFIG_DAMON_VADDR"), "{e}");
    assert!(available(&Empty, &root()).is_err());
}

#[test]
fn bad_input_is_refused_before_any_write_stand_in_sysfs() {
    let mut k = Kdamonds::take(StandIn::new(&root()), &root(), 1).unwrap();
    assert_eq!(
        k.start(0, 1, &regions(2), 100_000),
        Err(DamonError::TooFewRegions(2))
    );
    assert_eq!(
        k.start(0, 1, &regions(4), 10),
        Err(DamonError::BadInterval(10))
    );
    assert_eq!(
        k.start(3, 1, &regions(4), 100_000),
        Err(DamonError::NotOurs(3))
    );
    assert_eq!(k.fs.get("kdamonds/0/state").as_deref(), Some("off"));
    // Unsorted regions: the kernel (here its model) refuses at "on".
    let mut r = regions(4);
    r.swap(0, 3);
    let e = k.start(0, 1, &r, 100_000).unwrap_err();
    assert!(e.to_string().contains("state"), "{e}");
}

/// A stand-in shared with the test, to look at it after the driver drops.
struct Shared(std::sync::Arc<std::sync::Mutex<StandIn>>);

impl Sysfs for Shared {
    fn read(&self, p: &Path) -> io::Result<String> {
        self.0.lock().unwrap().read(p)
    }
    fn write(&mut self, p: &Path, v: &str) -> io::Result<()> {
        self.0.lock().unwrap().write(p, v)
    }
}

#[test]
fn drop_stops_and_removes_only_tierds_kdamonds_stand_in_sysfs() {
    let fs = std::sync::Arc::new(std::sync::Mutex::new(StandIn::new(&root())));
    let mut k = Kdamonds::take(Shared(fs.clone()), &root(), 2).unwrap();
    k.start(0, 9, &regions(3), 50_000).unwrap();
    assert!(fs.lock().unwrap().running());
    drop(k);
    let fs = fs.lock().unwrap();
    assert!(!fs.running());
    assert_eq!(fs.get("kdamonds/nr_kdamonds").as_deref(), Some("0"));
    assert!(fs.get("kdamonds/0/state").is_none(), "{:?}", fs.files);
}
