//! What every controller receives: the client, the (budgeted) cloud provider, the shared
//! informers, metrics, events and the shutdown signal.

use ccm_core::NodeView;
use std::sync::Arc;

use ccm_core::CloudProvider;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::Client;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::machinery::events::{DEFAULT_FLUSH_TIMEOUT, EventBroadcaster, EventRecorder};
use crate::machinery::informer::{self, Informer};
use crate::machinery::label_selector::ManagedNodeSelector;
use crate::machinery::metrics::{MetricsRegistry, WorkQueueMetrics};
use crate::machinery::ownership::Ownership;
use crate::machinery::shadow::Shadow;
use crate::machinery::workqueue::{Activity, Backoff, WorkQueue};
use crate::runtime::client::{ClientError, ClientFactory};

/// The context handed to every controller, built-in or the vendor's own. Cheap to clone.
#[derive(Clone)]
pub struct ControllerContext {
    /// This controller's Kubernetes client (Go's `ClientBuilder.ClientOrDie(<client name>)`):
    /// its own token bucket, a user agent ending in the controller's client name and, with
    /// `--use-service-account-credentials`, the credentials of its ServiceAccount. The shared
    /// informers have a client of their own, with the root credentials.
    pub client: Client,
    /// The cloud provider, wrapped in the cloud-call budget (metrics, rate limit, timeout).
    pub cloud: Arc<dyn CloudProvider>,
    /// The shared Node informer. It holds each Node as a compact [`NodeView`] (what providers
    /// receive), stripped of what no controller or provider reads ([`informer::strip_node`],
    /// or the vendor's replacement): never write one back whole.
    pub nodes: Informer<Node, NodeView>,
    /// The shared Service informer (`managedFields` stripped).
    pub services: Informer<Service>,
    /// The process's metrics registry.
    pub metrics: Arc<MetricsRegistry>,
    /// The shared work-queue metric family.
    pub workqueue_metrics: WorkQueueMetrics,
    /// Fires when the process shuts down or stops leading: stop taking work, finish what runs.
    pub shutdown: CancellationToken,
    /// `--cluster-name`, passed to every load-balancer and route call.
    pub cluster_name: String,
    /// This process's identity (leader-election identity), used as the events' reporting
    /// instance.
    pub identity: String,
    /// The process's Event queue (see [`ControllerContext::recorder`]).
    pub events: EventBroadcaster,
    /// Work in flight (see [`ControllerContext::activity`]).
    activity: Activity,
    /// Replaces every queue's backoff (see [`ControllerContext::with_queue_backoff`]).
    queue_backoff: Option<Backoff>,
    /// Makes the clients of other names ([`ControllerContext::client_for`]); `None` in a
    /// standalone context.
    clients: Option<ClientFactory>,
    /// The client this controller's Events are written with (`None`: the Event writer's).
    event_client: Option<Client>,
    /// Shadow mode (`machinery/shadow`): the controllers also plan for objects they would
    /// normally leave alone, so the guards can compare; they tell the recorder which objects
    /// they compared and which would-deletes it already holds.
    shadow: Option<Arc<Shadow>>,
    /// Which Nodes are ours (`machinery/ownership.rs`), shared by every clone.
    ownership: Arc<Ownership>,
}

impl std::fmt::Debug for ControllerContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerContext")
            .field("cluster_name", &self.cluster_name)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// Which objects the informers of [`ControllerContext::standalone_scoped`] see. The default
/// sees everything.
#[derive(Clone, Debug, Default)]
pub struct InformerScope {
    /// A label selector for Nodes, e.g. `test-run=abc`.
    pub node_labels: Option<String>,
    /// Only Services in this namespace.
    pub service_namespace: Option<String>,
    /// A label selector for Services.
    pub service_labels: Option<String>,
}

/// What [`ControllerContext::start`] needs.
pub struct ContextParams {
    /// The client of the shared informers (root credentials), also the context's
    /// [`ControllerContext::client`] until the runtime gives each controller its own.
    pub client: Client,
    /// Makes each controller's client (`None`: every controller uses `client`).
    pub clients: Option<ClientFactory>,
    /// The (already budget-wrapped) provider.
    pub cloud: Arc<dyn CloudProvider>,
    /// The metrics registry.
    pub metrics: Arc<MetricsRegistry>,
    /// The work-queue metric family, registered once in `metrics`.
    pub workqueue_metrics: WorkQueueMetrics,
    /// The shutdown signal.
    pub shutdown: CancellationToken,
    /// `--cluster-name`.
    pub cluster_name: String,
    /// This process's identity.
    pub identity: String,
    /// Removes fields from every Node before it is cached: [`informer::strip_node`] unless the
    /// vendor set [`Builder::strip_cached_node`](crate::Builder::strip_cached_node). It never
    /// sees `metadata.managedFields` or `status.images`: the Node informer does not decode them.
    pub strip_node: fn(&mut Node),
    /// The Event queue; the caller runs its writer (the runtime stops it after the controllers
    /// drained, so their last Events are flushed).
    pub events: EventBroadcaster,
}

