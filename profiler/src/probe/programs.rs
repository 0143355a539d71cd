//! `tierd probe --programs`: every program of every BPF object tierd ships,
//! each loaded alone (autoload off for the others, so one refusal does not
//! hide another) and attached to its hook, then detached at once. The
//! kernel's verdict per program, for the kernels of the Linux bed.

use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};

use crate::bpf::{ept::EptSkelBuilder, pmu::PmuSkelBuilder, probe::ProbeSkelBuilder};
use crate::sampler::ept::{EptOptions, HostMode, configure};
use crate::sampler::pmu::events::EventType;
use crate::sampler::pmu::loader::{EventSpec, OpenOptions, PmuError, open_event};

/// Verifier log lines kept for a refused program: the end says why.
const LOG_TAIL: usize = 8;

/// Why the command cannot run at all.
#[derive(Debug, thiserror::Error)]
pub enum ProgramsError {
    #[error("bpf(BPF_PROG_LOAD) of a two-instruction socket filter: {0}; {1}")]
    NoBpf(std::io::Error, &'static str),
    #[error("open {object}: {message}")]
    Open {
        object: &'static str,
        message: String,
    },
}

/// The kernel's verdict on one program.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Verdict {
    pub object: String,
    pub program: String,
    pub section: String,
    /// The hook it was attached to (for perf_event: which event), or why
    /// it has none.
    pub attach_point: String,
    pub loaded: bool,
    /// None: the section names no hook (run through BPF_PROG_TEST_RUN only).
    pub attached: Option<bool>,
    pub error: Option<String>,
    /// Last lines of the verifier log (else of libbpf's warnings) when the
    /// load was refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub log: Vec<String>,
}

/// The whole report.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Programs {
    pub kernel: String,
    pub programs: Vec<Verdict>,
}

#[derive(Clone, Copy)]
enum Obj {
    Ept,
    Pmu,
    Probe,
}

impl Obj {
    const ALL: [Obj; 3] = [Obj::Ept, Obj::Pmu, Obj::Probe];

    fn file(self) -> &'static str {
        match self {
            Obj::Ept => "ept.bpf.o",
            Obj::Pmu => "pmu.bpf.o",
            Obj::Probe => "probe.bpf.o",
        }
    }
}

/// Runs every load and attach. Errors only when BPF itself is unusable.
pub fn run(kernel: String) -> Result<Programs, ProgramsError> {
    bpf_usable()?;
    let mut programs = Vec::new();
    for obj in Obj::ALL {
        for (name, section) in list(obj)? {
            programs.push(match visit(obj, Some(&name)) {
                Ok(Visit::Verdict(v)) => v,
                Ok(Visit::List(_)) | Err(_) => Verdict {
                    object: obj.file().into(),
                    program: name,
                    attach_point: section.clone(),
                    section,
                    loaded: false,
                    attached: None,
                    error: Some(format!("could not reopen {}", obj.file())),
                    log: Vec::new(),
                },
            });
        }
    }
    Ok(Programs { kernel, programs })
}

fn list(obj: Obj) -> Result<Vec<(String, String)>, ProgramsError> {
    match visit(obj, None)? {
        Visit::List(l) => Ok(l),
        Visit::Verdict(_) => Ok(Vec::new()),
    }
}

enum Visit {
    List(Vec<(String, String)>),
    Verdict(Verdict),
}

/// Opens a fresh copy of `obj`, configured as tierd configures it, and
/// lists its programs or (with `program`) loads and attaches that one.
fn visit(obj: Obj, program: Option<&str>) -> Result<Visit, ProgramsError> {
    let mut storage = MaybeUninit::uninit();
    let open_err = |e: libbpf_rs::Error| ProgramsError::Open {
        object: obj.file(),
        message: format!("{e:#}"),
    };
    Ok(match obj {
        Obj::Ept => {
            let mut open = EptSkelBuilder::default()
                .open(&mut storage)
                .map_err(open_err)?;
            // The host's SPTE masks where it has them, else the defaults.
            let masks = HostMode::detect_host()
                .and_then(|m| m.tracepoint_masks())
                .unwrap_or(EptOptions::default().masks);
            let options = EptOptions {
                masks,
                ..EptOptions::default()
            };
            configure(&mut open, &options).map_err(|e| ProgramsError::Open {
                object: obj.file(),
                message: e.to_string(),
            })?;
            visit_open(obj, open, program)
        }
        Obj::Pmu => visit_open(
            obj,
            PmuSkelBuilder::default()
                .open(&mut storage)
                .map_err(open_err)?,
            program,
        ),
        Obj::Probe => visit_open(
            obj,
            ProbeSkelBuilder::default()
                .open(&mut storage)
                .map_err(open_err)?,
            program,
        ),
    })
}

