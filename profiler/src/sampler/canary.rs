//! The start-up canary of the EPT backends: before a VM's numbers are
//! published, its first ageing passes must show that ageing reaches the
//! BPF programs and is attributed to the VM. A hook that never fires (shadow
//! paging, `tdp_mmu=N`, an ageing driver that does not reach KVM) or masks
//! that never match would otherwise read as an idle VM: a silent zero.
//!
//! The first pass over resident pages finds young ones on a working host:
//! KVM maps a guest page with its accessed bit set when the guest faults it
//! in (`make_spte`, arch/x86/kvm/mmu/spte.c, for non-prefetch faults).

/// What one canary pass saw for the VM.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CanaryPass {
    /// Resident pages tierd aged.
    pub sampled: u64,
    /// Young pages counted for the VM (every tier and outside them).
    pub young: u64,
    /// Program events counted for the VM (ageing calls or SPTE changes).
    pub events: u64,
    /// Ageing events no VM could be found for, during the pass.
    pub unattributed: u64,
}

/// The canary's state for one VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Canary {
    /// Not decided; `passes` canary passes seen so far.
    Running { passes: u32, last: String },
    /// Ageing reaches the programs for this VM: readings are published.
    Passed,
    /// Not measurable; retried after `retry_in` more passes.
    Failed { reason: String, retry_in: u32 },
}

/// Canary passes before a VM is declared unmeasurable.
pub const PASSES: u32 = 3;
/// Passes between retries of a failed canary.
pub const RETRY_EVERY: u32 = 60;

impl Default for Canary {
    fn default() -> Canary {
        Canary::Running {
            passes: 0,
            last: "start-up check: first ageing pass".into(),
        }
    }
}

impl Canary {
    /// Takes one pass; returns whether the pass's readings may be published.
    pub fn observe(&mut self, p: CanaryPass) -> bool {
        match self {
            Canary::Passed => true,
            Canary::Failed { retry_in, .. } if *retry_in > 1 => {
                *retry_in -= 1;
                false
            }
            Canary::Failed { .. } | Canary::Running { .. } => {
                let passes = match self {
                    Canary::Running { passes, .. } => *passes + 1,
                    _ => 1,
                };
                match verdict(p) {
                    Ok(()) => *self = Canary::Passed,
                    Err(why) if passes >= PASSES => {
                        *self = Canary::Failed {
                            reason: format!("start-up check failed after {passes} passes: {why}"),
                            retry_in: RETRY_EVERY,
                        }
                    }
                    Err(why) => {
                        *self = Canary::Running {
                            passes,
                            last: format!("start-up check, pass {passes} of {PASSES}: {why}"),
                        }
                    }
                }
                // The pass that proves it only arms: what it found young
                // had been young since the VMM mapped it.
                false
            }
        }
    }

    /// Why readings are withheld; None once passed.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Canary::Passed => None,
            Canary::Running { last, .. } => Some(last),
            Canary::Failed { reason, .. } => Some(reason),
        }
    }
}

/// Whether one pass shows working ageing for the VM, else why not.
pub fn verdict(p: CanaryPass) -> Result<(), String> {
    if p.young > 0 {
        return Ok(());
    }
    if p.sampled == 0 {
        return Err("no resident guest page to age yet".into());
    }
    if p.events > 0 {
        return Err(format!(
            "ageing of {} resident pages reached the BPF program for this VM but no page was \
             young: accessed bits are not seen (SPTE mask for another mode?) or another ager \
             clears them first",
            p.sampled
        ));
    }
    if p.unattributed > 0 {
        return Err(format!(
            "ageing events arrived while tierd aged {} resident pages, but none was attributed \
             to this VM (scan owner or VM key mismatch)",
            p.sampled
        ));
    }
    Err(format!(
        "tierd aged {} resident pages and no ageing event reached the BPF program: the hook \
         does not fire for this VM here (shadow paging, kvm.tdp_mmu=N, or the ageing driver \
         does not reach KVM)",
        p.sampled
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(sampled: u64, young: u64, events: u64, unattributed: u64) -> CanaryPass {
        CanaryPass {
            sampled,
            young,
            events,
            unattributed,
        }
    }

    #[test]
    fn young_pages_pass_the_canary_and_later_passes_publish() {
        let mut c = Canary::default();
        assert!(
            !c.observe(pass(100, 40, 40, 0)),
            "the proving pass only arms"
        );
        assert_eq!(c, Canary::Passed);
        assert!(
            c.observe(pass(100, 0, 0, 0)),
            "then an idle pass is a real zero"
        );
        assert_eq!(c.reason(), None);
    }

    #[test]
    fn each_failure_is_named() {
        for (p, words) in [
            (pass(0, 0, 0, 0), "no resident guest page"),
            (pass(64, 0, 64, 0), "no page was young"),
            (pass(64, 0, 0, 9), "none was attributed"),
            (pass(64, 0, 0, 0), "no ageing event reached"),
        ] {
            let e = verdict(p).unwrap_err();
            assert!(e.contains(words), "{p:?}: {e}");
        }
    }

    #[test]
    fn three_silent_passes_fail_then_a_retry_can_pass() {
        let mut c = Canary::default();
        for _ in 0..PASSES {
            assert!(!c.observe(pass(64, 0, 0, 0)));
        }
        let Canary::Failed { reason, .. } = &c else {
            panic!("{c:?}")
        };
        assert!(reason.contains("after 3 passes"), "{reason}");
        // Withheld until the retry pass, which can then pass.
        for _ in 1..RETRY_EVERY {
            assert!(!c.observe(pass(64, 64, 64, 0)));
            assert!(matches!(c, Canary::Failed { .. }));
        }
        assert!(!c.observe(pass(64, 64, 64, 0)));
        assert_eq!(c, Canary::Passed);
    }

    #[test]
    fn running_reason_says_which_pass() {
        let mut c = Canary::default();
        c.observe(pass(64, 0, 0, 0));
        assert!(c.reason().unwrap().contains("pass 1 of 3"), "{c:?}");
    }
}
