//! The guest's kernel command line (`guest/cmdline.h`, docs/testguest.md).
//! Parsing goes through the guest's own C parser compiled for the host, so
//! a harness can check a command line before it boots a VM with it.

use std::ffi::{CStr, CString, c_char};
use std::fmt::Write as _;

use thiserror::Error;

/// Most hot sets (one per tier).
pub const MAX_SETS: usize = 8;
/// Most phases.
pub const MAX_PHASES: usize = 16;
/// Most windows in `deaf=` and in `lie=`.
pub const MAX_WINDOWS: usize = 8;
const ERR_LEN: usize = 120;

#[repr(C)]
#[derive(Clone, Copy)]
struct CPhase {
    weight: [u8; MAX_SETS],
    len: u64,
    seconds: u8,
    active: [u32; MAX_SETS],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CWindow {
    start: u32,
    len: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CParams {
    nsets: u32,
    hot: [u32; MAX_SETS],
    nphases: u32,
    phase: [CPhase; MAX_PHASES],
    loop_: u8,
    accesses: u64,
    report: u64,
    report_seconds: u8,
    poll: u32,
    seed: u64,
    rate: u64,
    quiet: u8,
    zipf_cont: [u8; MAX_SETS],
    nzipf: u32,
    zipf: [u32; MAX_SETS],
    ndeaf: u32,
    nlie: u32,
    deaf: [CWindow; MAX_WINDOWS],
    lie: [CWindow; MAX_WINDOWS],
    vmem: u8,
    err: [c_char; ERR_LEN],
}

unsafe extern "C" {
    fn tg_params_default(p: *mut CParams);
    fn tg_params_parse(cmdline: *const c_char, p: *mut CParams) -> i32;
}

/// How long a phase lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Length {
    /// This many accesses (exact).
    Accesses(u64),
    /// This many RTC seconds.
    Seconds(u64),
    /// Until the VM stops (last phase only).
    Forever,
}

/// One workload phase: percent of accesses per hot set (sum 100), and how
/// many pages of each set it touches (its first ones; 0 = all).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Phase {
    pub weights: Vec<u8>,
    pub len: Length,
    /// Per set, empty when every page is touched.
    pub active: Vec<u32>,
}

/// Page popularity inside a hot set (`zipf=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Zipf {
    /// Zipf exponent in thousandths (0: every page alike): rank 1 = the
    /// set's first page.
    Exponent(u32),
    /// `+`: the set continues the previous set's ranking (one popularity
    /// order over both, the previous set holding the head; this set takes
    /// no weight of its own).
    Continues,
}

impl Zipf {
    /// Largest exponent in thousandths.
    pub const MAX_MILLI: u32 = 4000;

    /// As written on the command line: `1.2`, `0.99`, `1`, `+`.
    pub fn token(self) -> String {
        match self {
            Zipf::Continues => "+".into(),
            Zipf::Exponent(m) if m % 1000 == 0 => (m / 1000).to_string(),
            Zipf::Exponent(m) => {
                let frac = format!("{:03}", m % 1000);
                format!("{}.{}", m / 1000, frac.trim_end_matches('0'))
            }
        }
    }
}

/// Seconds `[start, start + len)` of the guest's clock (the `s=` of its
/// tick lines, counted from the start of the workload): a `deaf=` or `lie=`
/// window, written `STARTs+LENs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub start: u32,
    pub len: u32,
}

impl Window {
    /// As written on the command line: `30s+20s`.
    pub fn token(self) -> String {
        format!("{}s+{}s", self.start, self.len)
    }

    /// Whether second `s` of the guest's clock is inside the window.
    pub fn contains(self, s: u64) -> bool {
        s >= u64::from(self.start) && s - u64::from(self.start) < u64::from(self.len)
    }

    /// First second after the window.
    pub fn end(self) -> u64 {
        u64::from(self.start) + u64::from(self.len)
    }
}