fn visit_open<'o, O: OpenSkel<'o>>(obj: Obj, mut open: O, program: Option<&str>) -> Visit {
    let Some(program) = program else {
        let progs = open.open_object().progs();
        return Visit::List(
            progs
                .map(|p| {
                    let text = |s: &std::ffi::OsStr| s.to_string_lossy().into_owned();
                    (text(p.name()), text(p.section()))
                })
                .collect(),
        );
    };
    let mut section = String::new();
    for mut p in open.open_object_mut().progs_mut() {
        let this = p.name() == program;
        if this {
            section = p.section().to_string_lossy().into_owned();
        }
        p.set_autoload(this);
    }
    let mut v = Verdict {
        object: obj.file().into(),
        program: program.into(),
        attach_point: section.replacen('/', " ", 1),
        section,
        loaded: false,
        attached: None,
        error: None,
        log: Vec::new(),
    };
    let (loaded, warnings) = crate::bpf::capture_libbpf_warnings(|| open.load());
    let skel = match loaded {
        Ok(skel) => skel,
        Err(e) => {
            v.error = Some(format!("load: {}", describe(&e)));
            v.log = log_tail(&warnings, program);
            return Visit::Verdict(v);
        }
    };
    v.loaded = true;
    if let Some(prog) = skel.object().progs_mut().find(|p| p.name() == program) {
        attach(&prog, &mut v);
    }
    Visit::Verdict(v)
}

/// Attaches by section: `perf_event` to an event on this thread, a named
/// hook through libbpf's auto-attach; the link is dropped at once.
fn attach(prog: &libbpf_rs::ProgramMut<'_>, v: &mut Verdict) {
    let result = if v.section == "perf_event" {
        let Some((counter, event)) = perf_event(v) else {
            return;
        };
        v.attach_point = format!("perf_event: {event} on this thread (not enabled)");
        let link = prog.attach_perf_event(counter.file().as_raw_fd());
        // The link closes the event's fd too: close it first, as
        // PmuPrograms does, so that it is closed once by each owner.
        drop(counter);
        link.map(drop)
    } else if v.section.contains('/') {
        prog.attach().map(drop)
    } else {
        v.attach_point = format!("none: SEC(\"{}\") names no hook (test run only)", v.section);
        return;
    };
    v.attached = Some(result.is_ok());
    if let Err(e) = result {
        v.error = Some(format!("attach: {}", describe(&e)));
    }
}

/// A sampling event on this thread for the perf_event program: hardware
/// cycles, else the software cpu-clock (no PMU, e.g. under QEMU TCG).
fn perf_event(v: &mut Verdict) -> Option<(perf_event_open::count::Counter, String)> {
    let opts = OpenOptions {
        guest_only: false,
        sample_period: 1_000_000,
        sample_addr: false,
        enabled: false,
    };
    let cycles = EventSpec::new("cycles", EventType::Hardware, 0);
    let hw_err = match open_event(0, &cycles, &opts) {
        Ok(c) => return Some((c, "cycles (hardware)".into())),
        Err(e) => e,
    };
    let why = match &hw_err {
        PmuError::PerfOpen {
            errno: Some(n),
            message,
            ..
        } => errno_name(*n).map_or_else(|| message.clone(), str::to_string),
        other => other.to_string(),
    };
    let clock = EventSpec::new("cpu-clock", EventType::Software, 0);
    match open_event(0, &clock, &opts) {
        Ok(c) => Some((c, format!("cpu-clock (software; cycles: {why})"))),
        Err(e) => {
            v.attached = Some(false);
            v.error = Some(format!("attach: no event opens: {hw_err}; {e}"));
            None
        }
    }
}

fn describe(e: &libbpf_rs::Error) -> String {
    let text = format!("{e:#}");
    let errno = text
        .rfind("(os error ")
        .and_then(|i| text[i + 10..].split(')').next())
        .and_then(|n| n.parse::<i32>().ok());
    match errno.and_then(errno_name) {
        Some(name) => format!("{name}: {text}"),
        None => text,
    }
}

fn errno_name(n: i32) -> Option<&'static str> {
    Some(match n {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EACCES => "EACCES",
        libc::EINVAL => "EINVAL",
        libc::E2BIG => "E2BIG",
        libc::EBUSY => "EBUSY",
        libc::ENOMEM => "ENOMEM",
        libc::ENOSPC => "ENOSPC",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        524 => "ENOTSUPP",
        _ => return None,
    })
}

