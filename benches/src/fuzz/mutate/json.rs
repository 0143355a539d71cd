//! A JSON tree for structure-aware mutation.

use super::TOKENS;
use crate::fuzz::rng::Rng;

/// A JSON tree for mutation: objects keep duplicate keys and numbers keep
/// any raw text, which serde_json's `Value` cannot.
#[derive(Debug, Clone)]
pub enum J {
    Null,
    Bool(bool),
    /// Raw number text, written as is (may be invalid).
    Num(String),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
    /// Raw text, e.g. deep nesting kept flat so that writing, cloning and
    /// dropping it does not recurse.
    Raw(String),
}

impl J {
    pub fn from_value(v: &serde_json::Value) -> J {
        use serde_json::Value;
        match v {
            Value::Null => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Number(n) => J::Num(n.to_string()),
            Value::String(s) => J::Str(s.clone()),
            Value::Array(a) => J::Arr(a.iter().map(J::from_value).collect()),
            Value::Object(o) => J::Obj(
                o.iter()
                    .map(|(k, v)| (k.clone(), J::from_value(v)))
                    .collect(),
            ),
        }
    }

    pub fn write(&self, out: &mut Vec<u8>) {
        match self {
            J::Null => out.extend_from_slice(b"null"),
            J::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            J::Num(n) | J::Raw(n) => out.extend_from_slice(n.as_bytes()),
            J::Str(s) => write_str(s, out),
            J::Arr(a) => {
                out.push(b'[');
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    v.write(out);
                }
                out.push(b']');
            }
            J::Obj(o) => {
                out.push(b'{');
                for (i, (k, v)) in o.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_str(k, out);
                    out.push(b':');
                    v.write(out);
                }
                out.push(b'}');
            }
        }
    }

    /// About how many bytes [`J::write`] gives.
    fn weight(&self) -> usize {
        match self {
            J::Null | J::Bool(_) => 5,
            J::Num(s) | J::Raw(s) | J::Str(s) => s.len() + 2,
            J::Arr(a) => 2 + a.iter().map(|v| v.weight() + 1).sum::<usize>(),
            J::Obj(o) => {
                2 + o
                    .iter()
                    .map(|(k, v)| k.len() + 4 + v.weight())
                    .sum::<usize>()
            }
        }
    }

    /// A random node: descends into children with probability 2/3.
    fn pick(&mut self, rng: &mut Rng) -> &mut J {
        let mut node = self;
        loop {
            let stop = rng.chance(1, 3);
            let next = match &*node {
                J::Arr(a) if !a.is_empty() && !stop => Some(rng.below(a.len())),
                J::Obj(o) if !o.is_empty() && !stop => Some(rng.below(o.len())),
                _ => None,
            };
            node = match (next, node) {
                (Some(i), J::Arr(a)) => &mut a[i],
                (Some(i), J::Obj(o)) => &mut o[i].1,
                (_, n) => return n,
            };
        }
    }

    /// Half the numbers of this subtree set to extremes (sums and ends
    /// of several fields overflow only when more than one is extreme).
    fn extreme_numbers(&mut self, rng: &mut Rng) {
        const EXTREMES: &[&str] = &[
            "18446744073709551615",
            "18446744073709547520",
            "9223372036854775808",
            "4294967295",
            "0",
        ];
        match self {
            J::Num(n) if rng.chance(1, 2) => *n = rng.pick(EXTREMES).to_string(),
            J::Arr(a) => a.iter_mut().for_each(|v| v.extreme_numbers(rng)),
            J::Obj(o) => o.iter_mut().for_each(|(_, v)| v.extreme_numbers(rng)),
            _ => {}
        }
    }

    /// Grows the tree to about 1 MiB: a long string, deep nesting, or an
    /// array repeated (e.g. 10^4 zones or ranges).
    pub fn grow(&mut self, rng: &mut Rng) {
        const MIB: usize = 1 << 20;
        match rng.below(3) {
            0 => {
                let c = *rng.pick(&['a', '"', '\\', '\u{0}', 'é', '\u{10ffff}']);
                *self.pick(rng) = J::Str(std::iter::repeat_n(c, MIB / c.len_utf8()).collect());
            }
            1 => {
                let node = self.pick(rng);
                let mut inner = Vec::new();
                node.write(&mut inner);
                let d = MIB / 5 + rng.below(1000);
                let mut v = "[{\"a\":".repeat(d / 2);
                v.push_str(&String::from_utf8_lossy(&inner));
                v.push_str(&"}]".repeat(d / 2));
                *node = J::Raw(v);
            }
            _ => {
                for _ in 0..32 {
                    if let J::Arr(a) = self.pick(rng)
                        && let Some(first) = a.first().cloned()
                    {
                        let n = MIB / first.weight().max(1);
                        a.extend(std::iter::repeat_n(first, n));
                        return;
                    }
                }
                *self.pick(rng) = J::Str("a".repeat(MIB));
            }
        }
    }

    /// One structure-aware mutation somewhere in the tree; `big` allows
    /// sizes up to about 1 MiB (long strings, long arrays, deep nesting).
    pub fn mutate(&mut self, rng: &mut Rng, big: bool) {
        let scale = if big { 1 << 20 } else { 256 };
        let node = self.pick(rng);
        match rng.below(12) {
            11 => node.extreme_numbers(rng),
            0 => *node = J::Num(rng.pick(&TOKENS[..22]).to_string()),
            1 => {
                *node = match rng.below(5) {
                    0 => J::Null,
                    1 => J::Bool(rng.chance(1, 2)),
                    2 => J::Str(String::new()),
                    3 => J::Arr(Vec::new()),
                    _ => J::Obj(Vec::new()),
                }
            }
            2 => {
                // Long or odd string.
                let n = rng.size(scale);
                let c = *rng.pick(&['a', '"', '\\', '\u{0}', '\u{feff}', 'é', '\u{10ffff}']);
                *node = J::Str(std::iter::repeat_n(c, n).collect());
            }
            3 => {
                // Deep nesting (serde_json stops at 128).
                let d = 1 + rng.size(if big { 100_000 } else { 300 });
                let mut inner = Vec::new();
                node.write(&mut inner);
                let (open, close) = if rng.chance(1, 2) {
                    ("[", "]")
                } else {
                    ("{\"a\":", "}")
                };
                let mut v = open.repeat(d);
                v.push_str(&String::from_utf8_lossy(&inner));
                v.push_str(&close.repeat(d));
                *node = J::Raw(v);
            }
            4 => match node {
                // Duplicate a member or element.
                J::Obj(o) if !o.is_empty() => {
                    let i = rng.below(o.len());
                    let dup = o[i].clone();
                    o.insert(rng.below(o.len() + 1), dup);
                }
                J::Arr(a) if !a.is_empty() => {
                    let i = rng.below(a.len());
                    let dup = a[i].clone();
                    a.push(dup);
                }
                _ => {}
            },
            5 => match node {
                // Remove a member or element.
                J::Obj(o) if !o.is_empty() => {
                    o.remove(rng.below(o.len()));
                }
                J::Arr(a) if !a.is_empty() => {
                    a.remove(rng.below(a.len()));
                }
                _ => {}
            },
            6 => {
                // Many copies of an element (e.g. thousands of zones).
                if let J::Arr(a) = node
                    && let Some(first) = a.first().cloned()
                {
                    // Bounded by bytes, not count: ~2 MiB big, ~16 KiB not.
                    let room = if big { 2 << 20 } else { 16 << 10 } / first.weight().max(1);
                    let n = rng.size(room);
                    a.extend(std::iter::repeat_n(first, n));
                }
            }
            7 => {
                if let J::Obj(o) = node {
                    let k = *rng.pick(&["unknown", "", "op", "id", "zones", "ranges", "tier"]);
                    o.push((k.into(), J::Num("1".into())));
                }
            }
            8 => {
                // A key renamed (typo, case, unicode).
                if let J::Obj(o) = node
                    && !o.is_empty()
                {
                    let i = rng.below(o.len());
                    let k = &mut o[i].0;
                    match rng.below(3) {
                        0 => k.push('x'),
                        1 => *k = k.to_uppercase(),
                        _ => k.insert(0, '\u{0}'),
                    }
                }
            }
            9 => {
                if let J::Num(n) = node {
                    n.insert(0, '-');
                } else if let J::Str(s) = node {
                    let t: &&str = rng.pick(&TOKENS[..22]);
                    s.push_str(t);
                }
            }
            _ if node.weight() < (1 << 20) => {
                // The node nested inside itself (reshapes).
                let copy = node.clone();
                if let J::Arr(a) = node {
                    a.push(copy);
                } else if let J::Obj(o) = node {
                    o.push(("x".into(), copy));
                }
            }
            _ => {}
        }
    }
}

fn write_str(s: &str, out: &mut Vec<u8>) {
    // serde_json escapes correctly; a &str always serializes.
    out.extend_from_slice(serde_json::Value::from(s).to_string().as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzz::mutate::bytes;

    #[test]
    fn json_tree_round_trips_and_mutations_stay_bounded() {
        let v: serde_json::Value =
            serde_json::from_str(r#"{"a":[1,2,{"b":"c"}],"d":null}"#).unwrap();
        let j = J::from_value(&v);
        let mut out = Vec::new();
        j.write(&mut out);
        let back: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, v);
        let mut rng = Rng::new(3);
        for _ in 0..500 {
            let mut m = j.clone();
            m.mutate(&mut rng, false);
            let mut out = Vec::new();
            m.write(&mut out);
            assert!(out.len() < 1 << 20);
            let mut b = out.clone();
            bytes(&mut b, b"other", &mut rng, 4096);
            assert!(b.len() <= 4096);
        }
    }
}
