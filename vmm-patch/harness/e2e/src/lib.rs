//! `tier-e2e` as a library: launching a test guest under the patched
//! cloud-hypervisor ([`vmm`]), a Linux guest on the bed ([`bed`]) and tierd
//! ([`tierd`]), shared by the e2e and soak binaries and the benches
//! (`benches/`), so all start them the same way.

pub mod bed;
pub mod run;
pub mod tierd;
pub mod vmm;
