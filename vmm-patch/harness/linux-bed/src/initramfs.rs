//! The guest's root: an initramfs (cpio newc, uncompressed) holding
//! busybox-static, the modules, host-built programs with the shared
//! libraries `ldd` names, and the init script that serves shell commands on
//! the console (`tier_uml::console`'s protocol).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{BedError, io};

/// busybox-static's binary (Debian package `busybox-static`).
pub const BUSYBOX: &str = "/bin/busybox";

/// What goes into the guest's root besides busybox and init.
#[derive(Debug, Clone, Default)]
pub struct Contents {
    /// Module name and uncompressed `.ko`, insmod'ed in this order.
    pub modules: Vec<(String, PathBuf)>,
    /// Host programs, copied to `/opt/bin/<file name>` with their libraries.
    pub programs: Vec<PathBuf>,
    /// Extra files: guest path (absolute) and content; made executable.
    pub files: Vec<(String, Vec<u8>)>,
}

/// The init script: mounts what tierd and the checks need, loads the
/// modules, says ready, then runs one base64 command per console line.
pub fn init_script(modules: &[String]) -> String {
    let mut s = String::from(
        "#!/bin/busybox sh\n\
         /bin/busybox mkdir -p /sbin /usr/bin /usr/sbin /proc /sys /dev /tmp /run\n\
         /bin/busybox --install -s\n\
         export PATH=/opt/bin:/bin:/sbin:/usr/bin:/usr/sbin\n\
         mount -t proc proc /proc\n\
         mount -t sysfs sys /sys\n\
         mount -t devtmpfs dev /dev\n\
         mount -t tmpfs tmp /tmp\n\
         mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null\n\
         mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null\n\
         mount -t bpf bpf /sys/fs/bpf 2>/dev/null\n\
         stty -echo 2>/dev/null\n",
    );
    for m in modules {
        s += &format!("insmod /mod/{m}.ko || echo \"@@\"\"fail insmod {m}\"\n");
    }
    s + tier_uml::console::SERVE
}

/// Builds the initramfs at `out` from a staging directory beside it.
pub fn build(contents: &Contents, out: &Path) -> Result<(), BedError> {
    let stage = out.with_extension("d");
    if stage.exists() {
        std::fs::remove_dir_all(&stage).map_err(io(format!("clearing {}", stage.display())))?;
    }
    for d in ["bin", "mod", "opt/bin"] {
        mkdir(&stage.join(d))?;
    }
    copy(Path::new(BUSYBOX), &stage.join("bin/busybox"))?;
    for (name, ko) in &contents.modules {
        copy(ko, &stage.join(format!("mod/{name}.ko")))?;
    }
    let mut libs: Vec<PathBuf> = Vec::new();
    for p in &contents.programs {
        let name = p
            .file_name()
            .ok_or_else(|| BedError::Missing(format!("{} is not a file", p.display())))?;
        copy(p, &stage.join("opt/bin").join(name))?;
        for l in shared_libraries(p)? {
            if !libs.contains(&l) {
                libs.push(l);
            }
        }
    }
    for l in &libs {
        let rel = l.strip_prefix("/").unwrap_or(l);
        copy(l, &stage.join(rel))?;
    }
    let names: Vec<String> = contents.modules.iter().map(|(n, _)| n.clone()).collect();
    let mut files = contents.files.clone();
    files.push(("/init".into(), init_script(&names).into_bytes()));
    for (path, body) in &files {
        let dest = stage.join(path.trim_start_matches('/'));
        if let Some(d) = dest.parent() {
            mkdir(d)?;
        }
        std::fs::write(&dest, body).map_err(io(format!("writing {}", dest.display())))?;
        chmod_x(&dest)?;
    }
    cpio(&stage, out)
}

/// The shared libraries (and loader) `ldd` says `program` needs; none for
/// a static one.
pub fn shared_libraries(program: &Path) -> Result<Vec<PathBuf>, BedError> {
    let o = Command::new("ldd")
        .arg(program)
        .output()
        .map_err(io("running ldd"))?;
    let text = String::from_utf8_lossy(&o.stdout);
    Ok(parse_ldd(&text))
}

