//! tier-controller: the client side of tier.v1 (tierctl's views) and the
//! controller that balances DRAM between VMs: its decision function
//! (`policy`, see docs/controller.md) and a simulator that drives it
//! (`sim`), and the actuation side (`actuate`: the cloud-hypervisor HTTP
//! client of our patched VMM; not yet called by tierd).

pub mod actuate;
pub mod cli;
pub mod conn;
pub mod policy;
pub mod policy_json;
pub mod sim;
pub mod top;
pub mod view;
