//! Line-based structure-aware mutation of TOML text.

use crate::fuzz::rng::Rng;

/// Values a mutated TOML line may take.
const TOML_VALUES: &[&str] = &[
    "-1",
    "0",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "18446744073709551615",
    "4294967296",
    "nan",
    "-inf",
    "1e400",
    "1.5",
    "true",
    "\"\"",
    "\"0660\"",
    "\"0o7777\"",
    "\"/\"",
    "\"relative\"",
    "\"::1:9464\"",
    "\"[::1]:0\"",
    "\"127.0.0.1:99999\"",
    "\"0.0.0.0:9464\"",
    "\"\\u0000\"",
    "'''multi\nline'''",
    "\"\"\"a\\\n b\"\"\"",
    "[]",
    "[1, \"a\"]",
    "{}",
    "{ a = 1, a = 2 }",
    "1979-05-27T07:32:00Z",
    "07:32:00",
    "0x7fffffffffffffff",
];

/// One structure-aware mutation of TOML text, line-based: a value
/// replaced, a line duplicated (duplicate keys), removed or moved, a table
/// header added, deep nesting, a long string.
pub fn toml_lines(text: &mut Vec<u8>, rng: &mut Rng, big: bool) {
    let s = String::from_utf8_lossy(text).into_owned();
    let mut lines: Vec<String> = s.lines().map(str::to_string).collect();
    if lines.is_empty() {
        lines.push("a = 1".into());
    }
    let i = rng.below(lines.len());
    let op = if big { 5 + rng.below(3) } else { rng.below(8) };
    match op {
        0 | 1 => {
            if let Some((k, _)) = lines[i].split_once('=') {
                lines[i] = format!("{k}= {}", rng.pick(TOML_VALUES));
            }
        }
        2 => {
            let dup = lines[i].clone();
            lines.insert(rng.below(lines.len() + 1), dup);
        }
        3 => {
            lines.remove(i);
        }
        4 => {
            let h = *rng.pick(&[
                "[controller]",
                "[[controller]]",
                "[tier_kinds.a.b]",
                "[discovery]",
                "[metrics]",
                "[tcp]",
                "[x]",
                "[",
                "[]",
                "[a.\"b\".'c']",
            ]);
            lines.insert(rng.below(lines.len() + 1), h.into());
        }
        5 => {
            // Deep nesting: arrays or inline tables.
            let d = if big {
                100_000 + rng.below(1000)
            } else {
                1 + rng.size(300)
            };
            let v = if rng.chance(1, 2) {
                format!("{}1{}", "[".repeat(d), "]".repeat(d))
            } else {
                format!("{}1{}", "{a=".repeat(d), "}".repeat(d))
            };
            let k = lines[i].split_once('=').map_or("x", |(k, _)| k).to_string();
            lines[i] = format!("{k}= {v}");
        }
        6 => {
            let n = if big { 1 << 20 } else { rng.size(512) };
            let k = lines[i].split_once('=').map_or("x", |(k, _)| k).to_string();
            lines[i] = format!("{k}= \"{}\"", "a".repeat(n));
        }
        _ => {
            // Many keys (a wide table).
            let n = if big { 50_000 } else { rng.size(64) };
            for j in 0..n {
                lines.push(format!("k{j} = {j}"));
            }
        }
    }
    text.clear();
    for l in lines {
        text.extend_from_slice(l.as_bytes());
        text.push(b'\n');
    }
}