/// Absolute paths in `ldd` output: `lib => /path (0x..)` and the loader's
/// `/lib64/ld-linux-x86-64.so.2 (0x..)`.
pub fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = l.split("=>").nth(1).unwrap_or(l).trim();
            let path = path.split(" (").next()?.trim();
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

fn mkdir(d: &Path) -> Result<(), BedError> {
    std::fs::create_dir_all(d).map_err(io(format!("creating {}", d.display())))
}

fn copy(from: &Path, to: &Path) -> Result<(), BedError> {
    if let Some(d) = to.parent() {
        mkdir(d)?;
    }
    std::fs::copy(from, to).map(drop).map_err(io(format!(
        "copying {} to {}",
        from.display(),
        to.display()
    )))
}

fn chmod_x(p: &Path) -> Result<(), BedError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755))
        .map_err(io(format!("chmod {}", p.display())))
}

/// `find . | cpio -o -H newc` in `stage`, written to `out`.
fn cpio(stage: &Path, out: &Path) -> Result<(), BedError> {
    let mut list = String::new();
    walk(stage, stage, &mut list)?;
    let file = std::fs::File::create(out).map_err(io(format!("creating {}", out.display())))?;
    let mut child = Command::new("cpio")
        .args(["-o", "-H", "newc", "--quiet"])
        .current_dir(stage)
        .stdin(Stdio::piped())
        .stdout(file)
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io("running cpio (package cpio)"))?;
    if let Some(mut i) = child.stdin.take() {
        i.write_all(list.as_bytes())
            .map_err(io("writing cpio's file list"))?;
    }
    let o = child.wait_with_output().map_err(io("waiting for cpio"))?;
    if !o.status.success() {
        return Err(BedError::Missing(format!(
            "cpio failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )));
    }
    Ok(())
}

fn walk(root: &Path, dir: &Path, list: &mut String) -> Result<(), BedError> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(io(format!("reading {}", dir.display())))?
        .filter_map(Result::ok)
        .collect();
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for e in entries {
        let p = e.path();
        if let Ok(rel) = p.strip_prefix(root) {
            list.push_str(&rel.to_string_lossy());
            list.push('\n');
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(root, &p, list)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_lines_give_library_and_loader_paths() {
        let t = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                 \tlibelf.so.1 => /lib/x86_64-linux-gnu/libelf.so.1 (0x00007f)\n\
                 \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n\
                 \tnot a dynamic executable\n";
        assert_eq!(
            parse_ldd(t),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libelf.so.1"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2")
            ]
        );
    }

    #[test]
    fn init_loads_modules_in_order_and_hides_markers_from_echo() {
        let s = init_script(&["virtio".into(), "virtio_mem".into()]);
        let a = s.find("insmod /mod/virtio.ko").unwrap();
        let b = s.find("insmod /mod/virtio_mem.ko").unwrap();
        assert!(a < b);
        assert!(!s.contains("@@ready"), "split so an echo never matches");
        assert!(s.contains("mount -t bpf bpf /sys/fs/bpf"));
    }

    #[test]
    fn builds_a_newc_archive_with_init_and_programs() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("root.cpio");
        let c = Contents {
            programs: vec![PathBuf::from("/bin/true")],
            files: vec![("/etc/hello".into(), b"hi".to_vec())],
            ..Contents::default()
        };
        build(&c, &out).unwrap();
        let listing = Command::new("cpio")
            .args(["-t", "--quiet"])
            .stdin(std::fs::File::open(&out).unwrap())
            .output()
            .unwrap();
        let l = String::from_utf8_lossy(&listing.stdout);
        for want in [
            "init",
            "bin/busybox",
            "opt/bin/true",
            "etc/hello",
            "lib64/ld-linux-x86-64.so.2",
        ] {
            assert!(l.lines().any(|x| x == want), "{want} missing from:\n{l}");
        }
    }
}
