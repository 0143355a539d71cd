//! A row of [`Shape`]s as the PVH test guest's command line, and where its
//! phase changes fall in wall-clock time.
//!
//! The guest touches pages at random: hot set i holds the pages of tier i.
//! The VM's first zone, `sys`, holds the guest's own memory (image, page
//! tables, stack, rings, hot-set arrays) and no work pages, so the host
//! sees in `dram` and `slow` exactly the pages the truth counts; hot set 0
//! stays empty and the work sets are [`WORK`].
//! a phase makes the step's pages of each set active and sends each set a
//! share of the accesses proportional to pages x repeat (integer percent,
//! summing to 100; the truth is measured, so rounding only moves the
//! target). A row's [`Skew`] is the guest's `zipf=`, fixed at boot: every
//! step of a row has the same one. `Skew::Chain` is `zipf=0,S,+`: one
//! ranking over the dram set then the slow set, all accesses drawn through
//! the dram set (weight 100), so the split is the ranking's. Phases are timed in RTC seconds, and cloud-hypervisor's CMOS
//! RTC reads the host's CLOCK_REALTIME, so a phase ends at a whole
//! wall-clock second: phase 0 lasts `first_secs` RTC second changes after
//! the guest starts its workload, every later phase but the last
//! `per_step` intervals (whole seconds), the last one forever.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tier_testguest::params::{Length, Params, Phase, Report, VirtioMem, Zipf};

use super::{Schedule, Shape, Skew, WorkloadError};

/// Zones (= hot sets) of the VM: `sys`, `dram`, `slow`.
pub const SETS: usize = 3;
/// Hot set (and tier) index of the dram and the slow work pages.
pub const WORK: [usize; 2] = [1, 2];

/// Least time between the first RTC second change the host sees and the
/// row start: the host needs it to adopt the VM into the registry.
pub const SETUP_MARGIN: Duration = Duration::from_millis(200);

/// The guest's phases for one row and how they line up with the schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct GuestPlan {
    pub params: Params,
    /// RTC second changes phase 0 lasts (its first second is partial).
    pub first_secs: u64,
    /// Seconds of every later phase but the last.
    pub step_secs: u64,
    /// Row start after the guest's first RTC second change (B1): the change
    /// to step 1 is at B1 + first_secs - 1 s = row start + change_offset(1).
    pub start_after_b1: Duration,
}

/// Percent of accesses per set for `s`, summing to 100 (largest remainder;
/// a tier with accesses gets at least 1 %).
pub fn weights(s: &Shape) -> Result<[u8; 2], WorkloadError> {
    let acc = s.accesses_per_round();
    let total: u64 = acc.iter().sum();
    if total == 0 {
        return Err(WorkloadError::Shape {
            shape: s.label(),
            why: "no accesses".into(),
        });
    }
    let mut w = [0u64; 2];
    let mut rem = [0u64; 2];
    for i in 0..2 {
        w[i] = acc[i] * 100 / total;
        rem[i] = acc[i] * 100 % total;
    }
    let mut left = 100 - w.iter().sum::<u64>();
    while left > 0 {
        let i = if rem[0] >= rem[1] { 0 } else { 1 };
        w[i] += 1;
        rem[i] = 0;
        left -= 1;
    }
    for i in 0..2 {
        if acc[i] > 0 && w[i] == 0 {
            w[i] = 1;
            w[1 - i] -= 1;
        }
    }
    Ok([w[0] as u8, w[1] as u8])
}

/// Seconds in `d` when it is whole.
fn whole_secs(d: Duration) -> Option<u64> {
    (d.subsec_nanos() == 0).then_some(d.as_secs())
}

/// Accesses between two RTC (and balloon) polls of the guest: at the
/// fidelity rate a phase starts within 50 ms of its RTC second.
pub const POLL: u32 = 500;

