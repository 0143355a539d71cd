//! Backends `ept-fexit` and `ept-tracepoint`: per pass, a sample of each
//! VM's folios is aged while the ager is the scan owner of the VM's slot,
//! and tierd reads back what the BPF programs counted per (VM, tier): the
//! pages KVM found young since the previous ageing. The ager is tierd's own
//! thread writing page_idle's bitmap where the kernel has it, else tierd's
//! kdamond for the VM (the DAMON driver, `sampler/damon.rs`).
//!
//! Needs each tier's guest-physical ranges (gfn -> tier happens in BPF), so
//! VMs whose layout is unknown (kvm-fd discovery reports GPA 0) get a clear
//! error instead of numbers.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant};

use tier_proto::v1::{Backend, Vm};

use super::budget::{self, Budget, UnitSpec};
use super::canary::{Canary, CanaryPass};
use super::damon::{DamonDriver, per_round};
use super::ept::{EptOptions, EptPrograms, GfnRange, HostMode, MAX_VMS};
use super::ept_recency::EptRecency;
use super::folio::PageFlags;
use super::page_idle::{self, Bitmap, RangeError};
use super::{SampleError, Sampler, Signals, TierReading};

const PAGE: u64 = 4096;

/// What ages the sampled folios.
#[derive(Debug)]
enum Driver {
    /// tierd's thread writes their heads to page_idle's bitmap each pass.
    PageIdle(Bitmap),
    /// tierd's kdamond per VM ages them every sampling interval.
    Damon(DamonDriver),
}

/// A DAMON VM's folios are picked anew this often (memory that became
/// resident since joins the sample).
const DAMON_REPICK: Duration = Duration::from_secs(60);

/// The EPT sampler: BPF programs plus an ageing driver.
#[derive(Debug)]
pub struct EptAgeing {
    backend: Backend,
    progs: EptPrograms,
    driver: Driver,
    flags: PageFlags,
    /// The global unattributed counter (pages) at the last
    /// `take_signals`: the signal covers every ager, between passes too.
    unattributed_taken: u64,
    /// Health signals since the last `take_signals`.
    signals: Signals,
    slots: HashMap<String, u32>,
    canaries: HashMap<String, Canary>,
    /// Per VM, one page in `stride` of each tier is aged, by whole folios,
    /// from the configured stride (the densest sample) up.
    budget: Budget,
    /// Per VM: the stride of its last ageing, when it was, and whether
    /// budget-skipped slots came since.
    aged: HashMap<String, Aged>,
    /// Per VM and tier, when each sampled folio was last young (page_idle
    /// only: DAMON reports per region, not per folio).
    recency: EptRecency,
    /// Scratch of the idle bitmap reads, kept between passes.
    idle_buf: page_idle::IdleBuf,
}

/// A VM's last ageing pass.
#[derive(Debug, Clone, Copy)]
struct Aged {
    stride: u64,
    at: Instant,
    skipped: bool,
}

fn err(what: &str, e: impl std::fmt::Display) -> SampleError {
    SampleError::Io {
        path: what.into(),
        message: e.to_string(),
    }
}

impl EptAgeing {
    /// Loads and attaches the programs `backend` needs, then takes an
    /// ageing driver: page_idle, else DAMON (kdamonds ageing every
    /// `damon_sample`), else the error names both reasons.
    pub fn new(
        backend: Backend,
        stride: u64,
        damon_sample: Duration,
    ) -> Result<EptAgeing, SampleError> {
        let flags = PageFlags::open().map_err(|e| err("kpageflags (needs CAP_SYS_ADMIN)", e))?;
        let tracepoint = backend == Backend::EptTracepoint;
        let mut options = EptOptions {
            tracepoint,
            fexit: backend == Backend::EptFexit,
            ..EptOptions::default()
        };
        if tracepoint {
            // The SPTE bits of this host's MMU (EPT A/D, access tracking,
            // NPT), or why the tracepoint never fires here.
            options.masks = HostMode::detect_host()
                .and_then(|m| m.tracepoint_masks())
                .map_err(|e| err("kvm mode (/sys/module)", e))?;
        }
        let progs = EptPrograms::load(&options).map_err(|e| err("bpf", e))?;
        // Last: DAMON is taken only once nothing else can fail.
        let driver = match Bitmap::open(Path::new(page_idle::BITMAP)) {
            Ok(b) => Driver::PageIdle(b),
            Err(pi) => match DamonDriver::new(MAX_VMS as usize, damon_sample) {
                Ok(d) => Driver::Damon(d),
                Err(d) => return Err(no_driver(&pi, &d)),
            },
        };
        Ok(EptAgeing {
            backend,
            progs,
            driver,
            flags,
            unattributed_taken: 0,
            signals: Signals::default(),
            slots: HashMap::new(),
            canaries: HashMap::new(),
            budget: Budget::unlimited(stride),
            recency: EptRecency::default(),
            idle_buf: page_idle::IdleBuf::default(),
            aged: HashMap::new(),
        })
    }

