//! The demo's guests under a patched cloud-hypervisor (`--ch-bin` or
//! `TIERD_CH_BIN`): two PVH test guests whose DRAM needs swap every 40 s,
//! each with a dram and a slow zone and a per-tier balloon; tierd finds them
//! through their API sockets and its controller moves DRAM between them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// The guests' VMM processes, stopped by PID on drop.
pub struct Guests {
    children: Vec<Child>,
    pub api_dir: PathBuf,
}

impl Drop for Guests {
    fn drop(&mut self) {
        for c in &mut self.children {
            crate::run::stop(c);
        }
    }
}

/// The tierd config the demo runs with for these guests.
pub fn tierd_config(api_dir: &Path) -> String {
    format!(
        "interval_ms = 1000\n\
         # The guests are emulated here: one ageing pass per interval (docs/e2e.md).\n\
         passes_per_interval = 1\n\
         [tier_kinds]\n\
         slow = \"cxl\"\n\
         [discovery]\n\
         ch_api_dir = {:?}\n",
        api_dir.display().to_string()
    )
}

/// Builds the test guest and boots `a` and `b` in `dir`, each with 16 MiB of
/// its 32 MiB dram zone ballooned (so the controller has DRAM to move).
pub fn start(ch_bin: &Path, dir: &Path) -> anyhow::Result<Guests> {
    if !ch_bin.is_file() {
        bail!("--ch-bin {}: no such file", ch_bin.display());
    }
    let elf = guest_elf()?;
    let api_dir = dir.join("ch");
    std::fs::create_dir_all(&api_dir).context("creating the API socket directory")?;
    let mut guests = Guests {
        children: Vec::new(),
        api_dir: api_dir.clone(),
    };
    crate::run::step("demo", "booting test guests a and b");
    for (name, first, second) in [("a", 6000, 1500), ("b", 1500, 6000)] {
        let cmdline = format!(
            "hot=6000,300 phases=95/5@40s:{first}/300,95/5@40s:{second}/300 loop=1 report=0"
        );
        let log =
            std::fs::File::create(dir.join(format!("{name}.log"))).context("creating a VMM log")?;
        let mut cmd = Command::new(ch_bin);
        cmd.arg("--api-socket")
            .arg(format!(
                "path={}",
                api_dir.join(format!("{name}.sock")).display()
            ))
            .arg("--kernel")
            .arg(&elf)
            .args(["--cmdline", &cmdline])
            .args(["--cpus", "boot=1", "--memory", "size=0"])
            .args(["--memory-zone", "id=dram,size=32M,shared=on,prefault=on"])
            .args(["--memory-zone", "id=slow,size=64M,shared=on,prefault=on"])
            .args(["--numa", "guest_numa_id=0,memory_zones=dram"])
            .args(["--numa", "guest_numa_id=1,memory_zones=slow"])
            .args(["--balloon", "size=0,tiers=on,stats=on"])
            .arg("--serial")
            .arg(format!(
                "file={}",
                dir.join(format!("{name}.serial")).display()
            ))
            .args(["--console", "off"])
            .stdout(Stdio::null())
            .stderr(log);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", ch_bin.display()))?;
        println!(
            "guest {name}: cloud-hypervisor pid {}, {cmdline}",
            child.id()
        );
        guests.children.push(child);
    }
    let remote = ch_bin.with_file_name("ch-remote");
    for name in ["a", "b"] {
        let socket = api_dir.join(format!("{name}.sock"));
        wait_for(&socket)?;
        if remote.is_file() {
            // The VMM may take a moment after its socket appears.
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let st = Command::new(&remote)
                    .arg("--api-socket")
                    .arg(&socket)
                    .args(["resize", "--balloon-zone", "dram=16M"])
                    .stderr(Stdio::null())
                    .status()
                    .context("running ch-remote")?;
                if st.success() {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("ch-remote resize on {} kept failing", socket.display());
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        } else {
            println!(
                "note: no ch-remote beside {}: balloons start empty",
                ch_bin.display()
            );
        }
    }
    Ok(guests)
}

fn wait_for(socket: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("no API socket at {} after 20 s", socket.display())
}

/// Builds the test guest and returns its ELF path.
fn guest_elf() -> anyhow::Result<PathBuf> {
    crate::run::step(
        "demo",
        "building the test guest (cargo run -p tier-testguest)",
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // stdout is the path; cargo's progress (stderr) goes to the user.
    let out = Command::new(cargo)
        .args(["run", "-p", "tier-testguest"])
        .current_dir(crate::run::workspace_root()?)
        .stderr(Stdio::inherit())
        .output()
        .context("building the test guest")?;
    if !out.status.success() {
        bail!(
            "building the test guest failed ({}): see cargo's output above",
            out.status
        );
    }
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !path.is_file() {
        bail!(
            "the test guest build printed {}, not a file",
            path.display()
        );
    }
    Ok(path)
}