/// The guest's command line for `steps` under `schedule`, its accesses
/// paced to `rate` per second. It prints nothing while it runs (no tick
/// lines, `quiet=1`): the host reads its counts from memory.
pub fn plan(
    steps: &[Shape],
    schedule: &Schedule,
    rate: u64,
    seed: u64,
) -> Result<GuestPlan, WorkloadError> {
    if steps.is_empty() || steps.len() > tier_testguest::params::MAX_PHASES {
        return Err(WorkloadError::Schedule(format!(
            "{} steps; the guest takes 1 to {}",
            steps.len(),
            tier_testguest::params::MAX_PHASES
        )));
    }
    let step = schedule.interval * schedule.per_step;
    let step_secs = match whole_secs(step) {
        Some(s) if s > 0 => s,
        _ if steps.len() <= 2 => 0,
        _ => {
            return Err(WorkloadError::Schedule(format!(
                "a step of {step:?} is not whole seconds: the test guest times phases in RTC seconds"
            )));
        }
    };
    let lead = schedule.change_offset(1);
    let first_secs = (lead + Duration::from_secs(1) + SETUP_MARGIN)
        .as_secs_f64()
        .ceil() as u64;
    let start_after_b1 = Duration::from_secs(first_secs - 1) - lead;
    let hot = [
        steps.iter().map(|s| s.dram_pages).max().unwrap_or(0),
        steps.iter().map(|s| s.slow_pages).max().unwrap_or(0),
    ];
    let skew = steps[0].skew;
    let zipf = zipf_of(steps, skew, hot)?;
    // Per hot set (= per zone): the sys set stays empty.
    let sets = |sys: u32, work: [u32; 2]| {
        let mut v = vec![sys; SETS];
        v[WORK[0]] = work[0];
        v[WORK[1]] = work[1];
        v
    };
    let mut phases = Vec::with_capacity(steps.len());
    for (k, s) in steps.iter().enumerate() {
        let w = match skew {
            Skew::Chain(_) => [100, 0],
            _ => weights(s)?,
        };
        // Active 0 means "all": a set with no pages in this step keeps
        // weight 0 and one active page (none if its hot set is empty).
        let active = |pages: u32, hot: u32| if pages == 0 { hot.min(1) } else { pages };
        let len = if k + 1 == steps.len() {
            Length::Forever
        } else if k == 0 {
            Length::Seconds(first_secs)
        } else {
            Length::Seconds(step_secs)
        };
        let mut weights = vec![0; SETS];
        (weights[WORK[0]], weights[WORK[1]]) = (w[0], w[1]);
        phases.push(Phase {
            weights,
            len,
            active: sets(
                0,
                [active(s.dram_pages, hot[0]), active(s.slow_pages, hot[1])],
            ),
        });
    }
    let params = Params {
        hot: sets(0, hot),
        phases,
        loop_phases: false,
        accesses: None,
        report: Report::Off,
        poll: POLL,
        seed: seed.max(1),
        rate: Some(rate),
        quiet: true,
        zipf,
        deaf: Vec::new(),
        lie: Vec::new(),
        virtio_mem: VirtioMem::On,
    };
    params.check()?;
    Ok(GuestPlan {
        params,
        first_secs,
        step_secs,
        start_after_b1,
    })
}

/// `zipf=` for a row: none when uniform, else per set (`sys` uniform).
fn zipf_of(steps: &[Shape], skew: Skew, hot: [u32; 2]) -> Result<Vec<Zipf>, WorkloadError> {
    let bad = |s: &Shape, why: &str| WorkloadError::Shape {
        shape: s.label(),
        why: why.into(),
    };
    for s in steps {
        if s.skew != skew {
            return Err(bad(
                s,
                "the test guest's zipf= is fixed at boot: every step of a row has the same skew",
            ));
        }
        if matches!(skew, Skew::Chain(_))
            && (s.dram_pages != hot[0] || s.slow_pages == 0 || s.dram_pages == 0)
        {
            return Err(bad(
                s,
                "a chain's dram head is touched whole in every step and its slow tail has pages (only the tail may change)",
            ));
        }
    }
    let mut z = vec![Zipf::Exponent(0); SETS];
    match skew {
        Skew::Uniform => return Ok(Vec::new()),
        Skew::Zipf([d, s]) => (z[WORK[0]], z[WORK[1]]) = (Zipf::Exponent(d), Zipf::Exponent(s)),
        Skew::Chain(m) => (z[WORK[0]], z[WORK[1]]) = (Zipf::Exponent(m), Zipf::Continues),
    }
    Ok(z)
}

impl GuestPlan {
    /// Wall-clock time of the change to `step` (>= 1), given B1, the
    /// guest's first RTC second change.
    pub fn change_wall(&self, b1: SystemTime, step: usize) -> SystemTime {
        let later = (step.max(1) - 1) as u64 * self.step_secs;
        b1 + Duration::from_secs(self.first_secs - 1 + later)
    }
}

