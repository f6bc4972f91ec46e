//! What every controller uses: the context handed to it, the shared informers, the work queue,
//! Kubernetes Events, the cloud-call budget, metrics, the error type, which Nodes are ours (ownership.rs) and
//! bulk writes that give way to a busy API server (write_pacing). Nothing here imports a
//! controller, the options or the runtime (see `ARCHITECTURE.md`).

pub(crate) mod budget;
pub(crate) mod context;
pub(crate) mod error;
pub(crate) mod events;
pub(crate) mod go_syntax;
pub(crate) mod informer;
pub(crate) mod initial_list;
pub(crate) mod label_selector;
pub(crate) mod lean_node;
pub(crate) mod metrics;
pub(crate) mod ownership;
pub(crate) mod shadow;
pub(crate) mod workqueue;
pub(crate) mod write_pacing;
