//! The controller harness: whole controllers, built-in or your own, against a [`TestCluster`],
//! started the way the runtime starts them.
//!
//! [`ControllerHarness::builder`] chooses the controllers; [`HarnessBuilder::start`] then does
//! what `ccm_controllers::run()` does once it leads, in the same order: wrap the provider in
//! the cloud-call budget, start the shared informers and the Event writer, wait until the
//! informers have synced, call the provider's `initialize`, and start the controllers in the
//! runtime's order (the built-in table first, then your own, as
//! [`Builder`](ccm_controllers::Builder) orders them). The flags are the runtime's flags with
//! the test-sized values of [`TEST_FLAGS`] in front of a test's own
//! ([`HarnessBuilder::flag`]), and every work queue retries after [`TEST_RETRY_BACKOFF`]
//! instead of Go's seconds.
//!
//! [`ControllerHarness::settled`] waits until the controllers have processed everything there
//! is to process, instead of sleeping; [`ControllerHarness::stop`] stops them as the runtime
//! does on SIGTERM (stop taking work, let in-flight work finish, flush the Events) and awaits
//! every task it started.
//!
//! ```no_run
//! use ccm_testing::TestCluster;
//! use ccm_testing::builders::kubelet_node;
//! use ccm_testing::fake_cloud::FakeCloud;
//! use ccm_testing::harness::ControllerHarness;
//! use k8s_openapi::api::core::v1::Node;
//! use kube::Api;
//!
//! # async fn example() {
//! let cluster = TestCluster::start().await;
//! let cloud = FakeCloud::default();
//! let harness = ControllerHarness::builder(&cluster, cloud.provider())
//!     .cloud_node()
//!     .start()
//!     .await;
//! let name = cluster.unique_name("node");
//! cluster.create(&kubelet_node(&name).build()).await;
//! harness.settled().await;
//! let node = Api::<Node>::all(cluster.client()).get(&name).await.unwrap();
//! assert!(node.spec.unwrap().provider_id.is_some());
//! harness.stop().await.unwrap();
//! cluster.cleanup().await;
//! # }
//! ```
//!
//! ## On a real cluster
//!
//! With `CCM_TEST_KUBECONFIG` the controllers run against a cluster shared with others: give
//! them an [`InformerScope`] ([`HarnessBuilder::scope`]) that selects only the test's own
//! Nodes (a label) and Services (a namespace), so they never act on anything else.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ccm_controllers::controllers::{cloud_node, node_lifecycle, route, service};
use ccm_controllers::options::Options;
use ccm_controllers::{
    Backoff, BudgetedProvider, ContextParams, ControllerContext, ControllerEntry, ControllerError,
    DEFAULT_FLUSH_TIMEOUT, EventBroadcaster, InformerScope, MetricsRegistry, NoArgs, StartArgs,
    WorkQueueMetrics, builtin_controllers, parse_flags,
};
use ccm_core::{CloudProvider, InitContext};
use k8s_openapi::api::core::v1::{Node, NodeCondition, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use kube::api::{Api, ListParams, Patch, PatchParams};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::TestCluster;

/// The flags the harness passes in front of a test's own ([`HarnessBuilder::flag`]; a later
/// flag wins): the runtime's flags, with periods and worker counts sized for tests. The one
/// place that defines the harness's timings:
///
/// - `--concurrent-node-syncs=4`, `--concurrent-service-syncs=4`: a few workers, so tests also
///   exercise concurrency;
/// - `--node-monitor-period=100ms`: the lifecycle controller checks NotReady Nodes ten times a
///   second;
/// - `--node-deletion-grace-period=0s`: a Node whose instance is gone is deleted on the first
///   check (Go's behaviour; set a grace period to test the two-check rule);
/// - `--node-status-update-frequency=1h`: no periodic address refresh during a test, so cloud
///   call counts stay exact (set it shorter to test the refresh);
/// - `--node-sync-window=100ms`: Node changes reach load balancers a tenth of a second later;
/// - `--route-reconciliation-period=1h` and `--cluster-cidr=10.244.0.0/16`: routes follow Node
///   changes (the watch), not the periodic safety net, within the usual pod CIDR;
/// - `--cloud-api-timeout=30s`: a cloud call hanging in a test fails within the test's time.
pub const TEST_FLAGS: &[&str] = &[
    "--concurrent-node-syncs=4",
    "--concurrent-service-syncs=4",
    "--node-monitor-period=100ms",
    "--node-deletion-grace-period=0s",
    "--node-status-update-frequency=1h",
    "--node-sync-window=100ms",
    "--route-reconciliation-period=1h",
    "--cluster-cidr=10.244.0.0/16",
    "--cloud-api-timeout=30s",
];

/// The backoff of every controller work queue in the harness (Go's are 5 ms to 1000 s, and
/// 5 s to 300 s for Services): a failed key is retried after 10 ms, then 20 ms, ... at most
/// every second. Change it with [`HarnessBuilder::retry_backoff`].
pub const TEST_RETRY_BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(10),
    max: Duration::from_secs(1),
};