    /// Keeps `budget`: per VM the stride (from the configured one up) and
    /// the passes that fit its allowance.
    pub fn with_budget(mut self, budget: Budget) -> EptAgeing {
        self.budget = budget;
        self
    }

    fn slot(&mut self, vm: &Vm) -> Result<u32, SampleError> {
        if let Some(s) = self.slots.get(&vm.id) {
            return Ok(*s);
        }
        let used: HashSet<u32> = self.slots.values().copied().collect();
        let slot = (0..MAX_VMS)
            .find(|s| !used.contains(s))
            .ok_or_else(|| err("bpf", format!("more than {MAX_VMS} VMs")))?;
        let ranges = gfn_ranges(vm)?;
        self.progs.clear_vm(slot).map_err(|e| err("bpf", e))?;
        self.progs
            .set_vm(slot, &ranges)
            .map_err(|e| err("bpf", e))?;
        self.slots.insert(vm.id.clone(), slot);
        Ok(slot)
    }

    /// The folios of this pass at `stride`, per tier: pages, heads and
    /// extents.
    fn pick(&self, vm: &Vm, stride: u64) -> Result<Picked, SampleError> {
        let path = format!("/proc/{}/pagemap", vm.vmm_pid);
        let pagemap =
            File::open(&path).map_err(|_| SampleError::ProcessGone { pid: vm.vmm_pid })?;
        let mut p = Picked::default();
        let mut seen = HashSet::new();
        for t in &vm.tiers {
            let mut n = 0u64;
            for r in &t.ranges {
                if r.hva_start == 0 {
                    return Err(SampleError::NoMapping {
                        tier: t.name.clone(),
                    });
                }
                let s = page_idle::sample_range(
                    &pagemap,
                    &self.flags,
                    r.hva_start,
                    r.length,
                    stride,
                    &mut seen,
                )
                .map_err(|e| match e {
                    RangeError::Io(e) => err(&path, e),
                    refused => SampleError::Unmeasurable {
                        reason: refused.to_string(),
                    },
                })?;
                n += s.pages;
                p.weights.extend(
                    s.extents
                        .iter()
                        .map(|&(a, b)| u32::try_from((b - a) / PAGE).unwrap_or(u32::MAX)),
                );
                p.heads.extend(s.heads);
                p.extents.extend(s.extents);
            }
            p.pages.push(n);
            p.tier_heads
                .push(p.heads.len() - p.tier_heads.iter().sum::<usize>());
        }
        p.extents.sort_unstable();
        Ok(p)
    }

    /// One VM's slot of a pass under the budget's decision.
    fn budgeted_vm(
        &mut self,
        vm: &Vm,
        d: budget::Decision,
    ) -> Result<Vec<TierReading>, SampleError> {
        if !d.run {
            // Not a pass: the VM stays armed; the next one covers the
            // time since its last ageing.
            if let Some(a) = self.aged.get_mut(&vm.id) {
                a.skipped = true;
            }
            return Ok(vec![TierReading::default(); vm.tiers.len()]);
        }
        let cpu = budget::thread_cpu();
        let now = Instant::now();
        let before = self.aged.insert(
            vm.id.clone(),
            Aged {
                stride: d.stride,
                at: now,
                skipped: false,
            },
        );
        let out = self.sample_vm(vm, d.stride, before);
        let grid: u64 = vm
            .tiers
            .iter()
            .flat_map(|t| &t.ranges)
            .map(|r| budget::grid(r.length / PAGE, d.stride))
            .sum();
        self.budget.spent(
            &vm.id,
            budget::thread_cpu().saturating_sub(cpu),
            grid.max(1),
        );
        out
    }

