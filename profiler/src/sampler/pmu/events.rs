//! The per-CPU-model event table: which perf event counts accesses served
//! by which kind of memory tier, kept as data (`profiler/events/*.toml`,
//! built in; more files can be given and replace or extend built-in
//! entries).
//!
//! One `[[event]]` entry:
//!
//! ```toml
//! [[event]]
//! name = "MEM_LOAD_L3_MISS_RETIRED.LOCAL_DRAM"   # vendor's event name
//! vendor = "GenuineIntel"                        # /proc/cpuinfo vendor_id
//! family = 6                                     # /proc/cpuinfo "cpu family"
//! models = [0x6A, 0x6C]                          # and/or model_ranges = [[lo, hi]]
//! steppings = [[5, 0xF]]                         # optional; default every stepping
//! type = "raw"                                   # raw (default), hardware, software
//! config = 0x01D3                                # perf_event_attr.config
//! tier = "dram"                                  # dram | pmem | cxl | remote
//! source = "Intel perfmon ICX: ..."              # where the encoding comes from
//! verified = true                                # default true
//! period = 10007                                 # sample period when sampled (the daemon counts)
//! config1 = 0                                    # perf_event_attr.config1 (e.g. ldlat)
//! data_src = false                               # true is refused (see below)
//! ```
//!
//! `data_src = true` (precise samples whose data_src picks the tier) is
//! refused with [`GUEST_ONLY_PRECISE`]: tierd counts guest-only, and the
//! host cannot take precise samples of guest execution. The BPF decoder
//! of data_src stays (`data_src.rs`, tested under BPF_PROG_TEST_RUN), but
//! nothing the daemon opens reaches it.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;

/// Tier kinds are the protocol's; an event names one of dram, pmem, cxl or
/// remote (never unknown).
pub use tier_proto::v1::TierKind;

/// Sample period of an entry without `period`: one BPF run per this many
/// events (a prime, so the period does not beat with loop strides).
pub const DEFAULT_PERIOD: u64 = 10_007;

/// perf_event_attr.type of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum EventType {
    /// PERF_TYPE_HARDWARE (0).
    Hardware,
    /// PERF_TYPE_SOFTWARE (1); only useful for tests.
    Software,
    /// PERF_TYPE_RAW (4): model-specific event/umask.
    #[default]
    Raw,
}

impl EventType {
    fn parse(s: &str) -> Option<EventType> {
        match s {
            "hardware" => Some(EventType::Hardware),
            "software" => Some(EventType::Software),
            "raw" => Some(EventType::Raw),
            _ => None,
        }
    }

    /// The `perf_event_attr.type` number.
    pub fn perf_type(self) -> u32 {
        match self {
            EventType::Hardware => 0,
            EventType::Software => 1,
            EventType::Raw => 4,
        }
    }
}

/// The running CPU as /proc/cpuinfo names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuId {
    /// `vendor_id`: "GenuineIntel", "AuthenticAMD".
    pub vendor: String,
    /// `cpu family` (display family: base + extended).
    pub family: u32,
    /// `model` (display model: extended << 4 | base).
    pub model: u32,
    /// `stepping`, where cpuinfo gives it (tells Cascade Lake from
    /// Skylake-SP, both model 0x55).
    pub stepping: Option<u32>,
}

impl CpuId {
    /// Reads the first processor of `/proc/cpuinfo`.
    pub fn current() -> Result<CpuId, EventTableError> {
        let text = std::fs::read_to_string("/proc/cpuinfo").map_err(|e| EventTableError::Io {
            path: "/proc/cpuinfo".into(),
            message: e.to_string(),
        })?;
        CpuId::from_cpuinfo(&text)
    }

    /// Parses the first processor block of a /proc/cpuinfo text.
    pub fn from_cpuinfo(text: &str) -> Result<CpuId, EventTableError> {
        let (mut vendor, mut family, mut model, mut stepping) = (None, None, None, None);
        for line in text.lines() {
            if line.trim().is_empty() && vendor.is_some() {
                break;
            }
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match key.trim() {
                "vendor_id" => vendor = Some(value.to_string()),
                "cpu family" => family = value.parse::<u32>().ok(),
                "model" => model = value.parse::<u32>().ok(),
                "stepping" => stepping = value.parse::<u32>().ok(),
                _ => {}
            }
        }
        match (vendor, family, model) {
            (Some(vendor), Some(family), Some(model)) => Ok(CpuId {
                vendor,
                family,
                model,
                stepping,
            }),
            _ => Err(EventTableError::CpuInfo(
                "no vendor_id / cpu family / model in /proc/cpuinfo".into(),
            )),
        }
    }
}