/// How long [`ControllerHarness::settled`] waits before it panics, and how long
/// [`HarnessBuilder::start`] waits for the informers to sync.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long [`ControllerHarness::stop`] waits for the controllers to finish their in-flight
/// work (the runtime's `--shutdown-grace-period`) before it panics.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// How often `settled` looks at the controllers while they are busy.
const SETTLE_POLL: Duration = Duration::from_millis(5);

/// The pause between `settled`'s two looks at an idle harness: long enough for every task a
/// finished piece of work woke to run, and for the watch events of the controllers' last writes
/// to arrive (the second look lists from the API server again).
const SETTLE_RECHECK: Duration = Duration::from_millis(20);

/// The identity of the harness's controllers (the Events' reporting instance).
pub const HARNESS_IDENTITY: &str = "ccm-test-harness";

/// Chooses the controllers, flags and scope of a [`ControllerHarness`].
pub struct HarnessBuilder {
    client: kube::Client,
    cloud: Arc<dyn CloudProvider>,
    builtins: Vec<String>,
    own: Vec<ControllerEntry>,
    flags: Vec<String>,
    scope: InformerScope,
    retry_backoff: Backoff,
}

impl std::fmt::Debug for HarnessBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HarnessBuilder")
            .field("builtins", &self.builtins)
            .field("own", &self.own)
            .field("flags", &self.flags)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl HarnessBuilder {
    /// Adds the built-in controller with this canonical name or alias (as in
    /// `--controllers`, e.g. `"cloud-node"` or `"service-lb-controller"`); an unknown name
    /// makes [`HarnessBuilder::start`] panic.
    pub fn builtin(mut self, name: &str) -> Self {
        self.builtins.push(name.to_owned());
        self
    }

    /// Adds the cloud-node controller (initialises Nodes, refreshes their addresses).
    pub fn cloud_node(self) -> Self {
        self.builtin(cloud_node::NAME)
    }

    /// Adds the cloud-node-lifecycle controller (deletes Nodes whose instance is gone, taints
    /// shut-down ones).
    pub fn node_lifecycle(self) -> Self {
        self.builtin(node_lifecycle::NAME)
    }

    /// Adds the service controller (load balancers).
    pub fn service(self) -> Self {
        self.builtin(service::NAME)
    }

    /// Adds the route controller (needs `--cluster-cidr`, which [`TEST_FLAGS`] sets).
    pub fn route(self) -> Self {
        self.builtin(route::NAME)
    }

    /// Adds your own controller, with the start function
    /// [`Builder::controller_with_args`](ccm_controllers::Builder::controller_with_args)
    /// takes. A controller with the name of a built-in one replaces it and, as in the runtime,
    /// starts after the built-in ones. Also the way to run a built-in controller with a
    /// configuration no flag reaches, e.g.
    /// `|ctx, _| cloud_node::run(ctx, CloudNodeConfig { .. })`.
    pub fn controller<F, Fut>(self, name: &str, start: F) -> Self
    where
        F: Fn(ControllerContext, StartArgs) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), ControllerError>> + Send + 'static,
    {
        self.controller_entry(ControllerEntry::new(name, start))
    }

    /// Adds a controller entry (what [`Builder::controller_entry`](ccm_controllers::Builder::controller_entry)
    /// takes).
    pub fn controller_entry(mut self, entry: ControllerEntry) -> Self {
        self.own.retain(|e| e.name != entry.name);
        self.own.push(entry);
        self
    }

    /// Adds a runtime flag, e.g. `"--node-deletion-grace-period=1s"`; it wins over the same flag
    /// in [`TEST_FLAGS`].
    pub fn flag(mut self, flag: &str) -> Self {
        self.flags.push(flag.to_owned());
        self
    }

    /// Restricts the shared informers to these Nodes and Services (for a shared real cluster).
    pub fn scope(mut self, scope: InformerScope) -> Self {
        self.scope = scope;
        self
    }

    /// The backoff of every controller work queue, instead of [`TEST_RETRY_BACKOFF`].
    pub fn retry_backoff(mut self, backoff: Backoff) -> Self {
        self.retry_backoff = backoff;
        self
    }

    /// Starts the controllers as the runtime does once leading (see the [module
    /// docs](self)), and installs the test logging ([`crate::logging::init`]).
    ///
    /// # Panics
    ///
    /// On a broken test setup: a flag the runtime rejects, an unknown built-in name, informers
    /// that do not sync within [`SETTLE_TIMEOUT`], or a failing `initialize`.
    #[allow(clippy::panic)] // test harness: a broken setup must stop the test loudly
    pub async fn start(self) -> ControllerHarness {
        crate::logging::init();
        // As with `Builder::provider`: `--cloud-provider` defaults to the provider's name.
        let mut args = vec![
            "cloud-controller-manager".to_owned(),
            format!("--cloud-provider={}", self.cloud.provider_name()),
        ];
        args.extend(TEST_FLAGS.iter().map(|f| (*f).to_owned()));
        args.extend(self.flags.iter().cloned());
        let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let options: Options = match parse_flags::<NoArgs>(&arg_refs) {
            Ok((options, NoArgs)) => options,
            Err(e) => panic!(
                "ControllerHarness: the flags {:?} do not parse: {e}",
                &args[1..]
            ),
        };
        if let Err(errors) = options.validate() {
            let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
            panic!("ControllerHarness: invalid flags: {}", errors.join("; "));
        }
        let entries = self.entries();

        // The runtime's steps once leading (`LeadEnv::lead`), in its order.
        let metrics = MetricsRegistry::new();
        let budgeted = BudgetedProvider::new(self.cloud, &options.budget_config(), &metrics);
        let workqueue_metrics = WorkQueueMetrics::register(&metrics);
        let work = CancellationToken::new();
        let (events, event_writer) =
            EventBroadcaster::new(self.client.clone(), HARNESS_IDENTITY, &metrics);
        let events_stop = CancellationToken::new();
        let event_writer = AbortOnDropHandle::new(tokio::spawn(
            event_writer.run(events_stop.clone(), DEFAULT_FLUSH_TIMEOUT),
        ));
        let mut informers = JoinSet::new();
        let ctx = ControllerContext::start_scoped(
            ContextParams {
                client: self.client.clone(),
                cloud: budgeted.clone(),
                metrics,
                workqueue_metrics,
                shutdown: work.clone(),
                cluster_name: options.cluster_name().to_owned(),
                identity: HARNESS_IDENTITY.to_owned(),
                strip_node: ccm_controllers::strip_node,
                events,
                // One client for every controller: the harness has the test's client, not a
                // kubeconfig to make per-controller clients from.
                clients: None,
            },
            &self.scope,
            &mut informers,
        )
        .with_queue_backoff(self.retry_backoff)
        .with_managed_node_selector(options.cloud.managed_node_selector.clone());
        match tokio::time::timeout(SETTLE_TIMEOUT, ctx.wait_for_sync()).await {
            Ok(true) => tracing::debug!("harness: shared informers synced"),
            Ok(false) => {
                panic!("ControllerHarness: the shared informers stopped before they synced")
            }
            Err(_) => panic!(
                "ControllerHarness: the shared informers did not sync within {SETTLE_TIMEOUT:?}"
            ),
        }
        let init = budgeted.initialize(InitContext::new(
            Some(self.client.clone()),
            work.clone(),
            options.cluster_name(),
        ));
        if let Err(e) = init.await {
            panic!("ControllerHarness: the provider's initialize failed: {e}");
        }
        let interval = options.generic.controller_start_interval;
        let start_args = StartArgs::new(Arc::new(options));
        let mut controllers = JoinSet::new();
        let names: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
        for (i, entry) in entries.iter().enumerate() {
            tracing::info!(controller = %entry.name, "harness: starting controller");
            let run = (entry.start)(ctx.clone(), start_args.clone());
            controllers.spawn(async move { (i, run.await) });
            if !interval.is_zero() && i + 1 < entries.len() {
                tokio::time::sleep(interval).await;
            }
        }
        ControllerHarness {
            ctx,
            budgeted,
            scope: self.scope,
            names,
            controllers,
            informers,
            event_writer,
            events_stop,
        }
    }

    /// The chosen entries in the runtime's start order.
    #[allow(clippy::panic)] // test harness: a misspelt controller must stop the test loudly
    fn entries(&self) -> Vec<ControllerEntry> {
        let table = builtin_controllers();
        for name in &self.builtins {
            let known = table
                .iter()
                .any(|e| &e.name == name || e.aliases.contains(name));
            if !known {
                let names: Vec<&str> = table.iter().map(|e| e.name.as_str()).collect();
                panic!("ControllerHarness: no built-in controller {name:?} (known: {names:?})");
            }
        }
        let mut entries: Vec<ControllerEntry> = table
            .into_iter()
            .filter(|e| {
                self.builtins
                    .iter()
                    .any(|n| n == &e.name || e.aliases.contains(n))
            })
            .collect();
        for own in &self.own {
            entries.retain(|e| e.name != own.name);
            entries.push(own.clone());
        }
        entries
    }
}

