//! The guest's serial lines. Every line the guest prints starts with `tg `
//! and a kind (`boot`, `cmdline`, `balloon`, `zone`, `ready`, `phase`,
//! `tick`, `done`, `error`, `halted`), then `key=value` fields and plain
//! words; lists are comma-separated per tier (`acc=80123,19877`) and phase
//! weights slash-separated (`w=80/20`). docs/testguest.md lists the lines.

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
        assert_eq!(Line::parse("tg"), None);
        assert_eq!(Line::parse("tgx boot"), None);
    }
}
