//! What `tierctl top` knows about the fleet: the VM list (kept across
//! updates that say `vms_unchanged`), each VM's latest stats and last
//! controller decision, and a minute of history per VM.

use std::collections::{HashMap, VecDeque};

use tier_proto::v1::{Decision, SamplerHealth, StatsUpdate, TierSample, Vm, VmStats};

/// How much history a VM keeps (the sparkline's "last minute").
pub const WINDOW_NS: u64 = 60_000_000_000;
/// Cap on history points per VM, whatever the interval.
pub const MAX_POINTS: usize = 240;

/// One tier's numbers at one interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TierPoint {
    pub resident_bytes: u64,
    /// Host-sampled accesses per second; None without a sample.
    pub accesses_per_s: Option<f64>,
}

/// One VM's numbers at one interval.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub t_ns: u64,
    /// DRAM-hit ratio; None when no access was seen or not measured.
    pub hit: Option<f64>,
    /// Hot-set DRAM share; None where not measured.
    pub hot: Option<f64>,
    /// The headline (`VmView::headline`).
    pub headline: Option<f64>,
    /// Same order as the VM's tiers.
    pub tiers: Vec<TierPoint>,
}

/// One VM as `top` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct VmView {
    pub vm: Vm,
    pub stats: Option<VmStats>,
    /// Latest numbers per tier, same order as `vm.tiers`.
    pub now: Vec<TierPoint>,
    pub history: VecDeque<Point>,
    pub last_decision: Option<Decision>,
}

impl VmView {
    fn new(vm: Vm) -> VmView {
        VmView {
            vm,
            stats: None,
            now: Vec::new(),
            history: VecDeque::new(),
            last_decision: None,
        }
    }

    /// DRAM-hit ratio of the latest interval: the PMU's count where it
    /// counted every tier (what the controller acts on), else the
    /// host-sampled estimate's point where its interval says something.
    pub fn hit(&self) -> Option<f64> {
        let s = self.stats.as_ref()?;
        s.counted_dram_hit_ratio
            .or_else(|| crate::signal::measured_ratio(s))
    }

    /// Share of the hot set in DRAM, where measured.
    pub fn hot(&self) -> Option<f64> {
        crate::signal::hot_set(self.stats.as_ref()?).map(|h| h.share)
    }

    /// What `top` headlines: the PMU's count, else the hot-set share
    /// (what accessed bits measure), else the accessed-bit ratio.
    pub fn headline(&self) -> Option<f64> {
        let s = self.stats.as_ref()?;
        s.counted_dram_hit_ratio
            .or_else(|| self.hot())
            .or_else(|| self.hit())
    }

    /// Which signal steers the VM under `policy` (`signal::steer`); `?`
    /// before the policy or the VM's first stats are known.
    pub fn steer(&self, policy: Option<&tier_proto::v1::Policy>) -> &'static str {
        match (self.stats.as_ref(), policy) {
            (Some(s), Some(p)) => crate::signal::mode_of(p, &self.vm.id, &self.vm.name)
                .map_or("?", |m| crate::signal::steer(s, m)),
            _ => "?",
        }
    }

    /// Why the host sampler has no reading of the VM this interval.
    pub fn not_measured(&self) -> Option<&str> {
        self.stats
            .as_ref()
            .map(|s| s.not_measured.as_str())
            .filter(|s| !s.is_empty())
    }

    /// The VM's own target if the controller manages it, else `default`.
    pub fn target(&self, default: Option<f64>) -> Option<f64> {
        self.stats
            .as_ref()
            .and_then(|s| s.dram_hit_target)
            .or(default)
    }

    /// hit - target, in ratio units.
    pub fn delta(&self, default: Option<f64>) -> Option<f64> {
        Some(self.hit()? - self.target(default)?)
    }

    /// The latest sample of tier `i` (matched by name, order as a hint).
    pub fn sample(&self, i: usize) -> Option<&TierSample> {
        let name = &self.vm.tiers.get(i)?.name;
        let s = self.stats.as_ref()?;
        match s.tiers.get(i) {
            Some(t) if &t.tier == name => Some(t),
            _ => s.tiers.iter().find(|t| &t.tier == name),
        }
    }

    pub fn resident_total(&self) -> u64 {
        self.now.iter().map(|t| t.resident_bytes).sum()
    }

    pub fn accesses_total(&self) -> Option<f64> {
        self.now
            .iter()
            .filter_map(|t| t.accesses_per_s)
            .reduce(|a, b| a + b)
    }

    fn observe(&mut self, stats: VmStats, t_ns: u64, interval_ns: u64) {
        let secs = interval_ns as f64 / 1e9;
        self.stats = Some(stats);
        self.now = (0..self.vm.tiers.len())
            .map(|i| {
                let s = self.sample(i);
                TierPoint {
                    resident_bytes: s.map_or(0, |s| s.resident_bytes),
                    accesses_per_s: s
                        .filter(|_| secs > 0.0)
                        .map(|s| s.estimated_accesses / secs),
                }
            })
            .collect();
        // A restarted daemon's clock may step back: history stays monotonic.
        if self.history.back().is_some_and(|p| p.t_ns >= t_ns) {
            self.history.clear();
        }
        self.history.push_back(Point {
            t_ns,
            hit: self.hit(),
            hot: self.hot(),
            headline: self.headline(),
            tiers: self.now.clone(),
        });
        let oldest = t_ns.saturating_sub(WINDOW_NS);
        while self
            .history
            .front()
            .is_some_and(|p| p.t_ns < oldest || self.history.len() > MAX_POINTS)
        {
            self.history.pop_front();
        }
    }
}

