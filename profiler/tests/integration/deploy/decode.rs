//! Multi-document YAML into k8s-openapi types, strictly: k8s-openapi's
//! serde skips unknown fields (as the API server does without
//! `--validate=strict`), so every value it skips is caught through
//! serde_ignored and is an error naming its path.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde::de::DeserializeOwned;
use serde_yaml_ng::Value;

/// One decoded document.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // a handful per test, moved once
pub enum Object {
    Namespace(Namespace),
    ServiceAccount(ServiceAccount),
    ClusterRole(ClusterRole),
    ClusterRoleBinding(ClusterRoleBinding),
    ConfigMap(ConfigMap),
    DaemonSet(DaemonSet),
    Service(Service),
}

/// `T` from `doc`, failing on any field `T` does not have.
fn strict<T: DeserializeOwned>(doc: Value) -> Result<T, String> {
    let mut ignored = Vec::new();
    let t = serde_ignored::deserialize(doc, |path| ignored.push(dotted(&path)))
        .map_err(|e| e.to_string())?;
    if ignored.is_empty() {
        Ok(t)
    } else {
        Err(format!("unknown field(s): {}", ignored.join(", ")))
    }
}

/// `spec.template.spec.hostPid`: the keys and indices of `path`, without
/// serde_ignored's `?` for each Option on the way.
fn dotted(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    let (parent, own) = match path {
        Path::Root => return String::new(),
        Path::Seq { parent, index } => (parent, index.to_string()),
        Path::Map { parent, key } => (parent, key.clone()),
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => {
            return dotted(parent);
        }
    };
    match dotted(parent) {
        p if p.is_empty() => own,
        p => format!("{p}.{own}"),
    }
}

/// Every document of `text` by its `kind`; an empty document is skipped,
/// any other kind is an error (the checks below would not see it).
pub fn decode(text: &str) -> Result<Vec<Object>, String> {
    let mut out = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let at = |e: String| format!("document {i}: {e}");
        let value: Value = serde::Deserialize::deserialize(doc).map_err(|e| at(e.to_string()))?;
        if value.is_null() {
            continue;
        }
        let kind = value
            .get("kind")
            .and_then(Value::as_str)
            .ok_or_else(|| at("no kind".into()))?
            .to_string();
        let at = |e: String| format!("document {i} ({kind}): {e}");
        let obj = match kind.as_str() {
            "Namespace" => Object::Namespace(strict(value).map_err(at)?),
            "ServiceAccount" => Object::ServiceAccount(strict(value).map_err(at)?),
            "ClusterRole" => Object::ClusterRole(strict(value).map_err(at)?),
            "ClusterRoleBinding" => Object::ClusterRoleBinding(strict(value).map_err(at)?),
            "ConfigMap" => Object::ConfigMap(strict(value).map_err(at)?),
            "DaemonSet" => Object::DaemonSet(strict(value).map_err(at)?),
            "Service" => Object::Service(strict(value).map_err(at)?),
            other => return Err(at(format!("kind {other:?} is not checked here"))),
        };
        out.push(obj);
    }
    Ok(out)
}
