//! Where cloud-hypervisor API sockets are: the configured directory
//! (`[discovery] ch_api_dir`) and the `--api-socket` argument of processes
//! that hold a kvm-vm fd; and which process listens on one (SO_PEERCRED).

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// Unix sockets directly in `dir` and in its immediate subdirectories
/// (`dir/vm1.sock`, `dir/vm1/api.sock`), sorted. A missing directory is
/// empty.
pub fn in_dir(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let is_socket =
        |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_socket() {
            out.push(p);
        } else if ft.is_dir()
            && let Ok(sub) = std::fs::read_dir(&p)
        {
            out.extend(sub.flatten().map(|s| s.path()).filter(|s| is_socket(s)));
        }
    }
    out.sort();
    out
}

/// What `--api-socket` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiSocketArg {
    Path(PathBuf),
    /// A listening socket handed over by the parent.
    Fd(u32),
}

/// The `--api-socket` of a cloud-hypervisor command line (NUL-separated
/// /proc/PID/cmdline), as cloud-hypervisor parses it: `path=P`, `fd=N`, or
/// the whole value as a path. `None` without one.
pub fn api_socket_arg(cmdline: &[u8]) -> Option<ApiSocketArg> {
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let mut value = None;
    for (i, a) in args.iter().enumerate() {
        if a == "--api-socket" {
            value = args.get(i + 1).cloned();
        } else if let Some(v) = a.strip_prefix("--api-socket=") {
            value = Some(v.to_string());
        }
    }
    let value = value.filter(|v| !v.is_empty())?;
    let mut path = None;
    let mut fd = None;
    for opt in value.split(',') {
        if let Some(p) = opt.strip_prefix("path=") {
            path = Some(p.to_string());
        } else if let Some(n) = opt.strip_prefix("fd=") {
            fd = n.parse().ok();
        }
    }
    match (fd, path) {
        (Some(n), _) => Some(ApiSocketArg::Fd(n)),
        (None, Some(p)) if !p.is_empty() => Some(ApiSocketArg::Path(PathBuf::from(p))),
        (None, Some(_)) => None,
        (None, None) => Some(ApiSocketArg::Path(PathBuf::from(value))),
    }
}

/// The filesystem path a unix socket inode is bound to, from
/// /proc/net/unix (`Num RefCount Protocol Flags Type St Inode Path`);
/// abstract sockets (`@name`) have none.
pub fn path_of_socket_inode(net_unix: &str, inode: u64) -> Option<PathBuf> {
    net_unix.lines().skip(1).find_map(|l| {
        let cols: Vec<&str> = l.split_whitespace().collect();
        let ino: u64 = cols.get(6)?.parse().ok()?;
        let path = cols.get(7)?;
        (ino == inode && path.starts_with('/')).then(|| PathBuf::from(path))
    })
}

/// The API socket path of process `pid` from its command line; a
/// relative path is resolved against its working directory, `fd=N`
/// through the socket's inode in /proc/net/unix.
pub fn of_process(proc_root: &Path, pid: u32) -> Option<PathBuf> {
    let dir = proc_root.join(pid.to_string());
    let cmdline = std::fs::read(dir.join("cmdline")).ok()?;
    match api_socket_arg(&cmdline)? {
        ApiSocketArg::Path(p) if p.is_absolute() => Some(p),
        ApiSocketArg::Path(p) => Some(std::fs::read_link(dir.join("cwd")).ok()?.join(p)),
        ApiSocketArg::Fd(n) => {
            let link = std::fs::read_link(dir.join("fd").join(n.to_string())).ok()?;
            let inode: u64 = link
                .to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()?;
            let net = std::fs::read_to_string(dir.join("net/unix")).ok()?;
            path_of_socket_inode(&net, inode)
        }
    }
}

/// The VM's name from its socket: the subdirectory of `api_dir` it lives
/// in (`/run/cloud-hypervisor/vm1/api.sock` -> `vm1`), else the file stem
/// (`vm1.sock` -> `vm1`).
pub fn vm_name(socket: &Path, api_dir: Option<&Path>) -> String {
    if let (Some(dir), Some(parent)) = (api_dir, socket.parent())
        && parent != dir
        && parent.parent() == Some(dir)
        && let Some(n) = parent.file_name()
    {
        return n.to_string_lossy().into_owned();
    }
    socket
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| socket.display().to_string())
}