/// The verifier log's last lines when libbpf printed one, else libbpf's
/// warnings about `program` (e.g. a missing attach target).
fn log_tail(warnings: &[String], program: &str) -> Vec<String> {
    let begin = warnings
        .iter()
        .rposition(|l| l.contains("BEGIN PROG LOAD LOG"));
    let end = warnings
        .iter()
        .rposition(|l| l.contains("END PROG LOAD LOG"));
    let lines: Vec<&String> = match (begin, end) {
        (Some(b), Some(e)) if b < e => warnings[b + 1..e].iter().collect(),
        _ => {
            let tag = format!("'{program}'");
            warnings.iter().filter(|l| l.contains(&tag)).collect()
        }
    };
    let lines: Vec<&String> = lines.into_iter().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(LOG_TAIL)..]
        .iter()
        .map(|l| l.trim_start_matches("libbpf: ").to_string())
        .collect()
}

/// A trivial socket filter loads wherever bpf() works and is permitted.
fn bpf_usable() -> Result<(), ProgramsError> {
    // mov r0, 0; exit (struct bpf_insn, little-endian, registers 0).
    let insns: [u64; 2] = [0xb7, 0x95];
    let name = c"tierd_probe";
    // SAFETY: `insns` is two valid 8-byte bpf_insn, alive for the call;
    // the strings are NUL-terminated; null opts are allowed.
    let fd = unsafe {
        libbpf_rs::libbpf_sys::bpf_prog_load(
            libbpf_rs::libbpf_sys::BPF_PROG_TYPE_SOCKET_FILTER,
            name.as_ptr(),
            c"GPL".as_ptr(),
            insns.as_ptr().cast(),
            2,
            std::ptr::null_mut(),
        )
    };
    if fd >= 0 {
        // SAFETY: the fd was just returned to us and is closed once.
        unsafe { libc::close(fd) };
        return Ok(());
    }
    let err = std::io::Error::from_raw_os_error(-fd);
    let hint = match -fd {
        libc::ENOSYS => "the kernel has no bpf() (CONFIG_BPF_SYSCALL off)",
        libc::EPERM | libc::EACCES => "not permitted: run as root (CAP_BPF, CAP_PERFMON)",
        _ => "BPF is unusable here",
    };
    Err(ProgramsError::NoBpf(err, hint))
}

impl Programs {
    /// The text table of `tierd probe --programs`.
    pub fn render(&self) -> String {
        let yes_no = |b: bool| if b { "yes" } else { "no" };
        let rows: Vec<[String; 6]> = self
            .programs
            .iter()
            .map(|v| {
                [
                    v.object.clone(),
                    v.program.clone(),
                    v.attach_point.clone(),
                    yes_no(v.loaded).into(),
                    match v.attached {
                        Some(a) => yes_no(a).into(),
                        None if v.loaded => "n/a".into(),
                        None => "-".into(),
                    },
                    v.error.clone().unwrap_or_default(),
                ]
            })
            .collect();
        let head = ["object", "program", "attach point", "load", "attach", "why"];
        let mut width = head.map(str::len);
        for r in &rows {
            for (w, c) in width.iter_mut().zip(r) {
                *w = (*w).max(c.len());
            }
        }
        let line = |cells: [&str; 6]| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i == 5 {
                    s.push_str(c);
                } else {
                    s.push_str(&format!("{c:w$}  ", w = width[i]));
                }
            }
            s.trim_end().to_string() + "\n"
        };
        let mut out = line(head);
        for (r, v) in rows.iter().zip(&self.programs) {
            out.push_str(&line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]]));
            for l in &v.log {
                out.push_str(&format!("    | {l}\n"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tail_keeps_the_end_of_the_verifier_log() {
        let mut w = vec!["libbpf: prog 'p': BPF program load failed: EACCES".to_string()];
        w.push("libbpf: prog 'p': -- BEGIN PROG LOAD LOG --".into());
        w.extend((0..20).map(|i| format!("{i}: insn")));
        w.push("R1 invalid mem access 'scalar'".into());
        w.push("-- END PROG LOAD LOG --".into());
        w.push("libbpf: failed to load object 'x'".into());
        let tail = log_tail(&w, "p");
        assert_eq!(tail.len(), LOG_TAIL);
        assert_eq!(tail[LOG_TAIL - 1], "R1 invalid mem access 'scalar'");
    }

    #[test]
    fn log_tail_without_a_log_keeps_the_program_s_warnings() {
        let w = [
            "libbpf: prog 'p': failed to load: -EPERM".to_string(),
            "libbpf: failed to load object 'x'".into(),
        ];
        assert_eq!(log_tail(&w, "p"), ["prog 'p': failed to load: -EPERM"]);
    }
}
