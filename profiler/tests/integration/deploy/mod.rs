//! The deployment files, each checked by a real tool: the systemd unit by
//! `systemd-analyze verify` against the built tierd, the Kubernetes
//! manifests decoded strictly into the API types (k8s-openapi) with the
//! ConfigMap's tierd.toml through tierd's own config loader.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

mod decode;
mod kubernetes;
mod systemd;

use std::path::{Path, PathBuf};

/// A file under profiler/deploy.
fn deploy_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(rel)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