/// The whole wall-clock second at or before `t`.
pub fn floor_second(t: SystemTime) -> SystemTime {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// B1 from the first read of the guest's truth block that shows `s` >= 1
/// RTC second changes, at `seen`: the guest counts a change within a poll
/// of it, so the change is the whole second at or before `seen`, less the
/// seconds it counted after the first.
pub fn first_change(seen: SystemTime, s: u64) -> SystemTime {
    floor_second(seen) - Duration::from_secs(s.saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(ms: u64) -> Schedule {
        Schedule {
            interval: Duration::from_millis(ms),
            warmup: 1,
            per_step: 6,
            change_at: 0.4,
        }
    }

    #[test]
    fn weights_follow_pages_times_repeat() {
        assert_eq!(weights(&Shape::pages(7, 57)).unwrap(), [11, 89]);
        assert_eq!(weights(&Shape::pages(2048, 2048)).unwrap(), [50, 50]);
        assert_eq!(weights(&Shape::pages(2048, 0)).unwrap(), [100, 0]);
        let rate = Shape {
            dram_pages: 1024,
            dram_repeat: 4,
            slow_pages: 1024,
            slow_repeat: 1,
            skew: Skew::Uniform,
        };
        assert_eq!(weights(&rate).unwrap(), [80, 20]);
        assert_eq!(weights(&Shape::pages(1, 999)).unwrap(), [1, 99]);
        assert_eq!(weights(&Shape::pages(1, 3)).unwrap(), [25, 75]);
        assert!(weights(&Shape::pages(0, 0)).is_err());
    }

    #[test]
    fn a_row_becomes_a_command_line_the_guest_accepts() {
        let steps = [
            Shape::pages(1536, 512),
            Shape::pages(512, 1536),
            Shape::pages(1536, 512),
        ];
        let p = plan(&steps, &sched(1000), 10_000, 3).unwrap();
        let line = p.params.to_cmdline();
        assert_eq!(
            line,
            "hot=0,1536,1536 phases=0/75/25@9s:0/1536/512,0/25/75@6s:0/512/1536,0/75/25@0:0/1536/512 \
             loop=0 accesses=0 report=0 poll=500 seed=3 rate=10000 quiet=1"
        );
        assert_eq!(Params::parse(&line).unwrap(), p.params);
        assert_eq!((p.first_secs, p.step_secs), (9, 6));
        assert_eq!(p.start_after_b1, Duration::from_millis(600));
    }

    #[test]
    fn an_idle_tier_keeps_weight_zero_and_one_active_page() {
        let steps = [
            Shape::pages(2048, 2048),
            Shape::pages(2048, 0),
            Shape::pages(2048, 2048),
        ];
        let p = plan(&steps, &sched(1000), 10_000, 1).unwrap();
        let parsed = Params::parse(&p.params.to_cmdline()).unwrap();
        assert_eq!(parsed.phases[1].weights, vec![0, 100, 0]);
        assert_eq!(parsed.phases[1].active, vec![0, 2048, 1]);
        // A tier never used in the row has no hot set at all.
        let p = plan(&[Shape::pages(64, 0)], &sched(1000), 10_000, 1).unwrap();
        assert_eq!(
            p.params.to_cmdline(),
            "hot=0,64,0 phases=0/100/0@0:0/64/0 loop=0 accesses=0 report=0 poll=500 seed=1 rate=10000 quiet=1"
        );
    }

    #[test]
    fn skew_becomes_zipf_and_a_chain_draws_through_the_dram_set() {
        let z = Shape::pages(1024, 1024).skewed(Skew::Zipf([990, 1200]));
        let p = plan(&[z], &sched(1000), 10_000, 1).unwrap();
        assert!(
            p.params.to_cmdline().ends_with(" zipf=0,0.99,1.2"),
            "{}",
            p.params.to_cmdline()
        );
        let c = |tail| Shape::pages(512, tail).skewed(Skew::Chain(1000));
        let p = plan(&[c(3584), c(512), c(3584)], &sched(1000), 10_000, 2).unwrap();
        let line = p.params.to_cmdline();
        assert_eq!(
            line,
            "hot=0,512,3584 phases=0/100/0@9s:0/512/3584,0/100/0@6s:0/512/512,0/100/0@0:0/512/3584 \
             loop=0 accesses=0 report=0 poll=500 seed=2 rate=10000 quiet=1 zipf=0,1,+"
        );
        assert_eq!(Params::parse(&line).unwrap(), p.params);
        // Mixed skews, a chain whose head shrinks or whose tail is empty: refused.
        for steps in [
            vec![z, Shape::pages(1024, 1024)],
            vec![c(512), Shape::pages(256, 512).skewed(Skew::Chain(1000))],
            vec![c(0)],
        ] {
            let e = plan(&steps, &sched(1000), 10_000, 1).unwrap_err();
            assert!(matches!(e, WorkloadError::Shape { .. }), "{e}");
        }
    }

    #[test]
    fn steps_must_be_whole_seconds_only_when_a_middle_phase_needs_it() {
        let three = [Shape::pages(8, 8); 3];
        let e = plan(&three, &sched(250), 10_000, 1).unwrap_err();
        assert!(e.to_string().contains("not whole seconds"), "{e}");
        let p = plan(&three[..2], &sched(250), 10_000, 1).unwrap();
        // change_offset(1) = 7.4 * 250 ms = 1.85 s: phase 0 lasts 4 RTC
        // changes, the row starts 1.15 s after B1.
        assert_eq!(p.first_secs, 4);
        assert_eq!(p.start_after_b1, Duration::from_millis(1150));
        let p = plan(&three, &sched(500), 10_000, 1).unwrap();
        assert_eq!((p.first_secs, p.step_secs), (5, 3));
        assert!(p.start_after_b1 >= SETUP_MARGIN);
    }

    #[test]
    fn change_times_line_up_with_the_schedule() {
        let s = sched(1000);
        let steps = [Shape::pages(8, 8); 3];
        let p = plan(&steps, &s, 10_000, 1).unwrap();
        let b1 = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let t0 = b1 + p.start_after_b1;
        for step in 1..3 {
            assert_eq!(p.change_wall(b1, step), t0 + s.change_offset(step));
        }
        let seen = UNIX_EPOCH + Duration::from_millis(1_000_000_030);
        assert_eq!(first_change(seen, 1), b1);
        assert_eq!(
            first_change(seen, 3),
            b1 - Duration::from_secs(2),
            "a later first read counts back"
        );
    }
}
