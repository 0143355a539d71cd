//! The guest's serial lines. Every line the guest prints starts with `tg `
//! and a kind (`boot`, `cmdline`, `balloon`, `zone`, `ready`, `phase`,
//! `tick`, `done`, `error`, `halted`), then `key=value` fields and plain
//! words; lists are comma-separated per tier (`acc=80123,19877`) and phase
//! weights slash-separated (`w=80/20`). docs/testguest.md lists the lines.
//! Typed views of the lines a harness watches: [`Line::tick`] (`tick` and
//! `done`, with the per-tier canary losses `lost=`), [`Line::canary_lost`]
//! and [`Line::mode`] (`tg deaf on`, `tg lie off`, ...).

use std::collections::BTreeMap;

/// One `tg ...` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub kind: String,
    /// Tokens without `=`, in order.
    pub words: Vec<String>,
    pub fields: BTreeMap<String, String>,
}

fn number(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

impl Line {
    /// Parse one line; `None` unless it is a guest line (`tg KIND ...`).
    pub fn parse(line: &str) -> Option<Line> {
        let mut tokens = line.split_whitespace();
        if tokens.next()? != "tg" {
            return None;
        }
        let kind = tokens.next()?.to_string();
        let mut words = Vec::new();
        let mut fields = BTreeMap::new();
        for t in tokens {
            match t.split_once('=') {
                Some((k, v)) => {
                    fields.insert(k.to_string(), v.to_string());
                }
                None => words.push(t.to_string()),
            }
        }
        Some(Line {
            kind,
            words,
            fields,
        })
    }

    /// A numeric field (decimal, or hex with `0x`).
    pub fn u64(&self, key: &str) -> Option<u64> {
        number(self.fields.get(key)?)
    }

    /// A list field (`1,2,3` or `80/20`).
    pub fn list(&self, key: &str) -> Option<Vec<u64>> {
        self.fields
            .get(key)?
            .split([',', '/'])
            .map(number)
            .collect()
    }
}

/// The state a `tg tick` or `tg done` line reports, lists per tier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tick {
    /// Seconds of the guest's clock (`tick` only).
    pub s: Option<u64>,
    pub total: u64,
    pub acc: Vec<u64>,
    /// Ballooned pages.
    pub bal: Vec<u64>,
    pub free: Vec<u64>,
    /// Workload pages resident.
    pub res: Vec<u64>,
    /// Canary losses: accesses that found a workload page without its canary.
    pub lost: Vec<u64>,
    /// Stats buffers returned to the device.
    pub stats: u64,
}

/// A `tg canary lost gpa=0x... tier=N set=J page=K read=0x...` line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CanaryLost {
    pub gpa: u64,
    pub tier: u64,
    /// Hot set and page index in it.
    pub set: u64,
    pub page: u64,
    /// What the canary word held.
    pub read: u64,
}

/// Which misbehaviour a `tg deaf|lie on|off` line switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Deaf,
    Lie,
}

/// A `tg deaf on s=30` line: a `deaf=`/`lie=` window edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModeEdge {
    pub mode: Mode,
    pub on: bool,
    /// Second of the guest's clock at the edge.
    pub s: u64,
}

impl Line {
    /// The state of a `tick` or `done` line; `None` for other lines or a
    /// field missing.
    pub fn tick(&self) -> Option<Tick> {
        if self.kind != "tick" && self.kind != "done" {
            return None;
        }
        Some(Tick {
            s: self.u64("s"),
            total: self.u64("total")?,
            acc: self.list("acc")?,
            bal: self.list("bal")?,
            free: self.list("free")?,
            res: self.list("res")?,
            lost: self.list("lost")?,
            stats: self.u64("stats")?,
        })
    }

    /// A `tg canary lost` line.
    pub fn canary_lost(&self) -> Option<CanaryLost> {
        if self.kind != "canary" || self.words.first().map(String::as_str) != Some("lost") {
            return None;
        }
        Some(CanaryLost {
            gpa: self.u64("gpa")?,
            tier: self.u64("tier")?,
            set: self.u64("set")?,
            page: self.u64("page")?,
            read: self.u64("read")?,
        })
    }

