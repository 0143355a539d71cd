//! What one QMP session tells of a QEMU VM's memory: its guest NUMA nodes,
//! memory backends (and where each sits in the boot RAM container), the
//! virtio-mem devices and the balloon. Read once at discovery; devices and
//! balloon again every interval.

use serde_json::{Value, json};

use super::answers::{self, NumaNode, RamAlias, VirtioMemDev};
use super::qmp::{Qmp, QmpError};

/// One memory backend (`-object memory-backend-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    pub id: String,
    /// QOM type: `memory-backend-file`, `-memfd`, `-ram`, ...
    pub ty: String,
    pub size: u64,
    /// A file backend's `mem-path`.
    pub mem_path: Option<String>,
    pub host_nodes: Vec<u32>,
    pub policy: String,
    /// QOM path of the memory region containing the backend's
    /// (`/machine/pc.ram[0]` for boot memory), and its offset there.
    pub container: Option<String>,
    pub offset: Option<u64>,
}

/// The memory layout of one QEMU VM.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Machine {
    pub name: Option<String>,
    /// vCPUs (`query-cpus-fast`).
    pub cpus: u32,
    pub nodes: Vec<NumaNode>,
    pub backends: Vec<Backend>,
    pub devices: Vec<VirtioMemDev>,
    /// Types of memory devices other than virtio-mem (not attributed).
    pub other_devices: Vec<String>,
    pub aliases: Vec<RamAlias>,
    /// The balloon's `actual` (bytes left to the guest); `None` without one.
    pub balloon: Option<u64>,
}

/// What changes between intervals.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Live {
    pub devices: Vec<VirtioMemDev>,
    pub balloon: Option<u64>,
}

fn malformed(command: &str, detail: String) -> QmpError {
    QmpError::Malformed {
        socket: Default::default(),
        command: command.into(),
        detail,
    }
}

/// A refusal as `None`; other errors (the session is then unusable) kept.
fn soft(r: Result<Value, QmpError>) -> Result<Option<Value>, QmpError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(QmpError::Refused { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `query-balloon`'s actual; `None` when QEMU has no balloon device.
async fn balloon(q: &mut Qmp) -> Result<Option<u64>, QmpError> {
    match q.execute("query-balloon", json!({})).await {
        Ok(v) => v
            .get("actual")
            .and_then(Value::as_u64)
            .map(Some)
            .ok_or_else(|| malformed("query-balloon", format!("no actual: {v}"))),
        Err(QmpError::Refused { class, .. }) if class == "DeviceNotActive" => Ok(None),
        Err(QmpError::Refused { desc, .. }) if desc.contains("No balloon") => Ok(None),
        Err(e) => Err(e),
    }
}

/// The virtio-mem devices and the balloon now.
pub async fn read_live(q: &mut Qmp) -> Result<Live, QmpError> {
    let v = q.execute("query-memory-devices", json!({})).await?;
    let (devices, _) =
        answers::memory_devices(&v).map_err(|e| malformed("query-memory-devices", e))?;
    Ok(Live {
        devices,
        balloon: balloon(q).await?,
    })
}

async fn backend(
    q: &mut Qmp,
    id: &str,
    ty: &str,
    memdevs: &[answers::Memdev],
) -> Result<Backend, QmpError> {
    let path = format!("/objects/{id}");
    let policy = memdevs.iter().find(|m| m.id.as_deref() == Some(id));
    let size = match policy {
        Some(m) => m.size,
        None => {
            let v = q.qom_get(&path, "size").await?;
            v.as_u64()
                .ok_or_else(|| malformed("qom-get", format!("{path} size: {v}")))?
        }
    };
    let host_nodes = match policy {
        Some(m) => m.host_nodes.clone(),
        // query-memdev without ids: the property itself.
        None => q
            .qom_get(&path, "host-nodes")
            .await?
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|n| u32::try_from(n.as_u64()?).ok())
                    .collect()
            })
            .unwrap_or_default(),
    };
    let mem_path = if ty == "memory-backend-file" {
        q.qom_get(&path, "mem-path")
            .await?
            .as_str()
            .map(str::to_string)
    } else {
        None
    };
    let children = q.execute("qom-list", json!({ "path": path })).await?;
    let (mut container, mut offset) = (None, None);
    if let Some(region) = answers::region_child(&children) {
        let r = format!("{path}/{region}");
        // An unused backend's region has no container: QEMU may refuse.
        container = soft(q.qom_get(&r, "container").await)?
            .and_then(|v| v.as_str().map(String::from))
            .filter(|c| !c.is_empty());
        offset = soft(q.qom_get(&r, "addr").await)?.and_then(|v| v.as_u64());
    }
    Ok(Backend {
        id: id.to_string(),
        ty: ty.to_string(),
        size,
        mem_path,
        host_nodes,
        policy: policy.map_or_else(|| "unknown".into(), |m| m.policy.clone()),
        container,
        offset,
    })
}

/// Reads the whole layout.
pub async fn read(q: &mut Qmp) -> Result<Machine, QmpError> {
    let name = q
        .execute("query-name", json!({}))
        .await?
        .get("name")
        .and_then(Value::as_str)
        .map(str::to_string);
    let v = q.execute("query-cpus-fast", json!({})).await?;
    let cpus = v
        .as_array()
        .map_or(0, |a| u32::try_from(a.len()).unwrap_or(u32::MAX));
    let v = q.execute("qom-list", json!({ "path": "/objects" })).await?;
    let objects = answers::backend_objects(&v).map_err(|e| malformed("qom-list", e))?;
    let v = q.execute("query-memdev", json!({})).await?;
    let memdevs = answers::memdevs(&v).map_err(|e| malformed("query-memdev", e))?;
    let mut backends = Vec::with_capacity(objects.len());
    for (id, ty) in &objects {
        backends.push(backend(q, id, ty, &memdevs).await?);
    }
    let numa = q.hmp("info numa").await?;
    let nodes = answers::info_numa(&numa).map_err(|e| malformed("human-monitor-command", e))?;
    let aliases = answers::ram_aliases(&q.hmp("info mtree").await?);
    let v = q.execute("query-memory-devices", json!({})).await?;
    let (devices, other_devices) =
        answers::memory_devices(&v).map_err(|e| malformed("query-memory-devices", e))?;
    Ok(Machine {
        name,
        cpus,
        nodes,
        backends,
        devices,
        other_devices,
        aliases,
        balloon: balloon(q).await?,
    })
}
