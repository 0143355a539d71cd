//! `tierctl top`: state ([`app`], [`model`]), keys ([`input`]) and a pure
//! renderer ([`render`](mod@render): state -> frame; the table there, the
//! detail pane in `detail`) that tests and benches drive with ratatui's
//! `TestBackend`. Imports go one way: `format` (text forms), `layout`
//! (screen geometry), `model`, `estimate` and `ages` import no sibling; `app` reads
//! `model` and `layout`; `input` and `detail` read `app`; `render` reads all
//! of these and calls `detail`, which takes nothing from `render`. The
//! terminal and network loop lives in the tierctl binary.

mod age_bars;
pub mod app;
mod detail;
mod evidence;
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
