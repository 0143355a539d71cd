//! What the decision function sees of one VM in one interval, and how it is
//! built from the protocol's `Vm` + `VmStats`.

use tier_proto::v1::{TierKind, Vm, VmStats};

use super::ages::TierAges;
use super::hit_interval::HitEvidence;

/// One tier of one VM over one interval.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TierObs {
    /// Tier.name.
    pub name: String,
    pub size: u64,
    /// Balloon target in force (set by the controller), bytes.
    pub balloon_target: u64,
    /// Balloon size the guest reports, bytes.
    pub balloon_actual: u64,
    /// Host-sampled access estimate (`TierSample.estimated_accesses`).
    pub accesses: f64,
    /// Host-sampled bytes touched in the interval.
    pub accessed_bytes: u64,
    /// Bytes the guest holds in this tier measured idle: not touched
    /// within the longest horizon of its ages, by the interval's
    /// conservative (low) end (`idle_from_ages`). 0 where that is not
    /// measured: "not young in one pass" is no evidence (a page touched
    /// once a second is missed by a short pass a third of the time).
    pub idle_bytes: u64,
    /// The most the actuator can take from this tier, bytes; `None`: the
    /// whole tier (a balloon). A virtio-mem zone resized with
    /// `vm.resize-zone` can take only its hot-pluggable part (the boot
    /// size stays), a tier without an actuator nothing (`Some(0)`). The
    /// policy treats `size - reach` as a floor it cannot go below.
    pub reach: Option<u64>,
    /// The actuator's granularity, bytes (0: a page): a virtio-mem zone
    /// moves whole blocks, so a smaller release is made one block and a
    /// smaller need asks for one (the actuation layer rounds grants down).
    pub granule: u64,
    /// Recency profile (`TierSample.ages`); `None` where the backend gives
    /// none (PMU-only, older senders).
    pub ages: Option<TierAges>,
    /// Host-resident bytes (`TierSample.resident_bytes`): DRAM just given
    /// becomes resident as the guest moves into it (`state::Fill`).
    /// `None`: unknown this interval (`TierSample.resident_not_measured`).
    pub resident: Option<u64>,
}

impl TierObs {
    /// Bytes the target leaves to the guest.
    pub fn given(&self) -> u64 {
        self.size.saturating_sub(self.balloon_target)
    }

    /// Bytes the guest holds now (by the balloon's actual size).
    pub fn held(&self) -> u64 {
        self.size.saturating_sub(self.balloon_actual)
    }

    /// Bytes the actuator can never take (`size - reach`).
    pub fn unreachable(&self) -> u64 {
        self.reach.map_or(0, |r| self.size.saturating_sub(r))
    }

    /// Accesses, with NaN and negatives as 0.
    pub fn accesses(&self) -> f64 {
        if self.accesses.is_finite() && self.accesses > 0.0 {
            self.accesses
        } else {
            0.0
        }
    }
}

/// One VM over one interval: its DRAM tier and its slow tier.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct VmObs {
    pub id: String,
    pub name: String,
    pub dram: TierObs,
    /// Size 0 when the VM has no slow tier.
    pub slow: TierObs,
    /// False when the actuation layer knows the balloon cannot follow
    /// (no per-tier balloon, VMM calls failing): uncooperative at once.
    pub balloon_ok: bool,
    /// Guest-reported accesses `[dram, slow]`: shown, never acted on.
    pub guest_accesses: Option<[u64; 2]>,
    /// The ratio's interval, or the PMU's count (`Load::of` then splits
    /// the accesses by it).
    pub hit: HitEvidence,
}

impl VmObs {
    /// DRAM-hit ratio from the host samples; `None` without accesses.
    pub fn ratio(&self) -> Option<f64> {
        let (d, s) = (self.dram.accesses(), self.slow.accesses());
        (d + s > 0.0).then(|| d / (d + s))
    }

