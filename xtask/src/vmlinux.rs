//! `cargo xtask vmlinux`: bpf/include/x86_64/vmlinux.h from this kernel's BTF.

use anyhow::{Context, bail};

use crate::run;

pub fn run() -> anyhow::Result<()> {
    let out = run::workspace_root()?.join("bpf/include/x86_64/vmlinux.h");
    run::step("vmlinux", "bpftool btf dump of /sys/kernel/btf/vmlinux");
    let dump = std::process::Command::new("bpftool")
        .args([
            "btf",
            "dump",
            "file",
            "/sys/kernel/btf/vmlinux",
            "format",
            "c",
        ])
        .output()
        .context("running bpftool (apt-get install bpftool)")?;
    if !dump.status.success() {
        bail!("bpftool failed: {}", String::from_utf8_lossy(&dump.stderr));
    }
    std::fs::write(&out, &dump.stdout).with_context(|| format!("writing {}", out.display()))?;
    println!("wrote {} ({} bytes)", out.display(), dump.stdout.len());
    Ok(())
}
