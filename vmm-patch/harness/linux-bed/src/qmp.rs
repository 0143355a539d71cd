//! A QMP client: one JSON object per line over QEMU's unix socket;
//! asynchronous events interleave with answers and are skipped.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::BedError;

#[derive(Debug)]
pub struct Qmp {
    w: UnixStream,
    r: BufReader<UnixStream>,
}

/// One virtio-mem device as `query-memory-devices` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtioMem {
    pub id: String,
    pub memdev: String,
    pub node: u64,
    /// Guest-physical start of the device's region.
    pub memaddr: u64,
    /// Plugged bytes.
    pub size: u64,
    pub requested: u64,
    pub max: u64,
    pub block: u64,
}

impl Qmp {
    /// Connects and leaves capabilities negotiation mode.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Qmp, BedError> {
        let s = UnixStream::connect(path)
            .map_err(|e| BedError::Qmp(format!("connect {}: {e}", path.display())))?;
        s.set_read_timeout(Some(timeout))
            .map_err(|e| BedError::Qmp(e.to_string()))?;
        let r = BufReader::new(s.try_clone().map_err(|e| BedError::Qmp(e.to_string()))?);
        let mut q = Qmp { w: s, r };
        let greeting = q.line()?;
        if greeting.get("QMP").is_none() {
            return Err(BedError::Qmp(format!("no QMP greeting: {greeting}")));
        }
        q.execute("qmp_capabilities", json!({}))?;
        Ok(q)
    }

    fn line(&mut self) -> Result<Value, BedError> {
        let mut l = String::new();
        let n = self
            .r
            .read_line(&mut l)
            .map_err(|e| BedError::Qmp(format!("read: {e}")))?;
        if n == 0 {
            return Err(BedError::Qmp("QEMU closed the QMP socket".into()));
        }
        serde_json::from_str(&l).map_err(|e| BedError::Qmp(format!("bad JSON {l:?}: {e}")))
    }

    /// Runs `command`; its `return` value, or its `error` as an error.
    pub fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, BedError> {
        let mut req = json!({ "execute": command });
        if arguments.as_object().is_some_and(|o| !o.is_empty()) {
            req["arguments"] = arguments;
        }
        let mut text = req.to_string();
        text.push('\n');
        self.w
            .write_all(text.as_bytes())
            .map_err(|e| BedError::Qmp(format!("write: {e}")))?;
        loop {
            let v = self.line()?;
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                return Err(BedError::Qmp(format!("{command}: {e}")));
            }
        }
    }

    /// The virtio-mem devices.
    pub fn virtio_mem(&mut self) -> Result<Vec<VirtioMem>, BedError> {
        let v = self.execute("query-memory-devices", json!({}))?;
        Ok(parse_memory_devices(&v))
    }

    /// Asks device `id` to plug `bytes` (the guest plugs or unplugs blocks).
    pub fn resize(&mut self, id: &str, bytes: u64) -> Result<(), BedError> {
        self.execute(
            "qom-set",
            json!({ "path": format!("/machine/peripheral/{id}"), "property": "requested-size", "value": bytes }),
        )
        .map(drop)
    }

    /// Asks the balloon to leave the guest `bytes` (QMP's `balloon`).
    pub fn balloon(&mut self, bytes: u64) -> Result<(), BedError> {
        self.execute("balloon", json!({ "value": bytes })).map(drop)
    }

    /// The guest's memory as the balloon sees it (`query-balloon`'s actual).
    pub fn balloon_actual(&mut self) -> Result<u64, BedError> {
        let v = self.execute("query-balloon", json!({}))?;
        v.get("actual")
            .and_then(Value::as_u64)
            .ok_or_else(|| BedError::Qmp(format!("query-balloon: {v}")))
    }
}

/// The virtio-mem entries of a `query-memory-devices` answer.
pub fn parse_memory_devices(v: &Value) -> Vec<VirtioMem> {
    let Some(list) = v.as_array() else {
        return Vec::new();
    };
    list.iter()
        .filter(|d| d.get("type").and_then(Value::as_str) == Some("virtio-mem"))
        .filter_map(|d| {
            let d = d.get("data")?;
            let n = |k: &str| d.get(k).and_then(Value::as_u64);
            let s = |k: &str| d.get(k).and_then(Value::as_str).map(str::to_string);
            Some(VirtioMem {
                id: s("id")?,
                memdev: s("memdev")?,
                node: n("node")?,
                memaddr: n("memaddr")?,
                size: n("size")?,
                requested: n("requested-size")?,
                max: n("max-size")?,
                block: n("block-size")?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_devices_keep_virtio_mem_only() {
        let v = json!([
            {"type": "virtio-mem", "data": {"id": "vmem1", "memdev": "/objects/vm1", "node": 1,
             "memaddr": 4294967296u64, "size": 134217728, "requested-size": 134217728,
             "max-size": 536870912, "block-size": 2097152}},
            {"type": "dimm", "data": {"id": "d0"}}
        ]);
        let d = parse_memory_devices(&v);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].id, "vmem1");
        assert_eq!(d[0].memaddr, 1 << 32);
        assert_eq!(d[0].block, 2 << 20);
    }
}
