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

pub mod plan;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ccm_core::{CloudError, Route, Routes};
use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use tokio::sync::{RwLock, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::context::ControllerContext;
use crate::error::ControllerError;
use crate::events::EventRecorder;
use crate::informer::{Change, Subscription};
use crate::metrics::MetricsRegistry;
use crate::workqueue::{Activity, Backoff, Outcome, WorkQueue};

use plan::{DesiredCondition, NodeInfo, RouteCreate, RouteKey, RoutePlan};
pub use plan::{parse_cluster_cidrs, validate_cluster_cidrs};

/// The controller's canonical name (for `--controllers`).
pub const CONTROLLER_NAME: &str = "node-route-controller";
/// The controller's alias (Go's older short name).
pub const CONTROLLER_ALIAS: &str = "route";
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

/// Checks a configuration before the controller starts. The messages name the flags, as the
/// runtime shows them at startup.
pub fn check_config(config: &RouteConfig) -> Result<(), ControllerError> {
    let how = "set --cluster-cidr to one CIDR or to one IPv4 and one IPv6 CIDR separated by a \
               comma, or turn cloud routes off with --configure-cloud-routes=false";
    if config.cluster_cidrs.is_empty() {
        return Err(ControllerError::Config {
            controller: CONTROLLER_NAME,
            message: format!(
                "--cluster-cidr is required when cloud routes are configured \
                 (--configure-cloud-routes=true, the default) and the provider supports routes: {how}"
            ),
        });
    }
    if let Err(problem) = validate_cluster_cidrs(&config.cluster_cidrs) {
        return Err(ControllerError::Config {
            controller: CONTROLLER_NAME,
            message: format!("invalid --cluster-cidr: {problem}: {how}"),
        });
    }
    if config.reconciliation_period.is_zero() {
        return Err(ControllerError::Config {
            controller: CONTROLLER_NAME,
            message: "--route-reconciliation-period must be greater than zero".to_owned(),
        });
    }
    if config.max_concurrent_operations == 0 {
        return Err(ControllerError::Config {
            controller: CONTROLLER_NAME,
            message: "the route controller's concurrent cloud operations must be at least 1"
                .to_owned(),
        });
    }
    Ok(())
}

/// The route controller's metrics.
#[derive(Clone, Debug)]
struct RouteMetrics {
    syncs: Counter,
    duration: Histogram,
}

impl RouteMetrics {
    fn register(registry: &MetricsRegistry) -> Self {
        let m = RouteMetrics {
            syncs: Counter::default(),
            // 10 ms … ~160 s.
            duration: Histogram::new(exponential_buckets(0.01, 2.0, 15)),
        };
        registry.register(
            "route_controller_route_sync",
            "A metric counting the amount of times routes have been synced with the cloud provider.",
            m.syncs.clone(),
        );
        registry.register(
            "route_controller_route_sync_duration_seconds",
            "How long one route reconcile takes (listing routes, creates, deletes, conditions).",
            m.duration.clone(),
        );
        m
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
            controller: CONTROLLER_NAME,
            capability: "routes",
        });
    }
    check_config(&config)?;
    let metrics = RouteMetrics::register(&ctx.metrics);
    let changes = tokio::select! {
        () = ctx.shutdown.cancelled() => return Ok(()),
        changes = ctx.nodes.subscribe() => changes,
    };
    let Some(mut changes) = changes else {
        return Err(ControllerError::NotSynced(CONTROLLER_NAME));
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
    let ctrl = Arc::new(RouteController {
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

struct RouteController {
    ctx: ControllerContext,
    config: RouteConfig,
    recorder: EventRecorder,
    metrics: RouteMetrics,
    /// Cloud create/delete calls in flight (reconciles and retries together).
    ops: Arc<Semaphore>,
    /// Per-route create retries.
    retries: WorkQueue<RouteKey>,
    /// A reconcile holds it exclusively; retries share it, so a retry never races a
    /// reconcile's view of which creates failed.
    reconcile_lock: RwLock<()>,
    /// Creates that failed in the last reconcile and have not succeeded since.
    pending: Mutex<HashSet<RouteKey>>,
    /// Conditions written whose watch event the Node informer has not delivered yet, by Node
    /// name: without them a reconcile right after a write would see the old condition in the
    /// cache and write it again.
    written: Mutex<HashMap<String, Written>>,
}

/// A `NetworkUnavailable` write, and the resourceVersion of the cached Node it was decided on.
#[derive(Debug)]
struct Written {
    decided_on: Option<String>,
    desired: DesiredCondition,
}

/// What went wrong while executing a plan.
#[derive(Debug, Default)]
struct ExecResult {
    /// Failed creates, with the error and how long the attempt took (from before waiting for a
    /// permit, as Go measures).
    failed_creates: Vec<(RouteCreate, CloudError, Duration)>,
    /// Deletes that failed with an error other than `Retry`.
    failed_deletes: usize,
    /// The longest `Retry` delay a delete asked for.
    delete_retry_after: Option<Duration>,
}

/// Runs a plan's deletes and creates against the provider, at most `ops` permits' worth in
/// flight. When the plan says so, every delete finishes before the first create starts.
async fn execute(
    routes: &dyn Routes,
    cluster_name: &str,
    plan: &RoutePlan,
    ops: &Semaphore,
) -> ExecResult {
    let deletes = futures::future::join_all(plan.deletes.iter().map(|route| async move {
        let started = Instant::now();
        let Ok(_permit) = ops.acquire().await else {
            return Err(CloudError::msg("route operations closed"));
        };
        tracing::info!(route = %route.name, cidr = %route.destination_cidr, target = %route.target_node, "deleting route");
        let result = routes.delete_route(cluster_name, route).await;
        match &result {
            Ok(()) => tracing::info!(
                route = %route.name, cidr = %route.destination_cidr,
                after = ?started.elapsed(), "deleted route"
            ),
            Err(error) => tracing::warn!(
                route = %route.name, cidr = %route.destination_cidr,
                after = ?started.elapsed(), %error, "could not delete route"
            ),
        }
        result
    }));
    let creates = futures::future::join_all(plan.creates.iter().map(|create| async move {
        let started = Instant::now();
        let result = create_route(routes, cluster_name, create, ops).await;
        (create, result, started.elapsed())
    }));
    let (delete_results, create_results) = if plan.deletes_before_creates {
        let d = deletes.await;
        (d, creates.await)
    } else {
        futures::join!(deletes, creates)
    };
    let mut out = ExecResult::default();
    for result in delete_results {
        match result {
            Ok(()) => {}
            Err(e) => match e.retry_after() {
                Some(after) => {
                    out.delete_retry_after =
                        Some(out.delete_retry_after.unwrap_or_default().max(after));
                }
                None => out.failed_deletes += 1,
            },
        }
    }
    for (create, result, took) in create_results {
        if let Err(e) = result {
            out.failed_creates.push((create.clone(), e, took));
        }
    }
    out
}

/// One create call, holding an operation permit.
async fn create_route(
    routes: &dyn Routes,
    cluster_name: &str,
    create: &RouteCreate,
    ops: &Semaphore,
) -> Result<(), CloudError> {
    let started = Instant::now();
    let Ok(_permit) = ops.acquire().await else {
        return Err(CloudError::msg("route operations closed"));
    };
    let node = &create.route.target_node;
    let cidr = &create.route.destination_cidr;
    tracing::info!(%node, %cidr, hint = %create.name_hint, throttled = ?started.elapsed(), "creating route");
    let result = routes
        .create_route(cluster_name, &create.name_hint, &create.route)
        .await;
    match &result {
        Ok(()) => {
            tracing::info!(%node, %cidr, hint = %create.name_hint, after = ?started.elapsed(), "created route")
        }
        Err(error) => {
            tracing::warn!(%node, %cidr, hint = %create.name_hint, after = ?started.elapsed(), %error, "could not create route")
        }
    }
    result
}

/// Go's event text for a failed create.
fn failed_create_message(create: &RouteCreate, took: Duration, error: &CloudError) -> String {
    format!(
        "Could not create route {} {} for node {} after {:?}: {}",
        create.name_hint, create.route.destination_cidr, create.route.target_node, took, error
    )
}

impl RouteController {
    fn pending(&self) -> MutexGuard<'_, HashSet<RouteKey>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One full reconcile (§5.3).
    async fn reconcile(&self) -> Outcome {
        let _exclusive = self.reconcile_lock.write().await;
        let started = Instant::now();
        let outcome = self.reconcile_locked().await;
        self.metrics
            .duration
            .observe(started.elapsed().as_secs_f64());
        outcome
    }

    async fn reconcile_locked(&self) -> Outcome {
        self.metrics.syncs.inc();
        let Some(routes) = self.ctx.cloud.routes() else {
            return Outcome::Done;
        };
        let cluster_name = self.ctx.cluster_name.as_str();
        let listed = match routes.list_routes(cluster_name).await {
            Ok(listed) => listed,
            Err(error) => {
                tracing::warn!(%error, "could not list routes");
                return match error.retry_after() {
                    Some(after) => Outcome::RequeueAfter(after),
                    None => Outcome::Failed,
                };
            }
        };
        let mut nodes = self.ctx.nodes.list();
        nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let infos: Vec<NodeInfo> = nodes.iter().map(|n| NodeInfo::from_node(n)).collect();
        let plan = plan::plan(&infos, &listed, &self.config.cluster_cidrs);
        tracing::debug!(
            routes = listed.len(),
            nodes = infos.len(),
            deletes = plan.deletes.len(),
            creates = plan.creates.len(),
            "route reconcile planned"
        );
        let result = execute(routes, cluster_name, &plan, &self.ops).await;

        // Failed creates: an event (unless the provider asked for a retry), and a per-route retry.
        let mut failed: HashSet<RouteKey> = HashSet::new();
        let mut events = Vec::new();
        for (create, error, took) in &result.failed_creates {
            let key = create.key();
            failed.insert(key.clone());
            match error.retry_after() {
                Some(after) => self.retries.add_after(key, after),
                None => {
                    self.retries.add_rate_limited(key);
                    if let Some(node) = nodes
                        .iter()
                        .find(|n| n.metadata.name.as_deref() == Some(&create.route.target_node))
                    {
                        events.push((node.clone(), failed_create_message(create, *took, error)));
                    }
                }
            }
        }
        {
            let mut pending = self.pending();
            for key in pending.iter() {
                if !failed.contains(key) {
                    self.retries.forget(key);
                }
            }
            *pending = failed.clone();
        }
        for (node, note) in events {
            self.recorder
                .warning(node.as_ref(), REASON_FAILED_TO_CREATE_ROUTE, note);
        }

        // Conditions.
        self.prune_written();
        let updates = plan::condition_updates(&plan, &failed);
        futures::stream::iter(updates)
            .for_each_concurrent(CONDITION_WRITERS, |(name, desired)| async move {
                self.set_condition(&name, desired).await;
            })
            .await;

        if let Some(after) = result.delete_retry_after {
            Outcome::RequeueAfter(after)
        } else if result.failed_deletes > 0 {
            Outcome::Failed
        } else {
            Outcome::Done
        }
    }

    /// Retries one failed create, unless a reconcile settled it meanwhile.
    async fn retry_create(&self, key: RouteKey) -> Outcome {
        let _shared = self.reconcile_lock.read().await;
        if !self.pending().contains(&key) {
            return Outcome::Done;
        }
        let Some(routes) = self.ctx.cloud.routes() else {
            return Outcome::Done;
        };
        let node = self.ctx.nodes.get(&key.node);
        let info = node.as_deref().map(NodeInfo::from_node);
        let raw_cidr = info
            .as_ref()
            .and_then(|i| {
                i.pod_cidrs
                    .iter()
                    .find(|c| plan::normalize_cidr(c) == key.cidr)
            })
            .cloned();
        let (Some(node), Some(info), Some(raw_cidr)) = (node, info, raw_cidr) else {
            // The Node or its CIDR is gone: nothing to create (the reconcile its change
            // triggered cleans up).
            self.pending().remove(&key);
            return Outcome::Done;
        };
        let create = RouteCreate {
            name_hint: info.uid.clone(),
            route: Route {
                name: String::new(),
                target_node: info.name.clone(),
                enable_node_addresses: false,
                target_node_addresses: info.addresses.clone(),
                destination_cidr: raw_cidr,
                blackhole: false,
            },
        };
        let started = Instant::now();
        match create_route(routes, &self.ctx.cluster_name, &create, &self.ops).await {
            Ok(()) => {
                let others_pending = {
                    let mut pending = self.pending();
                    pending.remove(&key);
                    pending.iter().any(|k| k.node == key.node)
                };
                // Every other CIDR of the Node was routed in the last reconcile (only failed
                // creates are pending), so the Node is now fully routed.
                if !others_pending
                    && DesiredCondition::ROUTE_CREATED
                        .differs_from(info.network_unavailable.as_ref())
                {
                    self.set_condition(&info.name, DesiredCondition::ROUTE_CREATED)
                        .await;
                }
                Outcome::Done
            }
            Err(error) => match error.retry_after() {
                Some(after) => Outcome::RequeueAfter(after),
                None => {
                    let note = failed_create_message(&create, started.elapsed(), &error);
                    self.recorder
                        .warning(node.as_ref(), REASON_FAILED_TO_CREATE_ROUTE, note);
                    Outcome::Failed
                }
            },
        }
    }

    /// Writes the `NetworkUnavailable` condition through the status subresource: a strategic
    /// merge patch of this one condition (merge key `type`, so other conditions are untouched),
    /// decided on the informer's cached Node, without reading it first (see
    /// [`plan::condition_patch`] for `lastTransitionTime` and when the patch carries a
    /// resourceVersion precondition). A conflict is decided again on a fresh read; other
    /// failures are retried from the cache (Go: 5 attempts, 100 ms apart).
    async fn set_condition(&self, name: &str, desired: DesiredCondition) {
        let api: Api<Node> = Api::all(self.ctx.client.clone());
        let mut fresh: Option<Arc<Node>> = None;
        for attempt in 0..CONDITION_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(CONDITION_RETRY_DELAY).await;
            }
            let node = match fresh.take() {
                Some(node) => node,
                None => {
                    let Some(cached) = self.ctx.nodes.get(name) else {
                        // Deleted (the reconcile its deletion triggers cleans up).
                        return;
                    };
                    if self.written_since(&cached, desired) {
                        return;
                    }
                    cached
                }
            };
            let now = Time(jiff::Timestamp::now());
            let Some(patch) = plan::condition_patch(&node, &desired, &now) else {
                return;
            };
            match api
                .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
            {
                Ok(_) => {
                    tracing::info!(
                        node = name,
                        status = desired.status,
                        reason = desired.reason,
                        "set NetworkUnavailable"
                    );
                    self.remember_written(&node, desired);
                    return;
                }
                Err(kube::Error::Api(status)) if status.is_not_found() => return,
                Err(kube::Error::Api(status)) if status.is_conflict() => {
                    tracing::debug!(
                        node = name,
                        "conflict setting NetworkUnavailable; deciding again on a fresh read"
                    );
                    match api.get_opt(name).await {
                        Ok(Some(node)) => fresh = Some(Arc::new(node)),
                        Ok(None) => return,
                        Err(error) => {
                            tracing::warn!(node = name, %error, "could not read node to set its NetworkUnavailable condition");
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(node = name, %error, "could not set NetworkUnavailable");
                }
            }
        }
        tracing::warn!(
            node = name,
            "giving up setting NetworkUnavailable for now; the next reconcile tries again"
        );
    }

    fn written(&self) -> MutexGuard<'_, HashMap<String, Written>> {
        self.written.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this controller already wrote `desired` on the Node after the version `cached`
    /// is (the informer has not delivered the write yet): writing it again would only repeat
    /// it. Once the cache has moved on, the entry is dropped and the cache decides.
    fn written_since(&self, cached: &Node, desired: DesiredCondition) -> bool {
        let name = cached.metadata.name.as_deref().unwrap_or_default();
        let mut written = self.written();
        match written.get(name) {
            Some(w) if w.decided_on == cached.metadata.resource_version => w.desired == desired,
            Some(_) => {
                written.remove(name);
                false
            }
            None => false,
        }
    }

    /// Remembers a successful write decided on `node` (see [`RouteController::written_since`]).
    fn remember_written(&self, node: &Node, desired: DesiredCondition) {
        if let Some(name) = node.metadata.name.clone() {
            self.written().insert(
                name,
                Written {
                    decided_on: node.metadata.resource_version.clone(),
                    desired,
                },
            );
        }
    }

    /// Drops the remembered writes the informer has delivered by now (or whose Node is gone),
    /// so the map holds only writes in flight through the watch.
    fn prune_written(&self) {
        self.written().retain(|name, w| {
            self.ctx
                .nodes
                .get(name)
                .is_some_and(|n| n.metadata.resource_version == w.decided_on)
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A provider whose calls take a while, counting how many run at once.
    #[derive(Default)]
    struct SlowRoutes {
        running: AtomicUsize,
        max_running: AtomicUsize,
        calls: Mutex<Vec<String>>,
        fail_creates_for: Option<String>,
    }

    impl SlowRoutes {
        async fn op(&self, what: String) {
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_running.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(10)).await;
            self.calls.lock().unwrap().push(what);
            self.running.fetch_sub(1, Ordering::SeqCst);
        }
    }

    #[async_trait::async_trait]
    impl Routes for SlowRoutes {
        async fn list_routes(&self, _: &str) -> ccm_core::CloudResult<Vec<Route>> {
            Ok(Vec::new())
        }
        async fn create_route(
            &self,
            _: &str,
            _hint: &str,
            route: &Route,
        ) -> ccm_core::CloudResult<()> {
            self.op(format!("create {}", route.target_node)).await;
            if self.fail_creates_for.as_deref() == Some(route.target_node.as_str()) {
                return Err(CloudError::msg("quota exceeded"));
            }
            Ok(())
        }
        async fn delete_route(&self, _: &str, route: &Route) -> ccm_core::CloudResult<()> {
            self.op(format!("delete {}", route.name)).await;
            if route.name == "retry" {
                return Err(CloudError::retry(Duration::from_secs(7), "busy"));
            }
            if route.name == "fail" {
                return Err(CloudError::msg("boom"));
            }
            Ok(())
        }
    }

    fn create(node: &str) -> RouteCreate {
        RouteCreate {
            name_hint: format!("uid-{node}"),
            route: Route {
                target_node: node.into(),
                destination_cidr: "10.244.1.0/24".into(),
                ..Route::default()
            },
        }
    }

    fn delete(name: &str) -> Route {
        Route {
            name: name.into(),
            ..Route::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_the_limit_of_operations_is_in_flight() {
        let routes = SlowRoutes::default();
        let plan = RoutePlan {
            creates: (0..300).map(|i| create(&format!("n{i}"))).collect(),
            deletes: (0..100).map(|i| delete(&format!("d{i}"))).collect(),
            ..RoutePlan::default()
        };
        let ops = Semaphore::new(DEFAULT_MAX_CONCURRENT_OPERATIONS);
        let result = execute(&routes, "k", &plan, &ops).await;
        assert!(result.failed_creates.is_empty());
        assert_eq!(routes.calls.lock().unwrap().len(), 400);
        assert_eq!(routes.max_running.load(Ordering::SeqCst), 200);
    }

    #[tokio::test(start_paused = true)]
    async fn deletes_finish_before_creates_when_the_plan_says_so() {
        let routes = SlowRoutes::default();
        let plan = RoutePlan {
            creates: vec![create("a"), create("b")],
            deletes: vec![delete("old-a"), delete("old-b")],
            deletes_before_creates: true,
            ..RoutePlan::default()
        };
        execute(&routes, "k", &plan, &Semaphore::new(200)).await;
        let calls = routes.calls.lock().unwrap().clone();
        assert!(
            calls[..2].iter().all(|c| c.starts_with("delete")),
            "{calls:?}"
        );
        assert!(
            calls[2..].iter().all(|c| c.starts_with("create")),
            "{calls:?}"
        );

        // Otherwise they run together.
        let routes = SlowRoutes::default();
        let plan = RoutePlan {
            deletes_before_creates: false,
            ..plan
        };
        execute(&routes, "k", &plan, &Semaphore::new(200)).await;
        assert_eq!(routes.max_running.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_are_collected_without_stopping_the_rest() {
        let routes = SlowRoutes {
            fail_creates_for: Some("b".into()),
            ..SlowRoutes::default()
        };
        let plan = RoutePlan {
            creates: vec![create("a"), create("b"), create("c")],
            deletes: vec![delete("retry"), delete("fail"), delete("ok")],
            ..RoutePlan::default()
        };
        let result = execute(&routes, "k", &plan, &Semaphore::new(200)).await;
        assert_eq!(routes.calls.lock().unwrap().len(), 6);
        assert_eq!(result.failed_creates.len(), 1);
        let (c, e, took) = &result.failed_creates[0];
        assert_eq!(c.route.target_node, "b");
        assert_eq!(
            failed_create_message(c, *took, e),
            format!(
                "Could not create route uid-b 10.244.1.0/24 for node b after {took:?}: quota exceeded"
            )
        );
        assert_eq!(result.failed_deletes, 1);
        assert_eq!(result.delete_retry_after, Some(Duration::from_secs(7)));
    }

    #[test]
    fn config_errors_name_the_flags() {
        let err = check_config(&RouteConfig::default())
            .unwrap_err()
            .to_string();
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
        let err = check_config(&bad).unwrap_err().to_string();
        assert!(err.contains("invalid --cluster-cidr"), "{err}");
        assert!(err.contains("one IPv4 and one IPv6"), "{err}");
        assert!(err.contains("--configure-cloud-routes=false"), "{err}");
        let ok = RouteConfig {
            cluster_cidrs: vec!["10.0.0.0/16".parse().unwrap()],
            ..RouteConfig::default()
        };
        check_config(&ok).unwrap();
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
        let (informer, driver) = crate::informer::Informer::<Node>::from_stream(
            rx,
            crate::informer::strip_node,
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
