//! The route controller (`node-route-controller`, alias `route`): one cloud route per Node pod
//! CIDR, and the Nodes' `NetworkUnavailable` condition (reference §5).
//!
//! What it does, rule by rule as Go's `controllers/route`, with these deliberate differences:
//! - **Watch-driven with a periodic safety net** (reference §9 item 2). A reconcile runs when a
//!   Node is added or deleted or its `spec.podCIDRs` or `status.addresses` change (changes
//!   within [`RouteConfig::debounce`] are coalesced into one reconcile; changes during a
//!   reconcile cause exactly one more), and every [`RouteConfig::reconciliation_period`]
//!   (`--route-reconciliation-period`, default 10 s). With no Node changes the steady-state cost
//!   is one `list_routes` per period. Go (default) only polls every 10 s.
//! - **Failed creates are retried per route** with exponential backoff
//!   ([`RouteConfig::create_retry_backoff`]), without waiting for the next period and without
//!   listing the routes again; Go retries only on the next reconcile.
//! - **`CloudError::Retry` is honoured** on every call: a failed `list_routes` or delete requeues
//!   the reconcile after the provider's delay, a create is retried after it (and no
//!   `FailedToCreateRoute` event is emitted for it).
//! - **Blackhole routes of a live Node are replaced in the same pass** (Go deletes them and
//!   creates the route only on the next reconcile, reporting `RouteCreated` meanwhile).
//! - A failed reconcile (listing routes failed, or a delete failed) is retried with backoff
//!   ([`RouteConfig::reconcile_retry_backoff`]) instead of waiting for the next period.
//! - Pod CIDRs are compared as networks, not strings, so a provider listing `fd00:0::/64` for
//!   `fd00::/64` causes no churn.
//!
//! The planner (`plan`) is pure; this module is the shell that lists routes, calls the
//! cloud (at most [`RouteConfig::max_concurrent_operations`] create/delete calls in flight, Go's
//! 200), emits events and writes conditions.

mod cloud;
mod metrics;
mod patch;
pub(crate) mod plan;
mod sync;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::IpNet;
use tokio::sync::{RwLock, Semaphore};

use crate::machinery::context::ControllerContext;
use crate::machinery::error::ControllerError;
use crate::machinery::workqueue::{Backoff, WorkQueue};

use self::metrics::RouteMetrics;
use self::sync::{Reconciler, tick, watch_nodes};
pub use plan::{parse_cluster_cidrs, validate_cluster_cidrs};

/// The controller's canonical name (for `--controllers`).
pub const NAME: &str = "node-route-controller";
/// The controller's alias (Go's older short name).
pub const ALIAS: &str = "route";
/// The component the controller's events report as (Go's).
pub const EVENT_COMPONENT: &str = "route_controller";
/// Warning event reason when a route could not be created.
pub const REASON_FAILED_TO_CREATE_ROUTE: &str = "FailedToCreateRoute";
/// Go's limit of concurrent cloud route operations per reconcile.
pub const DEFAULT_MAX_CONCURRENT_OPERATIONS: usize = 200;

/// Name of the reconcile work queue (Go's, in the work-queue metrics).
const QUEUE_NAME: &str = "Routes";
/// Name of the per-route create retry queue.
const RETRY_QUEUE_NAME: &str = "RouteCreateRetries";
/// Workers retrying failed creates (each call also holds one of the operation permits).
const RETRY_WORKERS: usize = 8;
/// Attempts to write a Node condition when the write conflicts (Go: 5 × 100 ms).
const CONDITION_ATTEMPTS: u32 = 5;
/// Delay between condition write attempts.
const CONDITION_RETRY_DELAY: Duration = Duration::from_millis(100);
/// Condition writes in flight at once.
const CONDITION_WRITERS: usize = 16;

/// The route controller's configuration.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RouteConfig {
    /// `--cluster-cidr`: one CIDR, or one IPv4 and one IPv6 (see [`parse_cluster_cidrs`]).
    /// The controller deletes only routes inside these. Required: empty is a configuration
    /// error.
    pub cluster_cidrs: Vec<IpNet>,
    /// `--route-reconciliation-period` (Go default 10 s): the full reconcile that runs even
    /// when no Node changed.
    pub reconciliation_period: Duration,
    /// How long Node changes are collected before the reconcile they trigger starts.
    pub debounce: Duration,
    /// Most cloud route create/delete calls in flight at once (Go: 200).
    pub max_concurrent_operations: usize,
    /// Backoff between retries of one failed route create.
    pub create_retry_backoff: Backoff,
    /// Backoff between retries of a failed reconcile (routes could not be listed, or a delete
    /// failed).
    pub reconcile_retry_backoff: Backoff,
}

impl Default for RouteConfig {
    fn default() -> Self {
        RouteConfig {
            cluster_cidrs: Vec::new(),
            reconciliation_period: Duration::from_secs(10),
            debounce: Duration::from_millis(200),
            max_concurrent_operations: DEFAULT_MAX_CONCURRENT_OPERATIONS,
            create_retry_backoff: Backoff {
                base: Duration::from_secs(2),
                max: Duration::from_secs(300),
            },
            reconcile_retry_backoff: Backoff {
                base: Duration::from_secs(1),
                max: Duration::from_secs(300),
            },
        }
    }
}

