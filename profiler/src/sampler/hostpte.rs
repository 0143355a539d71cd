//! Backend `hostpte`: accessed bits of the VMM's own page tables over each
//! guest-memory mapping.
//!
//! Per interval: read `Referenced:` of the VMAs behind each tier from
//! `/proc/PID/smaps`, then re-arm with two writes to `/proc/PID/clear_refs`:
//! `1` clears the young bits and PG_referenced of every page, then `4`
//! (the soft-dirty clear) runs an MMU-notifier invalidation over the whole
//! address space, so KVM drops its SPTEs and the guest's next access to a
//! page faults through the host page tables again and marks it accessed.
//! Without the `4`, KVM keeps its mappings and guest accesses never reach
//! the host bits (measured: ~0 young pages while the guest touched 146).
//! The order matters: `4` before `1` loses pages re-faulted in between.
//!
//! Each tier's pass is timed from the re-arm's return to the moment the
//! smaps walk read that tier's VMA (the read is timed chunk by chunk): the
//! walk and re-arm take ~7 ms here, a third of a 25 ms lead pass, and pages
//! the guest touches during them are not seen.
//!
//! Exact at page granularity for what it sees: which pages were touched at
//! least once in the interval, not how often. The re-fault after each
//! invalidation costs the guest one KVM page fault per touched page per
//! interval. Where CONFIG_MEM_SOFT_DIRTY is on, `4` also clears the VMM's
//! soft-dirty bits (cloud-hypervisor does not use them).

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tier_proto::v1::{Backend, Vm};

use super::budget::{self, Budget, UnitSpec};
use super::hostpte_ages::HostPteAges;
use super::{SampleError, Sampler, TierReading};

const PAGE: u64 = 4096;

/// The hostpte sampler: remembers which VMs are armed and when each VMM
/// process was last re-armed.
#[derive(Debug)]
pub struct HostPte {
    armed: HashSet<String>,
    rearmed: HashMap<u32, Instant>,
    /// A pass walks a whole process: the budget can only skip passes.
    budget: Budget,
    /// Working-set ages and the long passes they need.
    ages: HostPteAges,
}

impl Default for HostPte {
    fn default() -> HostPte {
        HostPte::with_budget(Budget::unlimited(1))
    }
}

impl HostPte {
    /// Without a budget: every process every pass.
    pub fn new() -> HostPte {
        HostPte::default()
    }

    /// Keeping `budget`: a process whose pass costs more than its
    /// allowance skips passes (its next pass covers the time since).
    pub fn with_budget(budget: Budget) -> HostPte {
        HostPte {
            armed: HashSet::new(),
            rearmed: HashMap::new(),
            budget,
            ages: HostPteAges::default(),
        }
    }
}

/// One budget unit per VMM process, in first-seen order.
fn units(vms: &[&Vm]) -> Vec<(u32, UnitSpec)> {
    let mut out: Vec<(u32, UnitSpec)> = Vec::new();
    let mut at: HashMap<u32, usize> = HashMap::new();
    for vm in vms {
        let pages: u64 = vm.tiers.iter().map(|t| t.size_bytes / PAGE).sum();
        if let Some(u) = at.get(&vm.vmm_pid).and_then(|&i| out.get_mut(i)) {
            u.1.vms.push(vm.id.clone());
            u.1.pages += pages;
            continue;
        }
        at.insert(vm.vmm_pid, out.len());
        out.push((
            vm.vmm_pid,
            UnitSpec {
                key: format!("pid {}", vm.vmm_pid),
                vms: vec![vm.id.clone()],
                pages,
                scalable: false,
            },
        ));
    }
    out
}

fn io(path: &std::path::Path, source: std::io::Error, pid: u32) -> SampleError {
    if source.kind() == std::io::ErrorKind::NotFound || source.raw_os_error() == Some(libc::ESRCH) {
        return SampleError::ProcessGone { pid };
    }
    SampleError::Io {
        path: path.display().to_string(),
        message: source.to_string(),
    }
}

/// Clears the young state of every page of `pid` and makes KVM re-fault.
pub fn rearm(pid: u32) -> Result<(), SampleError> {
    let path = PathBuf::from(format!("/proc/{pid}/clear_refs"));
    for cmd in ["1", "4"] {
        std::fs::write(&path, cmd).map_err(|e| io(&path, e, pid))?;
    }
    Ok(())
}