/// PID of the process listening on `socket` (SO_PEERCRED of a connection:
/// the kernel records the listener's credentials).
pub async fn listener_pid(socket: &Path) -> std::io::Result<u32> {
    let s = tokio::net::UnixStream::connect(socket).await?;
    let cred = s.peer_cred()?;
    match cred.pid() {
        Some(p) if p > 0 => Ok(p as u32),
        _ => Err(std::io::Error::other(
            "the listener's pid is not visible from tierd's pid namespace",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(args: &[&str]) -> Vec<u8> {
        args.join("\0").into_bytes()
    }

    #[test]
    fn api_socket_forms() {
        let p = |s: &str| Some(ApiSocketArg::Path(PathBuf::from(s)));
        assert_eq!(
            api_socket_arg(&cmd(&[
                "cloud-hypervisor",
                "--api-socket",
                "path=/run/ch/a.sock",
                "--kernel",
                "k"
            ])),
            p("/run/ch/a.sock")
        );
        assert_eq!(
            api_socket_arg(&cmd(&["ch", "--api-socket=/tmp/b.sock"])),
            p("/tmp/b.sock")
        );
        assert_eq!(
            api_socket_arg(&cmd(&["ch", "--api-socket", "rel.sock"])),
            p("rel.sock")
        );
        assert_eq!(
            api_socket_arg(&cmd(&["ch", "--api-socket", "fd=7"])),
            Some(ApiSocketArg::Fd(7))
        );
        assert_eq!(api_socket_arg(&cmd(&["ch", "--kernel", "k"])), None);
        assert_eq!(api_socket_arg(&cmd(&["ch", "--api-socket"])), None);
        assert_eq!(api_socket_arg(&cmd(&["ch", "--api-socket", "path="])), None);
    }

    #[test]
    fn socket_inode_to_path() {
        let net = "\
Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 556069 /tmp/h3/run1/ch.sock
0000000000000000: 00000002 00000000 00010000 0001 01 556070 @abstract
0000000000000000: 00000003 00000000 00000000 0001 03 556071
";
        assert_eq!(
            path_of_socket_inode(net, 556069),
            Some(PathBuf::from("/tmp/h3/run1/ch.sock"))
        );
        assert_eq!(path_of_socket_inode(net, 556070), None);
        assert_eq!(path_of_socket_inode(net, 556071), None);
        assert_eq!(path_of_socket_inode(net, 1), None);
    }

    #[test]
    fn names_from_socket_paths() {
        let dir = Path::new("/run/cloud-hypervisor");
        assert_eq!(
            vm_name(Path::new("/run/cloud-hypervisor/vm1.sock"), Some(dir)),
            "vm1"
        );
        assert_eq!(
            vm_name(Path::new("/run/cloud-hypervisor/vm2/api.sock"), Some(dir)),
            "vm2"
        );
        assert_eq!(vm_name(Path::new("/tmp/x/api.sock"), None), "api");
    }

    #[test]
    fn directory_scan_finds_sockets_one_level_deep() {
        let root = tempfile::tempdir().unwrap();
        let a = root.path().join("a.sock");
        let _la = std::os::unix::net::UnixListener::bind(&a).unwrap();
        std::fs::create_dir(root.path().join("vm2")).unwrap();
        let b = root.path().join("vm2/api.sock");
        let _lb = std::os::unix::net::UnixListener::bind(&b).unwrap();
        std::fs::write(root.path().join("not-a-socket"), "x").unwrap();
        std::fs::create_dir_all(root.path().join("deep/er")).unwrap();
        let _lc =
            std::os::unix::net::UnixListener::bind(root.path().join("deep/er/c.sock")).unwrap();
        assert_eq!(in_dir(root.path()), vec![a, b]);
        assert!(in_dir(&root.path().join("absent")).is_empty());
    }

    #[tokio::test]
    async fn the_listener_pid_is_ours_for_our_socket() {
        let root = tempfile::tempdir().unwrap();
        let s = root.path().join("x.sock");
        let _l = tokio::net::UnixListener::bind(&s).unwrap();
        assert_eq!(listener_pid(&s).await.unwrap(), std::process::id());
        let dead = root.path().join("dead.sock");
        drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
        assert!(listener_pid(&dead).await.is_err());
    }
}