impl std::fmt::Display for CpuId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} family {:#x} model {:#x}",
            self.vendor, self.family, self.model
        )
    }
}

/// A validated table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventEntry {
    pub name: String,
    pub vendor: String,
    pub family: u32,
    /// Models, each range inclusive.
    pub models: Vec<(u32, u32)>,
    /// Steppings, each range inclusive; empty: every stepping.
    pub steppings: Vec<(u32, u32)>,
    pub event_type: EventType,
    pub config: u64,
    /// `perf_event_attr.config1`.
    pub config1: u64,
    /// Sample period (`period`, else [`DEFAULT_PERIOD`]).
    pub period: u64,
    /// Precise samples whose data_src picks the tier.
    pub data_src: bool,
    /// Tier kind of the counted accesses; `Unknown` only for a `data_src`
    /// entry without `tier`.
    pub tier: TierKind,
    pub source: String,
    pub verified: bool,
    /// Where the entry was read from ("builtin:intel.toml", a path).
    pub origin: String,
}

impl EventEntry {
    /// Whether the entry applies to `cpu`.
    pub fn matches(&self, cpu: &CpuId) -> bool {
        let stepping_ok = self.steppings.is_empty()
            || cpu.stepping.is_some_and(|s| {
                self.steppings
                    .iter()
                    .any(|&(lo, hi)| (lo..=hi).contains(&s))
            });
        self.vendor == cpu.vendor
            && self.family == cpu.family
            && self
                .models
                .iter()
                .any(|&(lo, hi)| (lo..=hi).contains(&cpu.model))
            && stepping_ok
    }

    /// Whether two entries' stepping sets share a stepping (empty: all).
    fn steppings_overlap(&self, o: &EventEntry) -> bool {
        self.steppings.is_empty()
            || o.steppings.is_empty()
            || self
                .steppings
                .iter()
                .any(|&(a, b)| o.steppings.iter().any(|&(c, d)| a <= d && c <= b))
    }

    fn overlaps(&self, o: &EventEntry) -> bool {
        self.name == o.name
            && self.vendor == o.vendor
            && self.family == o.family
            && self
                .models
                .iter()
                .any(|&(a, b)| o.models.iter().any(|&(c, d)| a <= d && c <= b))
            && self.steppings_overlap(o)
    }
}

/// Errors reading or validating a table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventTableError {
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    #[error("{origin}: not a valid event table: {message}")]
    Parse { origin: String, message: String },
    #[error("{origin}: event #{index} ({name:?}): {message}")]
    Entry {
        origin: String,
        index: usize,
        name: String,
        message: String,
    },
    #[error("cpuinfo: {0}")]
    CpuInfo(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TableFile {
    #[serde(default)]
    event: Vec<RawEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    #[serde(default)]
    name: String,
    #[serde(default)]
    vendor: String,
    family: Option<u32>,
    #[serde(default)]
    models: Vec<u32>,
    #[serde(default)]
    model_ranges: Vec<[u32; 2]>,
    #[serde(default)]
    steppings: Vec<[u32; 2]>,
    #[serde(rename = "type")]
    event_type: Option<String>,
    config: Option<u64>,
    config1: Option<u64>,
    period: Option<u64>,
    data_src: Option<bool>,
    #[serde(default)]
    tier: String,
    #[serde(default)]
    source: String,
    verified: Option<bool>,
}

const KNOWN_VENDORS: [&str; 2] = ["GenuineIntel", "AuthenticAMD"];

/// Why a `data_src = true` entry is refused on every CPU: tierd counts
/// guest-only, and precise samples of guest execution do not exist from
/// the host (docs/pmu.md, "Why no precise sampling").
pub const GUEST_ONLY_PRECISE: &str = "data_src = true asks for precise (PEBS/IBS) samples of \
guest-only events, which the host cannot take: Intel's perf disables host PEBS events while a \
guest runs (intel_guest_get_msrs), AMD IBS cannot exclude the host, and on Ice Lake and later \
some kernels let such an event disturb the guest. tierd counts guest-only events per vCPU \
thread instead: drop data_src and give the entry a tier";

/// The event table: validated entries of every file read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventTable {
    entries: Vec<EventEntry>,
}

