//! # ccm-controllers: the runtime of a Rust cloud-controller-manager
//!
//! This crate runs a cloud provider written against `ccm-core`: it parses Go-compatible flags,
//! builds the Kubernetes client, elects a leader, starts the shared informers and the four
//! controllers of Go's `k8s.io/cloud-provider` (cloud-node, cloud-node-lifecycle, service and
//! route) plus the node-IPAM controller of Kubernetes' own CCM ([`node_ipam`], with
//! `--allocate-node-cidrs`), serves health and metrics, and shuts down gracefully.
//!
//! Data flows one way: watch → shared store ([`informer`]) → controller queue ([`workqueue`])
//! → pure planning → cloud call (through the cloud-call budget) → API write → event/metric.
//!
//! ## Running
//!
//! A vendor's `main.rs` is a few lines: link the provider crate (so its
//! `register_cloud_provider!` registration is kept) and call [`run()`]:
//!
//! ```ignore
//! use acme_cloud as _;
//!
//! fn main() -> std::process::ExitCode {
//!     ccm_controllers::run()
//! }
//! ```
//!
//! [`run()`] parses Go-compatible flags ([`options`]), sets up logging (`-v`, `--log-format`),
//! reads `--cloud-config`, builds the provider named by `--cloud-provider`, wraps it in the
//! cloud-call budget ([`budget`]), builds the Kubernetes client ([`client`]), serves `/healthz`,
//! `/livez`, `/readyz` and `/metrics` ([`serving`]) over HTTPS with delegated authentication
//! ([`secure_serving`]), elects a leader ([`leader`]) and, while
//! leading, runs the enabled controllers until SIGTERM/SIGINT; it returns the exit code.
//! [`Builder`] adds the vendor's own flags (flattened clap `Args`), its own controllers (which get
//! the same [`ControllerContext`]) and changed defaults, without forking.

#![warn(missing_docs)]

pub mod budget;
mod builtin;
pub mod client;
pub mod cloud_node;
pub mod context;
pub mod controllers_flag;
mod error;
pub mod events;
pub mod informer;
mod instance_batch;
pub mod leader;
pub mod metrics;
pub mod node_ipam;
pub mod node_lifecycle;
pub mod options;
pub mod route;
pub mod runtime;
pub mod secure_serving;
pub mod service;
pub mod serving;
pub mod workqueue;

pub use context::{ContextParams, ControllerContext, InformerScope};
pub use error::ControllerError;
pub use events::{EventBroadcaster, EventRecorder, EventWriter};
pub use informer::{Change, Informer, Subscription};
pub use metrics::{MetricsRegistry, WorkQueueMetrics};
pub use workqueue::{Activity, ActivityGuard, Backoff, Outcome, WorkQueue};

pub use budget::{BudgetConfig, BudgetedProvider, TokenBucket};
pub use builtin::builtin_controllers;
pub use controllers_flag::{ControllerSelection, KnownController};
pub use options::{FlagError, Options, parse_go_duration};
pub use runtime::{
    Builder, ControllerEntry, ControllerFuture, NoArgs, StartArgs, StartFn, parse_flags, run,
};

#[cfg(doctest)]
#[doc = include_str!("../../docs/writing-a-provider.md")]
mod guide_writing_a_provider {}

#[cfg(doctest)]
#[doc = include_str!("../../docs/running.md")]
mod guide_running {}

#[cfg(doctest)]
#[doc = include_str!("../../docs/testing.md")]
mod guide_testing {}

#[cfg(doctest)]
#[doc = include_str!("../../docs/migrating-from-go.md")]
mod guide_migrating_from_go {}

#[cfg(doctest)]
#[doc = include_str!("../../docs/README.md")]
mod guide_index {}

#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
mod readme {}