/// The fleet as of the latest update.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fleet {
    pub sequence: u64,
    pub timestamp_ns: u64,
    pub interval_ns: u64,
    /// In the order tierd sent them (by id).
    pub vms: Vec<VmView>,
    pub health: Vec<SamplerHealth>,
    /// Updates this watcher lost (sequence gaps), since it started.
    pub lost_updates: u64,
    /// Updates applied, since it started.
    pub updates: u64,
    index: HashMap<String, usize>,
    /// Decisions about VMs not (yet) in the list.
    early_decisions: HashMap<String, Decision>,
}

impl Fleet {
    pub fn vm(&self, id: &str) -> Option<&VmView> {
        self.index.get(id).map(|&i| &self.vms[i])
    }

    /// Applies one update of a stream. `first_of_stream` is set after a
    /// (re)connect, when sequence numbers may start over.
    pub fn apply(&mut self, u: StatsUpdate, first_of_stream: bool) {
        if !first_of_stream && self.sequence != 0 && u.sequence > self.sequence + 1 {
            self.lost_updates += u.sequence - self.sequence - 1;
        }
        self.sequence = u.sequence;
        self.timestamp_ns = u.timestamp_unix_ns;
        self.interval_ns = u.interval_ns;
        self.health = u.health;
        self.updates += 1;
        if !u.vms_unchanged {
            self.set_vms(u.vms);
        } else if !u.departed_vm_ids.is_empty() {
            let keep: Vec<Vm> = self
                .vms
                .iter()
                .filter(|v| !u.departed_vm_ids.contains(&v.vm.id))
                .map(|v| v.vm.clone())
                .collect();
            self.set_vms(keep);
        }
        for s in u.stats {
            if let Some(&i) = self.index.get(&s.vm_id) {
                self.vms[i].observe(s, u.timestamp_unix_ns, u.interval_ns);
            }
        }
    }

    /// Replaces the VM list, keeping history and decisions of VMs that stay.
    fn set_vms(&mut self, vms: Vec<Vm>) {
        let mut old: HashMap<String, VmView> =
            self.vms.drain(..).map(|v| (v.vm.id.clone(), v)).collect();
        self.vms = vms
            .into_iter()
            .map(|vm| match old.remove(&vm.id) {
                Some(mut v) => {
                    if v.vm.tiers != vm.tiers {
                        v.history.clear();
                        v.now.clear();
                    }
                    v.vm = vm;
                    v
                }
                None => {
                    let mut v = VmView::new(vm);
                    v.last_decision = self.early_decisions.remove(&v.vm.id);
                    v
                }
            })
            .collect();
        self.index = self
            .vms
            .iter()
            .enumerate()
            .map(|(i, v)| (v.vm.id.clone(), i))
            .collect();
    }

