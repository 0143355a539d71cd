//! The `fuzz` bench's engine: seeded, structure-aware generation of inputs
//! for the parsers that read data from outside tierd's trust boundary,
//! each case run under `catch_unwind`, with memory read from
//! /proc/self/status. The bench binary (`src/bin/fuzz.rs`) prints the
//! tables; `docs/fuzz.md` says what is fuzzed and what was found.

pub mod mutate;
pub mod rng;
pub mod targets;

use std::cell::{Cell, RefCell};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::Instant;

pub use rng::Rng;

/// How a parser took one input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Parsed (and, where tierd goes on, used) without error.
    Accepted,
    /// Refused with a clean error.
    Rejected,
}

/// One parser under test.
pub trait Target {
    fn name(&self) -> &'static str;
    /// One input into `out` (empty on entry); `big` asks for an input of
    /// about 1 MiB (long strings, many elements, deep nesting).
    fn generate(&mut self, rng: &mut Rng, big: bool, out: &mut Vec<u8>);
    /// Runs the real parser, and what tierd does with its result.
    fn run(&mut self, input: &[u8]) -> Verdict;
    /// Anything the table should say besides the counts.
    fn notes(&self) -> String {
        String::new()
    }
}

/// A panic: the case, its message and where the input was saved.
#[derive(Debug, Clone)]
pub struct Panic {
    pub case: u64,
    pub message: String,
    pub input: Vec<u8>,
    pub saved: Option<PathBuf>,
}

/// What one target's run found.
#[derive(Debug, Clone)]
pub struct Report {
    pub name: &'static str,
    pub seed: u64,
    pub cases: u64,
    pub accepted: u64,
    pub rejected: u64,
    pub panics: Vec<Panic>,
    /// Panics beyond the ones kept in `panics`.
    pub panic_count: u64,
    /// Wall time of generation + parsing, s.
    pub secs: f64,
    /// Seconds per batch: generating and parsing, and generating only.
    pub batch_secs: Vec<f64>,
    pub gen_batch_secs: Vec<f64>,
    /// Largest input, bytes; inputs of at least 1 MiB.
    pub max_input: usize,
    pub big_inputs: u64,
    /// VmRSS before, VmRSS after, and the peak (VmHWM, reset before the
    /// run where the kernel allows) above VmRSS before, KiB.
    pub rss_before_kib: u64,
    pub rss_after_kib: u64,
    pub peak_growth_kib: u64,
    pub hwm_reset: bool,
    /// The target's own remarks ([`Target::notes`]).
    pub notes: String,
}

/// Panics kept (with their inputs) per target.
const KEEP_PANICS: usize = 10;
/// One case in this many is a big one (~1 MiB).
pub const BIG_EVERY: usize = 1000;

thread_local! {
    static IN_CASE: Cell<bool> = const { Cell::new(false) };
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// A panic hook that records panics of fuzz cases (on this thread) and
/// leaves every other panic to the hook that was there.
fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_CASE.with(Cell::get) {
                LAST_PANIC.with(|l| *l.borrow_mut() = Some(info.to_string()));
            } else {
                previous(info);
            }
        }));
    });
}

/// Runs one input under `catch_unwind`: the verdict, or the panic message.
pub fn run_case(target: &mut dyn Target, input: &[u8]) -> Result<Verdict, String> {
    install_hook();
    IN_CASE.with(|c| c.set(true));
    let r = catch_unwind(AssertUnwindSafe(|| target.run(input)));
    IN_CASE.with(|c| c.set(false));
    r.map_err(|_| {
        LAST_PANIC
            .with(|l| l.borrow_mut().take())
            .unwrap_or_else(|| "(no message)".into())
    })
}

