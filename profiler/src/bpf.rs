//! Generated libbpf-rs skeletons of the programs in ../bpf, and libbpf's
//! own messages routed into tracing (debug level: the probe reports refusals
//! itself, in one line each).

use std::sync::{Mutex, PoisonError};

/// libbpf's warnings while [`capture_libbpf_warnings`] runs; None otherwise.
static CAPTURED: Mutex<Option<Vec<String>>> = Mutex::new(None);

/// Sends libbpf's messages to `tracing` instead of stderr.
pub fn route_libbpf_logs() {
    fn print(level: libbpf_rs::PrintLevel, msg: String) {
        let msg = msg.trim_end();
        if level == libbpf_rs::PrintLevel::Warn {
            let mut captured = CAPTURED.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(lines) = captured.as_mut() {
                lines.extend(msg.lines().map(str::to_string));
            }
        }
        match level {
            libbpf_rs::PrintLevel::Warn => tracing::debug!(target: "libbpf", "{msg}"),
            _ => tracing::trace!(target: "libbpf", "{msg}"),
        }
    }
    libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, print)));
}

/// Runs `f` and returns, with its result, the lines libbpf warned while it
/// ran: a refused program's verifier log comes only this way.
pub fn capture_libbpf_warnings<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
    route_libbpf_logs();
    *CAPTURED.lock().unwrap_or_else(PoisonError::into_inner) = Some(Vec::new());
    let out = f();
    let lines = CAPTURED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .unwrap_or_default();
    (out, lines)
}

/// One generated skeleton module. The lint allowances for generated code
/// live here once, for every skeleton.
macro_rules! skeleton {
    ($(#[$doc:meta])* $name:ident, $file:literal) => {
        $(#[$doc])*
        #[allow(
            missing_debug_implementations,
            clippy::all,
            clippy::undocumented_unsafe_blocks,
            clippy::unwrap_used,
            clippy::expect_used,
            unsafe_op_in_unsafe_fn,
            rust_2018_idioms
        )]
        pub mod $name {
            include!(concat!(env!("OUT_DIR"), "/", $file));
        }
    };
}

skeleton!(
    /// `bpf/probe.bpf.c`: capability probes.
    probe,
    "probe.skel.rs"
);
skeleton!(
    /// `bpf/ept.bpf.c`: the EPT sampler (ageing tracepoint, fexit on the
    /// ageing functions, and an empty baseline program for the cost
    /// benchmark).
    ept,
    "ept.skel.rs"
);
skeleton!(
    /// `bpf/pmu.bpf.c`: per-(VM, tier) attribution of perf_event samples on
    /// vCPU threads.
    pmu,
    "pmu.skel.rs"
);