    /// DRAM-hit ratio the guest claims, if it reports.
    pub fn guest_ratio(&self) -> Option<f64> {
        let [d, s] = self.guest_accesses?;
        let total = d.checked_add(s)?;
        (total > 0).then(|| d as f64 / total as f64)
    }
}

/// Why a VM cannot be handed to the policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    #[error("VM {0}: no DRAM tier")]
    NoDramTier(String),
    #[error("VM {0}: no stats in this update")]
    NoStats(String),
}

/// Idle bytes as measured by a tier's ages: the low end of its cold bytes
/// (resident, untouched within the longest horizon), whole pages; 0 where
/// the ages do not measure them this interval.
pub fn idle_from_ages(ages: Option<&TierAges>) -> u64 {
    ages.filter(|a| a.not_measured.is_empty())
        .and_then(|a| a.cold)
        .map_or(0, |c| {
            let low = if c.low.is_finite() {
                c.low.max(0.0)
            } else {
                0.0
            };
            low as u64 / super::PAGE * super::PAGE
        })
}

/// Builds a `VmObs` from the protocol: the first DRAM tier and the first
/// other tier. Idle bytes are the ages' measured cold bytes
/// (`idle_from_ages`), never what one pass did not find young.
pub fn from_proto(vm: &Vm, stats: &VmStats) -> Result<VmObs, InputError> {
    if stats.vm_id != vm.id {
        return Err(InputError::NoStats(vm.id.clone()));
    }
    let pick = |want_dram: bool| {
        vm.tiers
            .iter()
            .enumerate()
            .find(|(_, t)| (t.kind() == TierKind::Dram) == want_dram)
    };
    let (di, dt) = pick(true).ok_or_else(|| InputError::NoDramTier(vm.id.clone()))?;
    let tier = |i: usize, t: &tier_proto::v1::Tier| {
        // tierd sends the tiers in the VM's order: try that place first.
        let s = stats
            .tiers
            .get(i)
            .filter(|s| s.tier == t.name)
            .or_else(|| stats.tiers.iter().find(|s| s.tier == t.name));
        let mut o = TierObs {
            name: t.name.clone(),
            size: t.size_bytes,
            ..Default::default()
        };
        if let Some(s) = s {
            o.balloon_target = s.balloon_target_bytes;
            o.balloon_actual = s.balloon_actual_bytes;
            o.accesses = s.estimated_accesses;
            o.accessed_bytes = s.estimated_accessed_bytes;
            o.ages = s.ages.as_ref().map(TierAges::from_proto);
            o.idle_bytes = idle_from_ages(o.ages.as_ref());
            o.resident = s
                .resident_not_measured
                .is_empty()
                .then_some(s.resident_bytes);
        }
        (i, o)
    };
    let (_, dram) = tier(di, dt);
    let slow = pick(false).map(|(i, t)| tier(i, t).1).unwrap_or_default();
    let guest_accesses = match stats.guest_reported_accesses.as_slice() {
        r if r.len() == vm.tiers.len() && r.len() >= 2 => {
            let si = pick(false).map(|(i, _)| i);
            si.and_then(|si| Some([*r.get(di)?, *r.get(si)?]))
        }
        _ => None,
    };
    Ok(VmObs {
        id: vm.id.clone(),
        name: vm.name.clone(),
        dram,
        slow,
        balloon_ok: true,
        guest_accesses,
        hit: evidence(stats),
    })
}

