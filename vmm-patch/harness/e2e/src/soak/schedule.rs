//! The seeded fault schedule: which fault, when. Every kind comes once in
//! each round, in a seeded order, so a run long enough for one round
//! injects every kind.

/// A fault the soak injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `kill -9` of tierd, started again at once.
    KillTierd,
    /// `kill -9` of VM b's vhost-user balloon backend, started again 1 s later.
    KillBackend,
    /// SIGSTOP of a VMM for longer than tierd's API timeout, then SIGCONT.
    StopVmm,
    /// `kill -9` of a VMM while its balloon moves, booted again 3 s later.
    KillVmMidMove,
    /// 64 idle and 16 garbage-writing clients on the backend's control socket.
    ControlFlood,
    /// 200 clients on tierd's socket, half of them writing garbage.
    TierdFlood,
    /// A watcher that stops reading for 10 s.
    StalledWatcher,
    /// VM a's guest ignores its balloon for 10 s (`deaf=`, set at boot).
    GuestDeaf,
    /// VM b's guest reports false stats for 10 s (`lie=`, set at boot).
    GuestLies,
}

pub const ALL: [Kind; 9] = [
    Kind::KillTierd,
    Kind::KillBackend,
    Kind::StopVmm,
    Kind::KillVmMidMove,
    Kind::ControlFlood,
    Kind::TierdFlood,
    Kind::StalledWatcher,
    Kind::GuestDeaf,
    Kind::GuestLies,
];

impl Kind {
    /// The name `--faults` takes.
    pub fn key(self) -> &'static str {
        match self {
            Kind::KillTierd => "kill-tierd",
            Kind::KillBackend => "kill-backend",
            Kind::StopVmm => "stop-vmm",
            Kind::KillVmMidMove => "kill-vm",
            Kind::ControlFlood => "control-flood",
            Kind::TierdFlood => "tierd-flood",
            Kind::StalledWatcher => "stalled-watcher",
            Kind::GuestDeaf => "guest-deaf",
            Kind::GuestLies => "guest-lies",
        }
    }

    /// Injected by the soak at run time; the guest's own windows are set
    /// on its command line instead.
    pub fn injected(self) -> bool {
        !matches!(self, Kind::GuestDeaf | Kind::GuestLies)
    }

    pub fn parse(key: &str) -> Result<Kind, String> {
        ALL.into_iter()
            .find(|k| k.key() == key)
            .ok_or_else(|| format!("no fault {key:?}; known: {}", ALL.map(Kind::key).join(", ")))
    }

    /// Aimed at one VM (the others act on tierd or the backend).
    pub fn per_vm(self) -> bool {
        matches!(self, Kind::StopVmm | Kind::KillVmMidMove)
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::KillTierd => "kill -9 tierd",
            Kind::KillBackend => "kill -9 backend",
            Kind::StopVmm => "SIGSTOP vmm 8 s",
            Kind::KillVmMidMove => "kill -9 vmm mid-move",
            Kind::ControlFlood => "control-socket flood",
            Kind::TierdFlood => "tierd-socket flood",
            Kind::StalledWatcher => "stalled watcher",
            Kind::GuestDeaf => "guest deaf 10 s",
            Kind::GuestLies => "guest lies 10 s",
        }
    }
}

/// One planned fault: at `at_s` seconds into the run, on VM `vm`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Planned {
    pub at_s: f64,
    pub kind: Kind,
    pub vm: usize,
}

/// xorshift64*: small, seeded, the same sequence everywhere.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (self.next() >> 11) as f64 / (1u64 << 53) as f64 * (hi - lo)
    }
}

/// Faults of `kinds` from `warmup_s` until `run_s - tail_s`, `gap` seconds
/// apart (drawn from [gap_lo, gap_hi)), in seeded rounds.
pub fn plan(
    seed: u64,
    kinds: &[Kind],
    run_s: f64,
    warmup_s: f64,
    tail_s: f64,
    gap: (f64, f64),
) -> Vec<Planned> {
    let mut rng = Rng::new(seed);
    let kinds: Vec<Kind> = kinds.iter().copied().filter(|k| k.injected()).collect();
    let mut out = Vec::new();
    let mut round: Vec<Kind> = Vec::new();
    let mut t = warmup_s;
    while t < run_s - tail_s {
        if round.is_empty() {
            if kinds.is_empty() {
                break;
            }
            round = kinds.to_vec();
            // Fisher-Yates with the seeded generator.
            for i in (1..round.len()).rev() {
                let j = (rng.next() % (i as u64 + 1)) as usize;
                round.swap(i, j);
            }
        }
        let kind = round.remove(0);
        // Only VM b has a vhost-user backend; other kinds pick a VM.
        let drawn = (rng.next() % 2) as usize;
        let vm = match kind {
            Kind::KillBackend | Kind::ControlFlood => 1,
            _ => drawn,
        };
        out.push(Planned { at_s: t, kind, vm });
        t += rng.range(gap.0, gap.1);
    }
    out
}

/// The guests' windows, in guest seconds: `deaf=` for VM a and `lie=` for
/// VM b, 10 s each, somewhere in the first 60 % of the run after warm-up
/// (the guest's clock starts about when the soak's does, a few seconds
/// earlier).
pub fn guest_windows(seed: u64, kinds: &[Kind], run_s: f64, warmup_s: f64) -> [String; 2] {
    let mut rng = Rng::new(seed ^ 0x0067_7565_7374);
    let mut at = || rng.range(warmup_s + 10.0, (run_s * 0.6).max(warmup_s + 11.0)) as u64;
    let (deaf, lie) = (at(), at());
    [
        if kinds.contains(&Kind::GuestDeaf) {
            format!("deaf={deaf}s+10s")
        } else {
            String::new()
        },
        if kinds.contains(&Kind::GuestLies) {
            format!("lie={lie}s+10s")
        } else {
            String::new()
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_schedule_and_a_round_has_every_kind() {
        let a = plan(7, &ALL, 600.0, 20.0, 15.0, (12.0, 25.0));
        assert_eq!(a, plan(7, &ALL, 600.0, 20.0, 15.0, (12.0, 25.0)));
        assert_ne!(a, plan(8, &ALL, 600.0, 20.0, 15.0, (12.0, 25.0)));
        let injected: Vec<Kind> = ALL.into_iter().filter(|k| k.injected()).collect();
        let mut first: Vec<Kind> = a.iter().take(injected.len()).map(|p| p.kind).collect();
        first.sort();
        assert_eq!(first, injected);
        assert!(a.windows(2).all(|w| w[1].at_s - w[0].at_s >= 12.0));
        assert!(
            a.iter()
                .all(|p| p.at_s >= 20.0 && p.at_s < 585.0 && p.vm < 2)
        );
    }

    #[test]
    fn a_short_run_still_gets_faults() {
        let a = plan(1, &ALL, 90.0, 15.0, 10.0, (9.0, 12.0));
        assert!(a.len() >= 5, "{a:?}");
    }

    #[test]
    fn faults_can_be_chosen_by_name() {
        let only = [Kind::parse("kill-backend").unwrap()];
        let a = plan(1, &only, 120.0, 15.0, 10.0, (9.0, 12.0));
        assert!(!a.is_empty() && a.iter().all(|p| p.kind == Kind::KillBackend));
        assert!(Kind::parse("nope").unwrap_err().contains("kill-tierd"));
        for k in ALL {
            assert_eq!(Kind::parse(k.key()), Ok(k));
        }
    }
}
