//! The demo VM as its own process, for discovery: tierd finds it by its
//! kvm-vm file descriptor and maps its memfd-backed regions to tiers.
//! Runs until SIGTERM or SIGINT; prints one `ready` line when the guest runs.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use tier_profiler::demo_vm::{DemoVm, DemoVmConfig, Phase};

#[derive(Debug, Parser)]
#[command(
    name = "tier-demo-vm",
    about = "A tiny real KVM VM with a dram and a slow region"
)]
struct Args {
    /// Size of the dram region in MiB.
    #[arg(long, default_value_t = 16)]
    dram_mib: u64,
    /// Size of the slow region in MiB.
    #[arg(long, default_value_t = 16)]
    slow_mib: u64,
    /// Work set per round: DRAM_PAGES:DRAM_REPEAT:SLOW_PAGES:SLOW_REPEAT.
    #[arg(long, value_parser = parse_phase)]
    phase: Option<Phase>,
    /// Name of the vCPU thread (cloud-hypervisor's is vcpu0; another name
    /// plays a VMM that does not name its vCPU threads).
    #[arg(long, default_value = "vcpu0")]
    vcpu_thread_name: String,
}

fn parse_phase(s: &str) -> Result<Phase, String> {
    let v: Vec<u32> = s
        .split(':')
        .map(|p| p.parse::<u32>().map_err(|e| format!("{p:?}: {e}")))
        .collect::<Result<_, _>>()?;
    match v[..] {
        [dram_pages, dram_repeat, slow_pages, slow_repeat] => Ok(Phase {
            dram_pages,
            dram_repeat,
            slow_pages,
            slow_repeat,
        }),
        _ => Err(format!("{s:?}: expected four numbers a:b:c:d")),
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tier-demo-vm: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let mut cfg = DemoVmConfig {
        dram_bytes: args.dram_mib << 20,
        slow_bytes: args.slow_mib << 20,
        ..DemoVmConfig::default()
    };
    if let Some(p) = args.phase {
        cfg.phase = p;
    }
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    let vm = DemoVm::start_named(cfg, &args.vcpu_thread_name).context("starting the demo VM")?;
    println!(
        "ready pid={} touched_pages={:?}",
        std::process::id(),
        vm.touched_pages()
    );
    while !STOP.load(Ordering::SeqCst) {
        if !vm.is_running() {
            anyhow::bail!("vCPU stopped: {}", vm.last_error().unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let c = vm.stop().context("stopping")?;
    eprintln!("tier-demo-vm: stopped after {} rounds", c.rounds);
    Ok(())
}
