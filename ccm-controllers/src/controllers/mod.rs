//! The built-in controllers of Go's `k8s.io/cloud-provider`, one folder each, all of one shape:
//! `mod.rs` (`NAME`, `ALIAS`, the `Config` with `validate()`, `run()`), `sync.rs` (the reconciler),
//! `plan.rs` (pure planning, no I/O), `patch.rs`/`cloud.rs` where the controller writes or calls.
//! Controllers import only the crate's plumbing (`machinery`) and each other's shared module, never
//! the runtime or the options (see `ARCHITECTURE.md`).

pub mod cloud_node;
pub(crate) mod node;
pub mod node_ipam;
pub mod node_lifecycle;
pub mod route;
pub mod service;
