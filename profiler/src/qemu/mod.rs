//! QEMU VMs found through their QMP sockets (docs/discovery.md): tierd's
//! QMP client, the answers it reads, the tier map from the guest's NUMA
//! nodes and their memory backends, the VM as the registry tracks it, and
//! the per-VM handle the controller resizes virtio-mem devices with.

pub mod answers;
pub mod choose;
pub mod discover;
pub mod handle;
pub mod layout;
pub mod machine;
pub mod qmp;
pub mod sockets;
pub mod targets;
pub mod tracked;

pub use discover::{QemuConfig, QemuDiscovery};
pub use handle::{Fleet, QemuHandle};