/// Controllers running against a [`TestCluster`] (see the [module docs](self)).
///
/// Dropping it without [`stop`](Self::stop) aborts every task it started.
pub struct ControllerHarness {
    ctx: ControllerContext,
    budgeted: Arc<BudgetedProvider>,
    scope: InformerScope,
    names: Vec<String>,
    controllers: JoinSet<(usize, Result<(), ControllerError>)>,
    informers: JoinSet<()>,
    event_writer: AbortOnDropHandle<()>,
    events_stop: CancellationToken,
}

impl std::fmt::Debug for ControllerHarness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerHarness")
            .field("controllers", &self.names)
            .field("scope", &self.scope)
            .field("in_flight", &self.ctx.activity().in_flight())
            .finish_non_exhaustive()
    }
}

/// What [`ControllerHarness::settled`] found busy the last time it looked.
#[derive(Debug, Default, PartialEq, Eq)]
struct Busy {
    /// Units of [`ccm_controllers::Activity`] in flight.
    work: usize,
    /// Informer changes not yet taken by every controller.
    undelivered: usize,
    /// Cloud calls in flight.
    cloud_calls: usize,
    /// Events queued but not written.
    events: usize,
}

impl Busy {
    fn is_idle(&self) -> bool {
        *self == Busy::default()
    }
}

