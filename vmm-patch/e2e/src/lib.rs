//! `tier-e2e` as a library: launching a test guest under the patched
//! cloud-hypervisor ([`vmm`]), shared by the e2e binary and the fidelity
//! bench (`benches/`), so both boot it the same way.

pub mod vmm;
