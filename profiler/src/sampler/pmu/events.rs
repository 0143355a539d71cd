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
//! type = "raw"                                   # raw (default), hardware, software
//! config = 0x01D3                                # perf_event_attr.config
//! tier = "dram"                                  # dram | pmem | cxl | remote
//! source = "Intel perfmon ICX: ..."              # where the encoding comes from
//! verified = true                                # default true
//! period = 10007                                 # sample period, default DEFAULT_PERIOD
//! config1 = 0                                    # perf_event_attr.config1 (e.g. ldlat)
//! data_src = false                               # precise; tier from each sample's data_src
//! ```
//!
//! A `data_src = true` entry is opened precise (`precise_ip` 2) with
//! PERF_SAMPLE_DATA_SRC, and each sample counts in the VM's tier of the
//! kind its data_src decodes to (`data_src.rs`); `tier` is then optional
//! and only used for samples that carry no data_src.

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
        let (mut vendor, mut family, mut model) = (None, None, None);
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
                _ => {}
            }
        }
        match (vendor, family, model) {
            (Some(vendor), Some(family), Some(model)) => Ok(CpuId {
                vendor,
                family,
                model,
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
        self.vendor == cpu.vendor
            && self.family == cpu.family
            && self
                .models
                .iter()
                .any(|&(lo, hi)| (lo..=hi).contains(&cpu.model))
    }

    fn overlaps(&self, o: &EventEntry) -> bool {
        self.name == o.name
            && self.vendor == o.vendor
            && self.family == o.family
            && self
                .models
                .iter()
                .any(|&(a, b)| o.models.iter().any(|&(c, d)| a <= d && c <= b))
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
    if data_src && event_type == EventType::Software {
        return Err(err(
            "data_src = true needs a precise hardware or raw event".into()
        ));
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
        }
    }

    /// (name, config, tier) of the verified entries selected for a CPU.
    fn resolved(c: &CpuId) -> Vec<(String, u64, TierKind)> {
        let t = EventTable::builtin().unwrap();
        t.select(c, false)
            .into_iter()
            .map(|e| (e.name.clone(), e.config, e.tier))
            .collect()
    }

    fn ev(name: &str, config: u64, tier: TierKind) -> (String, u64, TierKind) {
        (name.to_string(), config, tier)
    }

    #[test]
    fn builtin_table_parses_and_cites_sources() {
        let t = EventTable::builtin().unwrap();
        assert!(t.entries().len() >= 15, "{}", t.entries().len());
        for e in t.entries() {
            assert!(!e.source.is_empty(), "{}", e.name);
        }
    }

    #[test]
    fn ice_lake_server() {
        for model in [0x6A, 0x6C] {
            assert_eq!(
                resolved(&cpu("GenuineIntel", 6, model)),
                vec![
                    ev(
                        "MEM_LOAD_L3_MISS_RETIRED.LOCAL_DRAM",
                        0x01D3,
                        TierKind::Dram
                    ),
                    ev(
                        "MEM_LOAD_L3_MISS_RETIRED.REMOTE_DRAM",
                        0x02D3,
                        TierKind::Remote
                    ),
                    ev("MEM_LOAD_RETIRED.LOCAL_PMM", 0x80D1, TierKind::Pmem),
                    ev(
                        "MEM_LOAD_L3_MISS_RETIRED.REMOTE_PMM",
                        0x10D3,
                        TierKind::Pmem
                    ),
                ]
            );
        }
    }

    #[test]
    fn sapphire_and_emerald_rapids() {
        for model in [0x8F, 0xCF] {
            let c = cpu("GenuineIntel", 6, model);
            assert_eq!(
                resolved(&c),
                vec![
                    ev(
                        "MEM_LOAD_L3_MISS_RETIRED.LOCAL_DRAM",
                        0x01D3,
                        TierKind::Dram
                    ),
                    ev(
                        "MEM_LOAD_L3_MISS_RETIRED.REMOTE_DRAM",
                        0x02D3,
                        TierKind::Remote
                    ),
                ]
            );
            // PMM only when unverified entries are asked for.
            let t = EventTable::builtin().unwrap();
            let all: Vec<_> = t.select(&c, true).iter().map(|e| e.tier).collect();
            assert_eq!(all, [TierKind::Dram, TierKind::Remote, TierKind::Pmem]);
        }
    }

    #[test]
    fn granite_rapids_cxl_is_unverified() {
        for model in [0xAD, 0xAE] {
            let c = cpu("GenuineIntel", 6, model);
            assert_eq!(
                resolved(&c),
                vec![
                    ev(
                        "MEM_LOAD_L3_MISS_RETIRED.LOCAL_DRAM",
                        0x01D3,
                        TierKind::Dram
                    ),
                    ev(
                        "MEM_LOAD_L3_MISS_RETIRED.REMOTE_DRAM",
                        0x02D3,
                        TierKind::Remote
                    ),
                ]
            );
            let t = EventTable::builtin().unwrap();
            let cxl: Vec<_> = t
                .select(&c, true)
                .into_iter()
                .filter(|e| e.tier == TierKind::Cxl)
                .map(|e| (e.name.as_str(), e.verified))
                .collect();
            assert_eq!(
                cxl,
                [
                    ("MEM_LOAD_RETIRED.LOCAL_CXL_MEM", false),
                    ("MEM_LOAD_L3_MISS_RETIRED.REMOTE_CXL_MEM", false)
                ]
            );
        }
    }

    #[test]
    fn amd_zen4_and_zen5() {
        let want = vec![
            ev("LS_ANY_FILLS_FROM_SYS.DRAM_IO_NEAR", 0x0844, TierKind::Dram),
            ev(
                "LS_ANY_FILLS_FROM_SYS.DRAM_IO_FAR",
                0x4044,
                TierKind::Remote,
            ),
            ev(
                "LS_ANY_FILLS_FROM_SYS.ALTERNATE_MEMORIES",
                0x8044,
                TierKind::Cxl,
            ),
        ];
        // Zen 4: Genoa (0x11, this project's machines), Bergamo (0xA0),
        // Raphael (0x61); Zen 5: Turin (0x02, 0x11), Granite Ridge (0x44).
        for (family, model) in [
            (0x19, 0x11),
            (0x19, 0xA0),
            (0x19, 0x61),
            (0x1A, 0x02),
            (0x1A, 0x11),
            (0x1A, 0x44),
        ] {
            assert_eq!(
                resolved(&cpu("AuthenticAMD", family, model)),
                want,
                "{family:#x}/{model:#x}"
            );
        }
    }

    #[test]
    fn unlisted_cpus_resolve_nothing() {
        for c in [
            cpu("AuthenticAMD", 0x19, 0x01), // Zen 3 Milan
            cpu("AuthenticAMD", 0x17, 0x31), // Zen 2 Rome
            cpu("GenuineIntel", 6, 0x55),    // Skylake/Cascade Lake SP
            cpu("GenuineIntel", 6, 0x8E),    // client
            cpu("HygonGenuine", 0x18, 0x01),
        ] {
            assert!(resolved(&c).is_empty(), "{c}");
        }
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
name = "LS_ANY_FILLS_FROM_SYS.ALTERNATE_MEMORIES"
vendor = "AuthenticAMD"
family = 0x19
models = [0x11]
config = 0x8044
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
            .find(|e| e.name == "LS_ANY_FILLS_FROM_SYS.ALTERNATE_MEMORIES")
            .unwrap();
        assert_eq!((e.tier, e.origin.as_str()), (TierKind::Pmem, "user.toml"));
        // The replaced built-in entry (all Zen 4 models) is gone for every model.
        assert!(
            t.select(&cpu("AuthenticAMD", 0x19, 0xA0), false)
                .iter()
                .all(|e| e.name != "LS_ANY_FILLS_FROM_SYS.ALTERNATE_MEMORIES")
        );
    }

    #[test]
    fn period_config1_and_data_src_keys() {
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
data_src = true
source = "test"
"#
            ),
            "t.toml",
        )
        .unwrap();
        let [plain, precise] = t.entries() else {
            panic!("two entries")
        };
        assert_eq!(
            (plain.period, plain.config1, plain.data_src, plain.tier),
            (DEFAULT_PERIOD, 0, false, TierKind::Dram)
        );
        assert_eq!(
            (
                precise.period,
                precise.config1,
                precise.data_src,
                precise.tier
            ),
            (2003, 64, true, TierKind::Unknown)
        );
        // A data_src entry without a tier adds no kind of its own.
        let c = cpu("GenuineIntel", 6, 0x6A);
        assert_eq!(t.tiers_for(&c, false), BTreeSet::from([TierKind::Dram]));
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
                "data_src = true needs",
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