/// Name → resourceVersion of a set of objects.
type Versions = BTreeMap<String, String>;

fn versions<'a, K: Resource + 'a>(objects: impl IntoIterator<Item = &'a K>) -> Versions {
    objects
        .into_iter()
        .map(|o| {
            let meta = o.meta();
            (
                format!(
                    "{}/{}",
                    meta.namespace.as_deref().unwrap_or_default(),
                    meta.name.as_deref().unwrap_or_default()
                ),
                meta.resource_version.clone().unwrap_or_default(),
            )
        })
        .collect()
}

impl ControllerHarness {
    /// A harness for `cluster` whose controllers call `cloud` (wrapped in the cloud-call
    /// budget, as the runtime wraps it). Choose the controllers on the builder.
    pub fn builder(cluster: &TestCluster, cloud: Arc<dyn CloudProvider>) -> HarnessBuilder {
        HarnessBuilder {
            client: cluster.client(),
            cloud,
            builtins: Vec::new(),
            own: Vec::new(),
            flags: Vec::new(),
            scope: InformerScope::default(),
            retry_backoff: TEST_RETRY_BACKOFF,
        }
    }

    /// The controllers' context (client, budget-wrapped cloud, informers, metrics, Events).
    pub fn context(&self) -> &ControllerContext {
        &self.ctx
    }

    /// The names of the controllers, in the order they started.
    pub fn controllers(&self) -> &[String] {
        &self.names
    }

    /// The metrics in the OpenMetrics text format, as `/metrics` serves them.
    pub fn metrics(&self) -> String {
        self.ctx.metrics.encode().unwrap_or_default()
    }

    fn busy(&self) -> Busy {
        Busy {
            work: self.ctx.activity().in_flight(),
            undelivered: self.ctx.nodes.undelivered() + self.ctx.services.undelivered(),
            cloud_calls: self.budgeted.in_flight(),
            events: self.ctx.events.queued(),
        }
    }

