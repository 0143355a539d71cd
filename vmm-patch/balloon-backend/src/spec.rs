//! The tiers a backend serves: names and guest-physical ranges, in SPEC
//! order, as given on the command line (`--tier name=dram,ranges=...`).
//!
//! They play the role of `vm.info memory_zones[].ranges` (SPEC.md section
//! 6): the backend checks every PFN of tier i's queues against tier i's
//! ranges, never against the informational config-space fields.

use crate::release::{MAX_TIERS, PAGE_SIZE};

/// One guest-physical range `[start, start + size)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpaRange {
    pub start: u64,
    pub size: u64,
}

impl GpaRange {
    pub fn end(&self) -> u64 {
        self.start + self.size
    }
}

/// One tier: a cloud-hypervisor memory zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierSpec {
    pub name: String,
    /// Ascending, non-overlapping, 4 KiB aligned.
    pub ranges: Vec<GpaRange>,
    /// Guest NUMA node of the zone (`tier[i].guest_node`); `None` is
    /// reported as `0xffffffff`.
    pub guest_node: Option<u32>,
}

impl TierSpec {
    /// Bytes of the zone (sum of its ranges).
    pub fn zone_bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.size).sum()
    }
    /// Lowest guest-physical address.
    pub fn gpa_start(&self) -> u64 {
        self.ranges.first().map_or(0, |r| r.start)
    }
    /// `(highest end - gpa_start)` in bytes.
    pub fn span_bytes(&self) -> u64 {
        self.ranges.last().map_or(0, |r| r.end()) - self.gpa_start()
    }
}

/// A bad `--tier` argument or tier set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("--tier {arg:?}: {what}")]
    Tier { arg: String, what: String },
    #[error("{0} tiers given; 1..={MAX_TIERS} allowed")]
    Count(usize),
    #[error("tier name {0:?} given twice")]
    DuplicateName(String),
    #[error(
        "range {a_start:#x}-{a_end:#x} of tier {a:?} overlaps {b_start:#x}-{b_end:#x} of tier {b:?}"
    )]
    Overlap {
        a: String,
        a_start: u64,
        a_end: u64,
        b: String,
        b_start: u64,
        b_end: u64,
    },
}

fn parse_u64(s: &str) -> Option<u64> {
    let s = s.trim();
    let (digits, mult) = match s.char_indices().last() {
        Some((i, 'K' | 'k')) => (&s[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&s[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&s[..i], 1 << 30),
        Some((i, 'T' | 't')) => (&s[..i], 1 << 40),
        _ => (s, 1),
    };
    let v = if let Some(hex) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        u64::from_str_radix(hex, 16).ok()?
    } else {
        digits.parse::<u64>().ok()?
    };
    v.checked_mul(mult)
}

/// `START-END` (end exclusive) or `START+SIZE`; numbers decimal or `0x`
/// hex, with an optional K/M/G/T suffix (binary units).
fn parse_range(s: &str) -> Result<GpaRange, String> {
    let (start, size) = if let Some((a, b)) = s.split_once('+') {
        let start = parse_u64(a).ok_or_else(|| format!("bad start {a:?} in range {s:?}"))?;
        let size = parse_u64(b).ok_or_else(|| format!("bad size {b:?} in range {s:?}"))?;
        (start, size)
    } else if let Some((a, b)) = s.split_once('-') {
        let start = parse_u64(a).ok_or_else(|| format!("bad start {a:?} in range {s:?}"))?;
        let end = parse_u64(b).ok_or_else(|| format!("bad end {b:?} in range {s:?}"))?;
        if end <= start {
            return Err(format!("range {s:?}: end must be above start"));
        }
        (start, end - start)
    } else {
        return Err(format!("range {s:?}: expected START-END or START+SIZE"));
    };
    if size == 0 {
        return Err(format!("range {s:?} is empty"));
    }
    if start.checked_add(size).is_none() {
        return Err(format!("range {s:?} overflows"));
    }
    if !start.is_multiple_of(PAGE_SIZE) || !size.is_multiple_of(PAGE_SIZE) {
        return Err(format!("range {s:?} is not 4 KiB aligned"));
    }
    Ok(GpaRange { start, size })
}

/// Parses one `--tier` value: `name=NAME,ranges=R[:R...][,node=N]`.
pub fn parse_tier(arg: &str) -> Result<TierSpec, SpecError> {
    let err = |what: String| SpecError::Tier {
        arg: arg.to_string(),
        what,
    };
    let (mut name, mut ranges, mut node) = (None, None, None);
    for kv in arg.split(',') {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(err(format!("{kv:?} is not key=value")));
        };
        match k.trim() {
            "name" | "id" => {
                let v = v.trim();
                if v.is_empty()
                    || !v
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
                {
                    return Err(err(format!(
                        "name {v:?}: use letters, digits, '_', '.', '-'"
                    )));
                }
                name = Some(v.to_string());
            }
            "ranges" => {
                let mut rs = v
                    .split(':')
                    .map(parse_range)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(err)?;
                rs.sort_by_key(|r| r.start);
                if let Some(w) = rs.windows(2).find(|w| w[1].start < w[0].end()) {
                    return Err(err(format!(
                        "ranges {:#x}-{:#x} and {:#x}-{:#x} overlap",
                        w[0].start,
                        w[0].end(),
                        w[1].start,
                        w[1].end()
                    )));
                }
                let pages: u64 = rs.iter().map(|r| r.size / PAGE_SIZE).sum();
                if pages > u64::from(u32::MAX) {
                    return Err(err("zone larger than 2^32-1 pages (16 TiB)".into()));
                }
                ranges = Some(rs);
            }
            "node" => {
                node = Some(
                    v.trim()
                        .parse::<u32>()
                        .ok()
                        .filter(|&n| n != u32::MAX)
                        .ok_or_else(|| err(format!("bad guest node {v:?}")))?,
                );
            }
            other => {
                return Err(err(format!("unknown key {other:?} (name, ranges, node)")));
            }
        }
    }
    Ok(TierSpec {
        name: name.ok_or_else(|| err("name= missing".into()))?,
        ranges: ranges.ok_or_else(|| err("ranges= missing".into()))?,
        guest_node: node,
    })
}

