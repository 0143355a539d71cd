//! `tier.v1`: the protocol between tierd and its clients.
//!
//! The messages and the `TierService` gRPC service are generated from
//! `tier.proto` (documented field by field there). This crate adds the
//! protocol version, small conversions, the byte-size format both ends
//! print ([`human_bytes`]), and a client that connects over a unix socket
//! or TCP.

/// Generated code for package `tier.v1`.
#[allow(
    missing_debug_implementations,
    clippy::all,
    clippy::unwrap_used,
    clippy::expect_used,
    rust_2018_idioms
)]
pub mod v1 {
    tonic::include_proto!("tier.v1");
}

mod bytes;
mod client;
mod kind;

pub use bytes::human_bytes;
pub use client::{ConnectError, Endpoint, connect};

/// Bumped on incompatible changes of `tier.v1`; reported in `DaemonInfo`.
pub const PROTOCOL_VERSION: u32 = 1;

/// The encoded `FileDescriptorSet` of tier.proto, comments included: what
/// server reflection hands generic clients (grpcurl) instead of our .proto.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/tier_descriptor.bin"));

/// Default unix socket of tierd.
pub const DEFAULT_SOCKET: &str = "/run/tierd/tierd.sock";
