//! profiler/deploy/kubernetes/tierd.yaml: decoded strictly, then what tierd
//! needs of the pod checked against the objects, and the ConfigMap's
//! tierd.toml through the loader `tierd run` uses.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PodSpec, Service, ServiceAccount, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tier_profiler::config::{Config, Settings};

use super::decode::{Object, decode};
use super::{deploy_file, read};

/// The manifests by kind.
#[derive(Default)]
struct Manifests {
    namespaces: Vec<Namespace>,
    accounts: Vec<ServiceAccount>,
    roles: Vec<ClusterRole>,
    bindings: Vec<ClusterRoleBinding>,
    config_maps: Vec<ConfigMap>,
    daemon_sets: Vec<DaemonSet>,
    services: Vec<Service>,
}

fn manifest_text() -> String {
    read(&deploy_file("kubernetes/tierd.yaml"))
}

fn load() -> Manifests {
    let objects = decode(&manifest_text()).unwrap_or_else(|e| panic!("tierd.yaml: {e}"));
    let mut m = Manifests::default();
    for o in objects {
        match o {
            Object::Namespace(x) => m.namespaces.push(x),
            Object::ServiceAccount(x) => m.accounts.push(x),
            Object::ClusterRole(x) => m.roles.push(x),
            Object::ClusterRoleBinding(x) => m.bindings.push(x),
            Object::ConfigMap(x) => m.config_maps.push(x),
            Object::DaemonSet(x) => m.daemon_sets.push(x),
            Object::Service(x) => m.services.push(x),
        }
    }
    m
}

fn only<'a, T>(items: &'a [T], what: &str) -> &'a T {
    assert_eq!(items.len(), 1, "expected exactly one {what} in tierd.yaml");
    &items[0]
}

fn pod(ds: &DaemonSet) -> &PodSpec {
    ds.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("DaemonSet without a pod spec")
}

fn container<'a>(pod: &'a PodSpec, name: &str) -> &'a Container {
    pod.containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name:?}"))
}

/// The kube-rbac-proxy sidecar, by its image.
fn sidecar(pod: &PodSpec) -> &Container {
    pod.containers
        .iter()
        .find(|c| {
            c.image
                .as_deref()
                .is_some_and(|i| i.starts_with("quay.io/brancz/kube-rbac-proxy:"))
        })
        .expect("no kube-rbac-proxy container")
}

fn args(c: &Container) -> &[String] {
    c.args.as_deref().unwrap_or_default()
}

/// The value of `--name=value` among `c`'s args.
fn flag<'a>(c: &'a Container, name: &str) -> &'a str {
    let prefix = format!("{name}=");
    args(c)
        .iter()
        .find_map(|a| a.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("{}: no {name}= in {:?}", c.name, args(c)))
}

/// `c`'s mount of the volume that is host path `host`.
fn host_mount<'a>(pod: &'a PodSpec, c: &'a Container, host: &str) -> &'a VolumeMount {
    let vol = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.host_path.as_ref().is_some_and(|h| h.path == host))
        .unwrap_or_else(|| panic!("no hostPath volume {host}"));
    c.volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == vol.name)
        .unwrap_or_else(|| panic!("{}: volume {} ({host}) not mounted", c.name, vol.name))
}

fn labels(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> BTreeMap<String, String> {
    meta.labels.clone().unwrap_or_default()
}

/// The ConfigMap's tierd.toml, as the file `--config` names, loaded and
/// validated by tierd's own code (the path `tierd run --config` takes).
fn tierd_settings(m: &Manifests) -> Settings {
    let pod = pod(only(&m.daemon_sets, "DaemonSet"));
    let tierd = container(pod, "tierd");
    let a = args(tierd);
    let at = a
        .iter()
        .position(|x| x == "--config")
        .unwrap_or_else(|| panic!("tierd args {a:?} have no --config"));
    assert_eq!(a[0], "run", "tierd args {a:?}");
    let config = Path::new(a.get(at + 1).expect("--config without a path"));
    let (dir, key) = (
        config.parent().unwrap().to_str().unwrap(),
        config.file_name().unwrap().to_str().unwrap(),
    );
    let mount = tierd
        .volume_mounts
        .iter()
        .flatten()
        .find(|v| v.mount_path == dir)
        .unwrap_or_else(|| panic!("--config {}: {dir} is not mounted", config.display()));
    let cm_name = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .and_then(|v| v.config_map.as_ref())
        .unwrap_or_else(|| panic!("{dir} is not a ConfigMap volume"))
        .name
        .clone();
    let cm = m
        .config_maps
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(cm_name.as_str()))
        .unwrap_or_else(|| panic!("ConfigMap {cm_name} is not in tierd.yaml"));
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .unwrap_or_else(|| panic!("ConfigMap {cm_name} has no key {key}"));
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join(key);
    std::fs::write(&file, text).unwrap();
    Config::load(&file, true)
        .and_then(|c| c.validate())
        .unwrap_or_else(|e| panic!("ConfigMap {cm_name} {key}: {e}"))
}

