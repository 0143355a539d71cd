//! QEMU's answers as tierd reads them (QEMU 7.2 shapes, docs/discovery.md):
//! `query-memory-devices`, `query-memdev`, `qom-list /objects`, HMP `info
//! numa` and the RAM aliases of HMP `info mtree`. A malformed answer is an
//! error naming what was wrong, never a partial layout.

use serde_json::Value;

/// One virtio-mem device (`query-memory-devices`, type `virtio-mem`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtioMemDev {
    pub id: String,
    /// Backend id (`/objects/` stripped).
    pub memdev: String,
    pub node: u32,
    pub memaddr: u64,
    pub block: u64,
    /// Plugged bytes (`size`).
    pub plugged: u64,
    pub requested: u64,
    pub max: u64,
}

/// The virtio-mem devices of a `query-memory-devices` answer, and the
/// types of the other memory devices (not attributed to tiers).
pub fn memory_devices(v: &Value) -> Result<(Vec<VirtioMemDev>, Vec<String>), String> {
    let list = v
        .as_array()
        .ok_or_else(|| format!("query-memory-devices: not a list: {v}"))?;
    let mut devs = Vec::new();
    let mut others = Vec::new();
    for d in list {
        let ty = d.get("type").and_then(Value::as_str).unwrap_or("?");
        if ty != "virtio-mem" {
            others.push(ty.to_string());
            continue;
        }
        let data = d
            .get("data")
            .ok_or_else(|| format!("query-memory-devices: virtio-mem without data: {d}"))?;
        let n = |k: &str| {
            data.get(k)
                .and_then(Value::as_u64)
                .ok_or_else(|| format!("query-memory-devices: virtio-mem without {k}: {d}"))
        };
        let s = |k: &str| {
            data.get(k)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| format!("query-memory-devices: virtio-mem without {k}: {d}"))
        };
        let memdev = s("memdev")?;
        devs.push(VirtioMemDev {
            id: s("id")?,
            memdev: memdev
                .strip_prefix("/objects/")
                .unwrap_or(&memdev)
                .to_string(),
            node: u32::try_from(n("node")?)
                .map_err(|_| format!("query-memory-devices: node out of range: {d}"))?,
            memaddr: n("memaddr")?,
            block: n("block-size")?,
            plugged: n("size")?,
            requested: n("requested-size")?,
            max: n("max-size")?,
        });
    }
    Ok((devs, others))
}

/// One memory backend's policy (`query-memdev`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Memdev {
    /// Absent in some QEMU versions' answers.
    pub id: Option<String>,
    pub size: u64,
    pub host_nodes: Vec<u32>,
    pub policy: String,
}

pub fn memdevs(v: &Value) -> Result<Vec<Memdev>, String> {
    let list = v
        .as_array()
        .ok_or_else(|| format!("query-memdev: not a list: {v}"))?;
    list.iter()
        .map(|m| {
            let size = m
                .get("size")
                .and_then(Value::as_u64)
                .ok_or_else(|| format!("query-memdev: entry without size: {m}"))?;
            let host_nodes = match m.get("host-nodes") {
                None => Vec::new(),
                Some(h) => h
                    .as_array()
                    .and_then(|a| {
                        a.iter()
                            .map(|n| n.as_u64().and_then(|n| u32::try_from(n).ok()))
                            .collect::<Option<Vec<u32>>>()
                    })
                    .ok_or_else(|| format!("query-memdev: bad host-nodes: {m}"))?,
            };
            Ok(Memdev {
                id: m.get("id").and_then(Value::as_str).map(str::to_string),
                size,
                host_nodes,
                policy: m
                    .get("policy")
                    .and_then(Value::as_str)
                    .unwrap_or("default")
                    .to_string(),
            })
        })
        .collect()
}

/// Memory backends among the children of `/objects` (`qom-list`): id and
/// QOM type (`memory-backend-file`, `-memfd`, `-ram`, ...).
pub fn backend_objects(v: &Value) -> Result<Vec<(String, String)>, String> {
    let list = v
        .as_array()
        .ok_or_else(|| format!("qom-list /objects: not a list: {v}"))?;
    Ok(list
        .iter()
        .filter_map(|o| {
            let ty = o.get("type")?.as_str()?;
            let ty = ty.strip_prefix("child<")?.strip_suffix('>')?;
            ty.starts_with("memory-backend-")
                .then(|| Some((o.get("name")?.as_str()?.to_string(), ty.to_string())))?
        })
        .collect())
}

