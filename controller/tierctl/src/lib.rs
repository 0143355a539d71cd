//! tierctl: the client of tierd. Everything between the tier.v1 stream and
//! the user: the command line (`cli`), the connection (`conn`), the flat
//! table/JSON/CSV views of an update (`view`), the policy as JSON
//! (`policy_json`) and the live terminal UI (`top`). The binary's commands
//! (src/cmd/) run these; tests and benches drive them directly.

pub mod cli;
pub mod conn;
pub mod policy_json;
pub mod signal;
pub mod top;
pub mod view;
