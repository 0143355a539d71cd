//! tierd's image for the DaemonSet as an OCI image layout, assembled here
//! without a container daemon: one gzip layer holding tierd and tierctl in
//! /usr/local/bin and the shared libraries they load (ldd: libelf, zlib,
//! libgcc_s, libc, the loader) at the paths the loader looks for them; a
//! config with tierd as Entrypoint; a manifest; index.json naming it
//! `tierd:<version>`. Same binaries, same bytes (every time stamp is 0).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::json;
use sha2::{Digest, Sha256};

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Where the image puts tierd (the DaemonSet's `command`).
pub const ENTRYPOINT: &str = "/usr/local/bin/tierd";

/// The layout under `out/oci` and the same as one tar (for `ctr images
/// import`), from the binaries in `bins`; `fast`: gzip -1 (tests).
pub fn build(bins: &Path, out: &Path, fast: bool) -> anyhow::Result<(PathBuf, PathBuf)> {
    crate::run::step(
        "package",
        "OCI image layout (tar + gzip + sha256, no daemon)",
    );
    let (tierd, tierctl) = (bins.join("tierd"), bins.join("tierctl"));
    let mut files: Vec<(String, PathBuf, u32)> = vec![
        (ENTRYPOINT.into(), tierd.clone(), 0o755),
        ("/usr/local/bin/tierctl".into(), tierctl.clone(), 0o755),
    ];
    for lib in shared_libs(&[&tierd, &tierctl])? {
        // The file itself, at the name the loader asks for (no symlinks).
        let real = std::fs::canonicalize(&lib).with_context(|| lib.display().to_string())?;
        files.push((lib.to_string_lossy().into_owned(), real, 0o755));
    }
    let tar = layer_tar(&files)?;
    let diff_id = sha256(&tar);
    let layer = gzip(&tar, !fast)?;

    let dir = out.join("oci");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).with_context(|| format!("creating {}", blobs.display()))?;
    let layer_desc = blob(
        &blobs,
        &layer,
        "application/vnd.oci.image.layer.v1.tar+gzip",
    )?;
    let config = json!({
        "created": "1970-01-01T00:00:00Z",
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": [ENTRYPOINT],
            "Cmd": ["run"],
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
            "Labels": {
                "org.opencontainers.image.title": "tierd",
                "org.opencontainers.image.version": VERSION,
            },
        },
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{diff_id}")] },
        "history": [{ "created": "1970-01-01T00:00:00Z", "created_by": "cargo xtask package" }],
    });
    let config_desc = blob(
        &blobs,
        &serde_json::to_vec(&config).context("config")?,
        "application/vnd.oci.image.config.v1+json",
    )?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": [layer_desc],
    });
    let mut manifest_desc = blob(
        &blobs,
        &serde_json::to_vec(&manifest).context("manifest")?,
        "application/vnd.oci.image.manifest.v1+json",
    )?;
    // The tag for skopeo (`oci:DIR:VERSION`), the full name for containerd.
    manifest_desc["annotations"] = json!({
        "org.opencontainers.image.ref.name": VERSION,
        "io.containerd.image.name": format!("docker.io/library/tierd:{VERSION}"),
    });
    manifest_desc["platform"] = json!({ "architecture": "amd64", "os": "linux" });
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [manifest_desc],
    });
    write(
        &dir.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    write(
        &dir.join("index.json"),
        &serde_json::to_vec_pretty(&index).context("index")?,
    )?;
    let tar_path = out.join(format!("tierd_{VERSION}_oci.tar"));
    let mut archive = tar::Builder::new(
        std::fs::File::create(&tar_path).with_context(|| tar_path.display().to_string())?,
    );
    archive
        .append_dir_all(".", &dir)
        .context("archiving the layout")?;
    archive.finish().context("archiving the layout")?;
    Ok((dir, tar_path))
}

/// The layer: `files` (image path, source, mode) and their parent
/// directories, sorted, owned by root, time stamps 0.
fn layer_tar(files: &[(String, PathBuf, u32)]) -> anyhow::Result<Vec<u8>> {
    let mut dirs = std::collections::BTreeSet::from(["tmp".to_string()]);
    for (path, _, _) in files {
        let mut p = Path::new(path.trim_start_matches('/'));
        while let Some(parent) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
            dirs.insert(parent.to_string_lossy().into_owned());
            p = parent;
        }
    }
    let mut b = tar::Builder::new(Vec::new());
    for d in &dirs {
        let mut h = header(tar::EntryType::Directory, 0);
        h.set_mode(if d == "tmp" { 0o1777 } else { 0o755 });
        b.append_data(&mut h, format!("{d}/"), std::io::empty())
            .with_context(|| d.clone())?;
    }
    let mut sorted: Vec<_> = files.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    for (path, src, mode) in sorted {
        let data = std::fs::read(src).with_context(|| format!("reading {}", src.display()))?;
        let mut h = header(tar::EntryType::Regular, data.len() as u64);
        h.set_mode(*mode);
        b.append_data(&mut h, path.trim_start_matches('/'), data.as_slice())
            .with_context(|| path.clone())?;
    }
    b.into_inner().context("finishing the layer")
}

fn header(kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h
}

pub fn sha256(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Stores `data` as a blob; its descriptor.
fn blob(blobs: &Path, data: &[u8], media_type: &str) -> anyhow::Result<serde_json::Value> {
    let digest = sha256(data);
    write(&blobs.join(&digest), data)?;
    Ok(json!({
        "mediaType": media_type,
        "digest": format!("sha256:{digest}"),
        "size": data.len(),
    }))
}

fn write(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    std::fs::write(path, data).with_context(|| format!("writing {}", path.display()))
}

/// gzip -n (-9 if `best`, else -1): no name, no time, so the same input
/// gives the same bytes.
pub fn gzip(data: &[u8], best: bool) -> anyhow::Result<Vec<u8>> {
    let level = if best {
        flate2::Compression::best()
    } else {
        flate2::Compression::fast()
    };
    let mut gz = flate2::GzBuilder::new().mtime(0).write(Vec::new(), level);
    gz.write_all(data).context("gzip")?;
    gz.finish().context("gzip")
}

/// The shared libraries `bins` load (ldd), by path, the loader included.
pub fn shared_libs(bins: &[&Path]) -> anyhow::Result<Vec<PathBuf>> {
    let mut libs = std::collections::BTreeSet::new();
    for bin in bins {
        let o = Command::new("ldd")
            .arg(bin)
            .output()
            .with_context(|| format!("ldd {}", bin.display()))?;
        if !o.status.success() {
            bail!("ldd {}: {}", bin.display(), o.status);
        }
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            // "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)" or
            // "/lib64/ld-linux-x86-64.so.2 (0x...)"; the vDSO has no file.
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next(),
                None => line.split_whitespace().next(),
            };
            if let Some(p) = path.filter(|p| p.starts_with('/')) {
                libs.insert(PathBuf::from(p));
            }
        }
    }
    Ok(libs.into_iter().collect())
}
