//! `cargo xtask demo`: tierd with its demo VM (or, with a patched
//! cloud-hypervisor, two PVH test guests and the controller), its capability
//! report, and `tierctl top` (live on a terminal, one plain table otherwise).

use std::io::IsTerminal;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::{deps, run};

/// Stops tierd by its PID when the demo ends, however it ends.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        run::stop(&mut self.0);
    }
}

/// The demo VM's tierd: defaults, but the VM's hot set changes every 20 s.
const DEMO_CONFIG: &str = "\
# cargo xtask demo (docs/demo.md)
demo_cycle_s = 20
";

/// Build, start tierd with the demo VM, show the capability report and `tierctl top`.
#[derive(Debug, PartialEq, clap::Args)]
pub struct Args {
    /// Print this many updates as tables instead of the live view (terminal only).
    #[arg(long)]
    pub updates: Option<u64>,
    /// A patched cloud-hypervisor (`cargo xtask vmm-patch build`): run two
    /// PVH test guests under it and the controller instead of the demo VM.
    #[arg(long, env = "TIERD_CH_BIN")]
    pub ch_bin: Option<PathBuf>,
}

pub fn run(Args { updates, ch_bin }: Args) -> anyhow::Result<()> {
    deps::ensure(false)?;
    run::step("demo", "building tierd and tierctl (debug)");
    run::cargo(&["build", "-p", "tier-profiler", "-p", "tierctl"])
        .context("building tierd and tierctl")?;
    let bin = run::target_dir()?.join("debug");
    let tierd = bin.join("tierd");
    let tierctl = bin.join("tierctl");

    println!("== what this host can measure (tierd probe)");
    run::status(Command::new(&tierd).arg("probe"))?;

    let dir = std::env::temp_dir().join(format!("tierd-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let socket = dir.join("tierd.sock");
    let endpoint = format!("unix:{}", socket.display());
    let log = dir.join("tierd.log");
    let guests = match &ch_bin {
        Some(ch) => {
            println!("\n== two PVH test guests under {}", ch.display());
            Some(crate::demo_ch::start(ch, &dir)?)
        }
        None => None,
    };
    let mut cmd = Command::new(&tierd);
    cmd.arg("run");
    match &guests {
        Some(g) => {
            let config = dir.join("tierd.toml");
            std::fs::write(&config, crate::demo_ch::tierd_config(&g.api_dir))
                .context("writing tierd.toml")?;
            println!(
                "\n== starting tierd on the guests' API sockets (log: {})",
                log.display()
            );
            cmd.arg("--config").arg(config);
        }
        None => {
            let config = dir.join("tierd.toml");
            std::fs::write(&config, DEMO_CONFIG).context("writing tierd.toml")?;
            println!(
                "\n== starting tierd with the demo VM (config: {}, log: {})",
                config.display(),
                log.display()
            );
            cmd.arg("--config")
                .arg(config)
                .args(["--demo-vm", "--interval-ms", "1000"]);
        }
    }
    let child = cmd
        // Any free loopback port: a fixed one may be taken on this machine.
        .args(["--metrics-listen", "127.0.0.1:0", "--socket"])
        .arg(&socket)
        .stderr(std::fs::File::create(&log).context("creating the log file")?)
        .process_group(0) // Ctrl-C in the demo stops tierctl; we stop tierd.
        .spawn()
        .context("starting tierd")?;
    let mut daemon = Daemon(child);
    wait_for_socket(&socket, &mut daemon, &log)?;

    if let Some(url) = std::fs::read_to_string(&log).ok().and_then(|l| {
        l.split_whitespace()
            .find(|w| w.starts_with("http://"))
            .map(str::to_string)
    }) {
        println!("Prometheus metrics: {url}");
    }
    println!("\n== tierctl info");
    run::status(Command::new(&tierctl).args(["--endpoint", &endpoint, "info"]))?;
    if guests.is_some() {
        // Budget: the DRAM the two guests hold (2 x 16 MiB unballooned).
        println!("\n== tierctl policy set (the controller moves DRAM between the guests)");
        run::status(Command::new(&tierctl).args([
            "--endpoint",
            &endpoint,
            "policy",
            "set",
            "--default-target",
            "0.85",
            "--epsilon",
            "0.05",
            "--budget",
            "32M",
            "--max-step",
            "8M",
            "--cooldown",
            "1",
            "--idle-threshold",
            "0.3",
        ]))?;
        // Discovery of the sockets takes an interval or two.
        std::thread::sleep(Duration::from_millis(2500));
    }
    println!("\n== tierctl vms");
    run::status(Command::new(&tierctl).args(["--endpoint", &endpoint, "vms"]))?;

    let terminal = std::io::stdout().is_terminal();
    let mut top = Command::new(&tierctl);
    top.args(["--endpoint", &endpoint, "top"]);
    match (terminal, updates) {
        (true, Some(n)) => top.args(["-n", &n.to_string()]),
        (true, None) => {
            println!("\n== tierctl top (q or Ctrl-C to stop, ? for help)");
            &mut top
        }
        (false, _) => {
            // Let two intervals pass so the table has a full interval of
            // numbers; with the guests, long enough to see balloons move.
            let wait = if guests.is_some() { 8000 } else { 2100 };
            run::step(
                "demo",
                format!(
                    "waiting {:.1} s for full intervals before tierctl top --once",
                    wait as f64 / 1000.0
                ),
            );
            std::thread::sleep(Duration::from_millis(wait));
            println!("\n== tierctl top --once");
            top.arg("--once")
        }
    };
    let result = top
        .spawn()
        .context("starting tierctl top")
        .and_then(|mut c| {
            // Ctrl-C is for tierctl; this process must live on to stop tierd.
            // SAFETY: setting SIGINT to SIG_IGN has no preconditions; the child
            // already runs with the default disposition.
            unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
            c.wait().context("waiting for tierctl top")
        });
    drop(daemon);
    drop(guests);
    println!("\ntierd stopped; demo files in {}", dir.display());
    match result {
        Ok(st) if st.success() || (terminal && updates.is_none()) => Ok(()),
        Ok(st) => bail!("tierctl top failed: {st}"),
        Err(e) => Err(e),
    }
}

fn wait_for_socket(socket: &Path, daemon: &mut Daemon, log: &PathBuf) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Ok(());
        }
        if let Ok(Some(st)) = daemon.0.try_wait() {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            bail!("tierd exited ({st}) before serving:\n{text}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "tierd did not open {} within 20 s; see {}",
        socket.display(),
        log.display()
    )
}
