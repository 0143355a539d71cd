//! The DAMON ageing driver: where page_idle is absent (every Debian 12
//! kernel), tierd's own kdamonds age the sampled folios of each VM through
//! DAMON's sysfs interface, `vaddr` operations on the VMM process.
//! DAMON's access check of a region clears the young bit of one address
//! of it per sampling interval with `ptep/pmdp_clear_young_notify`
//! (mm/damon/ops-common.c, 6.12), which runs `kvm_age_gfn` in the kdamond
//! thread: the EPT hooks count what it finds young, attributed through the
//! kdamond's tid registered as the VM slot's scan owner.
//!
//! One region per sampled folio, so every sampled page is aged once per
//! sampling interval: the interval is the pass length. Regions are kept
//! as given: `vaddr`'s init leaves user-set regions alone
//! (`damon_va_init`), and the aggregation and update intervals are set so
//! long that DAMON never merges them nor re-fits them to the VMAs
//! (`kdamond_merge_regions`, `damon_va_update`). The cost is the regions:
//! one young-bit clear per region per sampling interval.
//!
//! Writing `nr_kdamonds` tears down every kdamond directory and all their
//! settings, and fails with EBUSY while any kdamond runs
//! (`damon_sysfs_kdamonds_add_dirs`, mm/damon/sysfs.c, 6.12). So tierd
//! takes DAMON only when nobody uses it (`nr_kdamonds` 0) and refuses,
//! naming what it found, otherwise; it never writes a kdamond it did not
//! create.

use std::io;
use std::path::{Path, PathBuf};

mod ageing;
pub use ageing::{Armed, DamonDriver, per_round};

/// DAMON's sysfs admin directory.
pub const ADMIN: &str = "/sys/kernel/mm/damon/admin";

/// Fewest regions DAMON accepts (`damon_set_attrs`: min_nr_regions >= 3).
pub const MIN_REGIONS: usize = 3;

/// Aggregation and update interval: long enough that DAMON never merges
/// tierd's regions nor refits them to the VMAs while tierd runs.
const NEVER_US: u64 = 3_600_000_000;

/// Reads and writes sysfs attributes (the real files, or a stand-in in
/// tests).
pub trait Sysfs: Send {
    fn read(&self, path: &Path) -> io::Result<String>;
    fn write(&mut self, path: &Path, value: &str) -> io::Result<()>;
}

/// The real sysfs.
#[derive(Debug, Default)]
pub struct RealSysfs;

impl Sysfs for RealSysfs {
    fn read(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(path)
    }
    fn write(&mut self, path: &Path, value: &str) -> io::Result<()> {
        std::fs::write(path, value)
    }
}

/// Why DAMON cannot be tierd's ageing driver.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DamonError {
    #[error(
        "DAMON sysfs absent ({0}): kernel without CONFIG_DAMON_SYSFS (Debian 12's 6.1); \
         CONFIG_DAMON_VADDR and CONFIG_DAMON_SYSFS are needed"
    )]
    Absent(PathBuf),
    #[error(
        "DAMON is in use by someone else: {0}; tierd never changes kdamonds it did not create \
         (writing nr_kdamonds would destroy their settings)"
    )]
    InUse(String),
    #[error("{path}: {message}")]
    Io { path: PathBuf, message: String },
    #[error("{0} regions: DAMON needs at least {MIN_REGIONS}")]
    TooFewRegions(usize),
    #[error("kdamond {0} is not one of tierd's")]
    NotOurs(usize),
    #[error("DAMON sampling interval {0} us: give 1000 us to 10 s")]
    BadInterval(u64),
}

/// tierd's kdamonds: created at [`Kdamonds::take`], turned off and removed
/// on drop.
pub struct Kdamonds<S: Sysfs> {
    fs: S,
    root: PathBuf,
    count: usize,
}

impl<S: Sysfs> std::fmt::Debug for Kdamonds<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kdamonds")
            .field("root", &self.root)
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

impl<S: Sysfs> Kdamonds<S> {
    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn read(&self, rel: &str) -> Result<String, DamonError> {
        let p = self.path(rel);
        self.fs
            .read(&p)
            .map(|s| s.trim().to_string())
            .map_err(|e| DamonError::Io {
                path: p,
                message: e.to_string(),
            })
    }

    fn write(&mut self, rel: &str, value: impl std::fmt::Display) -> Result<(), DamonError> {
        let p = self.path(rel);
        self.fs
            .write(&p, &value.to_string())
            .map_err(|e| DamonError::Io {
                path: p,
                message: e.to_string(),
            })
    }