    /// `before`: the VM's previous ageing. A changed stride ages a new set
    /// of folios: the pass only arms (pages new to the sample were young
    /// since whenever). After skipped slots the pass's exposure is the
    /// time since that ageing.
    fn sample_vm(
        &mut self,
        vm: &Vm,
        stride: u64,
        before: Option<Aged>,
    ) -> Result<Vec<TierReading>, SampleError> {
        let slot = self.slot(vm)?;
        let restrided = before.is_some_and(|b| b.stride != stride);
        let late = before.filter(|b| b.skipped).map(|b| b.at.elapsed());
        let unattributed_before = self.progs.unattributed().map_err(|e| err("bpf", e))?;
        let (sampled, exposure, rounds) = if let Driver::PageIdle(_) = &self.driver {
            let p = self.pick(vm, stride)?;
            let _owner = self.progs.scan_as(slot).map_err(|e| err("bpf", e))?;
            if let Driver::PageIdle(bitmap) = &self.driver {
                // Which sampled folios were young: read before re-marking
                // (the read ages them as the write would; counted alike).
                let idle = bitmap
                    .idle_into(&p.heads, &mut self.idle_buf)
                    .map_err(|e| err(page_idle::BITMAP, e))?;
                let start = before.map_or_else(Instant::now, |b| b.at);
                self.recency
                    .observe(vm, &p.tier_heads, &p.heads, &p.weights, idle, start);
                bitmap
                    .mark_idle(&page_idle::words(p.heads))
                    .map_err(|e| err(page_idle::BITMAP, e))?;
            }
            (p.pages, late, 1.0)
        } else {
            let Driver::Damon(d) = &mut self.driver else {
                return Err(err("ageing driver", "not DAMON"));
            };
            if d.armed(&vm.id)
                .is_none_or(|a| a.armed_at.elapsed() >= DAMON_REPICK)
            {
                return self.arm_damon(vm, slot, stride);
            }
            let pages = d
                .armed(&vm.id)
                .map(|a| a.tier_pages.clone())
                .unwrap_or_default();
            (pages, Some(d.sample()), d.rounds(&vm.id))
        };
        let unattributed = self.progs.unattributed().map_err(|e| err("bpf", e))?;
        let counts = self.progs.take_vm_counts(slot).map_err(|e| err("bpf", e))?;
        self.signals.foreign_young += counts.foreign.young_pages;
        self.signals.unmapped += counts.unmapped.checked_pages;
        let all = counts.tiers.iter().chain([&counts.unmapped]);
        let pass = CanaryPass {
            sampled: sampled.iter().sum(),
            young: all.clone().map(|c| c.young_pages).sum(),
            events: all.map(|c| c.events).sum(),
            unattributed: unattributed.events.wrapping_sub(unattributed_before.events),
        };
        let canary = self.canaries.entry(vm.id.clone()).or_default();
        let publish = canary.observe(pass);
        if let Some(why) = canary.reason() {
            return Err(SampleError::Unmeasurable {
                reason: why.to_string(),
            });
        }
        if !publish || (restrided && matches!(self.driver, Driver::PageIdle(_))) {
            // The pass that proved the VM only arms, as every first pass
            // did: young since the VMM mapped the page means nothing.
            return Ok(vec![TierReading::default(); sampled.len()]);
        }
        Ok(sampled
            .iter()
            .enumerate()
            // A tier the programs kept no count for was not read: no
            // pass (its accesses unknown), not 0 young pages.
            .map(|(i, &n)| match counts.tiers.get(i) {
                Some(c) => TierReading {
                    sampled_pages: n,
                    young_pages: per_round(c.young_pages, rounds, n),
                    exposure,
                },
                None => TierReading::default(),
            })
            .collect())
    }

    /// (Re)starts the VM's kdamond on freshly picked folios; the pass only
    /// arms (no reading).
    fn arm_damon(
        &mut self,
        vm: &Vm,
        slot: u32,
        stride: u64,
    ) -> Result<Vec<TierReading>, SampleError> {
        let p = self.pick(vm, stride)?;
        let Driver::Damon(d) = &mut self.driver else {
            return Err(err("ageing driver", "not DAMON"));
        };
        if let Some(tid) = d.disarm(&vm.id) {
            let _ = self.progs.clear_scan_owner(tid);
        }
        let tid = d
            .arm(&vm.id, slot, vm.vmm_pid, &p.extents, p.pages.clone())
            .map_err(|e| SampleError::Unmeasurable {
                reason: format!("DAMON driver: {e}"),
            })?;
        self.progs
            .set_scan_owner(tid, slot)
            .map_err(|e| err("bpf", e))?;
        self.progs
            .reset_vm_counts(slot)
            .map_err(|e| err("bpf", e))?;
        Ok(vec![TierReading::default(); p.pages.len()])
    }
}

/// Neither ageing driver: both reasons, which name the kernel options.
fn no_driver(page_idle: &std::io::Error, damon: &super::damon::DamonError) -> SampleError {
    err(
        "ageing driver",
        format!("page_idle: {page_idle}; DAMON: {damon}"),
    )
}

/// One pass's sample of a VM.
#[derive(Debug, Default)]
struct Picked {
    /// Pages per tier.
    pages: Vec<u64>,
    heads: Vec<u64>,
    /// Pages of each head's folio inside the range, and heads per tier.
    weights: Vec<u32>,
    tier_heads: Vec<usize>,
    /// Sorted `[start, end)` host virtual addresses of the folios.
    extents: Vec<(u64, u64)>,
}