    /// A `tg deaf on|off` or `tg lie on|off` line.
    pub fn mode(&self) -> Option<ModeEdge> {
        let mode = match self.kind.as_str() {
            "deaf" => Mode::Deaf,
            "lie" => Mode::Lie,
            _ => return None,
        };
        let on = match self.words.first()?.as_str() {
            "on" => true,
            "off" => false,
            _ => return None,
        };
        Some(ModeEdge {
            mode,
            on,
            s: self.u64("s")?,
        })
    }
}

/// Every complete guest line of a serial log, in order (other lines are
/// skipped). A last line without its newline is still being written by the
/// VMM and is left for the next read: parsed now it would miss fields.
pub fn parse_log(text: &str) -> Vec<Line> {
    let complete = match text.rfind('\n') {
        Some(end) => &text[..=end],
        None => "",
    };
    complete.lines().filter_map(Line::parse).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_still_being_written_is_left_out() {
        let lines = parse_log("tg tick s=1 acc=1,2\ntg tick s=2 acc=3");
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].u64("s"), Some(1));
        assert!(parse_log("tg boot").is_empty());
    }

    #[test]
    fn parses_guest_lines() {
        let log = "noise\n\
                   tg zone i=1 start=0x10000000 span=65536 total=65536 free=65536 node=1\n\
                   tg phase n=1 w=20/80 len=100000 at=100000 acc=80123,19877\n\
                   tg balloon tier=0 target=15872 out of reach: 15000 ballooned\n";
        let lines = parse_log(log);
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].kind, "zone");
        assert_eq!(lines[0].u64("start"), Some(0x1000_0000));
        assert_eq!(lines[1].list("w"), Some(vec![20, 80]));
        assert_eq!(lines[1].list("acc"), Some(vec![80123, 19877]));
        assert_eq!(lines[2].words[..3], ["out", "of", "reach:"]);
        assert_eq!(lines[2].u64("nope"), None);
        assert_eq!(lines[0].tick(), None);
        assert_eq!(Line::parse("tg"), None);
        assert_eq!(Line::parse("tgx boot"), None);
    }

    #[test]
    fn parses_ticks_canary_and_mode_lines() {
        let log = "tg tick s=3 phase=1 total=40000 acc=20004,19996 bal=0,16 free=15992,16320 res=64,64 lost=0,2 stats=3\n\
                   tg done total=60000 acc=30000,30000 bal=0,0 free=1,2 res=64,64 lost=0,0 stats=9\n\
                   tg canary lost gpa=0x10234000 tier=1 set=0 page=12 read=0x0\n\
                   tg deaf on s=30\n\
                   tg lie off s=7\n\
                   tg deaf maybe s=1\n\
                   tg tick s=4 total=1 acc=1,0\n";
        let lines = parse_log(log);
        let t = lines[0].tick().unwrap();
        assert_eq!(t.s, Some(3));
        assert_eq!((t.total, t.stats), (40000, 3));
        assert_eq!(t.acc, [20004, 19996]);
        assert_eq!(t.bal, [0, 16]);
        assert_eq!(t.free, [15992, 16320]);
        assert_eq!(t.res, [64, 64]);
        assert_eq!(t.lost, [0, 2]);
        let d = lines[1].tick().unwrap();
        assert_eq!((d.s, d.total, d.lost.clone()), (None, 60000, vec![0, 0]));
        assert_eq!(
            lines[2].canary_lost(),
            Some(CanaryLost {
                gpa: 0x1023_4000,
                tier: 1,
                set: 0,
                page: 12,
                read: 0
            })
        );
        assert_eq!(lines[2].tick(), None);
        assert_eq!(
            lines[3].mode(),
            Some(ModeEdge {
                mode: Mode::Deaf,
                on: true,
                s: 30
            })
        );
        assert_eq!(
            lines[4].mode(),
            Some(ModeEdge {
                mode: Mode::Lie,
                on: false,
                s: 7
            })
        );
        assert_eq!(lines[5].mode(), None);
        assert_eq!(lines[6].tick(), None, "a tick without its lists");
        assert_eq!(lines[0].mode(), None);
        assert_eq!(lines[3].canary_lost(), None);
    }
}
