//! `tier-testguest`: prints the path of the built guest ELF, or checks a
//! guest command line with the guest's own parser.
//!
//!     tier-testguest                  # path of the ELF (for --kernel)
//!     tier-testguest check 'hot=...'  # parse; print the normalised line or the error

use std::process::ExitCode;

use tier_testguest::params::Params;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] | ["path"] => {
            println!("{}", tier_testguest::elf_path().display());
            ExitCode::SUCCESS
        }
        ["check", cmdline] => match Params::parse(cmdline) {
            Ok(p) => {
                println!("{}", p.to_cmdline());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("tier-testguest: {e}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!("usage: tier-testguest [path] | tier-testguest check 'CMDLINE'");
            ExitCode::from(2)
        }
    }
}