/// The files of `profiler/events/`, built in.
const BUILTIN: [(&str, &str); 2] = [
    (
        "builtin:intel.toml",
        include_str!("../../../events/intel.toml"),
    ),
    ("builtin:amd.toml", include_str!("../../../events/amd.toml")),
];

impl EventTable {
    /// The built-in table (`profiler/events/*.toml`).
    pub fn builtin() -> Result<EventTable, EventTableError> {
        let mut t = EventTable::default();
        for (origin, text) in BUILTIN {
            t.extend(EventTable::from_toml(text, origin)?);
        }
        Ok(t)
    }

    /// The built-in table extended by user files, in order: a user entry
    /// with the same name, vendor and family and overlapping models
    /// replaces the earlier one.
    pub fn builtin_and(paths: &[&Path]) -> Result<EventTable, EventTableError> {
        let mut t = EventTable::builtin()?;
        for p in paths {
            t.extend(EventTable::from_file(p)?);
        }
        Ok(t)
    }

    /// Reads one table file.
    pub fn from_file(path: &Path) -> Result<EventTable, EventTableError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| EventTableError::Io {
            path: origin.clone(),
            message: e.to_string(),
        })?;
        EventTable::from_toml(&text, &origin)
    }

    /// Parses and validates a table; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<EventTable, EventTableError> {
        let file: TableFile = toml::from_str(text).map_err(|e| EventTableError::Parse {
            origin: origin.into(),
            message: e.to_string(),
        })?;
        let mut entries: Vec<EventEntry> = Vec::new();
        for (index, raw) in file.event.into_iter().enumerate() {
            let entry = validate(raw, origin, index)?;
            if let Some(prev) = entries.iter().find(|e| e.overlaps(&entry)) {
                return Err(EventTableError::Entry {
                    origin: origin.into(),
                    index,
                    name: entry.name.clone(),
                    message: format!(
                        "duplicate: {} family {:#x} already has this event for an overlapping model",
                        prev.vendor, prev.family
                    ),
                });
            }
            entries.push(entry);
        }
        Ok(EventTable { entries })
    }

    /// Adds `other`'s entries; those overlapping an existing one replace it.
    pub fn extend(&mut self, other: EventTable) {
        for e in other.entries {
            self.entries.retain(|old| !old.overlaps(&e));
            self.entries.push(e);
        }
    }

    pub fn entries(&self) -> &[EventEntry] {
        &self.entries
    }

    /// The entries for `cpu`; entries with `verified = false` only with
    /// `include_unverified`.
    pub fn select(&self, cpu: &CpuId, include_unverified: bool) -> Vec<&EventEntry> {
        self.entries
            .iter()
            .filter(|e| e.matches(cpu) && (e.verified || include_unverified))
            .collect()
    }

    /// Tier kinds the selected entries of `cpu` can tell apart.
    pub fn tiers_for(&self, cpu: &CpuId, include_unverified: bool) -> BTreeSet<TierKind> {
        self.select(cpu, include_unverified)
            .into_iter()
            .map(|e| e.tier)
            .filter(|k| *k != TierKind::Unknown)
            .collect()
    }
}

