//! The cloud-node controller (`cloud-node-controller`, Go alias `cloud-node`): initialises the
//! Nodes kubelet `--cloud-provider=external` registers with the
//! `node.cloudprovider.kubernetes.io/uninitialized` taint, reconciles their beta/GA labels, and
//! refreshes their addresses periodically.
//!
//! Behaviour follows Go's `k8s.io/cloud-provider/controllers/node`, with these deliberate
//! differences:
//! - **Concurrency**: [`CloudNodeConfig::workers`] defaults to
//!   [`DEFAULT_WORKERS`] (Go: 1, where 1,000 nodes at 100 ms per cloud call take over 100 s);
//!   zero is refused instead of silently starting nothing.
//! - **Writes**: labels, providerID and taint removal go in one JSON patch guarded by a `test`
//!   of `metadata.resourceVersion`, re-planned from a fresh GET on conflict (Go PUTs the whole
//!   cached object); addresses go in one merge patch of the status subresource. So a node costs
//!   three API requests: two writes and the `Synced` event.
//! - **Failures** emit a Warning `SyncFailed` event naming the step (metadata, providerID,
//!   node IP, update, addresses), and a failed address write is retried (Go only logs both).
//!   `CloudError::Retry` requeues after the provider's delay, with no event.
//! - **Legacy providers**: the by-provider-ID lookups are skipped when the node has no
//!   providerID (Go calls them with an empty string), and an empty instance ID is an error
//!   rather than the providerID `"<provider>://"`.
//! - **Batched lookups**: with a provider offering
//!   [`InstancesBatch`](ccm_core::InstancesBatch), the Nodes initialised within 100 ms of each
//!   other are looked up in one `describe_instances` call (at most `max_batch_size` Nodes), and
//!   the periodic refresh asks every initialised Node in calls of `max_batch_size`. A Node
//!   missing from an answer is asked alone; a `Retry` of a call delays every Node of it.
//! - **Refresh last**: the periodic refresh's cloud calls go after initialisation and the
//!   lifecycle checks in the cloud-call budget; a refresh that does not fit its period
//!   stretches it, with the gauge `node_controller_address_refresh_period_seconds` and one
//!   warning (`refresh.rs`).
//! - **Labels kept in step** (off by default, [`CloudNodeConfig::reconcile_cloud_labels`]):
//!   the periodic refresh also brings zone, region, instance type (GA and beta) and the
//!   provider's additional labels in step with the cloud, from the answer it already gets
//!   (`plan::plan_cloud_labels` states the rule); Go writes them once, at initialisation.
//! - **Address change detection** is exact within each address type (Go's map-based check
//!   misses changes between lists holding several addresses of one type).

pub(crate) mod cloud;
mod metrics;
pub(crate) mod plan;
mod refresh;
mod shadow;
mod sync;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ccm_core::NodeView;
use ccm_core::well_known::TAINT_UNINITIALIZED;
use futures::StreamExt;
use tokio::time::MissedTickBehavior;

use crate::controllers::node::instance_batch;
use crate::machinery::budget::lanes::{Lane, in_lane};
use crate::machinery::context::ControllerContext;
use crate::machinery::error::ControllerError;
use crate::machinery::informer::Change;
use crate::machinery::workqueue::{Backoff, WorkQueue};

use self::metrics::CloudNodeMetrics;
use self::sync::Reconciler;

/// The controller's canonical name.
pub const NAME: &str = "cloud-node-controller";
/// The short name `--controllers` also accepts (and the `running_managed_controllers` label).
pub const ALIAS: &str = "cloud-node";
/// The component name of its Events (Go's).
pub const EVENT_COMPONENT: &str = "cloud-node-controller";
/// The name of its work queue (Go's; the `name` label of the work-queue metrics).
pub const QUEUE_NAME: &str = "Nodes";
/// Default of `--concurrent-node-syncs`. With 100 workers, 1,000 nodes registering together at
/// 100 ms per cloud call initialise about 100 times faster than with Go's default of 1, which
/// needs over 100 s of cloud calls alone (`benches/node_init.rs`; figures:
/// docs/performance.md, "Worker defaults").
pub const DEFAULT_WORKERS: usize = 100;

/// How many times the periodic address refresh retries a `describe_instances` call answered
/// with `CloudError::Retry` (after the provider's delay) before leaving its Nodes to the next
/// period.
const REFRESH_BATCH_RETRIES: usize = 5;

