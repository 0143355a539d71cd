//! `tier-e2e` as a library: launching a test guest under the patched
//! cloud-hypervisor ([`vmm`]) and tierd ([`tierd`]), shared by the e2e and
//! soak binaries and the fidelity bench (`benches/`), so all start them the
//! same way.

pub mod run;
pub mod tierd;
pub mod vmm;