/// The PMU's count where it counted every tier, else the estimator's
/// interval, else (older senders) the sampling error alone.
pub fn evidence(stats: &VmStats) -> HitEvidence {
    let unit = |v: f64| v.is_finite() && (0.0..=1.0).contains(&v);
    if let Some(c) = stats.counted_dram_hit_ratio.filter(|&c| unit(c)) {
        return HitEvidence::Counted(c);
    }
    match (stats.dram_hit_low, stats.dram_hit_high) {
        (Some(low), Some(high)) if unit(low) && unit(high) && low <= high => {
            HitEvidence::Interval {
                low,
                high,
                low_open: stats.dram_hit_low_open,
                high_open: stats.dram_hit_high_open,
            }
        }
        _ => HitEvidence::Sampling {
            error: stats.dram_hit_error,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tier_proto::v1::{Tier, TierSample};

    #[test]
    fn builds_from_proto() {
        let vm = Vm {
            id: "ch:1".into(),
            name: "a".into(),
            tiers: vec![
                Tier {
                    name: "slow".into(),
                    kind: TierKind::Cxl as i32,
                    size_bytes: 32 << 20,
                    ..Default::default()
                },
                Tier {
                    name: "dram".into(),
                    kind: TierKind::Dram as i32,
                    size_bytes: 16 << 20,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let stats = VmStats {
            vm_id: "ch:1".into(),
            tiers: vec![TierSample {
                tier: "dram".into(),
                estimated_accesses: 300.0,
                estimated_accessed_bytes: 4 << 20,
                balloon_target_bytes: 8 << 20,
                balloon_actual_bytes: 6 << 20,
                passes: 4,
                ..Default::default()
            }],
            guest_reported_accesses: vec![10, 30],
            ..Default::default()
        };
        let o = from_proto(&vm, &stats).unwrap();
        assert_eq!(o.dram.name, "dram");
        assert_eq!(o.dram.given(), 8 << 20);
        // Holds 10M (16 - 6 actual), 4M of it touched in a pass: without
        // ages nothing is measured idle.
        assert_eq!(o.dram.idle_bytes, 0);
        assert_eq!(o.slow.name, "slow");
        assert_eq!(o.slow.accesses, 0.0);
        assert_eq!(o.ratio(), Some(1.0));
        // Guest counts are in tier order: slow 10, dram 30.
        assert_eq!(o.guest_accesses, Some([30, 10]));
        assert_eq!(o.guest_ratio(), Some(0.75));
        let mut other = stats.clone();
        other.vm_id = "x".into();
        assert!(from_proto(&vm, &other).is_err());
        // Before its first ageing pass nothing is known to be idle.
        let mut arming = stats.clone();
        arming.tiers[0].passes = 0;
        arming.tiers[0].estimated_accesses = 0.0;
        arming.tiers[0].estimated_accessed_bytes = 0;
        assert_eq!(from_proto(&vm, &arming).unwrap().dram.idle_bytes, 0);
        assert!(o.dram.ages.is_none());
        // Ages come along per tier, intervals kept.
        let mut aged = stats.clone();
        aged.tiers[0].ages = Some(tier_proto::v1::TierAges {
            working_set: vec![tier_proto::v1::WorkingSet {
                horizon_seconds: 10.0,
                bytes: 3e6,
                bytes_low: 2e6,
                bytes_high: 4e6,
                not_measured: String::new(),
            }],
            ..Default::default()
        });
        let a = from_proto(&vm, &aged).unwrap().dram.ages.unwrap();
        assert_eq!(a.at(10.0).unwrap().bytes.unwrap().low, 2e6);
        // Idle is the cold bytes' low end, whole pages, when measured.
        let cold = |ages: &mut tier_proto::v1::TierAges| {
            ages.cold_bytes = Some(5e6);
            ages.cold_bytes_low = Some(4e6 + 100.0);
            ages.cold_bytes_high = Some(6e6);
        };
        let mut t = aged.clone();
        if let Some(a) = t.tiers[0].ages.as_mut() {
            cold(a);
        }
        assert_eq!(from_proto(&vm, &t).unwrap().dram.idle_bytes, 976 * 4096);
        t.tiers[0].ages.as_mut().unwrap().not_measured = "hostpte: no pass".into();
        assert_eq!(from_proto(&vm, &t).unwrap().dram.idle_bytes, 0);
    }
}
