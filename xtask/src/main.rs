//! `cargo xtask <task>`: everything a fresh machine needs, in one place.
//! One module per task, each with its arguments and `run`.

mod bench;
mod ci;
mod compat;
mod demo;
mod demo_ch;
mod deps;
#[cfg(test)]
mod docs;
mod e2e;
mod linux_bed;
mod linux_bed_fidelity;
mod linux_bed_plugin;
mod linux_driver;
mod oci;
mod package;
mod run;
mod soak;
mod test;
mod uml;
mod vmlinux;
mod vmm_patch;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "tierd project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, PartialEq, Subcommand)]
enum Task {
    Deps(deps::Args),
    /// fmt check, clippy -D warnings, and every test (runs `deps` first).
    Test,
    Demo(demo::Args),
    Bench(bench::Args),
    E2e(e2e::Args),
    Soak(soak::Args),
    Uml(uml::Args),
    Package(package::Args),
    /// Regenerate bpf/include/x86_64/vmlinux.h from this kernel's BTF.
    Vmlinux,
    Compat(compat::Args),
    LinuxDriver(linux_driver::Args),
    LinuxBed(linux_bed::Args),
    /// Build the Linux bed's exact-truth QEMU plugin; prints the .so path.
    #[command(hide = true)]
    LinuxBedPlugin,
    VmmPatch(vmm_patch::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli.task) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(task: Task) -> anyhow::Result<()> {
    match task {
        Task::Deps(a) => deps::run(a),
        Task::Test => test::run(),
        Task::Demo(a) => demo::run(a),
        Task::Bench(a) => bench::run(a),
        Task::E2e(a) => e2e::run(a),
        Task::Soak(a) => soak::run(a),
        Task::Uml(a) => uml::run(a),
        Task::Package(a) => package::run(a),
        Task::Vmlinux => vmlinux::run(),
        Task::Compat(a) => compat::run(a),
        Task::LinuxDriver(a) => linux_driver::run(a),
        Task::LinuxBed(a) => linux_bed::run(a),
        Task::LinuxBedPlugin => linux_bed_plugin::run(),
        // Needs no checkout: ci builds it from the vendored tarballs.
        Task::VmmPatch(vmm_patch::Args {
            action: vmm_patch::Action::BuildVendored,
            ..
        }) => ci::build_vendored_cmd(),
        Task::VmmPatch(a) => vmm_patch::run(a),
    }
}

#[cfg(test)]
mod tests;