    /// Creates `count` kdamonds for tierd if DAMON is unused; otherwise
    /// refuses, naming the kdamonds found.
    pub fn take(fs: S, root: &Path, count: usize) -> Result<Kdamonds<S>, DamonError> {
        let mut k = Kdamonds {
            fs,
            root: root.join("kdamonds"),
            count: 0,
        };
        let nr = match k.read("nr_kdamonds") {
            Ok(v) => v,
            Err(_) => return Err(DamonError::Absent(k.path("nr_kdamonds"))),
        };
        let nr: usize = nr.parse().map_err(|_| DamonError::Io {
            path: k.path("nr_kdamonds"),
            message: format!("not a number: {nr:?}"),
        })?;
        if nr > 0 {
            let found: Vec<String> = (0..nr)
                .map(|i| {
                    let state = k
                        .read(&format!("{i}/state"))
                        .unwrap_or_else(|e| e.to_string());
                    let pid = k.read(&format!("{i}/pid")).unwrap_or_default();
                    format!("kdamond {i} {state} (pid {pid})")
                })
                .collect();
            return Err(DamonError::InUse(found.join(", ")));
        }
        k.write("nr_kdamonds", count)?;
        k.count = count;
        Ok(k)
    }

    /// Sets kdamond `i` up to age `regions` (sorted, disjoint `[start,
    /// end)` virtual addresses) of process `pid` every `sample_us`, and
    /// starts it; returns the kdamond's pid (its tid: the scan owner).
    pub fn start(
        &mut self,
        i: usize,
        pid: u32,
        regions: &[(u64, u64)],
        sample_us: u64,
    ) -> Result<u32, DamonError> {
        if i >= self.count {
            return Err(DamonError::NotOurs(i));
        }
        if regions.len() < MIN_REGIONS {
            return Err(DamonError::TooFewRegions(regions.len()));
        }
        if !(1000..=10_000_000).contains(&sample_us) {
            return Err(DamonError::BadInterval(sample_us));
        }
        self.stop(i)?;
        let k = format!("{i}");
        self.write(&format!("{k}/contexts/nr_contexts"), 1)?;
        let c = format!("{k}/contexts/0");
        self.write(&format!("{c}/operations"), "vaddr")?;
        let a = format!("{c}/monitoring_attrs");
        // aggr_us >= sample_us is checked by DAMON: raise it first.
        self.write(&format!("{a}/intervals/aggr_us"), NEVER_US)?;
        self.write(&format!("{a}/intervals/update_us"), NEVER_US)?;
        self.write(&format!("{a}/intervals/sample_us"), sample_us)?;
        let n = regions.len();
        self.write(&format!("{a}/nr_regions/max"), n)?;
        self.write(&format!("{a}/nr_regions/min"), n)?;
        self.write(&format!("{c}/targets/nr_targets"), 1)?;
        let t = format!("{c}/targets/0");
        self.write(&format!("{t}/pid_target"), pid)?;
        self.write(&format!("{t}/regions/nr_regions"), n)?;
        for (j, (start, end)) in regions.iter().enumerate() {
            self.write(&format!("{t}/regions/{j}/start"), start)?;
            self.write(&format!("{t}/regions/{j}/end"), end)?;
        }
        self.write(&format!("{k}/state"), "on")?;
        let pid = self.read(&format!("{k}/pid"))?;
        pid.parse::<u32>().map_err(|_| DamonError::Io {
            path: self.path(&format!("{k}/pid")),
            message: format!("kdamond did not start (pid {pid})"),
        })
    }

    /// Turns kdamond `i` off if it runs.
    pub fn stop(&mut self, i: usize) -> Result<(), DamonError> {
        if i >= self.count {
            return Err(DamonError::NotOurs(i));
        }
        if self.read(&format!("{i}/state"))? == "on" {
            self.write(&format!("{i}/state"), "off")?;
        }
        Ok(())
    }
}

impl<S: Sysfs> Drop for Kdamonds<S> {
    fn drop(&mut self) {
        if self.count == 0 {
            return;
        }
        for i in 0..self.count {
            if let Err(e) = self.stop(i) {
                tracing::warn!(kdamond = i, error = %e, "stopping tierd's kdamond");
            }
        }
        // All of them are ours and off: removing them disturbs nobody.
        if let Err(e) = self.write("nr_kdamonds", 0) {
            tracing::warn!(error = %e, "removing tierd's kdamonds");
        }
    }
}

/// Whether this host could use DAMON as the driver, read-only.
pub fn available(fs: &impl Sysfs, root: &Path) -> Result<(), DamonError> {
    let p = root.join("kdamonds/nr_kdamonds");
    let nr = fs.read(&p).map_err(|_| DamonError::Absent(p.clone()))?;
    match nr.trim() {
        "0" => Ok(()),
        n => Err(DamonError::InUse(format!("{n} kdamond(s) configured"))),
    }
}

#[cfg(test)]
mod tests;
