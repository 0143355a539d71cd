//! `tier-testguest`: a freestanding PVH test guest for the per-tier balloon
//! of `vmm-patch/SPEC.md`, built by `build.rs` with the system C compiler.
//!
//! The guest (`guest/`, C and a little assembly) boots under the patched
//! cloud-hypervisor with `--kernel`, drives the per-tier balloon with a
//! polled virtio-pci driver, runs a phased access workload over the memory
//! of each tier and reports exact per-tier access counts through the stats
//! queue and on the serial port. See `docs/testguest.md`.
//!
//! This crate gives the host side what it needs to use it:
//! - [`elf_path`]: the built guest ELF;
//! - [`canary`]: the pattern in every page the guest's workload uses
//!   ([`CANARY`]), for checking guest memory from outside;
//! - [`params`]: the guest's command line, parsed and checked by the guest's
//!   own C parser (compiled for the host), and built from Rust;
//! - [`serial`]: the guest's `tg ...` serial lines as key/value records;
//! - [`truth`]: the exact counts the guest keeps in its memory;
//! - [`wire`]: the guest's config-space, queue-order and stats code, compiled
//!   for the host (what the SPEC agreement tests check);
//! - [`zipf`]: the guest's Zipf popularity tables (`zipf=`), compiled for the host.

use std::path::Path;

pub mod canary;
pub mod params;
pub mod serial;
pub mod truth;
pub mod wire;
pub mod zipf;

pub use canary::CANARY;

/// Path of the guest ELF that `build.rs` produced (in this build's `OUT_DIR`).
pub const ELF_PATH: &str = env!("TIER_TESTGUEST_ELF");

/// The guest ELF, to pass as cloud-hypervisor's `--kernel`.
pub fn elf_path() -> &'static Path {
    Path::new(ELF_PATH)
}

unsafe extern "C" {
    fn tg_abi_layout(which: u32) -> usize;
}

/// Size or offset number `which` of the C structs (see `host/abi.c`), for
/// the layout checks of the mirrored `#[repr(C)]` types.
#[doc(hidden)]
pub fn c_layout(which: u32) -> usize {
    // SAFETY: a pure C function of its integer argument.
    unsafe { tg_abi_layout(which) }
}