/// One VMA of smaps: start, end, the bytes of one of its fields and where
/// its header line starts in the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    pub bytes: u64,
    pub offset: usize,
}

/// The VMAs of /proc/PID/smaps text with the value of `field` ("Rss:",
/// "Referenced:", ...) of each.
pub fn parse_smaps_field(text: &str, field: &str) -> Vec<Vma> {
    let [vmas] = parse_smaps_fields(text, [field]);
    vmas
}

/// The VMAs of smaps text once per field of `fields`, each with that
/// field's value, in one pass over the text.
pub fn parse_smaps_fields<const N: usize>(text: &str, fields: [&str; N]) -> [Vec<Vma>; N] {
    let mut out: [Vec<Vma>; N] = std::array::from_fn(|_| Vec::new());
    let mut offset = 0;
    'lines: for raw in text.split_inclusive('\n') {
        let at = offset;
        offset += raw.len();
        let line = raw.trim_end_matches('\n');
        for (field, vmas) in fields.iter().zip(out.iter_mut()) {
            if let Some(v) = line.strip_prefix(field) {
                if let (Some(last), Ok(kb)) = (
                    vmas.last_mut(),
                    v.trim().trim_end_matches("kB").trim().parse::<u64>(),
                ) {
                    last.bytes = kb * 1024;
                }
                continue 'lines;
            }
        }
        // Header lines start with "start-end perms ..."; field lines with "Name:".
        let Some(range) = line.split_whitespace().next() else {
            continue;
        };
        if range.ends_with(':') {
            continue;
        }
        if let Some((a, b)) = range.split_once('-')
            && let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16))
        {
            for vmas in &mut out {
                vmas.push(Vma {
                    start,
                    end,
                    bytes: 0,
                    offset: at,
                });
            }
        }
    }
    out
}

/// Field bytes inside [start, start+len). A VMA that only partly
/// overlaps contributes in proportion to the overlap (smaps has no finer
/// grain); guest-memory mappings are whole VMAs in practice.
pub fn bytes_in(vmas: &[Vma], start: u64, len: u64) -> u64 {
    overlaps(vmas, start, len)
        .map(|(v, overlap)| {
            let size = v.end - v.start;
            if overlap == size {
                v.bytes
            } else {
                (v.bytes as u128 * overlap as u128 / size as u128) as u64
            }
        })
        .sum()
}

/// The VMAs that overlap `[start, start+len)`, each with the bytes of the
/// overlap.
fn overlaps(vmas: &[Vma], start: u64, len: u64) -> impl Iterator<Item = (&Vma, u64)> {
    let end = start.saturating_add(len);
    vmas.iter()
        .filter(move |v| v.start < end && v.end > start)
        .map(move |v| (v, v.end.min(end) - v.start.max(start)))
}

/// A file read in chunks, with the instant each chunk was read.
#[derive(Debug, Default)]
pub struct TimedText {
    pub text: String,
    /// (end offset of a chunk in `text`, midpoint of its read), in order.
    pub marks: Vec<(usize, Instant)>,
}

impl TimedText {
    /// When the byte at `offset` was read; `None` past the end.
    pub fn at(&self, offset: usize) -> Option<Instant> {
        let i = self.marks.partition_point(|&(end, _)| end <= offset);
        self.marks.get(i).map(|m| m.1)
    }
}

/// Reads `path` to its end. The buffer is larger than seq_file's, so each
/// read returns exactly the smaps records the kernel walked during it.
fn read_timed(path: &std::path::Path) -> std::io::Result<TimedText> {
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 64 << 10];
    let mut bytes = Vec::new();
    let mut marks = Vec::new();
    loop {
        let t0 = Instant::now();
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        let t1 = Instant::now();
        bytes.extend_from_slice(buf.get(..n).unwrap_or_default());
        marks.push((bytes.len(), t0 + (t1 - t0) / 2));
    }
    let text = String::from_utf8(bytes)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    Ok(TimedText { text, marks })
}

/// One process's smaps walk: the VMAs with their `Referenced:` bytes and
/// when each was walked, and when the re-arm after it returned (inside a
/// long pass: the re-arm that began it).
struct Walk {
    vmas: Vec<Vma>,
    /// `Rss:` of the same VMAs: the pages the walk could see (the working
    /// set's cold bytes are counted over these).
    resident: Vec<Vma>,
    smaps: TimedText,
    rearmed: Instant,
}