impl ControllerContext {
    /// Starts the shared informers on `tasks` and returns the context. The informers run until
    /// `params.shutdown` fires; use [`ControllerContext::wait_for_sync`] before acting.
    pub fn start(params: ContextParams, tasks: &mut JoinSet<()>) -> Self {
        Self::start_scoped(params, &InformerScope::default(), tasks)
    }

    /// Like [`ControllerContext::start`], with informers that see only the objects in `scope`
    /// (the controller harness of `ccm-testing` uses it, so that a test on a shared cluster
    /// acts only on its own objects).
    pub fn start_scoped(
        params: ContextParams,
        scope: &InformerScope,
        tasks: &mut JoinSet<()>,
    ) -> Self {
        let with_labels = |config: watcher::Config, selector: &Option<String>| match selector {
            Some(s) => config.labels(s),
            None => config,
        };
        let (nodes, node_driver) = Informer::nodes(
            Api::<Node>::all(params.client.clone()),
            with_labels(informer::node_watcher_config(), &scope.node_labels),
            params.strip_node,
            params.shutdown.clone(),
        );
        let service_api = match &scope.service_namespace {
            Some(ns) => Api::<Service>::namespaced(params.client.clone(), ns),
            None => Api::<Service>::all(params.client.clone()),
        };
        let (services, service_driver) = Informer::new(
            service_api,
            with_labels(informer::watcher_config(), &scope.service_labels),
            informer::strip_nothing,
            params.shutdown.clone(),
        );
        tasks.spawn(node_driver);
        tasks.spawn(service_driver);
        let schemes = params
            .cloud
            .provider_id_schemes()
            .into_iter()
            .map(str::to_owned)
            .collect();
        let ownership = Ownership::new(schemes, &params.metrics);
        tasks.spawn(
            ownership
                .clone()
                .track(nodes.clone(), params.shutdown.clone()),
        );
        ControllerContext {
            client: params.client,
            cloud: params.cloud,
            nodes,
            services,
            metrics: params.metrics,
            workqueue_metrics: params.workqueue_metrics,
            shutdown: params.shutdown,
            cluster_name: params.cluster_name,
            identity: params.identity,
            events: params.events,
            activity: Activity::new(),
            queue_backoff: None,
            clients: params.clients,
            event_client: None,
            shadow: None,
            ownership,
        }
    }

    /// Narrows the Nodes this process manages to those `selector` selects
    /// (`--managed-node-selector`; `None` or an empty selector: every Node not of another
    /// cloud). Nodes outside it are foreign: no controller touches them or asks the cloud
    /// about them. Applies to every clone of this context; set it before the controllers start.
    pub fn with_managed_node_selector(self, selector: Option<ManagedNodeSelector>) -> Self {
        self.ownership.set_selector(selector);
        self
    }

    /// Which Nodes are ours (`machinery/ownership.rs`).
    pub(crate) fn ownership(&self) -> &Arc<Ownership> {
        &self.ownership
    }

    /// This context for the controller whose client is named `client_name` (Go's
    /// `ControllerInitContext.ClientName`): [`ControllerContext::client`] becomes that
    /// client, and its Events are written with the same identity. Without a client factory
    /// (a standalone context) the context is returned unchanged.
    pub async fn for_client(mut self, client_name: &str) -> Result<Self, ClientError> {
        if let Some(clients) = &self.clients {
            self.client = clients.client_for(client_name).await?;
            self.event_client = Some(clients.event_client_for(client_name).await?);
        }
        Ok(self)
    }

    /// A new client named `name`, as the runtime makes one for each controller (see
    /// [`ClientFactory::client_for`]): for a controller that acts under a second identity.
    /// With `--use-service-account-credentials` it authenticates as ServiceAccount
    /// `kube-system/<name>`, which the cluster's RBAC must allow what the controller does. In a
    /// standalone context, [`ControllerContext::client`].
    pub async fn client_for(&self, name: &str) -> Result<Client, ClientError> {
        match &self.clients {
            Some(clients) => clients.client_for(name).await,
            None => Ok(self.client.clone()),
        }
    }

