//! The guest's memory as the host holds it: UML maps its physical memory
//! from an unnamed temporary file in TMPDIR (`O_TMPFILE`, shown as
//! `DIR/#INODE (deleted)`; arch/um/os-Linux/mem.c), the same file
//! tier-balloon punches holes in.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::UmlError;

/// Allocated bytes of the memory file the UML process `pid` holds open
/// (its file in `dir`, the TMPDIR it was given).
pub fn allocated_bytes(pid: u32, dir: &Path) -> Result<u64, UmlError> {
    let fds = Path::new("/proc").join(pid.to_string()).join("fd");
    let entries = std::fs::read_dir(&fds).map_err(|e| UmlError::Io {
        what: fds.display().to_string(),
        source: e,
    })?;
    for e in entries.flatten() {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        let t = target.to_string_lossy();
        let inside = t.strip_prefix(&*dir.to_string_lossy());
        if inside.is_some_and(|rest| rest.starts_with("/#") || rest.starts_with("/vm_file-")) {
            // Through /proc/PID/fd: the file is unlinked.
            let m = std::fs::metadata(e.path()).map_err(|err| UmlError::Io {
                what: t.to_string(),
                source: err,
            })?;
            return Ok(m.blocks() * 512);
        }
    }
    Err(UmlError::Control(format!(
        "no UML memory file (#INODE or vm_file-*) under {} among {}",
        dir.display(),
        fds.display()
    )))
}