fn validate(raw: RawEntry, origin: &str, index: usize) -> Result<EventEntry, EventTableError> {
    let name = raw.name.trim().to_string();
    let err = |message: String| EventTableError::Entry {
        origin: origin.into(),
        index,
        name: name.clone(),
        message,
    };
    if name.is_empty() {
        return Err(err("`name` is missing or empty".into()));
    }
    if !KNOWN_VENDORS.contains(&raw.vendor.as_str()) {
        return Err(err(format!(
            "vendor {:?}: expected one of {KNOWN_VENDORS:?} (/proc/cpuinfo vendor_id)",
            raw.vendor
        )));
    }
    let family = raw
        .family
        .ok_or_else(|| err("`family` is missing".into()))?;
    let mut models: Vec<(u32, u32)> = raw.models.iter().map(|&m| (m, m)).collect();
    for [lo, hi] in raw.model_ranges {
        if lo > hi {
            return Err(err(format!("model range [{lo:#x}, {hi:#x}] is empty")));
        }
        models.push((lo, hi));
    }
    if models.is_empty() {
        return Err(err("no `models` or `model_ranges`".into()));
    }
    if let Some(&(m, _)) = models.iter().find(|&&(_, hi)| hi > 0xff) {
        return Err(err(format!("model {m:#x} out of range (0..=0xff)")));
    }
    let mut steppings = Vec::new();
    for [lo, hi] in raw.steppings {
        if lo > hi || hi > 0xf {
            return Err(err(format!(
                "stepping range [{lo:#x}, {hi:#x}]: expected lo <= hi <= 0xf"
            )));
        }
        steppings.push((lo, hi));
    }
    let type_name = raw.event_type.as_deref().unwrap_or("raw");
    let event_type = EventType::parse(type_name).ok_or_else(|| {
        err(format!(
            "type {type_name:?}: expected raw, hardware or software"
        ))
    })?;
    let config = raw
        .config
        .ok_or_else(|| err("`config` is missing".into()))?;
    if event_type == EventType::Raw && config & 0xff == 0 {
        return Err(err(format!(
            "raw config {config:#x} has no event select (bits 0-7)"
        )));
    }
    let data_src = raw.data_src.unwrap_or(false);
    let tier = if data_src && raw.tier.is_empty() {
        TierKind::Unknown
    } else {
        TierKind::from_short_name(&raw.tier)
            .filter(|k| *k != TierKind::Unknown)
            .ok_or_else(|| {
                err(format!(
                    "tier {:?}: expected dram, pmem, cxl or remote",
                    raw.tier
                ))
            })?
    };
    let period = raw.period.unwrap_or(DEFAULT_PERIOD);
    if period == 0 {
        return Err(err("period 0: an event must overflow to be counted".into()));
    }
    if data_src {
        return Err(err(GUEST_ONLY_PRECISE.into()));
    }
    if raw.source.trim().is_empty() {
        return Err(err(
            "`source` is missing: say where the encoding comes from".into(),
        ));
    }
    Ok(EventEntry {
        name: name.clone(),
        vendor: raw.vendor,
        family,
        models,
        steppings,
        event_type,
        config,
        config1: raw.config1.unwrap_or(0),
        period,
        data_src,
        tier,
        source: raw.source,
        verified: raw.verified.unwrap_or(true),
        origin: origin.into(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn cpu(vendor: &str, family: u32, model: u32) -> CpuId {
        CpuId {
            vendor: vendor.into(),
            family,
            model,
            stepping: None,
        }
    }

    /// (name, config, tier) of the verified entries selected for a CPU.
    fn resolved(c: &CpuId) -> Vec<(String, u64, TierKind)> {
        resolved_with(c, false)
    }

    /// (name, config, tier) of the entries selected for a CPU, unverified
    /// ones too when `include_unverified`.
    fn resolved_with(c: &CpuId, include_unverified: bool) -> Vec<(String, u64, TierKind)> {
        let t = EventTable::builtin().unwrap();
        t.select(c, include_unverified)
            .into_iter()
            .map(|e| (e.name.clone(), e.config, e.tier))
            .collect()
    }

    fn ev(name: &str, config: u64, tier: TierKind) -> (String, u64, TierKind) {
        (name.to_string(), config, tier)
    }

    const AMD: &str = "AuthenticAMD";
    const INTEL: &str = "GenuineIntel";

    fn local_dram() -> (String, u64, TierKind) {
        ev(
            "MEM_LOAD_L3_MISS_RETIRED.LOCAL_DRAM",
            0x01D3,
            TierKind::Dram,
        )
    }

    fn remote_dram() -> (String, u64, TierKind) {
        ev(
            "MEM_LOAD_L3_MISS_RETIRED.REMOTE_DRAM",
            0x02D3,
            TierKind::Remote,
        )
    }

    fn local_pmm() -> (String, u64, TierKind) {
        ev("MEM_LOAD_RETIRED.LOCAL_PMM", 0x80D1, TierKind::Pmem)
    }

    fn remote_pmm() -> (String, u64, TierKind) {
        ev(
            "MEM_LOAD_L3_MISS_RETIRED.REMOTE_PMM",
            0x10D3,
            TierKind::Pmem,
        )
    }

    #[test]
    fn builtin_table_parses_and_cites_sources() {
        let t = EventTable::builtin().unwrap();
        // intel.toml: ICX 4, CLX 4, SPR 4, EMR 2, GNR 4; amd.toml: Zen 4 3, Zen 5 3.
        assert_eq!(t.entries().len(), 24);
        for e in t.entries() {
            assert!(!e.source.is_empty(), "{}", e.name);
            assert_eq!(
                (e.event_type, e.data_src, e.config1, e.period),
                (EventType::Raw, false, 0, DEFAULT_PERIOD),
                "{}",
                e.name
            );
        }
        // Every built-in entry is verified against its vendor file; the
        // only stepping-bound ones are Cascade Lake's PMM events (model
        // 0x55 is Skylake-SP too, whose event list lacks them).
        assert!(t.entries().iter().all(|e| e.verified));
        let by_stepping: Vec<_> = t
            .entries()
            .iter()
            .filter(|e| !e.steppings.is_empty())
            .map(|e| (e.name.as_str(), e.models.clone(), e.steppings.clone()))
            .collect();
        assert_eq!(
            by_stepping,
            [
                (
                    "MEM_LOAD_RETIRED.LOCAL_PMM",
                    vec![(0x55, 0x55)],
                    vec![(5, 0xF)]
                ),
                (
                    "MEM_LOAD_L3_MISS_RETIRED.REMOTE_PMM",
                    vec![(0x55, 0x55)],
                    vec![(5, 0xF)]
                ),
            ]
        );
    }

    /// Every built-in `source` names the vendor file the encoding was read
    /// from, the commit, the event as that file spells it and the
    /// EventCode/UMask written there, which must be the entry's `config`.
    #[test]
    fn builtin_sources_name_the_file_and_the_encoding() {
        let t = EventTable::builtin().unwrap();
        for e in t.entries() {
            let s = e.source.as_str();
            let names_a_file = [".json", ".csv", "PPR", "Performance Monitor Counters"]
                .iter()
                .any(|f| s.contains(f));
            assert!(names_a_file, "{}: {s}", e.name);
            let repo = if e.vendor == INTEL {
                "intel/perfmon @"
            } else {
                "torvalds/linux @"
            };
            let commit = s
                .split_once(repo)
                .and_then(|(_, rest)| rest.split(' ').next())
                .unwrap_or_else(|| panic!("{}: no {repo:?} in {s}", e.name));
            assert!(
                commit.len() >= 12 && commit.chars().all(|c| c.is_ascii_hexdigit()),
                "{}: commit {commit:?}",
                e.name
            );
            let lower = s.to_ascii_lowercase();
            assert!(
                lower.contains(&e.name.to_ascii_lowercase()),
                "{}: {s}",
                e.name
            );
            let (select, umask) = (e.config & 0xff, e.config >> 8);
            assert!(
                lower.contains(&format!("eventcode {select:#04x} umask {umask:#04x}")),
                "{}: config {:#06x} is not the encoding cited in {s}",
                e.name,
                e.config
            );
        }
    }

    #[test]
    fn ice_lake_server() {
        for model in [0x6A, 0x6C] {
            let c = cpu(INTEL, 6, model);
            let want = vec![local_dram(), remote_dram(), local_pmm(), remote_pmm()];
            assert_eq!(resolved(&c), want);
            assert_eq!(resolved_with(&c, true), want);
        }
    }

    /// Model 0x55 is Cascade Lake (steppings 5-7, Cooper Lake 0xA-0xB) and
    /// Skylake-SP (steppings 0-4); tierd matches no stepping, so only the
    /// events both parts define are selected by default.
    #[test]
    fn cascade_lake_and_skylake_sp_share_model_0x55() {
        let at = |stepping| CpuId {
            stepping,
            ..cpu(INTEL, 6, 0x55)
        };
        // Cascade Lake (5-7) and Cooper Lake (0xA, 0xB): PMem too.
        for s in [5, 7, 0xA, 0xB] {
            assert_eq!(
                resolved(&at(Some(s))),
                vec![local_dram(), remote_dram(), local_pmm(), remote_pmm()],
                "stepping {s}"
            );
        }
        // Skylake-SP (0-4), or no stepping known: DRAM only, even with
        // unverified entries asked for.
        for c in [at(Some(0)), at(Some(4)), at(None)] {
            assert_eq!(
                resolved_with(&c, true),
                vec![local_dram(), remote_dram()],
                "{c:?}"
            );
        }
    }

    #[test]
    fn steppings_parse_and_bound_duplicates() {
        let with = |steppings: &str| {
            format!("[[event]]\n{GOOD}steppings = [[0, 4]]\n[[event]]\n{GOOD}{steppings}")
        };
        // Disjoint steppings of one model are two entries, not a duplicate.
        let t = EventTable::from_toml(&with("steppings = [[5, 0xF]]\n"), "t.toml").unwrap();
        assert_eq!(t.entries().len(), 2);
        for (body, want) in [
            (with("steppings = [[3, 6]]\n"), "duplicate"),
            (with(""), "duplicate"),
            (with("steppings = [[6, 5]]\n"), "stepping range"),
            (with("steppings = [[5, 16]]\n"), "stepping range"),
        ] {
            let e = entry_error(&body);
            assert!(
                e.starts_with("bad.toml: event #1") && e.contains(want),
                "{e}"
            );
        }
        let info = "vendor_id : GenuineIntel\ncpu family : 6\nmodel : 85\nstepping : 7\n";
        assert_eq!(CpuId::from_cpuinfo(info).unwrap().stepping, Some(7));
    }

    #[test]
    fn sapphire_and_emerald_rapids() {
        // Sapphire Rapids has local and remote PMem (Optane PMem 300).
        let spr = cpu(INTEL, 6, 0x8F);
        let want = vec![local_dram(), remote_dram(), local_pmm(), remote_pmm()];
        assert_eq!(resolved(&spr), want);
        assert_eq!(resolved_with(&spr, true), want);
        // Emerald Rapids has no PMem events, not even unverified ones.
        let emr = cpu(INTEL, 6, 0xCF);
        assert_eq!(resolved(&emr), vec![local_dram(), remote_dram()]);
        assert_eq!(resolved_with(&emr, true), vec![local_dram(), remote_dram()]);
        // Neither measures CXL.
        let t = EventTable::builtin().unwrap();
        for c in [spr, emr] {
            assert!(!t.tiers_for(&c, true).contains(&TierKind::Cxl), "{c}");
        }
    }

    #[test]
    fn granite_rapids_with_cxl() {
        for model in [0xAD, 0xAE] {
            let c = cpu(INTEL, 6, model);
            let want = vec![
                local_dram(),
                remote_dram(),
                ev("MEM_LOAD_RETIRED.LOCAL_CXL_MEM", 0x80D1, TierKind::Cxl),
                ev(
                    "MEM_LOAD_L3_MISS_RETIRED.REMOTE_CXL_MEM",
                    0x10D3,
                    TierKind::Cxl,
                ),
            ];
            assert_eq!(resolved(&c), want);
            assert_eq!(resolved_with(&c, true), want);
            let t = EventTable::builtin().unwrap();
            assert_eq!(
                t.tiers_for(&c, false),
                BTreeSet::from([TierKind::Dram, TierKind::Remote, TierKind::Cxl])
            );
        }
    }

    #[test]
    fn amd_zen4_and_zen5() {
        let want = vec![
            ev(
                "LS_DMND_FILLS_FROM_SYS.DRAM_IO_NEAR",
                0x0843,
                TierKind::Dram,
            ),
            ev(
                "LS_DMND_FILLS_FROM_SYS.DRAM_IO_FAR",
                0x4043,
                TierKind::Remote,
            ),
            ev(
                "LS_DMND_FILLS_FROM_SYS.ALTERNATE_MEMORIES",
                0x8043,
                TierKind::Cxl,
            ),
        ];
        // Zen 4 (amd.c: 0x10-0x1F, 0x60-0xAF): Genoa (0x11, this project's
        // machines), Storm Peak (0x18), Raphael (0x61), Phoenix (0x74),
        // Bergamo (0xA0), the range ends (0x10, 0x1F, 0x60, 0xAF).
        // Zen 5 (amd.c: 0x00-0x2F, 0x40-0x4F, 0x60-0x7F): Turin (0x02,
        // 0x11), Strix Point (0x24), Granite Ridge (0x44), the range ends.
        for (family, model) in [
            (0x19, 0x10),
            (0x19, 0x11),
            (0x19, 0x18),
            (0x19, 0x1F),
            (0x19, 0x60),
            (0x19, 0x61),
            (0x19, 0x74),
            (0x19, 0x90),
            (0x19, 0xA0),
            (0x19, 0xAF),
            (0x1A, 0x00),
            (0x1A, 0x02),
            (0x1A, 0x11),
            (0x1A, 0x24),
            (0x1A, 0x2F),
            (0x1A, 0x40),
            (0x1A, 0x44),
            (0x1A, 0x4F),
            (0x1A, 0x60),
            (0x1A, 0x7F),
        ] {
            let c = cpu(AMD, family, model);
            assert_eq!(resolved(&c), want, "{c}");
            assert_eq!(resolved_with(&c, true), want, "{c}");
        }
    }

    #[test]
    fn unlisted_cpus_resolve_nothing() {
        for c in [
            cpu(AMD, 0x19, 0x01), // Zen 3 Milan
            cpu(AMD, 0x19, 0x21), // Zen 3 Vermeer
            cpu(AMD, 0x19, 0x50), // Zen 3 Cezanne
            cpu(AMD, 0x19, 0xB0), // past the Zen 4 ranges
            cpu(AMD, 0x17, 0x31), // Zen 2 Rome
            cpu(AMD, 0x1A, 0x30), // family 0x1A, in no Zen 5 range
            cpu(AMD, 0x1A, 0x3F),
            cpu(AMD, 0x1A, 0x50), // Zen 6 (amd.c: 0x50-0x5F, 0x80-0xAF, 0xC0-0xCF)
            cpu(AMD, 0x1A, 0x5F),
            cpu(AMD, 0x1A, 0x80),
            cpu(AMD, 0x1A, 0xAF),
            cpu(AMD, 0x1A, 0xC0),
            cpu(INTEL, 6, 0x8E), // client
            cpu(INTEL, 6, 0x97), // Alder Lake client
            cpu(INTEL, 6, 0xAF), // Sierra Forest (E-cores)
            cpu(INTEL, 6, 0x6B), // between Ice Lake models
            cpu("HygonGenuine", 0x18, 0x01),
        ] {
            assert!(resolved_with(&c, true).is_empty(), "{c}");
        }
    }

    /// A user entry with a built-in's name replaces it on the overlapping
    /// family/models, wherever the built-in applied.
    #[test]
    fn user_file_replaces_a_builtin_demand_fill_entry() {
        const ALT: &str = "LS_DMND_FILLS_FROM_SYS.ALTERNATE_MEMORIES";
        let mut t = EventTable::builtin().unwrap();
        let before = t.entries().len();
        let user = EventTable::from_toml(
            &format!(
                "[[event]]\nname = \"{ALT}\"\nvendor = \"AuthenticAMD\"\nfamily = 0x1A\n\
                 models = [0x02]\nconfig = 0x8043\ntier = \"pmem\"\nsource = \"site override\"\n"
            ),
            "user.toml",
        )
        .unwrap();
        t.extend(user);
        assert_eq!(t.entries().len(), before);
        let turin = cpu(AMD, 0x1A, 0x02);
        let e = t
            .select(&turin, false)
            .into_iter()
            .find(|e| e.name == ALT)
            .unwrap();
        assert_eq!((e.tier, e.origin.as_str()), (TierKind::Pmem, "user.toml"));
        // The built-in Zen 5 entry is gone for every Zen 5 model; Zen 4's stays.
        assert!(
            t.select(&cpu(AMD, 0x1A, 0x44), false)
                .iter()
                .all(|e| e.name != ALT)
        );
        assert!(
            t.select(&cpu(AMD, 0x19, 0x11), false)
                .iter()
                .any(|e| e.name == ALT && e.origin == "builtin:amd.toml")
        );
    }

    #[test]
    fn cpuinfo_is_parsed() {
        let text = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\n";
        assert_eq!(
            CpuId::from_cpuinfo(text).unwrap(),
            cpu("AuthenticAMD", 25, 17)
        );
        assert!(CpuId::from_cpuinfo("processor : 0\n").is_err());
    }

    #[test]
    fn user_file_extends_and_replaces() {
        let mut t = EventTable::builtin().unwrap();
        let user = EventTable::from_toml(
            r#"
[[event]]
name = "LS_DMND_FILLS_FROM_SYS.ALTERNATE_MEMORIES"
vendor = "AuthenticAMD"
family = 0x19
models = [0x11]
config = 0x8043
tier = "pmem"
source = "site override"
"#,
            "user.toml",
        )
        .unwrap();
        t.extend(user);
        let c = cpu("AuthenticAMD", 0x19, 0x11);
        let e = t
            .select(&c, false)
            .into_iter()
            .find(|e| e.name == "LS_DMND_FILLS_FROM_SYS.ALTERNATE_MEMORIES")
            .unwrap();
        assert_eq!((e.tier, e.origin.as_str()), (TierKind::Pmem, "user.toml"));
        // The replaced built-in entry (all Zen 4 models) is gone for every model.
        assert!(
            t.select(&cpu("AuthenticAMD", 0x19, 0xA0), false)
                .iter()
                .all(|e| e.name != "LS_DMND_FILLS_FROM_SYS.ALTERNATE_MEMORIES")
        );
    }

    #[test]
    fn period_and_config1_keys() {
        let t = EventTable::from_toml(
            &format!(
                "[[event]]\n{GOOD}\n[[event]]\n{}",
                r#"name = "MEM_TRANS_RETIRED.LOAD_LATENCY_GT_64"
vendor = "GenuineIntel"
family = 6
models = [0x6A]
config = 0x01CD
config1 = 64
period = 2003
tier = "remote"
source = "test"
"#
            ),
            "t.toml",
        )
        .unwrap();
        let [plain, latency] = t.entries() else {
            panic!("two entries")
        };
        assert_eq!(
            (plain.period, plain.config1, plain.data_src, plain.tier),
            (DEFAULT_PERIOD, 0, false, TierKind::Dram)
        );
        assert_eq!(
            (latency.period, latency.config1, latency.tier),
            (2003, 64, TierKind::Remote)
        );
    }

    /// Precise sampling of guest-only events is refused on every CPU and
    /// every event type, with or without a tier: the error names the file,
    /// the entry and why.
    #[test]
    fn data_src_entries_are_refused_for_guest_only_counting() {
        for (extra, event_type) in [
            ("tier = \"dram\"\ndata_src = true", "raw"),
            ("data_src = true", "raw"),
            ("tier = \"dram\"\ndata_src = true", "hardware"),
            ("tier = \"dram\"\ndata_src = true", "software"),
        ] {
            let body = format!(
                "[[event]]\n{GOOD}\n[[event]]\n{}",
                GOOD.replace("\"X\"", "\"MEM_TRANS_RETIRED.LOAD_LATENCY_GT_64\"")
                    .replace("tier = \"dram\"", extra)
                    .replace(
                        "config = 0x01D3",
                        &format!("type = \"{event_type}\"\nconfig = 0x01CD")
                    )
            );
            let e = entry_error(&body);
            assert!(
                e.starts_with("bad.toml: event #1 (\"MEM_TRANS_RETIRED.LOAD_LATENCY_GT_64\"): ")
                    && e.ends_with(GUEST_ONLY_PRECISE),
                "{e}"
            );
        }
        // `data_src = false` is the default and is accepted.
        let ok = format!("[[event]]\n{GOOD}data_src = false\n");
        assert!(!EventTable::from_toml(&ok, "ok.toml").unwrap().entries()[0].data_src);
    }

    fn entry_error(body: &str) -> String {
        EventTable::from_toml(body, "bad.toml")
            .unwrap_err()
            .to_string()
    }

    const GOOD: &str = r#"name = "X"
vendor = "GenuineIntel"
family = 6
models = [0x6A]
config = 0x01D3
tier = "dram"
source = "test"
"#;

    #[test]
    fn malformed_tables_are_refused_naming_the_entry() {
        let with = |from: &str, to: &str| {
            format!(
                "[[event]]\n{GOOD}\n[[event]]\n{}",
                GOOD.replace("\"X\"", "\"Y\"").replace(from, to)
            )
        };
        let cases = [
            (with("tier = \"dram\"", "tier = \"hbm\""), "tier \"hbm\""),
            (
                with("vendor = \"GenuineIntel\"", "vendor = \"Intel\""),
                "vendor \"Intel\"",
            ),
            (
                with("source = \"test\"", "source = \"\""),
                "`source` is missing",
            ),
            (with("models = [0x6A]", "models = []"), "no `models`"),
            (
                with("config = 0x01D3", "config = 0x0100"),
                "no event select",
            ),
            (with("family = 6\n", ""), "`family` is missing"),
            (
                with("models = [0x6A]", "model_ranges = [[0x70, 0x60]]"),
                "is empty",
            ),
            (with("\"Y\"", "\"X\""), "duplicate"),
            (
                with("tier = \"dram\"", "tier = \"dram\"\nperiod = 0"),
                "period 0",
            ),
            (with("tier = \"dram\"", "tier = \"\""), "tier \"\""),
            (
                with(
                    "config = 0x01D3",
                    "type = \"software\"\nconfig = 2\ndata_src = true",
                ),
                "data_src = true asks for precise",
            ),
        ];
        for (body, want) in cases {
            let e = entry_error(&body);
            assert!(
                e.starts_with("bad.toml: event #1 (") && e.contains(want),
                "{e} (wanted {want:?})"
            );
        }
        // Not TOML, or an unknown key: a parse error with the origin.
        let e = entry_error("[[event]]\nname = \"X\"\ncolour = 1\n");
        assert!(
            e.starts_with("bad.toml: not a valid event table") && e.contains("colour"),
            "{e}"
        );
        let e = entry_error("[[event]\n");
        assert!(e.starts_with("bad.toml: not a valid event table"), "{e}");
    }
}