    /// Records a controller decision as its VM's last action.
    pub fn apply_decision(&mut self, d: Decision) {
        match self.index.get(&d.vm_id) {
            Some(&i) => {
                let v = &mut self.vms[i];
                if v.last_decision
                    .as_ref()
                    .is_none_or(|old| old.sequence <= d.sequence)
                {
                    v.last_decision = Some(d);
                }
            }
            None => {
                self.early_decisions.insert(d.vm_id.clone(), d);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tier_proto::v1::{Tier, TierKind};

    fn vm(id: &str) -> Vm {
        Vm {
            id: id.into(),
            name: id.into(),
            vcpus: 2,
            tiers: vec![
                Tier {
                    name: "dram".into(),
                    kind: TierKind::Dram as i32,
                    size_bytes: 1 << 30,
                    ..Default::default()
                },
                Tier {
                    name: "slow".into(),
                    kind: TierKind::Cxl as i32,
                    size_bytes: 4 << 30,
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    fn stats(id: &str, hit: f64) -> VmStats {
        VmStats {
            vm_id: id.into(),
            tiers: vec![
                TierSample {
                    tier: "dram".into(),
                    resident_bytes: 100,
                    estimated_accesses: 500.0,
                    ..Default::default()
                },
                TierSample {
                    tier: "slow".into(),
                    resident_bytes: 50,
                    estimated_accesses: 100.0,
                    ..Default::default()
                },
            ],
            dram_hit_ratio: hit,
            has_accesses: true,
            ..Default::default()
        }
    }

    fn update(seq: u64, vms: Option<Vec<Vm>>, stats: Vec<VmStats>) -> StatsUpdate {
        StatsUpdate {
            sequence: seq,
            timestamp_unix_ns: seq * 1_000_000_000,
            interval_ns: 500_000_000,
            vms_unchanged: vms.is_none(),
            vms: vms.unwrap_or_default(),
            stats,
            ..Default::default()
        }
    }

    #[test]
    fn keeps_the_vm_list_when_unchanged_and_counts_gaps() {
        let mut f = Fleet::default();
        f.apply(update(1, Some(vec![vm("a"), vm("b")]), vec![]), true);
        f.apply(update(2, None, vec![stats("a", 0.5)]), false);
        assert_eq!(f.vms.len(), 2);
        let a = f.vm("a").unwrap();
        assert_eq!(a.hit(), Some(0.5));
        // 500 accesses in 0.5 s.
        assert_eq!(a.now[0].accesses_per_s, Some(1000.0));
        assert_eq!(a.accesses_total(), Some(1200.0));
        assert_eq!(a.resident_total(), 150);
        f.apply(update(5, None, vec![stats("a", 0.6)]), false);
        assert_eq!(f.lost_updates, 2);
        assert_eq!(f.vm("a").unwrap().history.len(), 2);
        // A new stream may start anywhere.
        f.apply(update(1, Some(vec![vm("a")]), vec![]), true);
        assert_eq!(f.lost_updates, 2);
        assert!(f.vm("b").is_none());
    }

    #[test]
    fn history_is_one_minute() {
        let mut f = Fleet::default();
        f.apply(update(1, Some(vec![vm("a")]), vec![]), true);
        for s in 2..=100 {
            f.apply(update(s, None, vec![stats("a", 0.5)]), false);
        }
        let h = &f.vm("a").unwrap().history;
        assert_eq!(h.len(), 61, "points at 40..=100 s");
        assert_eq!(h.front().unwrap().t_ns, 40_000_000_000);
    }

    #[test]
    fn departed_vms_go_and_decisions_stick() {
        let mut f = Fleet::default();
        f.apply_decision(Decision {
            vm_id: "b".into(),
            sequence: 7,
            ..Default::default()
        });
        f.apply(update(1, Some(vec![vm("a"), vm("b")]), vec![]), true);
        assert_eq!(
            f.vm("b").unwrap().last_decision.as_ref().unwrap().sequence,
            7
        );
        let mut u = update(2, None, vec![]);
        u.departed_vm_ids = vec!["a".into()];
        f.apply(u, false);
        assert!(f.vm("a").is_none());
        assert_eq!(f.vm("b").unwrap().vm.id, "b");
    }

    #[test]
    fn target_falls_back_to_the_policy_default() {
        let mut f = Fleet::default();
        f.apply(update(1, Some(vec![vm("a")]), vec![stats("a", 0.5)]), true);
        let a = f.vm("a").unwrap();
        assert_eq!(a.target(Some(0.9)), Some(0.9));
        assert!((a.delta(Some(0.9)).unwrap() + 0.4).abs() < 1e-12);
        let mut s = stats("a", 0.5);
        s.dram_hit_target = Some(0.6);
        f.apply(update(2, None, vec![s]), false);
        assert_eq!(f.vm("a").unwrap().target(Some(0.9)), Some(0.6));
    }
}
