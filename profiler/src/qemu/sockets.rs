//! Where QMP sockets are: the configured paths and globs (`[discovery]
//! qemu_qmp`, `--qmp`), `*` and `?` within one path component.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// Whether `name` matches `pat` (`*` any run, `?` one character).
pub fn matches(pat: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pat.chars().collect(), name.chars().collect());
    // Classic two-pointer wildcard match with one backtrack point.
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        match p.get(i) {
            Some('*') => {
                star = Some((i, j));
                i += 1;
            }
            Some(c) if *c == '?' || *c == n[j] => {
                i += 1;
                j += 1;
            }
            _ => match star {
                Some((si, sj)) => {
                    i = si + 1;
                    j = sj + 1;
                    star = Some((si, sj + 1));
                }
                None => return false,
            },
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

/// The paths `pattern` (absolute) names, sorted; components without a
/// wildcard are taken as they are.
pub fn expand(pattern: &Path) -> Vec<PathBuf> {
    let mut at = vec![PathBuf::from("/")];
    for comp in pattern.components().skip(1) {
        let c = comp.as_os_str().to_string_lossy();
        let wild = c.contains(['*', '?']);
        let mut next = Vec::new();
        for dir in &at {
            if !wild {
                next.push(dir.join(c.as_ref()));
                continue;
            }
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            next.extend(
                entries
                    .flatten()
                    .filter(|e| matches(&c, &e.file_name().to_string_lossy()))
                    .map(|e| e.path()),
            );
        }
        at = next;
    }
    at.sort();
    at
}

/// The unix sockets every pattern names, sorted, each once.
pub fn find(patterns: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = patterns
        .iter()
        .flat_map(|p| expand(p))
        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The VM's name when QEMU has none (`-name`): the socket's directory for
/// libvirt-style `.../domain-1-vm1/monitor.sock`, else the file stem.
pub fn vm_name(socket: &Path) -> String {
    let stem = socket
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| socket.display().to_string());
    match socket.parent().and_then(Path::file_name) {
        Some(d) if matches!(stem.as_str(), "monitor" | "qmp") => d.to_string_lossy().into_owned(),
        _ => stem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_match_within_a_component() {
        assert!(matches("*.sock", "vm1.sock"));
        assert!(matches("domain-*", "domain-3-web"));
        assert!(matches("vm?.qmp", "vm1.qmp"));
        assert!(matches("*", ""));
        assert!(matches("a*b*c", "aXXbYc"));
        assert!(!matches("a*b*c", "aXXbY"));
        assert!(!matches("*.sock", "vm1.socket"));
        assert!(!matches("vm?", "vm"));
    }

    #[test]
    fn globs_find_sockets_only() {
        let root = tempfile::tempdir().unwrap();
        for d in ["domain-1-a", "domain-2-b", "other"] {
            std::fs::create_dir(root.path().join(d)).unwrap();
        }
        let a = root.path().join("domain-1-a/monitor.sock");
        let b = root.path().join("domain-2-b/monitor.sock");
        let _la = std::os::unix::net::UnixListener::bind(&a).unwrap();
        let _lb = std::os::unix::net::UnixListener::bind(&b).unwrap();
        std::fs::write(root.path().join("other/monitor.sock"), "x").unwrap();
        let pat = root.path().join("*/monitor.sock");
        assert_eq!(find(&[pat.clone(), a.clone()]), vec![a.clone(), b]);
        assert!(find(&[root.path().join("none/*.sock")]).is_empty());
        assert_eq!(vm_name(&a), "domain-1-a");
        assert_eq!(vm_name(Path::new("/run/tierd/qmp/web.sock")), "web");
    }
}