    /// The Nodes and Services of the scope as the API server has them now.
    async fn api_versions(&self) -> Result<(Versions, Versions), kube::Error> {
        let mut node_list = ListParams::default();
        if let Some(labels) = &self.scope.node_labels {
            node_list = node_list.labels(labels);
        }
        let nodes = Api::<Node>::all(self.ctx.client.clone())
            .list(&node_list)
            .await?;
        let services_api = match &self.scope.service_namespace {
            Some(ns) => Api::<Service>::namespaced(self.ctx.client.clone(), ns),
            None => Api::<Service>::all(self.ctx.client.clone()),
        };
        let mut service_list = ListParams::default();
        if let Some(labels) = &self.scope.service_labels {
            service_list = service_list.labels(labels);
        }
        let services = services_api.list(&service_list).await?;
        Ok((versions(&nodes.items), versions(&services.items)))
    }

    fn store_versions(&self) -> (Versions, Versions) {
        (
            self.ctx
                .nodes
                .list()
                .iter()
                .map(|n| {
                    (
                        format!("/{}", n.name()),
                        n.resource_version().unwrap_or_default().to_owned(),
                    )
                })
                .collect(),
            versions(self.ctx.services.list().iter().map(AsRef::as_ref)),
        )
    }

    /// Resolves once the controllers have processed everything there is to process now:
    /// every Node and Service the API server holds (in the scope) has reached the informers
    /// and every controller, no work queue has a key waiting or being processed, nothing runs
    /// outside a queue (a node-sync window, a monitor pass), no cloud call is in flight and no
    /// Event waits to be written, and it stays so on a second look after a short pause (which
    /// also catches the watch events of the controllers' own last writes).
    ///
    /// Not in flight: keys waiting for their retry backoff or a `CloudError::Retry` delay, and
    /// periodic work that has not started yet (the next monitor pass, address refresh or
    /// route reconcile). After a failure, wait for the retry's effect with
    /// [`crate::wait`] instead.
    ///
    /// # Panics
    ///
    /// When it has not settled within [`SETTLE_TIMEOUT`] (the message says what was busy).
    #[allow(clippy::panic)] // test harness: a hung controller must stop the test loudly
    pub async fn settled(&self) {
        if let Err(busy) = self.settled_within(SETTLE_TIMEOUT).await {
            panic!("ControllerHarness: not settled within {SETTLE_TIMEOUT:?}: {busy}");
        }
    }

