//! tierd, started here with its own config and socket, stopped by its PID.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tier_proto::v1::tier_service_client::TierServiceClient;
use tier_proto::{Endpoint, connect};
use tonic::transport::Channel;

use crate::vmm::STOP_GRACE;
use tier_test_support::ChildGuard;

/// How often hostpte sweeps for the working-set ages in the e2e's tierd:
/// each sweep gives each VM's hot set about once.
pub const WS_SWEEP_EVERY_S: u64 = 10;

/// A running tierd.
#[derive(Debug)]
pub struct Tierd {
    child: ChildGuard,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl Tierd {
    /// Starts `bin run` with a config that samples with `backend`, finds
    /// cloud-hypervisor VMs through the API sockets in `ch_dir`, takes the
    /// zone `slow` for CXL memory (this host has one memory tier) and runs
    /// the controller. Only the VMMs in `ch_dir` are its to drive: other
    /// cloud-hypervisor processes on the host (another test's) are not
    /// looked up by their command line, and other KVM processes are not
    /// tracked by their kvm-vm fd (one counted against the run's DRAM
    /// budget once). `extra` is appended to the `[controller]` table
    /// (e.g. `policy_file = "..."`). No sampler CPU budget: the scenarios
    /// time the controller against every interval's estimate (a hostpte
    /// pass of a cloud-hypervisor guest costs more than the default budget
    /// pays for every interval; docs/config.md, "Sampler budget").
    pub fn start(
        bin: &Path,
        dir: &Path,
        ch_dir: &Path,
        backend: &str,
        interval_ms: u64,
        passes: u32,
        extra: &str,
    ) -> anyhow::Result<Tierd> {
        let socket = dir.join("tierd.sock");
        let text = format!(
            "socket = {socket:?}\n\
             socket_mode = \"0600\"\n\
             interval_ms = {interval_ms}\n\
             passes_per_interval = {passes}\n\
             backend = {backend:?}\n\
             [sampler]\n\
             cpu_budget_pct = 0\n\
             ws_horizons_s = [1, 5]\n\
             ws_sweep_s = 5\n\
             ws_sweep_every_s = {WS_SWEEP_EVERY_S}\n\
             [tier_kinds]\n\
             slow = \"cxl\"\n\
             [metrics]\n\
             listen = \"\"\n\
             [discovery]\n\
             ch_api_dir = {ch_dir:?}\n\
             ch_cmdline = false\n\
             kvm_fd = false\n\
             [controller]\n\
             enabled = true\n\
             {extra}\n",
            socket = socket.display().to_string(),
            ch_dir = ch_dir.display().to_string(),
        );
        Tierd::with_config(bin, dir, &text)
    }

    /// Starts `bin run` with `text` as its config file in `dir` (its
    /// `socket` must be `dir/tierd.sock`), logging to `dir/tierd.log`.
    pub fn with_config(bin: &Path, dir: &Path, text: &str) -> anyhow::Result<Tierd> {
        let socket = dir.join("tierd.sock");
        let config = dir.join("tierd.toml");
        std::fs::write(&config, text).context("writing tierd.toml")?;
        let log = dir.join("tierd.log");
        // Appended: a restarted tierd keeps the earlier lines.
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .context("opening tierd.log")?;
        let child = Command::new(bin)
            .arg("run")
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let child = ChildGuard::with_grace(child, STOP_GRACE);
        Ok(Tierd { child, socket, log })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A client once the socket answers.
    pub async fn client(
        &mut self,
        timeout: Duration,
    ) -> anyhow::Result<TierServiceClient<Channel>> {
        let endpoint =
            Endpoint::parse(&self.socket.display().to_string()).context("tierd socket path")?;
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().context("waiting for tierd")? {
                bail!(
                    "tierd exited ({status}); its log ({}):\n{}",
                    self.log.display(),
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            if self.socket.exists()
                && let Ok(c) = connect(&endpoint).await
            {
                return Ok(c);
            }
            if start.elapsed() > timeout {
                bail!(
                    "tierd socket {} not up after {timeout:?}",
                    self.socket.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM by PID, then SIGKILL after [`STOP_GRACE`] (also on drop).
    pub fn stop(&mut self) {
        self.child.terminate();
    }

    /// SIGKILL by PID, and reaped: a crash, for the soak.
    pub fn kill9(&mut self) {
        let c = self.child.child_mut();
        let _ = c.kill();
        let _ = c.wait();
    }
}