/// smaps of `pid`, read before the re-arm that starts the next pass; with
/// `keep` (inside a long pass) not re-armed: the next pass goes on from
/// that earlier re-arm.
fn read_and_rearm(pid: u32, keep: Option<Instant>) -> Result<Walk, SampleError> {
    let path = PathBuf::from(format!("/proc/{pid}/smaps"));
    let smaps = read_timed(&path).map_err(|e| io(&path, e, pid))?;
    let rearmed = match keep {
        Some(at) => at,
        None => {
            rearm(pid)?;
            Instant::now()
        }
    };
    let [vmas, resident] = parse_smaps_fields(&smaps.text, ["Referenced:", "Rss:"]);
    Ok(Walk {
        vmas,
        resident,
        smaps,
        rearmed,
    })
}

/// When the walk read the tier made of `ranges` (hva, length): the mean
/// of its VMAs' read instants, weighted by overlap; `None` if no VMA
/// overlaps.
fn walked_at(walk: &Walk, ranges: &[(u64, u64)]) -> Option<Instant> {
    let mut points = Vec::new();
    for &(start, len) in ranges {
        for (v, overlap) in overlaps(&walk.vmas, start, len) {
            points.push((walk.smaps.at(v.offset)?, u128::from(overlap)));
        }
    }
    let base = points.iter().map(|p| p.0).min()?;
    let total: u128 = points.iter().map(|p| p.1).sum();
    let weighted: u128 = points.iter().map(|&(t, w)| (t - base).as_nanos() * w).sum();
    let mean = u64::try_from(weighted.checked_div(total)?).ok()?;
    Some(base + Duration::from_nanos(mean))
}

/// Resident pages of each of `vm`'s tiers in `walk`.
fn resident(vm: &Vm, walk: &Walk) -> Vec<u64> {
    vm.tiers
        .iter()
        .map(|t| {
            let pages: u64 = t
                .ranges
                .iter()
                .map(|r| bytes_in(&walk.resident, r.hva_start, r.length) / PAGE)
                .sum();
            pages.min(t.size_bytes / PAGE)
        })
        .collect()
}

impl HostPte {
    /// `since`: when this process's previous re-arm returned.
    fn readings(
        &mut self,
        vm: &Vm,
        walk: &Walk,
        since: Option<Instant>,
    ) -> Result<Vec<TierReading>, SampleError> {
        for t in &vm.tiers {
            if t.ranges.iter().any(|r| r.hva_start == 0) {
                return Err(SampleError::NoMapping {
                    tier: t.name.clone(),
                });
            }
        }
        // The first interval of a VM has no armed start: report nothing
        // rather than pages touched since the VMM began.
        let first = self.armed.insert(vm.id.clone());
        Ok(vm
            .tiers
            .iter()
            .map(|t| {
                if first {
                    return TierReading::default();
                }
                let pages = t.size_bytes / PAGE;
                let ranges: Vec<(u64, u64)> =
                    t.ranges.iter().map(|r| (r.hva_start, r.length)).collect();
                let young = ranges
                    .iter()
                    .map(|&(start, len)| bytes_in(&walk.vmas, start, len) / PAGE)
                    .sum::<u64>()
                    .min(pages);
                let exposure = since
                    .zip(walked_at(walk, &ranges))
                    .map(|(s, at)| at.saturating_duration_since(s));
                TierReading {
                    sampled_pages: pages,
                    young_pages: young,
                    exposure,
                }
            })
            .collect())
    }
}

impl Sampler for HostPte {
    fn backend(&self) -> Backend {
        Backend::Hostpte
    }

