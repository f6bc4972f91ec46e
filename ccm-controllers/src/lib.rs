//! # ccm-controllers: the runtime of a Rust cloud-controller-manager
//!
//! This crate runs a cloud provider written against `ccm-core`: it parses Go-compatible flags,
//! builds the Kubernetes client, elects a leader, starts the shared informers and the four
//! controllers of Go's `k8s.io/cloud-provider` (cloud-node, cloud-node-lifecycle, service and
//! route) plus the node-IPAM controller of Kubernetes' own CCM ([`node_ipam`](controllers::node_ipam), with
//! `--allocate-node-cidrs`), serves health and metrics, and shuts down gracefully.
//!
//! Data flows one way: watch → shared store ([`Informer`]) → controller queue ([`WorkQueue`])
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
//! cloud-call budget ([`BudgetedProvider`]), builds the Kubernetes clients ([`ClientFactory`]), serves
//! `/healthz`, `/livez`, `/readyz` and `/metrics` over HTTPS with delegated authentication
//! ([`secure_serving`]), elects a leader (a `coordination.k8s.io` Lease) and, while
//! leading, runs the enabled controllers until SIGTERM/SIGINT; it returns the exit code.
//! [`Builder`] adds the vendor's own flags (flattened clap `Args`), its own controllers (which get
//! the same [`ControllerContext`]) and changed defaults, without forking.

#![warn(missing_docs)]

pub mod controllers;
mod machinery;
pub mod options;
mod runtime;
pub mod secure_serving;

/// Entry points into pure code for the fuzz targets of `fuzz/`; not a vendor API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub use runtime::fuzzing;

pub use machinery::budget::{BudgetConfig, BudgetedProvider, MIN_RETRY_AFTER};
pub use machinery::context::{ContextParams, ControllerContext, InformerScope};
pub use machinery::error::ControllerError;
pub use machinery::events::{
    DEFAULT_FLUSH_TIMEOUT, EventBroadcaster, EventRecorder, EventWriter, MAX_IN_FLIGHT,
    MAX_TRIES_PER_EVENT, NormalEventBudget, WARN_LOG_INTERVAL,
};
pub use machinery::go_syntax::parse_go_duration;
pub use machinery::informer::{CachedObject, Change, Informer, Subscription, strip_node};
pub use machinery::label_selector::{ManagedNodeSelector, SelectorError};
pub use machinery::metrics::{MetricsRegistry, WorkQueueMetrics};
pub use machinery::workqueue::{Activity, ActivityGuard, Backoff, Outcome, WorkQueue};
pub use runtime::builtin::builtin_controllers;
pub use runtime::client::{ClientError, ClientFactory, user_agent};
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
