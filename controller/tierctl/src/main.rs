//! tierctl: talk to tierd. `info`, `vms`, `vm`, `top`, `policy`, `balloon`,
//! `completions` (docs/tierctl.md). The command line is `tierctl::cli`;
//! the commands themselves are binary-only modules in src/cmd/.

mod cmd;

use std::process::ExitCode;

use clap::Parser;
use tierctl::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tierctl: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(cmd::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tierctl: {e:#}");
            ExitCode::FAILURE
        }
    }
}
