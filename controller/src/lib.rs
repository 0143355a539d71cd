//! tier-controller: the client side of tier.v1 (tierctl's views) and, with
//! its own issue, the controller that balances DRAM between VMs.

pub mod view;
