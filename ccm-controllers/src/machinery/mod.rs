//! What every controller uses: the context handed to it, the shared informers, the work queue,
//! Kubernetes Events, the cloud-call budget, metrics and the error type. Nothing here imports a
//! controller, the options or the runtime (see `ARCHITECTURE.md`).

pub mod budget;
pub mod context;
pub(crate) mod error;
pub mod events;
pub mod go_syntax;
pub mod informer;
pub mod metrics;
pub mod workqueue;
