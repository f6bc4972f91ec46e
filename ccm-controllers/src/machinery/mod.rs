//! What every controller uses: the context handed to it, the shared informers, the work queue,
//! Kubernetes Events, the cloud-call budget, metrics, the error type and which Nodes are ours (ownership.rs). Nothing here imports a
//! controller, the options or the runtime (see `ARCHITECTURE.md`).

pub(crate) mod budget;
pub(crate) mod context;
pub(crate) mod error;
pub(crate) mod events;
pub(crate) mod go_syntax;
pub(crate) mod informer;
pub(crate) mod initial_list;
pub(crate) mod label_selector;
pub(crate) mod metrics;
pub(crate) mod ownership;
pub(crate) mod shadow;
pub(crate) mod workqueue;