/// gfn ranges per tier index; an unknown layout (overlaps, GPA 0 for every
/// tier) is an error naming the VM.
pub fn gfn_ranges(vm: &Vm) -> Result<Vec<GfnRange>, SampleError> {
    let mut out = Vec::new();
    for (i, t) in vm.tiers.iter().enumerate() {
        for r in &t.ranges {
            out.push(GfnRange {
                start_gfn: r.gpa_start / PAGE,
                end_gfn: (r.gpa_start + r.length) / PAGE,
                tier: i as u32,
            });
        }
    }
    let mut sorted = out.clone();
    sorted.sort_by_key(|r| r.start_gfn);
    if sorted.windows(2).any(|w| w[0].end_gfn > w[1].start_gfn) {
        return Err(SampleError::Io {
            path: vm.id.clone(),
            message: "guest-physical layout unknown (tier ranges overlap): the EPT backends need it; use hostpte".into(),
        });
    }
    Ok(out)
}

impl Sampler for EptAgeing {
    fn backend(&self) -> Backend {
        self.backend
    }

    fn sample(&mut self, vms: &[&Vm]) -> Vec<Result<Vec<TierReading>, SampleError>> {
        let specs: Vec<UnitSpec> = vms
            .iter()
            .map(|vm| UnitSpec {
                key: vm.id.clone(),
                vms: vec![vm.id.clone()],
                pages: vm.tiers.iter().map(|t| t.size_bytes / PAGE).sum(),
                scalable: true,
            })
            .collect();
        let decisions = self.budget.begin_pass(&specs);
        vms.iter()
            .zip(decisions)
            .map(|(vm, d)| self.budgeted_vm(vm, d))
            .collect()
    }

    fn budget(&mut self) -> Option<&mut Budget> {
        Some(&mut self.budget)
    }

    fn take_signals(&mut self) -> Signals {
        match self.progs.unattributed() {
            Ok(u) => {
                self.signals.unattributed = u.checked_pages.wrapping_sub(self.unattributed_taken);
                self.unattributed_taken = u.checked_pages;
            }
            Err(e) => tracing::warn!(error = %e, "reading the unattributed counter"),
        }
        std::mem::take(&mut self.signals)
    }

    fn set_ages(&mut self, config: &crate::ages::AgesConfig) {
        self.recency.set_config(config);
    }

    fn ages(&mut self, vm: &Vm) -> Option<Vec<tier_proto::v1::TierAges>> {
        let why = match &self.driver {
            Driver::PageIdle(_) => None,
            Driver::Damon(_) => Some(
                "the DAMON ageing driver reports young pages per region and tier (not per folio): no ages",
            ),
        };
        let stride = self.aged.get(&vm.id).map_or(1, |a| a.stride);
        Some(self.recency.ages(vm, stride, why))
    }

    fn forget(&mut self, vm_id: &str) {
        self.recency.forget(vm_id);
        self.canaries.remove(vm_id);
        self.aged.remove(vm_id);
        if let Driver::Damon(d) = &mut self.driver
            && let Some(tid) = d.disarm(vm_id)
            && let Err(e) = self.progs.clear_scan_owner(tid)
        {
            tracing::warn!(vm = vm_id, error = %e, "clearing the kdamond's scan owner");
        }
        if let Some(slot) = self.slots.remove(vm_id)
            && let Err(e) = self.progs.clear_vm(slot)
        {
            tracing::warn!(vm = vm_id, error = %e, "clearing the BPF slot");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tier_proto::v1::{GpaRange, Tier};

    fn vm(ranges: &[(u64, u64)]) -> Vm {
        Vm {
            id: "t".into(),
            tiers: ranges
                .iter()
                .map(|&(gpa, len)| Tier {
                    ranges: vec![GpaRange {
                        gpa_start: gpa,
                        length: len,
                        hva_start: 1,
                    }],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn gfn_ranges_follow_the_tier_map() {
        let r = gfn_ranges(&vm(&[(0, 16 << 20), (0x1000_0000, 16 << 20)])).unwrap();
        assert_eq!(
            r,
            vec![
                GfnRange {
                    start_gfn: 0,
                    end_gfn: 4096,
                    tier: 0
                },
                GfnRange {
                    start_gfn: 0x10000,
                    end_gfn: 0x11000,
                    tier: 1
                },
            ]
        );
    }

    #[test]
    fn unknown_layout_is_refused() {
        let e = gfn_ranges(&vm(&[(0, 16 << 20), (0, 16 << 20)])).unwrap_err();
        assert!(e.to_string().contains("layout unknown"), "{e}");
    }

    #[test]
    fn without_either_driver_both_reasons_are_given() {
        let pi = Bitmap::open(Path::new("/nonexistent/page_idle/bitmap")).unwrap_err();
        let d = crate::sampler::damon::DamonError::InUse("kdamond 0 on (pid 77)".into());
        let e = no_driver(&pi, &d).to_string();
        assert!(e.contains("/nonexistent/page_idle/bitmap"), "{e}");
        assert!(e.contains("kdamond 0 on (pid 77)"), "{e}");
    }
}