/// The name of the memory-region child of a backend (`qom-list
/// /objects/ID`: `ID[0]` in 7.2).
pub fn region_child(v: &Value) -> Option<String> {
    v.as_array()?.iter().find_map(|o| {
        (o.get("type")?.as_str()? == "child<memory-region>")
            .then(|| Some(o.get("name")?.as_str()?.to_string()))?
    })
}

/// One guest NUMA node (`info numa`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaNode {
    pub id: u32,
    /// All its memory, boot and plugged.
    pub size: u64,
    /// Plugged through memory devices.
    pub plugged: u64,
}

impl NumaNode {
    /// Boot memory (`-numa node,memdev=`).
    pub fn boot(&self) -> u64 {
        self.size.saturating_sub(self.plugged)
    }
}

/// `info numa`: `N nodes`, then per node `node I size: S MB` and `node I
/// plugged: P MB`.
pub fn info_numa(text: &str) -> Result<Vec<NumaNode>, String> {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let count: usize = lines
        .next()
        .and_then(|l| l.strip_suffix(" nodes")?.parse().ok())
        .ok_or_else(|| format!("info numa: no node count: {text:?}"))?;
    let mut nodes: Vec<NumaNode> = Vec::new();
    for l in lines {
        let Some(rest) = l.strip_prefix("node ") else {
            continue;
        };
        let Some((id, field)) = rest.split_once(' ') else {
            continue;
        };
        let (Ok(id), Some((key, val))) = (id.parse::<u32>(), field.split_once(": ")) else {
            continue;
        };
        let mb = || -> Result<u64, String> {
            val.strip_suffix(" MB")
                .and_then(|n| n.trim().parse::<u64>().ok())
                .map(|n| n << 20)
                .ok_or_else(|| format!("info numa: bad size {l:?}"))
        };
        let i = match nodes.iter().position(|n| n.id == id) {
            Some(i) => i,
            None => {
                nodes.push(NumaNode {
                    id,
                    size: 0,
                    plugged: 0,
                });
                nodes.len() - 1
            }
        };
        match key {
            "size" => nodes[i].size = mb()?,
            "plugged" => nodes[i].plugged = mb()?,
            _ => {}
        }
    }
    if nodes.len() != count {
        return Err(format!(
            "info numa: {count} nodes announced, {} described",
            nodes.len()
        ));
    }
    Ok(nodes)
}

/// A window of the machine's boot RAM container seen at a guest address
/// (`info mtree`: `alias ram-below-4g @pc.ram 0-1fffffff` at 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RamAlias {
    pub gpa: u64,
    /// Offset in the RAM container.
    pub offset: u64,
    pub len: u64,
}

/// The `ram-below-4g` / `ram-above-4g` aliases of `info mtree`, once each
/// (the tree repeats them per address space).
pub fn ram_aliases(mtree: &str) -> Vec<RamAlias> {
    let mut out: Vec<RamAlias> = Vec::new();
    for l in mtree.lines() {
        let l = l.trim();
        let Some((head, tail)) = l.split_once(": alias ") else {
            continue;
        };
        let mut t = tail.split_whitespace();
        let (Some(name), Some(_target), Some(range)) = (t.next(), t.next(), t.next()) else {
            continue;
        };
        if !matches!(name, "ram-below-4g" | "ram-above-4g") {
            continue;
        }
        let span = |s: &str| -> Option<(u64, u64)> {
            let (a, b) = s.split_once('-')?;
            let a = u64::from_str_radix(a, 16).ok()?;
            let b = u64::from_str_radix(b, 16).ok()?;
            Some((a, b.checked_sub(a)?.checked_add(1)?))
        };
        let gpa = head.split_whitespace().next().and_then(span);
        if let (Some((gpa, _)), Some((offset, len))) = (gpa, span(range)) {
            let a = RamAlias { gpa, offset, len };
            if !out.contains(&a) {
                out.push(a);
            }
        }
    }
    out.sort_by_key(|a| a.offset);
    out
}

/// Guest-physical pieces (gpa, len) of container bytes [offset,
/// offset+len) through `aliases`; `None` unless all of it is seen.
pub fn gpa_pieces(aliases: &[RamAlias], offset: u64, len: u64) -> Option<Vec<(u64, u64)>> {
    let end = offset.checked_add(len)?;
    let mut out = Vec::new();
    let mut covered = 0u64;
    for a in aliases {
        let a_end = a.offset.saturating_add(a.len);
        let lo = offset.max(a.offset);
        let hi = end.min(a_end);
        if lo < hi {
            out.push((a.gpa.checked_add(lo - a.offset)?, hi - lo));
            covered += hi - lo;
        }
    }
    (covered == len).then_some(out)
}

#[cfg(test)]
#[path = "answers_tests.rs"]
mod tests;
