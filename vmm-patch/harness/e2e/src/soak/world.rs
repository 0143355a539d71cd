//! The processes of a soak: two test guests under the patched VMM (VM "b"
//! with its balloon behind `tier-balloon` over vhost-user), that backend and
//! tierd with its controller. Each can be killed and started again.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use tier_e2e::tierd::{self, Tierd};
use tier_e2e::vmm::{ChVm, STOP_GRACE, VhostUser, VmSpec};
use tier_proto::v1::{Policy, SetPolicyRequest};
use tier_test_support::{ChildGuard, try_wait_until};

pub const MIB: u64 = 1 << 20;

/// Binaries and the work directory.
#[derive(Debug, Clone)]
pub struct Paths {
    pub ch_bin: PathBuf,
    pub tierd: PathBuf,
    pub balloon: PathBuf,
    pub guest: PathBuf,
    pub work: PathBuf,
}

/// Sizes and the policy of the run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub dram_mib: u64,
    pub slow_mib: u64,
    /// DRAM balloon of each VM before tierd manages it (and after a reboot).
    pub initial_dram_balloon_mib: u64,
    pub interval_ms: u64,
    /// Extra guest command-line keys per VM (fault windows), appended.
    pub guest_extra: [String; 2],
}

impl Plan {
    /// DRAM the two VMs may hold together: what they hold at the start.
    pub fn budget(&self) -> u64 {
        2 * (self.dram_mib - self.initial_dram_balloon_mib) * MIB
    }

    pub fn policy(&self) -> Policy {
        Policy {
            enabled: true,
            dry_run: false,
            default_target: 0.85,
            epsilon: 0.05,
            host_dram_budget_bytes: self.budget(),
            max_step_bytes: 8 * MIB,
            cooldown_intervals: 1,
            idle_threshold: 0.3,
            vms: Vec::new(),
            ..Policy::default()
        }
    }

    /// VM `i` ("a" or "b"): their DRAM needs swap every 30 s, so the
    /// controller keeps moving DRAM between them.
    pub fn spec(&self, i: usize, dir: &Path) -> VmSpec {
        let name = ["a", "b"][i];
        let (first, second) = if i == 0 { (5000, 1500) } else { (1500, 5000) };
        VmSpec {
            name: name.into(),
            zones: vec![
                ("dram".into(), self.dram_mib),
                ("slow".into(), self.slow_mib),
            ],
            cmdline: format!(
                "hot=6000,300 phases=95/5@30s:{first}/300,95/5@30s:{second}/300 report=1s {}",
                self.guest_extra[i]
            )
            .trim()
            .to_string(),
            vhost_user: (i == 1).then(|| VhostUser {
                socket: dir.join("b-vu.sock"),
                control: dir.join("b-ctl.sock"),
            }),
            hotplug: None,
        }
    }
}

/// Everything running.
pub struct World {
    pub paths: Paths,
    pub plan: Plan,
    pub ch_dir: PathBuf,
    pub vms: [Option<ChVm>; 2],
    pub backend: Option<ChildGuard>,
    pub tierd: Tierd,
    pub policy_file: PathBuf,
}

impl World {
    pub async fn start(paths: Paths, plan: Plan) -> anyhow::Result<World> {
        let ch_dir = paths.work.join("ch");
        std::fs::create_dir_all(&ch_dir).context("creating the API socket directory")?;
        let spec_b = plan.spec(1, &paths.work);
        let backend = Some(start_backend(&paths, &spec_b)?);
        let mut vms = [None, None];
        for (i, slot) in vms.iter_mut().enumerate() {
            *slot = Some(boot_vm(&paths, &plan, &ch_dir, i).await?);
        }
        let policy_file = paths.work.join("policy.pb");
        let tierd = start_tierd(&paths, &plan, &ch_dir, &policy_file)?;
        let mut w = World {
            paths,
            plan,
            ch_dir,
            vms,
            backend,
            tierd,
            policy_file,
        };
        let mut client = w.tierd.try_client(Duration::from_secs(30)).await?;
        client
            .set_policy(SetPolicyRequest {
                policy: Some(w.plan.policy()),
            })
            .await
            .context("SetPolicy")?;
        Ok(w)
    }

    pub fn spec(&self, i: usize) -> VmSpec {
        self.plan.spec(i, &self.paths.work)
    }

    pub fn restart_tierd(&mut self) -> anyhow::Result<()> {
        self.tierd = start_tierd(&self.paths, &self.plan, &self.ch_dir, &self.policy_file)?;
        Ok(())
    }

    pub fn kill_backend(&mut self) {
        if let Some(mut c) = self.backend.take() {
            let _ = c.child_mut().kill();
            let _ = c.child_mut().wait();
        }
    }

    pub fn restart_backend(&mut self) -> anyhow::Result<()> {
        self.backend = Some(start_backend(&self.paths, &self.spec(1))?);
        Ok(())
    }

    pub fn backend_pid(&self) -> Option<u32> {
        self.backend.as_ref().map(ChildGuard::id)
    }

    pub async fn reboot_vm(&mut self, i: usize) -> anyhow::Result<()> {
        self.vms[i] = Some(boot_vm(&self.paths, &self.plan, &self.ch_dir, i).await?);
        Ok(())
    }

    pub fn stop(&mut self) {
        self.tierd.stop();
        for vm in self.vms.iter_mut().flatten() {
            vm.signal(libc::SIGCONT);
            vm.stop();
        }
        if let Some(c) = self.backend.as_mut() {
            c.terminate();
        }
    }
}

fn start_tierd(
    paths: &Paths,
    plan: &Plan,
    ch_dir: &Path,
    policy_file: &Path,
) -> anyhow::Result<Tierd> {
    tierd::start(
        &paths.tierd,
        &paths.work,
        ch_dir,
        "hostpte",
        plan.interval_ms,
        1,
        &format!("policy_file = {:?}", policy_file.display().to_string()),
    )
}

fn start_backend(paths: &Paths, spec: &VmSpec) -> anyhow::Result<ChildGuard> {
    let v = spec
        .vhost_user
        .as_ref()
        .context("VM b has no vhost-user sockets")?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(paths.work.join("backend.log"))
        .context("opening backend.log")?;
    let mut cmd = Command::new(&paths.balloon);
    cmd.arg("--socket")
        .arg(&v.socket)
        .arg("--control")
        .arg(&v.control);
    for t in spec.backend_tiers() {
        cmd.arg("--tier").arg(t);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", paths.balloon.display()))?;
    let child = ChildGuard::with_grace(child, STOP_GRACE);
    // The VMM connects at boot: wait for the socket.
    try_wait_until("tier-balloon's sockets", Duration::from_secs(5), || {
        (v.socket.exists() && v.control.exists()).then_some(())
    })
    .with_context(|| format!("tier-balloon did not create {}", v.socket.display()))?;
    Ok(child)
}

/// Boots VM `i`, waits for its driver and sets its starting DRAM balloon.
async fn boot_vm(paths: &Paths, plan: &Plan, ch_dir: &Path, i: usize) -> anyhow::Result<ChVm> {
    let spec = plan.spec(i, &paths.work);
    let mut vm = ChVm::boot(&spec, &paths.ch_bin, &paths.guest, ch_dir, &paths.work)?;
    vm.wait_ready(Duration::from_secs(30)).await?;
    vm.balloon_to(
        &[("dram".into(), plan.initial_dram_balloon_mib * MIB)],
        Duration::from_secs(60),
    )
    .await?;
    Ok(vm)
}
