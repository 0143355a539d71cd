//! The DAMON driver's per-VM side: one kdamond per VM slot ageing the VM's
//! sampled folios every `sample` (the pass length), with its tid as the
//! slot's scan owner; readings normalised to one ageing round.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{DamonError, Kdamonds, RealSysfs};

/// tierd's kdamonds and what each ages.
#[derive(Debug)]
pub struct DamonDriver {
    kdamonds: Kdamonds<RealSysfs>,
    sample: Duration,
    /// VM id -> its kdamond's state.
    vms: HashMap<String, Armed>,
}

/// One VM's kdamond.
#[derive(Debug, Clone)]
pub struct Armed {
    pub slot: u32,
    /// The kdamond thread: the slot's scan owner.
    pub tid: u32,
    /// Pages the regions hold, per tier.
    pub tier_pages: Vec<u64>,
    /// When its folios were picked and the kdamond started.
    pub armed_at: Instant,
    /// When the counters were last read.
    pub read_at: Instant,
}

impl DamonDriver {
    /// Takes DAMON (refusing one somebody else uses) with one kdamond per
    /// VM slot.
    pub fn new(slots: usize, sample: Duration) -> Result<DamonDriver, DamonError> {
        let kdamonds = Kdamonds::take(RealSysfs, std::path::Path::new(super::ADMIN), slots)?;
        Ok(DamonDriver {
            kdamonds,
            sample,
            vms: HashMap::new(),
        })
    }

    /// The pass length: every sampled page is aged once per interval.
    pub fn sample(&self) -> Duration {
        self.sample
    }

    pub fn armed(&self, vm_id: &str) -> Option<&Armed> {
        self.vms.get(vm_id)
    }

    /// Starts the VM's kdamond on `regions` (sorted host virtual address
    /// ranges of its sampled folios); returns the kdamond's tid.
    pub fn arm(
        &mut self,
        vm_id: &str,
        slot: u32,
        pid: u32,
        regions: &[(u64, u64)],
        tier_pages: Vec<u64>,
    ) -> Result<u32, DamonError> {
        let us = u64::try_from(self.sample.as_micros()).unwrap_or(u64::MAX);
        let tid = self.kdamonds.start(slot as usize, pid, regions, us)?;
        self.vms.insert(
            vm_id.to_string(),
            Armed {
                slot,
                tid,
                tier_pages,
                armed_at: Instant::now(),
                read_at: Instant::now(),
            },
        );
        Ok(tid)
    }

    /// Ageing rounds since the last read (at least a small positive
    /// number), and marks now as read.
    pub fn rounds(&mut self, vm_id: &str) -> f64 {
        let Some(a) = self.vms.get_mut(vm_id) else {
            return 1.0;
        };
        let now = Instant::now();
        let secs = now.duration_since(a.read_at).as_secs_f64();
        a.read_at = now;
        (secs / self.sample.as_secs_f64()).max(1e-3)
    }

    /// Stops the VM's kdamond; returns the tid that owned its slot.
    pub fn disarm(&mut self, vm_id: &str) -> Option<u32> {
        let a = self.vms.remove(vm_id)?;
        if let Err(e) = self.kdamonds.stop(a.slot as usize) {
            tracing::warn!(vm = vm_id, error = %e, "stopping the VM's kdamond");
        }
        Some(a.tid)
    }
}

/// Young pages of one ageing round: the counters summed over `rounds`
/// rounds, divided back, never above the pages aged.
pub fn per_round(young: u64, rounds: f64, pages: u64) -> u64 {
    ((young as f64 / rounds).round() as u64).min(pages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_brought_back_to_one_round() {
        // 4.9 rounds of 100 pages at 20 % young.
        assert_eq!(per_round(98, 4.9, 100), 20);
        // Never more than the pages aged.
        assert_eq!(per_round(1000, 1.0, 100), 100);
        assert_eq!(per_round(0, 3.0, 100), 0);
    }
}
