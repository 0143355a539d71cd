//! tierctl's integration tests under the standard harness, in one binary
//! (each module was a binary of its own): the `top` renderer and the batch
//! output's schema, with no daemon. A test keeps its file's name as its
//! module path, e.g. `cargo test -p tierctl --test integration top_render::`.
//! The tests against a real tierd are in tests/gated/.

mod top_batch_schema;
mod top_render;
