//! The demo VM as the registry sees it: identity, tier map from its known
//! layout, residency from mincore, and its exact access counts.

use tier_proto::v1::{GpaRange, Tier, TierKind, Vm, VmSource};

use super::{DemoVm, GuestRegion};
use crate::registry::TrackedVm;

/// A running demo VM plus its tier map.
#[derive(Debug)]
pub struct DemoTracked {
    vm: Vm,
    demo: DemoVm,
}

impl DemoTracked {
    /// `slow_kind` labels the "slow" region: on a host without a slow tier
    /// it is a stand-in, and its derivation says so.
    pub fn new(demo: DemoVm, slow_kind: TierKind) -> DemoTracked {
        let pid = std::process::id();
        let tiers = demo
            .regions()
            .iter()
            .map(|r| {
                let (kind, derivation) = if r.name == "dram" {
                    (TierKind::Dram, "demo layout: region dram".to_string())
                } else {
                    (
                        slow_kind,
                        format!(
                            "demo layout: region {} labelled {} (a stand-in when the host has no such memory)",
                            r.name,
                            slow_kind.short_name()
                        ),
                    )
                };
                Tier {
                    name: r.name.to_string(),
                    kind: kind as i32,
                    host_numa_nodes: vec![0],
                    ranges: vec![GpaRange {
                        gpa_start: r.gpa,
                        length: r.size,
                        hva_start: r.hva,
                    }],
                    size_bytes: r.size,
                    derivation,
                    hotplug: None,
                }
            })
            .collect();
        let vm = Vm {
            id: format!("demo:{pid}"),
            name: "demo".into(),
            vmm_pid: pid,
            api_socket: String::new(),
            vcpus: 1,
            tiers,
            source: VmSource::Demo as i32,
            discovered_unix_ns: crate::unix_now_ns(),
        };
        DemoTracked { vm, demo }
    }

    pub fn id(&self) -> &str {
        &self.vm.id
    }

    pub fn demo(&self) -> &DemoVm {
        &self.demo
    }
}

impl TrackedVm for DemoTracked {
    fn vm(&self) -> &Vm {
        &self.vm
    }

    fn alive(&self) -> bool {
        self.demo.is_running()
    }

    fn resident_bytes(&self) -> Result<Vec<u64>, String> {
        Ok(self.demo.regions().iter().map(resident).collect())
    }

    fn guest_reported_accesses(&self) -> Option<Vec<u64>> {
        Some(self.demo.counters().accesses.to_vec())
    }
}

/// Resident bytes of a region of this process, from mincore(2).
fn resident(r: &GuestRegion) -> u64 {
    const PAGE: u64 = 4096;
    let pages = (r.size / PAGE) as usize;
    let mut vec = vec![0u8; pages];
    // SAFETY: hva..hva+size is a live mapping owned by the DemoVm for as long
    // as `self.demo` exists; vec has one byte per page as mincore requires.
    let rc = unsafe {
        libc::mincore(
            r.hva as *mut libc::c_void,
            r.size as usize,
            vec.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return 0;
    }
    vec.iter().filter(|b| *b & 1 == 1).count() as u64 * PAGE
}
