//! `tier-balloon`: the host side of the per-tier virtio balloon of
//! `vmm-patch/SPEC.md`, as a vhost-user backend process.
//!
//! - [`release`]: the page-release engine. Per descriptor chain of one
//!   tier's inflate (or deflate) queue it validates every PFN against that
//!   tier's guest RAM regions, rejects the whole chain on any violation
//!   (counted by reason), and otherwise releases the pages with one
//!   `fallocate(PUNCH_HOLE|KEEP_SIZE)` + one `madvise(MADV_DONTNEED)` per
//!   coalesced run.
//! - [`device`]: the vhost-user device (vhost-user-backend): queues in SPEC
//!   order, config space through GET/SET_CONFIG, stats queue, targets and
//!   the config-change message; split as firecracker's balloon is: the
//!   engine over mapped memory (`device/engine.rs`), queue serving
//!   (`queues.rs`), the stats buffers (`stats.rs`), the `state` answer
//!   (`snapshot.rs`).
//! - [`chain`]: the bounded descriptor-chain walk (loops, indices past a
//!   table and bad indirect tables make the whole chain malformed).
//! - [`control`]: the control socket (newline-delimited JSON) for targets
//!   and state; [`server`] and [`relay`]: the vhost-user socket (the relay
//!   also answers out-of-window GET/SET_CONFIG itself).
//! - [`spec`]: the tiers (`--tier name=...,ranges=...`); [`config`]: the
//!   config-space layout and write rules.
//!
//! See `docs/balloon-backend.md`.

pub mod chain;
pub mod config;
pub mod control;
pub mod device;
pub mod relay;
pub mod release;
pub mod server;
pub mod spec;

pub use device::{Balloon, DeviceOptions, Snapshot};
pub use release::{
    Backing, HostRange, LayoutError, MAX_CHAIN_PFNS, MAX_TIERS, Op, Outcome, PAGE_SIZE, Region,
    RejectReason, Rejected, Releaser, SysReleaser, TierBalloon, TierStats, Tiers, memfd,
};
pub use spec::{GpaRange, TierSpec};