    fn sample(&mut self, vms: &[&Vm]) -> Vec<Result<Vec<TierReading>, SampleError>> {
        // One smaps read and one re-arm per VMM process, however many VMs
        // it holds: a second re-arm would erase the first VM's interval.
        let units = units(vms);
        let specs: Vec<UnitSpec> = units.iter().map(|u| u.1.clone()).collect();
        let decisions = self.budget.begin_pass(&specs);
        let mut walks: HashMap<u32, Result<Walk, SampleError>> = HashMap::new();
        let mut skipped = HashSet::new();
        // Read inside a long pass, not re-armed: nested in the long pass's
        // later readings, so not a pass of their own for the estimate.
        let mut nested = HashSet::new();
        for ((pid, spec), d) in units.iter().zip(decisions) {
            if !d.run {
                skipped.insert(*pid);
                continue;
            }
            // Inside a long pass (docs/working-set.md) the process is read
            // but not re-armed: each reading counts from the long pass's
            // start, a pass of its own for the estimate.
            let keep = self
                .ages
                .inside_long(*pid)
                .then(|| self.rearmed.get(pid).copied())
                .flatten();
            // A sweep's readings (its closing one too) span more than an
            // interval: no pass of one for the estimate.
            if keep.is_some() || self.ages.in_sweep(*pid) {
                nested.insert(*pid);
            }
            let cpu = budget::thread_cpu();
            walks.insert(*pid, read_and_rearm(*pid, keep));
            self.budget
                .spent(&spec.key, budget::thread_cpu().saturating_sub(cpu), 0);
            self.ages.walked(*pid);
        }
        let results = vms
            .iter()
            .map(|vm| {
                let since = self.rearmed.get(&vm.vmm_pid).copied();
                if skipped.contains(&vm.vmm_pid) {
                    // Not a pass (no pages examined): the process stays
                    // armed and its next pass covers the time since.
                    return Ok(vec![TierReading::default(); vm.tiers.len()]);
                }
                match walks.get(&vm.vmm_pid) {
                    Some(Ok(walk)) => {
                        let r = self.readings(vm, walk, since);
                        if let Ok(r) = &r {
                            self.ages.record(vm, r, &resident(vm, walk));
                        }
                        // A nested reading counts the same touches again
                        // as the long pass's last one: handed to the
                        // estimate it would count them twice and lift
                        // even the firm low end above the truth. Only the
                        // ages read it; the estimate gets the long pass
                        // once, when it closes.
                        if nested.contains(&vm.vmm_pid) {
                            return Ok(vec![TierReading::default(); vm.tiers.len()]);
                        }
                        r
                    }
                    Some(Err(e)) => Err(e.clone()),
                    None => Err(SampleError::ProcessGone { pid: vm.vmm_pid }),
                }
            })
            .collect();
        // The next pass of each process starts at this re-arm; one that
        // failed leaves the next pass's exposure unknown, one skipped
        // keeps its last.
        self.rearmed.retain(|pid, _| skipped.contains(pid));
        self.rearmed.extend(
            walks
                .into_iter()
                .filter_map(|(pid, w)| Some((pid, w.ok()?.rearmed))),
        );
        self.ages.pass_done();
        results
    }

    fn forget(&mut self, vm_id: &str) {
        self.armed.remove(vm_id);
        self.ages.forget(vm_id);
    }

    fn set_ages(&mut self, config: &crate::ages::AgesConfig) {
        self.ages.set_config(config);
    }

    fn interval_ends(&mut self) {
        self.ages.interval_ends();
    }

    fn ages(&mut self, vm: &Vm) -> Option<Vec<tier_proto::v1::TierAges>> {
        Some(self.ages.ages(vm))
    }

    fn quiet(&self, vm: &Vm) -> Option<String> {
        self.ages.quiet(vm)
    }