#[test]
fn manifests_decode_strictly_into_one_namespace() {
    let m = load();
    let ns = only(&m.namespaces, "Namespace").metadata.name.clone();
    assert_eq!(ns.as_deref(), Some("tierd"));
    let namespaced = m
        .accounts
        .iter()
        .map(|x| (&x.metadata, "ServiceAccount"))
        .chain(m.config_maps.iter().map(|x| (&x.metadata, "ConfigMap")))
        .chain(m.daemon_sets.iter().map(|x| (&x.metadata, "DaemonSet")))
        .chain(m.services.iter().map(|x| (&x.metadata, "Service")));
    for (meta, kind) in namespaced {
        assert_eq!(meta.namespace, ns, "{kind} {:?}", meta.name);
    }
    only(&m.daemon_sets, "DaemonSet");
    only(&m.services, "Service");
}

#[test]
fn daemonset_is_privileged_on_host_pids_with_the_host_paths() {
    let m = load();
    let pod = pod(only(&m.daemon_sets, "DaemonSet"));
    assert_eq!(pod.host_pid, Some(true), "tierd must see VMM processes");
    assert_ne!(pod.host_network, Some(true), "no hostNetwork");
    let tierd = container(pod, "tierd");
    let privileged = tierd.security_context.as_ref().and_then(|s| s.privileged);
    assert_eq!(privileged, Some(true));
    // The same paths inside as on the host: the config names them so.
    for (host, read_only) in [
        ("/sys/kernel/btf", Some(true)),
        ("/sys/fs/bpf", None),
        ("/run/cloud-hypervisor", None),
        ("/run/tierd", None),
    ] {
        let mount = host_mount(pod, tierd, host);
        assert_eq!(mount.mount_path, host);
        if read_only.is_some() {
            assert_eq!(mount.read_only, read_only, "{host} read-only");
        }
    }
    assert!(
        pod.tolerations
            .iter()
            .flatten()
            .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()),
        "tolerates every taint (every node)"
    );
    let res = tierd.resources.as_ref().expect("tierd resources");
    let limits = res.limits.clone().unwrap_or_default();
    assert!(
        !limits.contains_key("cpu"),
        "no CPU limit (throttled passes)"
    );
    assert!(limits.contains_key("memory"), "a memory limit");
    let requests = res.requests.clone().unwrap_or_default();
    assert!(requests.contains_key("cpu") && requests.contains_key("memory"));
    let log = tierd.env.iter().flatten().find(|e| e.name == "TIERD_LOG");
    assert!(log.is_some_and(|e| e.value.is_some()), "TIERD_LOG set");
    assert!(pod.termination_grace_period_seconds.is_some());
}

#[test]
fn configmap_config_is_valid_for_tierd_and_matches_the_pod() {
    let m = load();
    let s = tierd_settings(&m);
    let pod = pod(only(&m.daemon_sets, "DaemonSet"));
    let tierd = container(pod, "tierd");
    let run_tierd = host_mount(pod, tierd, "/run/tierd");
    assert!(
        s.socket.starts_with(&run_tierd.mount_path),
        "socket {} outside the host's /run/tierd",
        s.socket.display()
    );
    let ch = host_mount(pod, tierd, "/run/cloud-hypervisor");
    assert_eq!(
        s.ch.api_dir.as_deref(),
        Some(Path::new(&ch.mount_path)),
        "ch_api_dir is the mounted VMM socket directory"
    );
    let metrics = s.metrics.expect("[metrics] listen set");
    assert!(metrics.ip().is_loopback());
    assert_eq!(
        flag(sidecar(pod), "--upstream"),
        format!("http://{metrics}/"),
        "kube-rbac-proxy --upstream is tierd's metrics listen"
    );
}

#[test]
fn metrics_service_reaches_the_sidecar() {
    let m = load();
    let ds = only(&m.daemon_sets, "DaemonSet");
    let pod_labels = labels(
        ds.spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .as_ref()
            .unwrap(),
    );
    let proxy = sidecar(pod(ds));
    let listen = flag(proxy, "--secure-listen-address");
    let listen_port: i32 = listen.rsplit_once(':').unwrap().1.parse().unwrap();
    let svc = only(&m.services, "Service");
    assert!(
        labels(&svc.metadata).contains_key("app.kubernetes.io/name"),
        "Service labelled for a ServiceMonitor"
    );
    let spec = svc.spec.as_ref().unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"), "headless");
    let selector = spec.selector.clone().unwrap_or_default();
    assert!(!selector.is_empty());
    for (k, v) in &selector {
        assert_eq!(pod_labels.get(k), Some(v), "selector {k}={v} on the pods");
    }
    let port = spec
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("https-metrics"))
        .expect("Service port https-metrics");
    let target = match port.target_port.clone() {
        None => port.port,
        Some(IntOrString::Int(n)) => n,
        Some(IntOrString::String(name)) => {
            proxy
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .unwrap_or_else(|| panic!("targetPort {name}: no such sidecar port"))
                .container_port
        }
    };
    assert_eq!(target, listen_port, "targetPort is kube-rbac-proxy's port");
    assert!(
        proxy
            .ports
            .iter()
            .flatten()
            .any(|p| p.container_port == listen_port),
        "the sidecar declares port {listen_port}"
    );
}

