//! The heat histogram: young pages per 2 MiB granule of each VM.
//!
//! The kernel side is a per-CPU array of slots; each range of a VM owns a
//! contiguous run of them (`HeatSpan`, written into its `struct gfn_range`),
//! so the program indexes it from the range it already found. Userspace
//! hands the runs out here, first fit; when the array is full a range gets
//! a short run or none, and its other granules count as dropped.
//!
//! The slots only grow; a drain remembers the sums it read and reports the
//! difference next time, so nothing that lands during a read is lost.

use std::collections::BTreeMap;

use libbpf_rs::{MapCore, MapFlags};

use super::counts::u64_at;
use super::ranges::{HeatSpan, granule, granules};
use super::{EptError, EptPrograms, GfnRange, map_err};

/// (vm slot, granule) -> young pages; (heat slot, sum read).
type HeatRead = (BTreeMap<(u32, u64), u64>, Vec<(u32, u64)>);

/// One VM's sorted ranges and the heat spans they own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Owned {
    ranges: Vec<GfnRange>,
    spans: Vec<HeatSpan>,
}

/// Slot allocation for every VM, and the sums read at the last drain.
#[derive(Debug)]
pub(super) struct HeatSlots {
    capacity: u32,
    vms: Vec<Owned>,
    drained: Vec<u64>,
}

impl HeatSlots {
    /// `capacity` slots (0 when heat is off: every span is empty).
    pub fn new(capacity: u32, vms: usize) -> HeatSlots {
        HeatSlots {
            capacity,
            vms: vec![Owned::default(); vms],
            drained: vec![0; capacity as usize],
        }
    }

    /// The spans of `slot`'s `sorted` ranges. When they differ from what the
    /// slot had, its old spans are freed and new ones handed out; the second
    /// value then lists the spans whose slots must be zeroed.
    pub fn assign(&mut self, slot: usize, sorted: &[GfnRange]) -> (Vec<HeatSpan>, Vec<HeatSpan>) {
        if self.vms[slot].ranges == sorted {
            return (self.vms[slot].spans.clone(), Vec::new());
        }
        self.vms[slot] = Owned::default();
        let mut spans = Vec::with_capacity(sorted.len());
        for r in sorted {
            let want = u32::try_from(granules(r)).unwrap_or(u32::MAX);
            let span = self.take(want);
            spans.push(span);
            // Claimed at once so the next range of this VM sees it taken.
            self.vms[slot].spans.push(span);
        }
        for s in &spans {
            for i in s.base..s.base + s.len {
                self.drained[i as usize] = 0;
            }
        }
        self.vms[slot].ranges = sorted.to_vec();
        (spans.clone(), spans)
    }

    /// First free run of `want` slots, else the longest free run (short).
    fn take(&self, want: u32) -> HeatSpan {
        let mut used: Vec<HeatSpan> = self
            .vms
            .iter()
            .flat_map(|o| o.spans.iter().copied())
            .filter(|s| s.len > 0)
            .collect();
        used.sort_by_key(|s| s.base);
        let mut gaps = Vec::new();
        let mut at = 0u32;
        for s in used {
            if s.base > at {
                gaps.push(HeatSpan {
                    base: at,
                    len: s.base - at,
                });
            }
            at = at.max(s.base + s.len);
        }
        if self.capacity > at {
            gaps.push(HeatSpan {
                base: at,
                len: self.capacity - at,
            });
        }
        if let Some(g) = gaps.iter().find(|g| g.len >= want) {
            return HeatSpan {
                base: g.base,
                len: want,
            };
        }
        gaps.into_iter().max_by_key(|g| g.len).unwrap_or_default()
    }

    /// (first granule, span) of every range of `slot`.
    fn spans_of(&self, slot: usize) -> impl Iterator<Item = (u64, HeatSpan)> + '_ {
        let o = &self.vms[slot];
        o.ranges
            .iter()
            .zip(&o.spans)
            .map(|(r, s)| (granule(r.start_gfn), *s))
    }
}

impl EptPrograms {
    /// Young pages in granules that got no heat slot (histogram full).
    pub fn heat_dropped(&self) -> Result<u64, EptError> {
        let values = self
            .skel
            .maps
            .heat_dropped
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .map_err(map_err("heat_dropped", "lookup"))?
            .unwrap_or_default();
        Ok(values
            .iter()
            .map(|v| u64_at(v, 0))
            .fold(0u64, u64::wrapping_add))
    }