impl RouteConfig {
    /// Checks the configuration before the controller starts. The messages name the flags, as
    /// the runtime shows them at startup.
    pub fn validate(&self) -> Result<(), ControllerError> {
        let config = self;
        let how = "set --cluster-cidr to one CIDR or to one IPv4 and one IPv6 CIDR separated by a \
               comma, or turn cloud routes off with --configure-cloud-routes=false";
        if config.cluster_cidrs.is_empty() {
            return Err(ControllerError::Config {
                controller: NAME,
                message: format!(
                    "--cluster-cidr is required when cloud routes are configured \
                 (--configure-cloud-routes=true, the default) and the provider supports routes: {how}"
                ),
            });
        }
        if let Err(problem) = validate_cluster_cidrs(&config.cluster_cidrs) {
            return Err(ControllerError::Config {
                controller: NAME,
                message: format!("invalid --cluster-cidr: {problem}: {how}"),
            });
        }
        if config.reconciliation_period.is_zero() {
            return Err(ControllerError::Config {
                controller: NAME,
                message: "--route-reconciliation-period must be greater than zero".to_owned(),
            });
        }
        if config.max_concurrent_operations == 0 {
            return Err(ControllerError::Config {
                controller: NAME,
                message: "the route controller's concurrent cloud operations must be at least 1"
                    .to_owned(),
            });
        }
        Ok(())
    }
}

/// Runs the route controller until `ctx.shutdown` fires, then lets in-flight work finish.
///
/// Fails at once with [`ControllerError::MissingCapability`] when the provider has no
/// `routes`, and with [`ControllerError::Config`] when `config` is invalid (e.g. no
/// `--cluster-cidr`).
pub async fn run(ctx: ControllerContext, config: RouteConfig) -> Result<(), ControllerError> {
    if ctx.cloud.routes().is_none() {
        return Err(ControllerError::MissingCapability {
            controller: NAME,
            capability: "routes",
        });
    }
    config.validate()?;
    let metrics = RouteMetrics::register(&ctx.metrics);
    let changes = tokio::select! {
        () = ctx.shutdown.cancelled() => return Ok(()),
        changes = ctx.nodes.subscribe() => changes,
    };
    let Some(mut changes) = changes else {
        return Err(ControllerError::NotSynced(NAME));
    };
    // The first reconcile (the ticker's, at once) covers every Node in the store at start.
    changes.skip_initial();
    tracing::info!(
        cluster_cidrs = ?config.cluster_cidrs,
        period = ?config.reconciliation_period,
        "starting route controller"
    );

    let shutdown = ctx.shutdown.clone();
    let queue: WorkQueue<()> = ctx.queue(QUEUE_NAME, config.reconcile_retry_backoff);
    let ctrl = Arc::new(Reconciler {
        recorder: ctx.recorder(EVENT_COMPONENT),
        ops: Arc::new(Semaphore::new(config.max_concurrent_operations)),
        retries: ctx.queue(RETRY_QUEUE_NAME, config.create_retry_backoff),
        reconcile_lock: RwLock::new(()),
        pending: Mutex::new(HashSet::new()),
        written: Mutex::new(HashMap::new()),
        metrics,
        ctx,
        config,
    });

    let watcher = tokio::spawn(watch_nodes(
        changes,
        ctrl.ctx.activity().clone(),
        queue.clone(),
        ctrl.config.debounce,
        shutdown.clone(),
    ));
    let ticker = tokio::spawn(tick(
        queue.clone(),
        ctrl.config.reconciliation_period,
        shutdown.clone(),
    ));
    let retry_workers = {
        let ctrl = ctrl.clone();
        let retries = ctrl.retries.clone();
        let shutdown = shutdown.clone();
        async move {
            retries
                .run_workers(RETRY_WORKERS, shutdown, move |key| {
                    let ctrl = ctrl.clone();
                    async move { ctrl.retry_create(key).await }
                })
                .await;
        }
    };
    let reconcile_worker = {
        let ctrl = ctrl.clone();
        let shutdown = shutdown.clone();
        async move {
            queue
                .run_workers(1, shutdown, move |()| {
                    let ctrl = ctrl.clone();
                    async move { ctrl.reconcile().await }
                })
                .await;
        }
    };
    tokio::join!(reconcile_worker, retry_workers);
    let _ = watcher.await;
    let _ = ticker.await;
    tracing::info!("route controller stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn config_errors_name_the_flags() {
        let err = RouteConfig::default().validate().unwrap_err().to_string();
        assert!(err.starts_with("node-route-controller: "), "{err}");
        assert!(err.contains("--cluster-cidr"), "{err}");
        assert!(err.contains("--configure-cloud-routes=false"), "{err}");
        let bad = RouteConfig {
            cluster_cidrs: vec![
                "10.0.0.0/16".parse().unwrap(),
                "10.1.0.0/16".parse().unwrap(),
            ],
            ..RouteConfig::default()
        };
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.contains("invalid --cluster-cidr"), "{err}");
        assert!(err.contains("one IPv4 and one IPv6"), "{err}");
        assert!(err.contains("--configure-cloud-routes=false"), "{err}");
        let ok = RouteConfig {
            cluster_cidrs: vec!["10.0.0.0/16".parse().unwrap()],
            ..RouteConfig::default()
        };
        ok.validate().unwrap();
        assert_eq!(ok.reconciliation_period, Duration::from_secs(10));
        assert_eq!(ok.max_concurrent_operations, 200);
    }
}
