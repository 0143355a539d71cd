//! `tierctl top`: state ([`app`], [`model`]), keys ([`input`]) and a pure
//! renderer ([`render`]: state -> frame) that tests and benches drive with
//! ratatui's `TestBackend`. The terminal and network loop lives in the
//! tierctl binary.

pub mod app;
mod detail;
mod estimate;
pub mod format;
pub mod input;
pub mod layout;
pub mod model;
pub mod render;
pub mod synthetic;

pub use app::App;
pub use render::render;

/// The ratatui tierctl renders with, for benches and tests (same version).
pub use ratatui;