    /// Zeroes [`EptPrograms::heat_dropped`].
    pub fn reset_heat_dropped(&self) -> Result<(), EptError> {
        self.percpu_zero(&self.skel.maps.heat_dropped, "heat_dropped", 0, 8)
    }

    fn heat_slot_sum(&self, idx: u32) -> Result<u64, EptError> {
        Ok(self
            .skel
            .maps
            .heat
            .lookup_percpu(&idx.to_ne_bytes(), MapFlags::ANY)
            .map_err(map_err("heat", "lookup"))?
            .unwrap_or_default()
            .iter()
            .map(|v| u64_at(v, 0))
            .fold(0u64, u64::wrapping_add))
    }

    /// Zeroes the heat slots of `spans` on every CPU.
    pub(super) fn zero_heat(&self, spans: &[HeatSpan]) -> Result<(), EptError> {
        for s in spans {
            for idx in s.base..s.base + s.len {
                self.percpu_zero(&self.skel.maps.heat, "heat", idx, 8)?;
            }
        }
        Ok(())
    }

    /// The heat histogram: (vm slot, 2 MiB granule = gfn / 512) -> young
    /// pages since load or the last drain. Granules without young pages
    /// are left out. One map read per granule a VM owns.
    pub fn heat(&self) -> Result<BTreeMap<(u32, u64), u64>, EptError> {
        Ok(self.read_heat()?.0)
    }

    /// Like [`EptPrograms::heat`], and the next read starts from here.
    pub fn drain_heat(&mut self) -> Result<BTreeMap<(u32, u64), u64>, EptError> {
        let (out, read) = self.read_heat()?;
        for (idx, sum) in read {
            self.heat.drained[idx as usize] = sum;
        }
        Ok(out)
    }

    /// The histogram since the last drain, and each slot's sum as read.
    fn read_heat(&self) -> Result<HeatRead, EptError> {
        let mut out = BTreeMap::new();
        let mut read = Vec::new();
        for slot in 0..self.heat.vms.len() {
            for (first, span) in self.heat.spans_of(slot) {
                for i in 0..span.len {
                    let idx = span.base + i;
                    let sum = self.heat_slot_sum(idx)?;
                    read.push((idx, sum));
                    let young = sum.wrapping_sub(self.heat.drained[idx as usize]);
                    if young > 0 {
                        *out.entry((slot as u32, first + u64::from(i))).or_insert(0) += young;
                    }
                }
            }
        }
        Ok((out, read))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start_gfn: u64, end_gfn: u64) -> GfnRange {
        GfnRange {
            start_gfn,
            end_gfn,
            tier: 0,
        }
    }

    fn span(base: u32, len: u32) -> HeatSpan {
        HeatSpan { base, len }
    }

    #[test]
    fn ranges_get_disjoint_runs_first_fit() {
        let mut h = HeatSlots::new(10, 4);
        let (a, zero) = h.assign(0, &[r(0, 1024), r(2048, 2049)]);
        assert_eq!(a, vec![span(0, 2), span(2, 1)]);
        assert_eq!(zero, a, "new spans are zeroed");
        let (b, _) = h.assign(1, &[r(0, 512 * 3)]);
        assert_eq!(b, vec![span(3, 3)]);
        // Same ranges again: same spans, nothing to zero.
        assert_eq!(h.assign(0, &[r(0, 1024), r(2048, 2049)]), (a, vec![]));
        // VM 0 shrinks: its old runs are free for VM 2.
        let (c, _) = h.assign(0, &[]);
        assert!(c.is_empty());
        let (d, _) = h.assign(2, &[r(0, 512 * 2)]);
        assert_eq!(d, vec![span(0, 2)]);
    }

    #[test]
    fn a_full_array_gives_short_or_empty_runs() {
        let mut h = HeatSlots::new(4, 2);
        let (a, _) = h.assign(0, &[r(0, 512 * 3)]);
        assert_eq!(a, vec![span(0, 3)]);
        let (b, _) = h.assign(1, &[r(0, 512 * 5), r(512 * 5, 512 * 6)]);
        assert_eq!(b, vec![span(3, 1), span(0, 0)]);
        let mut off = HeatSlots::new(0, 1);
        assert_eq!(off.assign(0, &[r(0, 512)]).0, vec![span(0, 0)]);
    }

    #[test]
    fn reassigning_forgets_old_drain_readings() {
        let mut h = HeatSlots::new(2, 1);
        h.assign(0, &[r(0, 512)]);
        h.drained[0] = 9;
        h.assign(0, &[r(512, 1024)]);
        assert_eq!(h.drained[0], 0);
    }
}
