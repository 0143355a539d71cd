//! Shared by the UML test binaries: runs the trials one guest at a time,
//! each ignored with `missing` as the reason when the guest cannot boot.

use libtest_mimic::{Arguments, Completion, Failed, Trial};

/// A trial: its name and body.
pub type Body = fn() -> Result<Completion, Failed>;

pub fn run(missing: Option<String>, trials: &[(&'static str, Body)]) -> ! {
    let mut args = Arguments::from_args();
    // One guest at a time: each boots a kernel, and two share 2 cores badly.
    args.test_threads.get_or_insert(1);
    let trials = trials
        .iter()
        .map(|&(name, f)| {
            let missing = missing.clone();
            Trial::ignorable_test(name, move || match missing {
                Some(why) => Ok(Completion::ignored_with(why)),
                None => f(),
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit()
}