/// The periodic address refresh spreads its `describe_instances` calls over this fraction of
/// `--node-status-update-frequency` (30 s of the default 5 minutes): 5,000 Nodes at 100 per
/// call are 50 calls at 1.7 per second instead of a burst that a cloud's quota answers with
/// `Retry` in part (docs/performance.md, "steady"). Each Node's addresses are still refreshed
/// once per period.
const REFRESH_SPREAD_DIVISOR: u32 = 10;

/// Configuration of the cloud-node controller.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CloudNodeConfig {
    /// `--concurrent-node-syncs`: nodes initialised in parallel. Default
    /// [`DEFAULT_WORKERS`]; zero is an error.
    pub workers: usize,
    /// `--node-status-update-frequency`: how often every initialised node's addresses are
    /// refreshed from the cloud. Default 5 minutes; zero is an error.
    pub status_update_frequency: Duration,
    /// `--concurrent-node-status-updates`: parallel address refreshes; 0 means the same as
    /// `workers` (Go's default).
    pub status_update_workers: usize,
    /// `--reconcile-cloud-labels`: the periodic refresh also brings zone, region, instance
    /// type (GA and beta labels) and the provider's additional labels in step with the cloud,
    /// from the answer it already gets (with `InstancesV2` or `InstancesBatch`; the legacy
    /// `Instances` refresh asks only for addresses, so its labels stay as initialised).
    /// Default off (Go writes them once, at initialisation).
    pub reconcile_cloud_labels: bool,
}

impl Default for CloudNodeConfig {
    fn default() -> Self {
        CloudNodeConfig {
            workers: DEFAULT_WORKERS,
            status_update_frequency: Duration::from_secs(5 * 60),
            status_update_workers: 0,
            reconcile_cloud_labels: false,
        }
    }
}

impl CloudNodeConfig {
    /// Checks the configuration, naming the offending flag.
    pub fn validate(&self) -> Result<(), ControllerError> {
        if self.workers == 0 {
            return Err(ControllerError::Config {
                controller: NAME,
                message:
                    "--concurrent-node-syncs must be at least 1 (0 would never initialise a node)"
                        .into(),
            });
        }
        if self.status_update_frequency.is_zero() {
            return Err(ControllerError::Config {
                controller: NAME,
                message: "--node-status-update-frequency must be greater than 0".into(),
            });
        }
        Ok(())
    }

    fn effective_status_workers(&self) -> usize {
        if self.status_update_workers == 0 {
            self.workers
        } else {
            self.status_update_workers
        }
    }
}