/// What the guest's virtio-mem driver does (`virtio_mem=`, guest/vmem.h).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VirtioMem {
    /// Follow the device's requested size (plug and unplug blocks).
    #[default]
    On,
    /// Leave the device alone, as a guest without the driver.
    Off,
    /// Set the device up but never send a request: plugged size stays.
    Mute,
    /// Send only requests the device answers with ERROR: nothing is plugged.
    Error,
}

impl VirtioMem {
    const ALL: [VirtioMem; 4] = [
        VirtioMem::On,
        VirtioMem::Off,
        VirtioMem::Mute,
        VirtioMem::Error,
    ];

    /// As written on the command line.
    pub fn token(self) -> &'static str {
        match self {
            VirtioMem::On => "on",
            VirtioMem::Off => "off",
            VirtioMem::Mute => "mute",
            VirtioMem::Error => "error",
        }
    }
}

/// How often the guest prints a `tg tick` line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Report {
    Accesses(u64),
    Seconds(u64),
    Off,
}

/// The guest's parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Params {
    /// Hot-set pages of set i (set i prefers tier i).
    pub hot: Vec<u32>,
    pub phases: Vec<Phase>,
    /// After the last phase start again at phase 0.
    pub loop_phases: bool,
    /// Stop the workload after this many accesses.
    pub accesses: Option<u64>,
    pub report: Report,
    /// Accesses between two balloon polls.
    pub poll: u32,
    pub seed: u64,
    /// Accesses per second, paced on the TSC; `None`: as fast as it runs.
    pub rate: Option<u64>,
    /// No `tg phase` lines (read the phase from the truth block instead).
    pub quiet: bool,
    /// Popularity per set (`zipf=`); sets past the end (or all, when
    /// empty) are uniform.
    pub zipf: Vec<Zipf>,
    /// `deaf=`: windows in which the balloon driver does nothing (reads no
    /// target, moves no page, writes no actual, serves no stats buffer).
    pub deaf: Vec<Window>,
    /// `lie=`: windows in which the stats the driver returns are false
    /// ([`crate::wire::lie_stats`]).
    pub lie: Vec<Window>,
    /// `virtio_mem=`: the virtio-mem driver's behaviour.
    pub virtio_mem: VirtioMem,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ParamsError {
    #[error("guest command line: {0}")]
    Invalid(String),
    #[error("guest command line contains a NUL byte")]
    Nul,
}

impl Default for Params {
    fn default() -> Self {
        let mut c = std::mem::MaybeUninit::<CParams>::zeroed();
        // SAFETY: tg_params_default writes every field of the struct, whose
        // layout matches the C one (checked by the layout test); zeroed is a
        // valid CParams anyway.
        let c = unsafe {
            tg_params_default(c.as_mut_ptr());
            c.assume_init()
        };
        Self::from_c(&c)
    }
}

impl Params {
    /// Parse a command line exactly as the guest does (over its defaults).
    pub fn parse(cmdline: &str) -> Result<Self, ParamsError> {
        let s = CString::new(cmdline).map_err(|_| ParamsError::Nul)?;
        let mut c = std::mem::MaybeUninit::<CParams>::zeroed();
        // SAFETY: `c` is a writable CParams (C layout, zero-initialised and
        // then filled by tg_params_default); `s` is NUL-terminated and lives
        // across the call.
        let (rc, c) = unsafe {
            tg_params_default(c.as_mut_ptr());
            let rc = tg_params_parse(s.as_ptr(), c.as_mut_ptr());
            (rc, c.assume_init())
        };
        if rc != 0 {
            // SAFETY: the C parser always NUL-terminates `err` within ERR_LEN.
            let msg = unsafe { CStr::from_ptr(c.err.as_ptr()) };
            return Err(ParamsError::Invalid(msg.to_string_lossy().into_owned()));
        }
        Ok(Self::from_c(&c))
    }

