//! cloud-hypervisor VMs found through their API sockets (docs/discovery.md):
//! where the sockets are, the tier map from `vm.info` zones, the VM as the
//! registry tracks it, and the per-VM API handle the controller and
//! SetBalloonTargets drive the per-tier balloon with.

pub mod discover;
pub mod handle;
pub mod layout;
pub mod sockets;
pub mod tracked;

pub use discover::{ChConfig, ChDiscovery};
pub use handle::{CallError, ChHandle, Fleet, Snapshot};