    /// Like [`settled`](Self::settled), with a timeout; `Err` says what was still busy.
    pub async fn settled_within(&self, timeout: Duration) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = String::from("nothing looked at yet");
        let mut previous: Option<((Versions, Versions), u64)> = None;
        loop {
            if tokio::time::Instant::now() >= deadline {
                return Err(last);
            }
            // 1. The informers hold what the API server holds.
            let api = match self.api_versions().await {
                Ok(v) => v,
                Err(e) => {
                    last = format!("listing Nodes and Services failed: {e}");
                    tokio::time::sleep(SETTLE_RECHECK).await;
                    continue;
                }
            };
            if self.store_versions() != api {
                last = "the informers lag behind the API server".to_owned();
                tokio::time::sleep(SETTLE_POLL).await;
                continue;
            }
            // 2. Every change delivered, nothing in flight.
            let busy = self.busy();
            if !busy.is_idle() {
                last = format!("{busy:?}");
                previous = None;
                tokio::time::sleep(SETTLE_POLL).await;
                continue;
            }
            // 3. Twice in a row, with nothing started in between.
            let now = (api, self.ctx.activity().started());
            if previous.as_ref() == Some(&now) {
                return Ok(());
            }
            last = "idle once; looking again".to_owned();
            previous = Some(now);
            tokio::time::sleep(SETTLE_RECHECK).await;
        }
    }

    /// Sets the Node's `Ready` condition to `True` or `False` as kubelet would (see
    /// [`set_node_ready`]).
    pub async fn set_node_ready(&self, name: &str, ready: bool) {
        set_node_ready(&self.ctx.client, name, ready).await;
    }

    /// Stops as the runtime does on SIGTERM: the controllers stop taking work and finish what
    /// is in flight, then the queued Events are written, then the informers stop; every task
    /// the harness started has ended when it returns. Returns the first error a controller
    /// returned, in start order (a controller that ended early, e.g. on an invalid
    /// configuration, or a missing capability, which the runtime logs and skips).
    ///
    /// # Panics
    ///
    /// When the controllers do not finish within [`STOP_TIMEOUT`], or one panicked.
    #[allow(clippy::panic)] // test harness: a controller that cannot stop must fail the test
    pub async fn stop(mut self) -> Result<(), ControllerError> {
        self.ctx.shutdown.cancel();
        let mut results: Vec<Option<Result<(), ControllerError>>> =
            self.names.iter().map(|_| None).collect();
        let joined = tokio::time::timeout(STOP_TIMEOUT, async {
            while let Some(joined) = self.controllers.join_next().await {
                match joined {
                    Ok((i, result)) => {
                        if let Some(slot) = results.get_mut(i) {
                            *slot = Some(result);
                        }
                    }
                    Err(e) => panic!("ControllerHarness: a controller panicked: {e}"),
                }
            }
        })
        .await;
        if joined.is_err() {
            let running: Vec<&String> = self
                .names
                .iter()
                .zip(&results)
                .filter(|(_, r)| r.is_none())
                .map(|(n, _)| n)
                .collect();
            panic!("ControllerHarness: {running:?} did not stop within {STOP_TIMEOUT:?}");
        }
        // The controllers are done: flush their Events, then stop the informers.
        self.events_stop.cancel();
        let _ = (&mut self.event_writer).await;
        while self.informers.join_next().await.is_some() {}
        for (name, result) in self.names.iter().zip(results.iter()) {
            if let Some(Err(e)) = result {
                tracing::warn!(controller = %name, "harness: controller ended with an error: {e}");
            }
        }
        results
            .into_iter()
            .flatten()
            .find(Result::is_err)
            .unwrap_or(Ok(()))
    }

    /// Stops at once, as a killed process does: every task is aborted wherever it is, queued
    /// Events are dropped, and nothing is flushed.
    pub async fn crash(mut self) {
        self.ctx.shutdown.cancel();
        self.controllers.abort_all();
        self.informers.abort_all();
        self.event_writer.abort();
        while self.controllers.join_next().await.is_some() {}
        while self.informers.join_next().await.is_some() {}
        let _ = (&mut self.event_writer).await;
    }
}

/// Sets the `Ready` condition of Node `name` to `True` (reason `KubeletReady`) or `False`
/// (reason `KubeletNotReady`), with fresh heartbeat and transition times, as kubelet reports
/// it; the other conditions are kept. For the node-lifecycle controller, which checks NotReady
/// Nodes only.
///
/// # Panics
///
/// When the Node cannot be read or patched.
#[allow(clippy::panic)] // test helper: a failed step must stop the test loudly
pub async fn set_node_ready(client: &kube::Client, name: &str, ready: bool) {
    const ATTEMPTS: usize = 5;
    let nodes: Api<Node> = Api::all(client.clone());
    for attempt in 1..=ATTEMPTS {
        let node = match nodes.get(name).await {
            Ok(n) => n,
            Err(e) => panic!("set_node_ready: reading Node {name:?}: {e}"),
        };
        let patch = serde_json::json!({
            // A precondition: a concurrent write (e.g. a controller's) makes this attempt
            // conflict instead of being overwritten with the conditions read above.
            "metadata": {"resourceVersion": node.metadata.resource_version},
            "status": {"conditions": with_ready(&node, ready)},
        });
        match nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::debug!(node = %name, ready, "set the Ready condition");
                return;
            }
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < ATTEMPTS => continue,
            Err(e) => panic!("set_node_ready: patching Node {name:?}: {e}"),
        }
    }
}

/// The Node's conditions with `Ready` replaced.
fn with_ready(node: &Node, ready: bool) -> Vec<NodeCondition> {
    let now = Time(jiff::Timestamp::now());
    let (status, reason, message) = if ready {
        ("True", "KubeletReady", "kubelet is posting ready status")
    } else {
        ("False", "KubeletNotReady", "container runtime is down")
    };
    let mut conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    conditions.retain(|c| c.type_ != "Ready");
    conditions.push(NodeCondition {
        type_: "Ready".to_owned(),
        status: status.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now),
    });
    conditions
}
