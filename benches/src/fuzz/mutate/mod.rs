//! Input mutation: byte-level (flips, truncation, splicing, tokens,
//! invalid UTF-8) here, structure-aware for JSON ([`json`]: a tree that
//! can hold duplicate keys and raw number text) and for line-based TOML
//! ([`toml`]).

mod json;
mod toml;

pub use json::J;
pub use toml::toml_lines;

use super::rng::Rng;

/// Tokens that tend to reach edge cases of JSON and TOML parsers.
pub(super) const TOKENS: &[&str] = &[
    "0",
    "-1",
    "-0",
    "1.5",
    "1e999",
    "-1e999",
    "NaN",
    "nan",
    "inf",
    "-inf",
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "4294967295",
    "4294967296",
    "65535",
    "65536",
    "0x10",
    "0o777",
    "01",
    "1_000",
    "null",
    "true",
    "false",
    "\"\"",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\"\\uDFFF\\uD800\"",
    "\"\\",
    "{}",
    "[]",
    "{",
    "[",
    "}",
    "]",
    "\"",
    ",",
    ":",
    "=",
    "\n",
    "\r\n",
    "\t",
    "'''",
    "\"\"\"",
    "[[",
    "]]",
    "#",
    "\u{feff}",
    "\u{10ffff}",
    "\u{0}",
];

/// Byte sequences that are not UTF-8.
const BAD_UTF8: &[&[u8]] = &[
    b"\xff",
    b"\xc3\x28",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\xe2\x82",
    b"\xc0\xaf",
];

/// One to eight byte-level mutations of `buf`, never longer than `max`.
/// `other` is a second input to splice from.
pub fn bytes(buf: &mut Vec<u8>, other: &[u8], rng: &mut Rng, max: usize) {
    let n = 1 + rng.size(7);
    for _ in 0..n {
        let len = buf.len();
        match rng.below(12) {
            0 if len > 0 => {
                let i = rng.below(len);
                buf[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                buf[i] = rng.byte();
            }
            2 => {
                let i = rng.below(len + 1);
                let k = rng.size(16);
                let fresh: Vec<u8> = (0..k).map(|_| rng.byte()).collect();
                buf.splice(i..i, fresh);
            }
            3 if len > 0 => {
                let i = rng.below(len);
                let k = rng.size(len - i);
                buf.drain(i..i + k);
            }
            4 => buf.truncate(rng.below(len + 1)),
            5 if len > 0 => {
                // Duplicate a range in place.
                let i = rng.below(len);
                let k = rng.size(len - i);
                let copy = buf[i..i + k].to_vec();
                let at = rng.below(buf.len() + 1);
                buf.splice(at..at, copy);
            }
            6 if !other.is_empty() => {
                // Splice: a prefix of this one, a suffix of the other.
                let cut = rng.below(len + 1);
                let from = rng.below(other.len());
                buf.truncate(cut);
                buf.extend_from_slice(&other[from..]);
            }
            7 | 8 => {
                let t = rng.pick(TOKENS).as_bytes();
                let i = rng.below(len + 1);
                if rng.chance(1, 2) && len > 0 {
                    // Replace a short run instead of inserting.
                    let k = rng.size(8).min(len - i);
                    buf.splice(i..i + k, t.iter().copied());
                } else {
                    buf.splice(i..i, t.iter().copied());
                }
            }
            9 => {
                let t = rng.pick(BAD_UTF8);
                let i = rng.below(len + 1);
                buf.splice(i..i, t.iter().copied());
            }
            10 => {
                // A digit run replaced by an extreme number.
                if let Some(i) = (0..8)
                    .map(|_| rng.below(len.max(1)))
                    .find(|&i| buf.get(i).is_some_and(u8::is_ascii_digit))
                {
                    let mut j = i;
                    while buf.get(j).is_some_and(u8::is_ascii_digit) {
                        j += 1;
                    }
                    let t = rng.pick(&TOKENS[..22]).as_bytes();
                    buf.splice(i..j, t.iter().copied());
                }
            }
            _ if len > 0 => {
                // Swap two bytes (reorders delimiters).
                let (i, j) = (rng.below(len), rng.below(len));
                buf.swap(i, j);
            }
            _ => buf.push(rng.byte()),
        }
        buf.truncate(max);
    }
}

/// Random bytes: printable-heavy half the time, else anything.
pub fn random(out: &mut Vec<u8>, rng: &mut Rng, max: usize) {
    let n = rng.size(max);
    let printable = rng.chance(1, 2);
    out.extend((0..n).map(|_| {
        if printable {
            *rng.pick(b" {}[]\":,=.-0123456789abcdefghijklmnopqrstuvwxyz_\n")
        } else {
            rng.byte()
        }
    }));
}