    fn from_c(c: &CParams) -> Self {
        let nsets = c.nsets as usize;
        let phases = c.phase[..c.nphases as usize]
            .iter()
            .map(|p| Phase {
                weights: p.weight[..nsets].to_vec(),
                active: if p.active.iter().all(|&a| a == 0) {
                    Vec::new()
                } else {
                    p.active[..nsets].to_vec()
                },
                len: match (p.len, p.seconds) {
                    (0, _) => Length::Forever,
                    (n, 0) => Length::Accesses(n),
                    (n, _) => Length::Seconds(n),
                },
            })
            .collect();
        Params {
            hot: c.hot[..nsets].to_vec(),
            phases,
            loop_phases: c.loop_ != 0,
            accesses: (c.accesses != 0).then_some(c.accesses),
            report: match (c.report, c.report_seconds) {
                (0, _) => Report::Off,
                (n, 0) => Report::Accesses(n),
                (n, _) => Report::Seconds(n),
            },
            poll: c.poll,
            seed: c.seed,
            rate: (c.rate != 0).then_some(c.rate),
            quiet: c.quiet != 0,
            zipf: (0..c.nzipf as usize)
                .map(|j| {
                    if c.zipf_cont[j] != 0 {
                        Zipf::Continues
                    } else {
                        Zipf::Exponent(c.zipf[j])
                    }
                })
                .collect(),
            deaf: windows(&c.deaf[..c.ndeaf as usize]),
            lie: windows(&c.lie[..c.nlie as usize]),
            virtio_mem: VirtioMem::ALL
                .get(usize::from(c.vmem))
                .copied()
                .unwrap_or_default(),
        }
    }

    /// The command line for these parameters (every key spelled out).
    pub fn to_cmdline(&self) -> String {
        let list = |v: &mut String, items: Vec<String>, sep: &str| v.push_str(&items.join(sep));
        let mut s = String::from("hot=");
        list(&mut s, self.hot.iter().map(u32::to_string).collect(), ",");
        s.push_str(" phases=");
        let phases = self
            .phases
            .iter()
            .map(|p| {
                let w: Vec<String> = p.weights.iter().map(u8::to_string).collect();
                let len = match p.len {
                    Length::Accesses(n) => n.to_string(),
                    Length::Seconds(n) => format!("{n}s"),
                    Length::Forever => "0".into(),
                };
                if p.active.is_empty() {
                    format!("{}@{len}", w.join("/"))
                } else {
                    let a: Vec<String> = p.active.iter().map(u32::to_string).collect();
                    format!("{}@{len}:{}", w.join("/"), a.join("/"))
                }
            })
            .collect();
        list(&mut s, phases, ",");
        let report = match self.report {
            Report::Accesses(n) => n.to_string(),
            Report::Seconds(n) => format!("{n}s"),
            Report::Off => "0".into(),
        };
        let _ = write!(
            s,
            " loop={} accesses={} report={report} poll={} seed={} rate={} quiet={}",
            u8::from(self.loop_phases),
            self.accesses.unwrap_or(0),
            self.poll,
            self.seed,
            self.rate.unwrap_or(0),
            u8::from(self.quiet)
        );
        if !self.zipf.is_empty() {
            s.push_str(" zipf=");
            list(&mut s, self.zipf.iter().map(|z| z.token()).collect(), ",");
        }
        for (key, w) in [("deaf", &self.deaf), ("lie", &self.lie)] {
            if !w.is_empty() {
                let _ = write!(s, " {key}=");
                list(&mut s, w.iter().map(|w| w.token()).collect(), ",");
            }
        }
        if self.virtio_mem != VirtioMem::On {
            let _ = write!(s, " virtio_mem={}", self.virtio_mem.token());
        }
        s
    }

    /// Check these parameters with the guest's parser.
    pub fn check(&self) -> Result<(), ParamsError> {
        Self::parse(&self.to_cmdline()).map(|_| ())
    }
}