/// The per-target seed: the same cases whether run alone or with others.
pub fn target_seed(seed: u64, name: &str) -> u64 {
    name.bytes().fold(seed ^ 0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Generates case `i` of a target's stream into `out`.
fn generate(target: &mut dyn Target, rng: &mut Rng, i: u64, out: &mut Vec<u8>) -> bool {
    out.clear();
    let big = i % BIG_EVERY as u64 == BIG_EVERY as u64 - 1;
    target.generate(rng, big, out);
    big
}

/// Fields of /proc/self/status, KiB: (VmRSS, VmHWM).
pub fn rss_kib() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Resets VmHWM to the current RSS (`echo 5 > /proc/self/clear_refs`, a
/// per-process knob); false where the kernel refuses.
pub fn reset_hwm() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Escaped text of an input, at most `max` bytes of it.
pub fn escaped(input: &[u8], max: usize) -> String {
    let head = &input[..input.len().min(max)];
    let mut s = head.escape_ascii().to_string();
    if input.len() > max {
        s.push_str(&format!("... ({} bytes)", input.len()));
    }
    s
}

/// Fuzzes `target` with `cases` inputs from `seed`, timing batches of
/// `batch`; panicking inputs are saved under `save` if given. `tick` is
/// called after every batch (progress).
pub fn fuzz(
    target: &mut dyn Target,
    seed: u64,
    cases: u64,
    batch: u64,
    save: Option<&Path>,
    tick: &mut dyn FnMut(),
) -> Report {
    let batch = batch.max(1);
    let name = target.name();
    let tseed = target_seed(seed, name);
    // Baseline first: the same stream, generated only.
    let mut rng = Rng::new(tseed);
    let mut buf = Vec::new();
    let mut gen_batch_secs = Vec::new();
    let mut i = 0;
    while i < cases {
        let n = batch.min(cases - i);
        let t = Instant::now();
        for k in i..i + n {
            generate(target, &mut rng, k, &mut buf);
            std::hint::black_box(&buf);
        }
        gen_batch_secs.push(t.elapsed().as_secs_f64());
        i += n;
    }
    buf = Vec::new();
    let (rss_before, _) = rss_kib();
    let hwm_reset = reset_hwm();
    let mut r = Report {
        name,
        seed,
        cases,
        accepted: 0,
        rejected: 0,
        panics: Vec::new(),
        panic_count: 0,
        secs: 0.0,
        batch_secs: Vec::new(),
        gen_batch_secs,
        max_input: 0,
        big_inputs: 0,
        rss_before_kib: rss_before,
        rss_after_kib: 0,
        peak_growth_kib: 0,
        hwm_reset,
        notes: String::new(),
    };
    let mut rng = Rng::new(tseed);
    let start = Instant::now();
    let mut i = 0;
    while i < cases {
        let n = batch.min(cases - i);
        let t = Instant::now();
        for k in i..i + n {
            if generate(target, &mut rng, k, &mut buf) {
                r.big_inputs += 1;
            }
            r.max_input = r.max_input.max(buf.len());
            match run_case(target, &buf) {
                Ok(Verdict::Accepted) => r.accepted += 1,
                Ok(Verdict::Rejected) => r.rejected += 1,
                Err(message) => {
                    r.panic_count += 1;
                    if r.panics.len() < KEEP_PANICS {
                        let saved = save.and_then(|dir| {
                            let p = dir.join(format!("{name}-seed{seed}-case{k}.bin"));
                            std::fs::write(&p, &buf).ok().map(|()| p)
                        });
                        r.panics.push(Panic {
                            case: k,
                            message,
                            input: buf.clone(),
                            saved,
                        });
                    }
                }
            }
        }
        r.batch_secs.push(t.elapsed().as_secs_f64());
        i += n;
        tick();
    }
    r.secs = start.elapsed().as_secs_f64();
    drop(buf);
    let (rss_after, hwm) = rss_kib();
    r.rss_after_kib = rss_after;
    r.peak_growth_kib = hwm.saturating_sub(rss_before);
    r.notes = target.notes();
    r
}

/// True when this build panics on integer overflow (debug, or a profile
/// with `overflow-checks`): only then are silent wrap-arounds found.
pub fn overflow_checks() -> bool {
    install_hook();
    IN_CASE.with(|c| c.set(true));
    let r = catch_unwind(|| std::hint::black_box(u64::MAX) + std::hint::black_box(1u64));
    IN_CASE.with(|c| c.set(false));
    LAST_PANIC.with(|l| l.borrow_mut().take());
    r.is_err()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_accepts_and_rejects_and_never_panics() {
        let dir = tempfile::tempdir().unwrap();
        for mut t in targets::all() {
            let r = fuzz(t.as_mut(), 1, 1000, 250, Some(dir.path()), &mut || {});
            for p in &r.panics {
                eprintln!(
                    "{} case {}: {}\n  input: {}",
                    r.name,
                    p.case,
                    p.message,
                    escaped(&p.input, 300)
                );
            }
            assert_eq!(r.panic_count, 0, "{} panicked", r.name);
            assert_eq!(r.accepted + r.rejected, 1000, "{}", r.name);
            assert!(r.accepted > 0, "{}: nothing accepted", r.name);
            assert!(r.rejected > 0, "{}: nothing rejected", r.name);
            assert_eq!(r.big_inputs, 1, "{}", r.name);
            assert!(r.max_input >= 64 << 10, "{}: {}", r.name, r.max_input);
            assert_eq!((r.batch_secs.len(), r.gen_batch_secs.len()), (4, 4));
        }
    }

    #[test]
    fn a_panicking_parser_is_caught_and_its_input_saved() {
        struct Boom;
        impl Target for Boom {
            fn name(&self) -> &'static str {
                "boom"
            }
            fn generate(&mut self, rng: &mut Rng, _big: bool, out: &mut Vec<u8>) {
                out.push(rng.byte() % 4);
            }
            fn run(&mut self, input: &[u8]) -> Verdict {
                match input[0] {
                    0 => panic!("boom on zero"),
                    1 => Verdict::Rejected,
                    _ => Verdict::Accepted,
                }
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let r = fuzz(&mut Boom, 5, 200, 100, Some(dir.path()), &mut || {});
        assert!(r.panic_count > 20, "{}", r.panic_count);
        assert_eq!(r.accepted + r.rejected + r.panic_count, 200);
        let p = &r.panics[0];
        assert!(p.message.contains("boom on zero"), "{}", p.message);
        assert_eq!(std::fs::read(p.saved.as_ref().unwrap()).unwrap(), vec![0]);
        // The same seed gives the same cases.
        let again = fuzz(&mut Boom, 5, 200, 100, None, &mut || {});
        assert_eq!(again.panic_count, r.panic_count);
        assert_eq!(again.accepted, r.accepted);
    }

    #[test]
    fn rss_is_readable_and_escaping_is_bounded() {
        let (rss, hwm) = rss_kib();
        assert!(rss > 0 && hwm >= rss, "{rss} {hwm}");
        assert_eq!(escaped(b"a\n\xff", 10), "a\\n\\xff");
        assert!(escaped(&[b'x'; 100], 5).ends_with("(100 bytes)"));
        // Tests build with overflow checks.
        assert!(overflow_checks());
    }
}
