//! `tier-balloon`: the host side of the per-tier virtio balloon of
//! `vmm-patch/SPEC.md`.
//!
//! This crate currently holds the page-release engine ([`release`]): per
//! descriptor chain of one tier's inflate or deflate queue it validates every
//! PFN against that tier's guest RAM regions, rejects the whole chain on any
//! violation (counted by reason), and otherwise releases the pages with one
//! `fallocate(PUNCH_HOLE|KEEP_SIZE)` + one `madvise(MADV_DONTNEED)` per
//! coalesced run. The vhost-user device around it comes later.
//!
//! See `docs/balloon-backend.md`.

pub mod release;

pub use release::{
    Backing, HostRange, LayoutError, MAX_CHAIN_PFNS, MAX_TIERS, Op, Outcome, PAGE_SIZE, Region,
    RejectReason, Rejected, Releaser, SysReleaser, TierBalloon, TierStats, Tiers, memfd,
};