/// Runs the cloud-node controller until `ctx.shutdown` fires, then lets in-flight work finish.
///
/// Fails at once when the configuration is invalid or the provider offers neither
/// `instances_v2` nor `instances`; returns `Ok` when shut down (also before the informers
/// synced).
pub async fn run(ctx: ControllerContext, config: CloudNodeConfig) -> Result<(), ControllerError> {
    config.validate()?;
    if ctx.cloud.instances_v2().is_none() && ctx.cloud.instances().is_none() {
        return Err(ControllerError::MissingCapability {
            controller: NAME,
            capability: "instances_v2 or instances",
        });
    }
    // Every Node in the store at start arrives once on the subscription, then every change.
    let changes = tokio::select! {
        () = ctx.shutdown.cancelled() => return Ok(()),
        changes = ctx.nodes.subscribe() => changes,
    };
    let Some(mut changes) = changes else {
        return Err(ControllerError::NotSynced(NAME));
    };

    let metrics = CloudNodeMetrics::register(&ctx.metrics);
    metrics::register_uninitialised(&ctx.metrics, &ctx.nodes, ctx.ownership());
    let recorder = ctx.recorder(EVENT_COMPONENT);
    let shared = Arc::new(Reconciler::new(
        ctx.clone(),
        recorder,
        metrics,
        config.reconcile_cloud_labels,
        config.workers,
    ));
    let queue: WorkQueue<String> = ctx.queue(QUEUE_NAME, Backoff::CONTROLLER);
    tracing::info!(
        workers = config.workers,
        status_update_frequency = ?config.status_update_frequency,
        reconcile_cloud_labels = config.reconcile_cloud_labels,
        "starting {NAME}"
    );

    // Informer → queue (Go: Add and Update handlers; a Delete only drops what we remember).
    let feeder = {
        let (ctx, queue, shared) = (ctx.clone(), queue.clone(), shared.clone());
        tokio::spawn(async move {
            loop {
                let change = tokio::select! {
                    () = ctx.shutdown.cancelled() => break,
                    change = changes.recv() => change,
                };
                match change {
                    None => break,
                    Some(Change::Applied { new, .. }) => {
                        expect_comparison(&ctx, &new);
                        queue.add(new.name().to_owned());
                    }
                    Some(Change::Deleted(node)) => shared.forget(node.name()),
                    Some(Change::Resync) => {
                        for node in ctx.nodes.list() {
                            expect_comparison(&ctx, &node);
                            queue.add(node.name().to_owned());
                        }
                    }
                }
            }
        })
    };

    // Periodic address refresh of every initialised node (Go: immediately, then every period).
    let refresher = {
        let (ctx, queue, shared) = (ctx.clone(), queue.clone(), shared.clone());
        let period = config.status_update_frequency;
        let workers = config.effective_status_workers();
        let mut achieved = refresh::RefreshPeriod::register(&ctx.metrics, period);
        // Its cloud calls go last in the budget (after initialisation and lifecycle checks).
        tokio::spawn(in_lane(Lane::Refresh, async move {
            let mut ticker = tokio::time::interval(period);
            ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
            // The label reconcile of the first pass is already queued: the subscription
            // delivered every Node at start.
            let mut first_pass = true;
            loop {
                tokio::select! {
                    () = ctx.shutdown.cancelled() => break,
                    _ = ticker.tick() => {}
                }
                let _busy = ctx.activity().begin();
                let started = tokio::time::Instant::now();
                let queue_labels = !std::mem::take(&mut first_pass);
                // Foreign Nodes (machinery/ownership.rs) are neither refreshed nor relabelled.
                let (initialised, tainted): (Vec<_>, Vec<_>) = ctx
                    .nodes
                    .list()
                    .into_iter()
                    .filter(|n| ctx.ownership().owns(n))
                    .partition(|n| !n.has_taint(TAINT_UNINITIALIZED));
                let count = initialised.len();
                let batching = instance_batch::batches(ctx.cloud.as_ref());
                let tainted = futures::stream::iter(tainted.into_iter().map(|n| (n, None)));
                // With a batching provider, the initialised Nodes' addresses come from
                // `describe_instances` calls of up to `max_batch_size` Nodes each, used as
                // each call answers (never every Node's answer held at once).
                let nodes = if batching {
                    instance_batch::describe_batches(
                        ctx.cloud.as_ref(),
                        initialised,
                        REFRESH_BATCH_RETRIES,
                        period / REFRESH_SPREAD_DIVISOR,
                        &ctx.shutdown,
                    )
                    .flat_map(futures::stream::iter)
                    .map(|(node, answer)| (node, Some(answer)))
                    .chain(tainted)
                    .boxed()
                } else {
                    futures::stream::iter(initialised.into_iter().map(|n| (n, None)))
                        .chain(tainted)
                        .boxed()
                };
                let refreshed = AtomicUsize::new(0);
                let pass = nodes
                    .take_until(ctx.shutdown.cancelled())
                    .for_each_concurrent(workers, |(node, answer)| {
                        let (shared, queue, refreshed) =
                            (shared.clone(), queue.clone(), &refreshed);
                        async move {
                            shared.refresh_addresses(&node, answer).await;
                            refreshed.fetch_add(1, Ordering::Relaxed);
                            // And the label reconcile, as Go's UpdateNodeStatus does.
                            if queue_labels {
                                queue.add(node.name().to_owned());
                            }
                        }
                    });
                // A pass that overruns the period says so while it runs (`refresh.rs`).
                let mut check = tokio::time::interval_at(
                    started + refresh::RUNNING_CHECK,
                    refresh::RUNNING_CHECK,
                );
                tokio::pin!(pass);
                loop {
                    tokio::select! {
                        () = &mut pass => break,
                        _ = check.tick() => {
                            achieved.running(
                                started.elapsed(),
                                refreshed.load(Ordering::Relaxed),
                                count,
                                batching,
                            );
                        }
                    }
                }
                achieved.pass_done(started.elapsed(), count, batching);
            }
        }))
    };

    let handler_shared = shared.clone();
    queue
        .run_workers(config.workers, ctx.shutdown.clone(), move |name: String| {
            let shared = handler_shared.clone();
            async move { shared.sync_node(name).await }
        })
        .await;
    let _ = feeder.await;
    let _ = refresher.await;
    tracing::info!("{NAME} stopped");
    Ok(())
}

/// Shadow mode: `node`, one of ours, is queued to be compared (`machinery/shadow/progress.rs`).
fn expect_comparison(ctx: &ControllerContext, node: &NodeView) {
    if let Some(shadow) = ctx.shadow()
        && ctx.ownership().owns(node)
    {
        shadow.expect("Node", node.name());
    }
}
