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
//! The planner ([`plan`]) is pure; this module is the shell that lists routes, calls the
//! cloud (at most [`RouteConfig::max_concurrent_operations`] create/delete calls in flight, Go's
//! 200), emits events and writes conditions.

mod cloud;
mod metrics;
mod patch;
pub mod plan;
mod sync;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use tokio::sync::{RwLock, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::machinery::context::ControllerContext;
use crate::machinery::error::ControllerError;
use crate::machinery::informer::{Change, Subscription};
use crate::machinery::workqueue::{Activity, Backoff, WorkQueue};

use self::metrics::RouteMetrics;
use self::sync::Reconciler;
use plan::NodeInfo;
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

/// Whether a Node change can change the routes: added, deleted, its pod CIDRs or its
/// addresses changed, or the subscriber missed changes.
fn is_relevant(change: &Change<Node>) -> bool {
    match change {
        Change::Applied { old: None, .. } | Change::Deleted(_) | Change::Resync => true,
        Change::Applied {
            old: Some(old),
            new,
        } => {
            let (o, n) = (NodeInfo::from_node(old), NodeInfo::from_node(new));
            o.pod_cidrs != n.pod_cidrs || o.addresses != n.addresses || o.uid != n.uid
        }
    }
}

/// Turns relevant Node changes into reconciles: the first relevant change opens a window of
/// `debounce`; everything arriving in it is folded into one reconcile.
async fn watch_nodes(
    mut changes: Subscription<Node>,
    activity: Activity,
    queue: WorkQueue<()>,
    debounce: Duration,
    shutdown: CancellationToken,
) {
    loop {
        let change = tokio::select! {
            () = shutdown.cancelled() => return,
            c = changes.recv() => c,
        };
        let Some(change) = change else { return };
        if !is_relevant(&change) {
            continue;
        }
        // In flight until the reconcile is queued (the queue counts from then on).
        let _busy = activity.begin();
        let window = tokio::time::sleep(debounce);
        tokio::pin!(window);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = &mut window => break,
                c = changes.recv() => if c.is_none() { return },
            }
        }
        queue.add(());
    }
}

/// The periodic safety net: a full reconcile every `period` (not sliding: a slow reconcile
/// does not push the next one back, as Go's `NonSlidingUntil`), the first one at once.
async fn tick(queue: WorkQueue<()>, period: Duration, shutdown: CancellationToken) {
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = interval.tick() => queue.add(()),
        }
    }
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

    #[test]
    fn only_cidr_address_and_membership_changes_are_relevant() {
        use k8s_openapi::api::core::v1::{NodeAddress, NodeCondition, NodeSpec, NodeStatus};
        let base = Node {
            metadata: kube::api::ObjectMeta {
                name: Some("a".into()),
                uid: Some("u".into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                pod_cidrs: Some(vec!["10.244.1.0/24".into()]),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(vec![NodeAddress {
                    type_: "InternalIP".into(),
                    address: "10.0.0.1".into(),
                }]),
                ..Default::default()
            }),
        };
        let applied = |old: &Node, new: &Node| Change::Applied {
            old: Some(Arc::new(old.clone())),
            new: Arc::new(new.clone()),
        };
        assert!(is_relevant(&Change::Applied {
            old: None,
            new: Arc::new(base.clone())
        }));
        assert!(is_relevant(&Change::Deleted(Arc::new(base.clone()))));
        assert!(is_relevant(&Change::Resync));

        let mut labels = base.clone();
        labels.metadata.labels = Some([("x".to_owned(), "y".to_owned())].into());
        labels
            .status
            .as_mut()
            .unwrap()
            .conditions
            .get_or_insert_default()
            .push(NodeCondition {
                type_: "NetworkUnavailable".into(),
                status: "False".into(),
                ..Default::default()
            });
        assert!(!is_relevant(&applied(&base, &labels)));

        let mut cidrs = base.clone();
        cidrs.spec.as_mut().unwrap().pod_cidrs =
            Some(vec!["10.244.1.0/24".into(), "fd00::/64".into()]);
        assert!(is_relevant(&applied(&base, &cidrs)));

        let mut addrs = base.clone();
        addrs.status.as_mut().unwrap().addresses = None;
        assert!(is_relevant(&applied(&base, &addrs)));
    }

    #[tokio::test(start_paused = true)]
    async fn node_changes_within_the_debounce_window_make_one_reconcile() {
        // Drives watch_nodes from a real informer fed by a channel.
        use kube::runtime::watcher::Event;
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let shutdown = CancellationToken::new();
        let (informer, driver) = crate::machinery::informer::Informer::<Node>::from_stream(
            rx,
            crate::machinery::informer::strip_node,
            shutdown.clone(),
        );
        tokio::spawn(driver);
        tx.unbounded_send(Ok(Event::Init)).unwrap();
        tx.unbounded_send(Ok(Event::InitDone)).unwrap();
        let sub = informer.subscribe().await.unwrap();
        let queue: WorkQueue<()> = WorkQueue::new("t", Backoff::CONTROLLER, None);
        let watcher = tokio::spawn(watch_nodes(
            sub,
            Activity::new(),
            queue.clone(),
            Duration::from_millis(200),
            shutdown.clone(),
        ));
        let node = |name: &str| Node {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                resource_version: Some("1".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        for i in 0..10 {
            tx.unbounded_send(Ok(Event::Apply(node(&format!("n{i}")))))
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(queue.is_empty());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(queue.len(), 1);
        let () = queue.get().await.unwrap();
        queue.done(&());
        // An irrelevant change (same node, same fields) triggers nothing.
        let mut same = node("n1");
        same.metadata.resource_version = Some("2".into());
        tx.unbounded_send(Ok(Event::Apply(same))).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(queue.is_empty());
        shutdown.cancel();
        watcher.await.unwrap();
    }
}