    fn budget(&mut self) -> Option<&mut Budget> {
        Some(&mut self.budget)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
7f0000000000-7f0000100000 rw-p 00000000 00:00 0 
Size:               1024 kB
Rss:                 200 kB
Referenced:          120 kB
VmFlags: rd wr mr mw me ac nh 
7f0000200000-7f0000300000 rw-s 00000000 00:01 42                         /memfd:slow (deleted)
Size:               1024 kB
Referenced:            8 kB
VmFlags: rd wr sh mr mw me ms 
";

    #[test]
    fn parses_vmas_and_referenced() {
        let v = parse_smaps_field(SMAPS, "Referenced:");
        let second = SMAPS.find("7f0000200000-").unwrap_or(usize::MAX);
        assert_eq!(
            v,
            vec![
                Vma {
                    start: 0x7f00_0000_0000,
                    end: 0x7f00_0010_0000,
                    bytes: 120 * 1024,
                    offset: 0,
                },
                Vma {
                    start: 0x7f00_0020_0000,
                    end: 0x7f00_0030_0000,
                    bytes: 8 * 1024,
                    offset: second,
                },
            ]
        );
    }

    #[test]
    fn several_fields_in_one_pass_are_each_one_field() {
        let [referenced, rss] = parse_smaps_fields(SMAPS, ["Referenced:", "Rss:"]);
        assert_eq!(referenced, parse_smaps_field(SMAPS, "Referenced:"));
        assert_eq!(rss, parse_smaps_field(SMAPS, "Rss:"));
        assert_ne!(referenced, rss);
    }

    #[test]
    fn referenced_in_whole_partial_and_disjoint() {
        let v = parse_smaps_field(SMAPS, "Referenced:");
        assert_eq!(bytes_in(&v, 0x7f00_0000_0000, 0x10_0000), 120 * 1024);
        assert_eq!(bytes_in(&v, 0x7f00_0000_0000, 0x30_0000), 128 * 1024);
        // Half of the first VMA: half its referenced bytes.
        assert_eq!(bytes_in(&v, 0x7f00_0000_0000, 0x8_0000), 60 * 1024);
        assert_eq!(bytes_in(&v, 0x7f00_0010_0000, 0x10_0000), 0);
    }

    /// Cold bytes are counted over these: `Rss:` in the tier's ranges, no
    /// more than its size.
    #[test]
    fn resident_pages_per_tier_from_rss() {
        let tier = |name: &str, hva: u64, size: u64| tier_proto::v1::Tier {
            name: name.into(),
            size_bytes: size,
            ranges: vec![tier_proto::v1::GpaRange {
                hva_start: hva,
                length: 0x10_0000,
                ..Default::default()
            }],
            ..Default::default()
        };
        let vm = Vm {
            tiers: vec![
                tier("dram", 0x7f00_0000_0000, 0x10_0000),
                tier("slow", 0x7f00_0020_0000, 0x10_0000),
            ],
            ..Default::default()
        };
        let w = walk(&[], Instant::now());
        assert_eq!(resident(&vm, &w), vec![50, 0]);
    }

    fn walk(marks: &[(usize, u64)], base: Instant) -> Walk {
        let [vmas, resident] = parse_smaps_fields(SMAPS, ["Referenced:", "Rss:"]);
        Walk {
            vmas,
            resident,
            smaps: TimedText {
                text: SMAPS.into(),
                marks: marks
                    .iter()
                    .map(|&(end, ms)| (end, base + Duration::from_millis(ms)))
                    .collect(),
            },
            rearmed: base,
        }
    }

    #[test]
    fn each_vma_is_timed_by_the_chunk_that_read_its_header() {
        let base = Instant::now();
        let second = SMAPS.find("7f0000200000-").unwrap_or(0);
        // Chunk 1 ends just past the second header's start: both in it.
        let w = walk(&[(second + 1, 2), (SMAPS.len(), 5)], base);
        assert_eq!(w.smaps.at(0), Some(base + Duration::from_millis(2)));
        assert_eq!(w.smaps.at(second), Some(base + Duration::from_millis(2)));
        assert_eq!(w.smaps.at(SMAPS.len()), None);
        // Chunk 1 ends right before it: the second VMA is read at 5 ms.
        let w = walk(&[(second, 2), (SMAPS.len(), 5)], base);
        let first = [(0x7f00_0000_0000, 0x10_0000)];
        let slow = [(0x7f00_0020_0000, 0x10_0000)];
        let ms = |at: Option<Instant>| at.map(|a| (a - base).as_secs_f64() * 1e3);
        assert_eq!(ms(walked_at(&w, &first)), Some(2.0));
        assert_eq!(ms(walked_at(&w, &slow)), Some(5.0));
        // A tier over both, the second half as large: weighted 2/3, 1/3.
        let both = [(0x7f00_0000_0000, 0x10_0000), (0x7f00_0020_0000, 0x8_0000)];
        let mean = ms(walked_at(&w, &both)).unwrap_or(f64::NAN);
        assert!((mean - 3.0).abs() < 1e-6, "{mean}");
        assert_eq!(walked_at(&w, &[(0x1000, 0x1000)]), None);
    }

    #[test]
    fn a_real_smaps_read_is_timed_in_order_to_its_end() {
        let path = PathBuf::from(format!("/proc/{}/smaps", std::process::id()));
        let t0 = Instant::now();
        let timed = read_timed(&path).expect("own smaps");
        let vmas = parse_smaps_field(&timed.text, "Rss:");
        assert!(!vmas.is_empty());
        assert_eq!(timed.marks.last().map(|m| m.0), Some(timed.text.len()));
        assert!(
            timed
                .marks
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1)
        );
        for v in &vmas {
            let at = timed.at(v.offset);
            assert!(at.is_some_and(|a| a >= t0 && a <= Instant::now()), "{v:?}");
        }
    }
}
