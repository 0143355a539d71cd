//! The sampler CPU budget (`[sampler] cpu_budget_pct`): what sampling may
//! cost the host, kept by choosing per VM how much of it is sampled
//! (the stride, where the backend can sample a fraction) and how many
//! passes run (where it cannot, as hostpte: one pass walks the whole
//! process).
//!
//! Each unit of work (a VM for the EPT backends, a VMM process for hostpte)
//! gets an allowance per interval: a quarter of the budget spread evenly
//! (the floor no VM goes below), the rest by each VM's need (the width of
//! its last DRAM-hit interval: a VM whose estimate is already tight needs
//! fewer pages). What a unit cannot use at full coverage goes to the others
//! (water-filling). A scalable unit then picks the stride whose measured
//! cost fits its allowance; every unit runs an interval's passes only if its
//! credit (allowance accrued per pass slot, minus CPU spent) is not negative
//! when the interval starts, so passes dearer than the allowance are
//! followed by skipped intervals: fewer passes, never more CPU than
//! budgeted over time (at most one interval's passes ahead), and reported
//! as limited. Whole intervals, not scattered passes: the estimate needs an
//! interval's short and long passes together to fit rates and bound them.

use std::collections::HashMap;
use std::time::Duration;

/// Share of the budget spread evenly over the units, whatever their need.
pub const FLOOR_SHARE: f64 = 0.25;
/// A scalable unit keeps at least this many grid pages per pass (or all
/// of them): below it the estimate's interval is too wide to act on.
pub const MIN_GRID: u64 = 256;
/// Grid pages of a scalable unit's first pass, before its cost is known.
pub const PROBE_GRID: u64 = 4096;
/// Strides are chosen to cost this share of the allowance: room for noise,
/// so passes are not skipped by a cost a little above the estimate.
const HEADROOM: f64 = 0.8;
/// Need of a VM without an interval yet (as wide as can be).
const NO_INTERVAL_NEED: f64 = 1.0;
/// Smallest need: a VM with a point interval still gets something above
/// the floor.
const MIN_NEED: f64 = 0.02;
/// Weight of a new cost measurement in the running estimate.
const EWMA: f64 = 0.3;

/// CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID): user and
/// system time, so the kernel's page-table walks tierd asks for count.
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`, which lives
    // for the call; the clock id is a constant the kernel knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// One unit of sampling work as the backend sees it this pass.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitSpec {
    /// VM id (EPT) or "pid N" (hostpte).
    pub key: String,
    /// The VMs it measures.
    pub vms: Vec<String>,
    /// Pages the unit covers (guest pages of its tiers).
    pub pages: u64,
    /// Whether the backend can sample a fraction (a stride).
    pub scalable: bool,
}

/// What a unit does this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Run a pass (else the slot is skipped: the VM keeps its armed state
    /// and the next pass covers the time since the last one).
    pub run: bool,
    /// Page stride of the sample (scalable units; 1 otherwise).
    pub stride: u64,
}

/// What the budget chose and what sampling spent for one VM over the
/// interval just ended.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct VmBudget {
    pub vm: String,
    /// Share of its pages the sample covers (1/stride; 1 for hostpte).
    pub coverage: f64,
    /// Stride of the last pass that ran.
    pub stride: u64,
    /// Passes that ran in the interval.
    pub passes: u32,
    /// Pass slots in the interval.
    pub slots: u32,
    /// Passes per interval the allowance pays for at the measured cost
    /// (at most `slots`).
    pub passes_allowed: f64,
    /// The VM's allowance, % of one core.
    pub budget_pct: f64,
    /// CPU spent sampling it in the interval, % of one core.
    pub spent_pct: f64,
    /// Why it gets less than every page on every pass ("" if it does not).
    pub limited: String,
}

/// The host's budget and spend over the interval just ended.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Report {
    /// Configured budget, % of one core (0: no budget).
    pub budget_pct: f64,
    /// CPU spent by sampling over the interval, % of one core.
    pub spent_pct: f64,
    pub spent: Duration,
    pub vms: Vec<VmBudget>,
}

/// Running state of one unit.
#[derive(Debug, Clone, Default)]
struct Unit {
    vms: Vec<String>,
    pages: u64,
    scalable: bool,
    /// Seconds of CPU per grid page (scalable) or per pass; None: unmeasured.
    cost: Option<f64>,
    /// Seconds of CPU the unit may still spend (negative: in debt).
    credit: f64,
    /// Whether this interval's passes run (decided at its first slot).
    running: bool,
    /// Its allowance, seconds per interval, at the last plan.
    allowance: f64,
    stride: u64,
    /// This interval: passes run, slots seen, CPU spent.
    passes: u32,
    slots: u32,
    spent: f64,
    seen: bool,
}

/// The budget keeper; one per sampler.
#[derive(Debug, Clone)]
pub struct Budget {
    /// Fraction of one core; None: no budget (every page, every pass).
    share: Option<f64>,
    interval: Duration,
    slots: u32,
    min_stride: u64,
    units: HashMap<String, Unit>,
    needs: HashMap<String, f64>,
    /// Allowance per unit for this interval, seconds.
    planned: HashMap<String, f64>,
    /// Pass slots begun since the last report.
    slot: u32,
}

impl Budget {
    /// `pct`: % of one core, 0 = no budget; `slots`: passes per interval;
    /// `min_stride`: the configured stride (the densest sample).
    pub fn new(pct: f64, interval: Duration, slots: u32, min_stride: u64) -> Budget {
        Budget {
            share: (pct > 0.0).then_some(pct / 100.0),
            interval,
            slots: slots.max(1),
            min_stride: min_stride.max(1),
            units: HashMap::new(),
            needs: HashMap::new(),
            planned: HashMap::new(),
            slot: 0,
        }
    }

    /// No budget: every unit runs every pass at the configured stride.
    pub fn unlimited(min_stride: u64) -> Budget {
        Budget::new(0.0, Duration::from_secs(1), 1, min_stride)
    }

    pub fn is_on(&self) -> bool {
        self.share.is_some()
    }

    /// Per VM, the width of its last DRAM-hit interval (1 where it had
    /// none): the budget leans towards the wide ones.
    pub fn set_needs(&mut self, needs: HashMap<String, f64>) {
        self.needs = needs;
    }

    fn budget_secs(&self) -> Option<f64> {
        self.share.map(|s| s * self.interval.as_secs_f64())
    }

    fn need(&self, vm: &str) -> f64 {
        self.needs
            .get(vm)
            .copied()
            .filter(|n| n.is_finite())
            .unwrap_or(NO_INTERVAL_NEED)
            .clamp(MIN_NEED, 1.0)
    }

    /// Seconds per interval the unit costs at full coverage, every slot.
    fn full_cost(&self, u: &Unit) -> Option<f64> {
        let per_pass = if u.scalable {
            u.cost? * grid(u.pages, self.min_stride) as f64
        } else {
            u.cost?
        };
        Some(per_pass * f64::from(self.slots))
    }

    /// Starts one pass slot: plans allowances over `units` and says per
    /// unit (in order) whether it runs and at what stride.
    pub fn begin_pass(&mut self, units: &[UnitSpec]) -> Vec<Decision> {
        for s in units {
            let u = self.units.entry(s.key.clone()).or_default();
            u.vms.clone_from(&s.vms);
            u.pages = s.pages;
            u.scalable = s.scalable;
            u.seen = true;
        }
        let Some(total) = self.budget_secs() else {
            return units
                .iter()
                .map(|s| {
                    let u = self.units.entry(s.key.clone()).or_default();
                    u.slots += 1;
                    u.stride = if s.scalable { self.min_stride } else { 1 };
                    Decision {
                        run: true,
                        stride: u.stride,
                    }
                })
                .collect();
        };
        // Planned at an interval's first pass (or when a unit is new): the
        // costs it rests on change by interval, not by pass.
        if self.slot == 0 || units.iter().any(|s| !self.planned.contains_key(&s.key)) {
            let a = self.allot(units, total);
            self.planned = units.iter().map(|s| s.key.clone()).zip(a).collect();
        }
        self.slot += 1;
        let allowances: Vec<f64> = units
            .iter()
            .map(|s| self.planned.get(&s.key).copied().unwrap_or(0.0))
            .collect();
        let slots = f64::from(self.slots);
        let min_stride = self.min_stride;
        units
            .iter()
            .zip(allowances)
            .map(|(s, a)| {
                let u = self.units.entry(s.key.clone()).or_default();
                u.allowance = a;
                let first = u.slots == 0;
                u.slots += 1;
                // Credit accrues per slot, at most one interval's worth
                // ahead: an idle unit does not bank a burst.
                u.credit = (u.credit + a / slots).min(a);
                // Whole intervals run or not: their passes of different
                // lengths are what the estimate fits (and bounds); single
                // passes scattered over intervals would give it no interval.
                if first {
                    u.running = u.credit >= 0.0;
                }
                u.stride = if s.scalable {
                    stride_for(s.pages, min_stride, u.cost, a / slots)
                } else {
                    1
                };
                Decision {
                    run: u.running,
                    stride: u.stride,
                }
            })
            .collect()
    }

    /// Splits `total` seconds per interval over `units`: a floor share
    /// evenly, the rest by need, water-filled so no unit gets more than
    /// its full-coverage cost while another is short.
    fn allot(&self, units: &[UnitSpec], total: f64) -> Vec<f64> {
        let n = units.len();
        if n == 0 {
            return Vec::new();
        }
        let needs: Vec<f64> = units
            .iter()
            .map(|s| {
                s.vms
                    .iter()
                    .map(|v| self.need(v))
                    .sum::<f64>()
                    .max(MIN_NEED)
            })
            .collect();
        let need_sum: f64 = needs.iter().sum();
        let weights: Vec<f64> = needs
            .iter()
            .map(|w| FLOOR_SHARE / n as f64 + (1.0 - FLOOR_SHARE) * w / need_sum)
            .collect();
        let caps: Vec<Option<f64>> = units
            .iter()
            .map(|s| {
                self.units
                    .get(&s.key)
                    .and_then(|u| self.full_cost(u))
                    .map(|c| c / HEADROOM)
            })
            .collect();
        // Water-filling in order of full cost per weight: a unit whose
        // full cost is below its share of what is left takes just that;
        // from the first that is not, all the rest share by weight.
        let mut order: Vec<usize> = (0..n).collect();
        let key = |i: usize| caps[i].map_or(f64::INFINITY, |c| c / weights[i]);
        order.sort_by(|&a, &b| key(a).total_cmp(&key(b)));
        let mut out = vec![0.0; n];
        let mut left = total;
        let mut w_left: f64 = weights.iter().sum();
        for (k, &i) in order.iter().enumerate() {
            match caps[i] {
                Some(c) if c <= left * weights[i] / w_left => {
                    out[i] = c;
                    left -= c;
                    w_left -= weights[i];
                }
                _ => {
                    for &j in &order[k..] {
                        out[j] = left * weights[j] / w_left;
                    }
                    break;
                }
            }
        }
        out
    }

    /// Records a pass that ran: its CPU time and the grid pages it read
    /// (scalable units; ignored otherwise).
    pub fn spent(&mut self, key: &str, cpu: Duration, grid_pages: u64) {
        let on = self.is_on();
        let Some(u) = self.units.get_mut(key) else {
            return;
        };
        let secs = cpu.as_secs_f64();
        u.passes += 1;
        u.spent += secs;
        if on {
            u.credit -= secs;
        }
        let sample = if u.scalable {
            secs / grid_pages.max(1) as f64
        } else {
            secs
        };
        u.cost = Some(match u.cost {
            Some(c) => c + EWMA * (sample - c),
            None => sample,
        });
    }

    /// Forgets the units that were not in any pass since the last report.
    fn prune(&mut self) {
        self.units.retain(|_, u| std::mem::take(&mut u.seen));
    }

    /// What was chosen and spent since the last call, per VM (units split
    /// over their VMs by need); starts the next interval.
    pub fn take_report(&mut self) -> Report {
        self.prune();
        self.slot = 0;
        let secs = self.interval.as_secs_f64().max(1e-9);
        let pct = |s: f64| 100.0 * s / secs;
        let mut report = Report {
            budget_pct: self.share.map_or(0.0, |s| s * 100.0),
            ..Default::default()
        };
        let slots = f64::from(self.slots);
        let mut total = 0.0;
        let mut keys: Vec<&String> = self.units.keys().collect();
        keys.sort();
        for key in keys {
            let u = &self.units[key];
            total += u.spent;
            let per_pass = u.cost.map(|c| {
                if u.scalable {
                    c * grid(u.pages, u.stride) as f64
                } else {
                    c
                }
            });
            let passes_allowed = match (self.share, per_pass) {
                (None, _) | (_, None) => slots,
                (Some(_), Some(p)) if p > 0.0 => (u.allowance / p).min(slots),
                _ => slots,
            };
            let limited = limit_reason(u, self.min_stride, passes_allowed, slots, per_pass);
            let needs: Vec<f64> = u.vms.iter().map(|v| self.need(v)).collect();
            let need_sum: f64 = needs.iter().sum::<f64>().max(1e-12);
            for (vm, n) in u.vms.iter().zip(needs) {
                let part = n / need_sum;
                report.vms.push(VmBudget {
                    vm: vm.clone(),
                    coverage: 1.0 / u.stride.max(1) as f64,
                    stride: u.stride.max(1),
                    passes: u.passes,
                    slots: u.slots,
                    passes_allowed,
                    budget_pct: if self.share.is_some() {
                        pct(u.allowance * part)
                    } else {
                        0.0
                    },
                    spent_pct: pct(u.spent * part),
                    limited: limited.clone(),
                });
            }
        }
        report.spent = Duration::from_secs_f64(total);
        report.spent_pct = pct(total);
        for u in self.units.values_mut() {
            u.passes = 0;
            u.slots = 0;
            u.spent = 0.0;
        }
        report
    }
}

/// Grid pages of a pass over `pages` at `stride`.
pub fn grid(pages: u64, stride: u64) -> u64 {
    pages.div_ceil(stride.max(1))
}

/// The stride whose pass costs about `per_pass` seconds: `min_stride`
/// doubled until it fits, but never fewer than MIN_GRID grid pages (the
/// credit then skips slots instead). Doubling keeps strides few, so the
/// sampled set changes (and is re-armed) rarely.
fn stride_for(pages: u64, min_stride: u64, cost: Option<f64>, per_pass: f64) -> u64 {
    let floor_stride = (pages / MIN_GRID).max(min_stride);
    let Some(c) = cost.filter(|c| *c > 0.0) else {
        // Unmeasured: a probe pass of PROBE_GRID pages.
        let mut s = min_stride;
        while grid(pages, s) > PROBE_GRID && s < floor_stride {
            s *= 2;
        }
        return s;
    };
    let mut s = min_stride;
    while c * grid(pages, s) as f64 > HEADROOM * per_pass && s * 2 <= floor_stride.max(min_stride) {
        s *= 2;
    }
    s
}

fn limit_reason(
    u: &Unit,
    min_stride: u64,
    passes_allowed: f64,
    slots: f64,
    per_pass: Option<f64>,
) -> String {
    let mut why = Vec::new();
    if u.scalable && u.stride > min_stride {
        why.push(format!(
            "stride {} (configured {min_stride}) to fit the sampler CPU budget",
            u.stride
        ));
    }
    if passes_allowed + 1e-9 < slots {
        let ms = per_pass.unwrap_or(0.0) * 1e3;
        why.push(format!(
            "{passes_allowed:.2} of {slots} passes per interval: a pass costs {ms:.1} ms of CPU, the allowance is {:.1} ms per interval, so about 1 interval in {:.0} is sampled",
            u.allowance * 1e3,
            (slots / passes_allowed.max(1e-9)).ceil()
        ));
    }
    why.join("; ")
}

#[cfg(test)]
mod tests;
