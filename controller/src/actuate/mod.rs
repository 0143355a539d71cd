//! Actuation: applying the policy's per-tier balloon targets to a VMM and
//! reading back where each sub-balloon is.
//!
//! [`Vmm`] is what the controller needs from a VMM; [`ChApi`] implements it
//! over the HTTP API of the patched cloud-hypervisor (vmm-patch/SPEC.md
//! section 5) on its unix socket; [`VhostBalloon`] over the control socket
//! of the `tier-balloon` vhost-user backend (docs/balloon-backend.md).
//! [`ResizableZone`] maps the same balloon-style targets onto
//! `vm.resize-zone` of a virtio-mem zone ([`ChApi::resize_zone`], docs/virtio-mem.md).
//!
//! The cloud-hypervisor client, its API types, the trait and the error
//! every client shares are their own crate, tier-ch-api
//! (vmm-patch/ch-api/), which tierd's discovery reads VMs with as well;
//! they are re-exported here, so `tier_controller::actuate` names every
//! VMM client in one place.

mod vhost;

pub use tier_ch_api::{
    ActuateError, BALLOON_DEVICE, Backoff, BalloonInfo, BalloonZone, ChApi, Counters,
    DEFAULT_BLOCK, LINUX_MEMORY_BLOCK, MemoryConfigInfo, MemoryZone, ResizableZone, TierState,
    VirtioMem, VmConfigInfo, VmInfo, Vmm, VmmPing, ZoneConfig, ZoneRange, parse_counters,
    parse_vm_info, resize_zone_body, resize_zones_body, tier_states,
};
pub use vhost::{
    BackendConfig, BackendFrontend, BackendPing, BackendState, BackendStats, BackendZone,
    VhostBalloon, set_targets_line,
};
