//! # ccm-controllers: the runtime of a Rust cloud-controller-manager
//!
//! This crate runs a cloud provider written against `ccm-core`: it parses Go-compatible flags,
//! builds the Kubernetes client, elects a leader, starts the shared informers and the four
//! controllers of Go's `k8s.io/cloud-provider` (cloud-node, cloud-node-lifecycle, service and
//! route), serves health and metrics, and shuts down gracefully.
//!
//! Data flows one way: watch → shared store ([`informer`]) → controller queue ([`workqueue`])
//! → pure planning → cloud call (through the cloud-call budget) → API write → event/metric.

#![warn(missing_docs)]

pub mod context;
mod error;
pub mod events;
pub mod informer;
pub mod metrics;
pub mod service;
pub mod workqueue;

pub use context::{ContextParams, ControllerContext};
pub use error::ControllerError;
pub use events::EventRecorder;
pub use informer::{Change, Informer, Subscription};
pub use metrics::{MetricsRegistry, WorkQueueMetrics};
pub use workqueue::{Backoff, Outcome, WorkQueue};
