//! tier-controller: the controller that balances DRAM between VMs, which
//! tierd runs in process (profiler/src/control.rs). Its decision function
//! (`policy`, see docs/controller.md) and the VMM clients that apply its
//! decisions (`actuate`): tierd sets targets through the patched
//! cloud-hypervisor's HTTP API (`ChApi`, via profiler/src/ch/); the
//! vhost-user balloon backend's client (`VhostBalloon`) is tested against
//! that backend but not yet used by tierd. The client, tierctl, is its own
//! crate (controller/tierctl/), and so is the simulator that drives the
//! decision function in tests and benches (tier-sim, controller/sim/).

pub mod actuate;
pub mod policy;