/// Checks a tier set: 1..=8 tiers, unique names, no range shared by two
/// tiers.
pub fn validate(tiers: &[TierSpec]) -> Result<(), SpecError> {
    if tiers.is_empty() || tiers.len() > MAX_TIERS {
        return Err(SpecError::Count(tiers.len()));
    }
    let mut all = Vec::new();
    for (i, t) in tiers.iter().enumerate() {
        if tiers[..i].iter().any(|o| o.name == t.name) {
            return Err(SpecError::DuplicateName(t.name.clone()));
        }
        all.extend(t.ranges.iter().map(|r| (*r, t.name.as_str())));
    }
    all.sort_by_key(|(r, _)| r.start);
    if let Some(w) = all.windows(2).find(|w| w[1].0.start < w[0].0.end()) {
        return Err(SpecError::Overlap {
            a: w[0].1.to_string(),
            a_start: w[0].0.start,
            a_end: w[0].0.end(),
            b: w[1].1.to_string(),
            b_start: w[1].0.start,
            b_end: w[1].0.end(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ranges_names_and_nodes() {
        let t =
            parse_tier("name=slow,ranges=0x10000000-0x20000000:0x100000000+256M,node=1").unwrap();
        assert_eq!(t.name, "slow");
        assert_eq!(
            t.ranges,
            vec![
                GpaRange {
                    start: 0x1000_0000,
                    size: 0x1000_0000
                },
                GpaRange {
                    start: 0x1_0000_0000,
                    size: 256 << 20
                }
            ]
        );
        assert_eq!(t.guest_node, Some(1));
        assert_eq!(t.zone_bytes(), 512 << 20);
        assert_eq!(t.span_bytes(), 0x1_0000_0000 + (256 << 20) - 0x1000_0000);
    }

    #[test]
    fn refuses_bad_tiers_with_the_reason() {
        for (arg, needle) in [
            ("ranges=0-0x1000", "name= missing"),
            ("name=a", "ranges= missing"),
            ("name=a,ranges=0x1000-0x1000", "end must be above start"),
            ("name=a,ranges=0x800-0x2000", "not 4 KiB aligned"),
            ("name=a,ranges=0-0x2000:0x1000-0x3000", "overlap"),
            ("name=a b,ranges=0-0x1000", "name"),
            ("name=a,ranges=0-0x1000,colour=red", "unknown key"),
            ("name=a,ranges=zz-0x1000", "bad start"),
            ("name=a,ranges=0-0x1000,node=x", "bad guest node"),
            ("name=a,ranges=0+0x20000000000000", "2^32-1 pages"),
        ] {
            let e = parse_tier(arg).unwrap_err().to_string();
            assert!(e.contains(needle), "{arg}: {e}");
        }
        let a = parse_tier("name=a,ranges=0-0x2000").unwrap();
        let b = parse_tier("name=b,ranges=0x1000-0x3000").unwrap();
        assert!(matches!(
            validate(&[a.clone(), b]),
            Err(SpecError::Overlap { .. })
        ));
        assert!(matches!(
            validate(&[a.clone(), a.clone()]),
            Err(SpecError::DuplicateName(_))
        ));
        assert!(matches!(validate(&[]), Err(SpecError::Count(0))));
        assert!(matches!(validate(&vec![a; 9]), Err(SpecError::Count(9))));
    }
}