#[test]
fn service_account_is_bound_to_the_proxy_role() {
    let m = load();
    let ds = only(&m.daemon_sets, "DaemonSet");
    let sa = pod(ds)
        .service_account_name
        .clone()
        .expect("serviceAccountName");
    let ns = ds.metadata.namespace.clone();
    assert!(
        m.accounts
            .iter()
            .any(|a| a.metadata.name.as_ref() == Some(&sa) && a.metadata.namespace == ns),
        "ServiceAccount {sa} not in tierd.yaml"
    );
    let allows = |role: &ClusterRole, group: &str, resource: &str| {
        role.rules.iter().flatten().any(|r| {
            r.api_groups.iter().flatten().any(|g| g == group)
                && r.resources.iter().flatten().any(|x| x == resource)
                && r.verbs.iter().any(|v| v == "create")
        })
    };
    let bound = m.bindings.iter().any(|b| {
        let subject = b
            .subjects
            .iter()
            .flatten()
            .any(|s| s.kind == "ServiceAccount" && s.name == sa && s.namespace == ns);
        let role = m.roles.iter().find(|r| {
            b.role_ref.kind == "ClusterRole" && r.metadata.name.as_ref() == Some(&b.role_ref.name)
        });
        subject
            && role.is_some_and(|r| {
                allows(r, "authentication.k8s.io", "tokenreviews")
                    && allows(r, "authorization.k8s.io", "subjectaccessreviews")
            })
    });
    assert!(
        bound,
        "ServiceAccount {sa} is not bound to a ClusterRole creating tokenreviews and subjectaccessreviews"
    );
}

/// The decoder is strict at any depth: one misspelled field in a copy of
/// the file fails it, naming the field's path.
#[test]
fn decoder_rejects_misspelled_fields() {
    let text = manifest_text();
    for (good, bad, path) in [
        (
            "hostPID: true",
            "hostPid: true",
            "spec.template.spec.hostPid",
        ),
        (
            "terminationGracePeriodSeconds:",
            "terminationGracePeriodSecond:",
            "spec.template.spec.terminationGracePeriodSecond",
        ),
        (
            "privileged: true",
            "priviledged: true",
            "securityContext.priviledged",
        ),
        (
            "- operator: Exists",
            "- operater: Exists",
            "tolerations.0.operater",
        ),
    ] {
        assert_eq!(text.matches(good).count(), 1, "{good:?} once in tierd.yaml");
        let err = decode(&text.replacen(good, bad, 1))
            .err()
            .unwrap_or_else(|| panic!("{bad:?} was accepted"));
        assert!(
            err.contains("DaemonSet") && err.contains(path),
            "{bad:?}: error does not name {path}: {err}"
        );
    }
    let err = decode("apiVersion: v1\nkind: Secret\nmetadata:\n  name: x\n").unwrap_err();
    assert!(err.contains("Secret"), "{err}");
}

/// Every probe of tierd is a gRPC probe on the port `[health] listen`
/// serves (plaintext, health alone: docs/grpc.md); readiness asks for
/// tier.v1.TierService, which is SERVING only while a sampler measures.
#[test]
fn probes_are_grpc_on_the_health_listener() {
    let m = load();
    let s = tierd_settings(&m);
    let health = s.health.expect("[health] listen set for the probes");
    assert!(
        health.ip().is_unspecified(),
        "the kubelet probes the pod IP: {health}"
    );
    let pod = pod(only(&m.daemon_sets, "DaemonSet"));
    let tierd = container(pod, "tierd");
    let port = tierd
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("grpc-health"))
        .expect("a grpc-health port");
    assert_eq!(port.container_port, i32::from(health.port()));
    for (what, probe) in [
        ("startupProbe", &tierd.startup_probe),
        ("readinessProbe", &tierd.readiness_probe),
        ("livenessProbe", &tierd.liveness_probe),
    ] {
        let grpc = probe
            .as_ref()
            .and_then(|p| p.grpc.as_ref())
            .unwrap_or_else(|| panic!("{what} is not a gRPC probe"));
        assert_eq!(grpc.port, port.container_port, "{what}");
        let service = grpc.service.as_deref().unwrap_or("");
        if what == "readinessProbe" {
            assert_eq!(service, "tier.v1.TierService");
        } else {
            assert_eq!(service, "", "{what}: the server as a whole");
        }
    }
}

/// The image `cargo xtask package` builds (xtask/src/oci.rs), by version.
#[test]
fn daemonset_names_the_packaged_image() {
    let m = load();
    let tierd = container(pod(only(&m.daemon_sets, "DaemonSet")), "tierd");
    assert_eq!(
        tierd.image.as_deref(),
        Some(format!("tierd:{}", env!("CARGO_PKG_VERSION")).as_str())
    );
    assert_eq!(
        tierd.command,
        Some(vec!["/usr/local/bin/tierd".to_string()])
    );
}
