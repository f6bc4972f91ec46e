//! Helpers the test modules share. `https.rs`, `connection.rs`, `openmetrics.rs` and
//! `minimal_api.rs` are also compiled into the test binaries that run apart
//! (`tests/runtime_logs.rs`, `tests/runtime_signal.rs`), so each of those files holds only
//! what every binary that includes it uses.

pub(crate) mod connection;
pub(crate) mod https;
pub(crate) mod minimal_api;
pub(crate) mod node;
pub(crate) mod openmetrics;
pub(crate) mod requests;
pub(crate) mod service;