fn windows(c: &[CWindow]) -> Vec<Window> {
    c.iter()
        .map(|w| Window {
            start: w.start,
            len: w.len,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrored_struct_matches_the_c_layout() {
        assert_eq!(crate::c_layout(3), size_of::<CPhase>());
        assert_eq!(crate::c_layout(4), size_of::<CParams>());
        assert_eq!(crate::c_layout(5), std::mem::offset_of!(CParams, err));
        assert_eq!(crate::c_layout(6), std::mem::offset_of!(CParams, seed));
        assert_eq!(crate::c_layout(11), std::mem::offset_of!(CParams, zipf));
        assert_eq!(crate::c_layout(13), std::mem::offset_of!(CParams, deaf));
        assert_eq!(crate::c_layout(14), std::mem::offset_of!(CParams, lie));
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let p = Params::default();
        assert_eq!(
            p.to_cmdline(),
            "hot=256,256 phases=80/20@100000,20/80@100000 loop=1 accesses=0 report=1s poll=2048 seed=1 rate=0 quiet=0"
        );
        assert_eq!(Params::parse("").unwrap(), p);
    }

    #[test]
    fn parses_every_key() {
        let p = Params::parse(
            " hot=0x10,32,8 phases=50/25/25@2k,0/100@3s:0/4/0,100@0 loop=0 accesses=1m report=500 poll=64 seed=7 rate=10k quiet=1\n",
        )
        .unwrap();
        assert_eq!(p.hot, vec![16, 32, 8]);
        assert_eq!(
            p.phases,
            vec![
                Phase {
                    weights: vec![50, 25, 25],
                    len: Length::Accesses(2000),
                    active: vec![],
                },
                Phase {
                    weights: vec![0, 100, 0],
                    len: Length::Seconds(3),
                    active: vec![0, 4, 0],
                },
                Phase {
                    weights: vec![100, 0, 0],
                    len: Length::Forever,
                    active: vec![],
                },
            ]
        );
        assert!(!p.loop_phases);
        assert_eq!(p.accesses, Some(1_000_000));
        assert_eq!(p.report, Report::Accesses(500));
        assert_eq!((p.poll, p.seed), (64, 7));
        assert_eq!((p.rate, p.quiet), (Some(10_000), true));
        // Round trip through the builder.
        assert_eq!(Params::parse(&p.to_cmdline()).unwrap(), p);
        assert_eq!(
            Params::parse("seed=0").unwrap().seed,
            1,
            "xorshift never leaves 0"
        );
        assert_eq!(Params::parse("report=0").unwrap().report, Report::Off);
    }

    #[test]
    fn parses_zipf_exponents_and_chains() {
        let p = Params::parse("hot=512,1536,64 zipf=0.99,+,1.2 phases=60/0/40@0:0/100/0").unwrap();
        assert_eq!(
            p.zipf,
            vec![Zipf::Exponent(990), Zipf::Continues, Zipf::Exponent(1200)]
        );
        assert!(
            p.to_cmdline().ends_with(" zipf=0.99,+,1.2"),
            "{}",
            p.to_cmdline()
        );
        assert_eq!(Params::parse(&p.to_cmdline()).unwrap(), p);
        for (text, milli) in [
            ("0", 0),
            ("1", 1000),
            ("0.6", 600),
            ("1.25", 1250),
            ("4", 4000),
        ] {
            let p = Params::parse(&format!("zipf={text}")).unwrap();
            assert_eq!(p.zipf, vec![Zipf::Exponent(milli)], "{text}");
            assert_eq!(Zipf::Exponent(milli).token(), text);
        }
        assert_eq!(
            Params::parse("zipf=0.050").unwrap().zipf,
            vec![Zipf::Exponent(50)]
        );
        // Fewer entries than sets: the rest stay uniform; none: no key.
        assert_eq!(Params::parse("zipf=1").unwrap().zipf.len(), 1);
        assert!(!Params::default().to_cmdline().contains("zipf"));
        // A chain's last set may shrink; its later set takes no weight.
        assert!(Params::parse("hot=8,8 zipf=1,+ phases=100/0@1k:8/3").is_ok());
    }

    #[test]
    fn parses_virtio_mem_modes() {
        assert_eq!(Params::default().virtio_mem, VirtioMem::On);
        assert!(!Params::default().to_cmdline().contains("virtio_mem"));
        for m in VirtioMem::ALL {
            let p = Params::parse(&format!("virtio_mem={}", m.token())).unwrap();
            assert_eq!(p.virtio_mem, m);
            assert_eq!(Params::parse(&p.to_cmdline()).unwrap(), p);
        }
        assert_eq!(
            Params::parse("virtio_mem=maybe"),
            Err(ParamsError::Invalid(
                "virtio_mem= wants on, off, mute or error: 'virtio_mem=maybe'".into()
            ))
        );
    }

    #[test]
    fn parses_deaf_and_lie_windows() {
        let p = Params::parse("deaf=30s+20s,120s+15s lie=0s+5s,5s+1s,0x10s+1ks").unwrap();
        let w = |start, len| Window { start, len };
        assert_eq!(p.deaf, vec![w(30, 20), w(120, 15)]);
        // Adjacent windows are allowed; numbers take hex and k as elsewhere.
        assert_eq!(p.lie, vec![w(0, 5), w(5, 1), w(16, 1000)]);
        let line = p.to_cmdline();
        assert!(
            line.ends_with(" deaf=30s+20s,120s+15s lie=0s+5s,5s+1s,16s+1000s"),
            "{line}"
        );
        assert_eq!(Params::parse(&line).unwrap(), p);
        // Eight windows is the most; none: no key.
        let eight: Vec<String> = (0..8).map(|i| format!("{}s+1s", i * 2)).collect();
        let p = Params::parse(&format!("deaf={}", eight.join(","))).unwrap();
        assert_eq!(p.deaf.len(), 8);
        assert_eq!(Params::parse(&p.to_cmdline()).unwrap(), p);
        assert!(!Params::default().to_cmdline().contains("deaf"));
        assert!(!Params::default().to_cmdline().contains("lie"));
        // The edges: in from `start`, out at `start + len`.
        let win = w(30, 20);
        assert!(!win.contains(29) && win.contains(30) && win.contains(49) && !win.contains(50));
        assert_eq!(win.end(), 50);
    }

    #[test]
    fn bad_windows_are_rejected_with_the_reason() {
        let nine: Vec<String> = (0..9).map(|i| format!("{}s+1s", i * 2)).collect();
        let nine = nine.join(",");
        let malformed = "window wants STARTs+LENs (seconds, LEN > 0)";
        let cases = [
            (
                format!("deaf={nine}"),
                "deaf= has more than 8 windows: '16s+1s'".to_string(),
            ),
            (
                format!("lie={nine}"),
                "lie= has more than 8 windows: '16s+1s'".to_string(),
            ),
            (
                "deaf=10s+10s,15s+1s".into(),
                "windows must be in order and not overlap: '15s+1s'".into(),
            ),
            (
                "lie=10s+10s,5s+1s".into(),
                "windows must be in order and not overlap: '5s+1s'".into(),
            ),
            ("deaf=".into(), format!("{malformed}: ''")),
            ("deaf=30s".into(), format!("{malformed}: '30s'")),
            ("deaf=30+20s".into(), format!("{malformed}: '30+20s'")),
            ("deaf=30s+20".into(), format!("{malformed}: '30s+20'")),
            ("deaf=30s+0s".into(), format!("{malformed}: '30s+0s'")),
            ("deaf=s+5s".into(), format!("{malformed}: 's+5s'")),
            ("deaf=+5s".into(), format!("{malformed}: '+5s'")),
            ("deaf=5s+".into(), format!("{malformed}: '5s+'")),
            ("deaf=5s+x".into(), format!("{malformed}: '5s+x'")),
            ("lie=1s+1s,".into(), format!("{malformed}: ''")),
            ("lie=-1s+1s".into(), format!("{malformed}: '-1s+1s'")),
            (
                "lie=4294967295s+1s".into(),
                format!("{malformed}: '4294967295s+1s'"),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(
                Params::parse(&input),
                Err(ParamsError::Invalid(want)),
                "{input}"
            );
        }
        // A window built in Rust goes through the same check.
        let p = Params {
            deaf: vec![Window { start: 5, len: 5 }, Window { start: 9, len: 1 }],
            ..Params::default()
        };
        assert!(p.check().is_err());
    }

    #[test]
    fn bad_input_is_rejected_with_the_reason() {
        let cases = [
            ("hot=1,x", "hot= wants page counts: 'x'"),
            ("hot=1,2,3,4,5,6,7,8,9", "hot= has more than 8 sets: '9'"),
            (
                "phases=80/30@1k",
                "phase weights must sum to 100: '80/30@1k'",
            ),
            ("phases=80/20", "phase wants W0/W1/...@LEN: '80/20'"),
            (
                "phases=80/20@1x",
                "phase length wants N accesses or Ns seconds: '80/20@1x'",
            ),
            (
                "phases=100@0,100@5",
                "only the last phase may have length 0 (forever)",
            ),
            (
                "hot=0,4 phases=50/50@1",
                "a phase sends accesses to a set with no hot pages",
            ),
            (
                "hot=4 phases=50/50@1",
                "a phase sends accesses to a set with no hot pages",
            ),
            (
                "hot=4,4 phases=50/50@1s:5/4",
                "a phase has more active pages than its hot set",
            ),
            (
                "phases=50/50@1s:",
                "phase active pages want A0/A1/... of up to 8 sets: '50/50@1s:'",
            ),
            (
                "phases=50/50@1s:1/x",
                "phase active pages want A0/A1/... of up to 8 sets: '50/50@1s:1/x'",
            ),
            ("loop=2", "bad value: 'loop=2'"),
            ("quiet=2", "bad value: 'quiet=2'"),
            ("rate=fast", "bad value: 'rate=fast'"),
            ("poll=0", "bad value: 'poll=0'"),
            ("accesses=-1", "bad value: 'accesses=-1'"),
            (
                "seed=99999999999999999999",
                "bad value: 'seed=99999999999999999999'",
            ),
            ("colour=red", "unknown key: 'colour'"),
            (
                "zipf=1.2345",
                "zipf= wants exponents 0 to 4 with up to 3 decimals, or +: '1.2345'",
            ),
            (
                "zipf=4.001",
                "zipf= wants exponents 0 to 4 with up to 3 decimals, or +: '4.001'",
            ),
            (
                "zipf=1,",
                "zipf= wants exponents 0 to 4 with up to 3 decimals, or +: ''",
            ),
            (
                "zipf=1.",
                "zipf= wants exponents 0 to 4 with up to 3 decimals, or +: '1.'",
            ),
            (
                "zipf=-1",
                "zipf= wants exponents 0 to 4 with up to 3 decimals, or +: '-1'",
            ),
            (
                "zipf=0x1",
                "zipf= wants exponents 0 to 4 with up to 3 decimals, or +: '0x1'",
            ),
            ("zipf=1,1,1", "zipf= has more sets than hot="),
            ("zipf=+,1", "zipf= set 0 cannot continue a previous set (+)"),
            (
                "zipf=1,+",
                "a set that continues a zipf ranking (+) takes no weight: give it to the chain's first set",
            ),
            (
                "hot=8,8 zipf=1,+ phases=100/0@1k:4/8",
                "in a zipf chain only the last set may touch fewer than all its pages",
            ),
            ("quiet", "cmdline wants key=value: 'quiet'"),
        ];
        for (input, want) in cases {
            assert_eq!(
                Params::parse(input),
                Err(ParamsError::Invalid(want.to_string())),
                "{input}"
            );
        }
        assert_eq!(Params::parse("a\0b"), Err(ParamsError::Nul));
        let mut p = Params::default();
        p.phases[0].weights = vec![90, 20];
        assert!(p.check().is_err());
    }
}