    /// A context for tests and embedding: a fresh metrics registry, its own shutdown token,
    /// identity `standalone`. Informers and the Event writer run on the returned task set until
    /// `ctx.shutdown` fires (the writer then flushes the queued Events for up to
    /// [`DEFAULT_FLUSH_TIMEOUT`]).
    pub fn standalone(
        client: Client,
        cloud: Arc<dyn CloudProvider>,
        cluster_name: &str,
    ) -> (Self, JoinSet<()>) {
        Self::standalone_scoped(client, cloud, cluster_name, &InformerScope::default())
    }

    /// Like [`ControllerContext::standalone`], with informers that see only the objects in
    /// `scope`: a test run against a real cluster (`CCM_TEST_KUBECONFIG`) then never acts on
    /// anyone else's Nodes or Services.
    pub fn standalone_scoped(
        client: Client,
        cloud: Arc<dyn CloudProvider>,
        cluster_name: &str,
        scope: &InformerScope,
    ) -> (Self, JoinSet<()>) {
        let metrics = MetricsRegistry::new();
        let workqueue_metrics = WorkQueueMetrics::register(&metrics);
        let shutdown = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let (events, event_writer) = EventBroadcaster::new(client.clone(), "standalone", &metrics);
        tasks.spawn(event_writer.run(shutdown.clone(), DEFAULT_FLUSH_TIMEOUT));
        let params = ContextParams {
            client,
            cloud,
            metrics,
            workqueue_metrics,
            shutdown,
            cluster_name: cluster_name.to_owned(),
            identity: "standalone".to_owned(),
            strip_node: informer::strip_node,
            events,
            clients: None,
        };
        let ctx = Self::start_scoped(params, scope, &mut tasks);
        (ctx, tasks)
    }

    /// Waits until every shared informer has listed once. False if one stopped first.
    pub async fn wait_for_sync(&self) -> bool {
        self.nodes.wait_until_synced().await && self.services.wait_until_synced().await
    }

    /// An event recorder reporting as `component` (Go's event source component, e.g.
    /// `cloud-node-controller`). Its Events are queued and written by the process's one Event
    /// writer, with this controller's identity (see [`ControllerContext::for_client`]);
    /// recording never waits.
    pub fn recorder(&self, component: &str) -> EventRecorder {
        match &self.event_client {
            Some(client) => self.events.recorder_with_client(component, client.clone()),
            None => self.events.recorder(component),
        }
    }

    /// A work queue named `name` with the given backoff (or the one of
    /// [`ControllerContext::with_queue_backoff`]), reporting to the work-queue metrics and
    /// counted in [`ControllerContext::activity`].
    pub fn queue<T>(&self, name: &str, backoff: Backoff) -> WorkQueue<T>
    where
        T: Clone + Eq + std::hash::Hash + Send + Sync + 'static,
    {
        WorkQueue::with_activity(
            name,
            self.queue_backoff.unwrap_or(backoff),
            Some(self.workqueue_metrics.clone()),
            self.activity.clone(),
        )
    }

    /// The work in flight in every controller of this context: its queues (a key waiting or
    /// being processed) and the work the controllers do outside a queue. The controller
    /// harness of `ccm-testing` waits on it to know the controllers have settled.
    pub fn activity(&self) -> &Activity {
        &self.activity
    }

    /// Makes every queue of [`ControllerContext::queue`] retry with `backoff` instead of the
    /// controller's own (Go's 5 s to 300 s for Services): tests use a few milliseconds so a
    /// retry does not cost seconds. The runtime never sets it.
    pub fn with_queue_backoff(mut self, backoff: Backoff) -> Self {
        self.queue_backoff = Some(backoff);
        self
    }

    /// This context as a shadow's (`--shadow`), reporting to `shadow`: see
    /// [`ControllerContext::is_shadow`].
    pub(crate) fn into_shadow(mut self, shadow: Arc<Shadow>) -> Self {
        self.shadow = Some(shadow);
        self
    }

    /// The shadow's recorder, in shadow mode.
    pub(crate) fn shadow(&self) -> Option<&Arc<Shadow>> {
        self.shadow.as_ref()
    }

    /// Whether the process runs in shadow mode: its writes are dry runs and its mutating
    /// cloud calls are never sent, so a controller may plan for objects it would normally
    /// leave alone (the cloud-node controller re-plans the initialisation of initialised
    /// Nodes) to have them compared.
    pub(crate) fn is_shadow(&self) -> bool {
        self.shadow.is_some()
    }
}
