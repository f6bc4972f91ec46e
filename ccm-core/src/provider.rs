//! The provider traits: [`CloudProvider`] and its optional capabilities.
//!
//! Every method mirrors one method of Go's `cloudprovider.Interface` and its sub-interfaces, in
//! Rust naming. Go's `context.Context` has no parameter here: the framework cancels a call by
//! dropping its future (on shutdown, or when the per-call timeout `--cloud-api-timeout` fires),
//! so a provider must not rely on running to completion once it has been polled.

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

#[cfg(doc)]
use crate::InstanceAnswer;
use crate::{
    CloudError, InstanceAnswers, InstanceMetadata, IpModes, LoadBalancerClasses,
    LoadBalancerHostsAnswers, LoadBalancerStatus, NodeAddress, NodeView, Route, Service, Zone,
};

/// The result of every provider method.
pub type CloudResult<T> = Result<T, CloudError>;

/// What [`CloudProvider::initialize`] receives: a Kubernetes client and the shutdown signal.
///
/// The client is carried type-erased so that `ccm-core` does not depend on kube's HTTP client
/// (which changes major version three times a year; the provider contract should not). The
/// framework (`ccm-controllers`) always stores a `kube::Client`; get it back with
/// [`InitContext::client`]:
///
/// ```ignore
/// let client: kube::Client = ctx.client().expect("ccm-controllers passes a kube::Client");
/// ```
///
/// `client()` returns `None` only when the provider was built against a different `kube` version
/// than the framework (two copies of the type), or in a test that passed no client.
#[derive(Clone)]
pub struct InitContext {
    client: Option<Arc<dyn Any + Send + Sync>>,
    shutdown: CancellationToken,
    cluster_name: String,
}

impl std::fmt::Debug for InitContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InitContext")
            .field("has_client", &self.client.is_some())
            .field("shutdown", &self.shutdown.is_cancelled())
            .field("cluster_name", &self.cluster_name)
            .finish()
    }
}

impl InitContext {
    /// Builds a context. `client` is the framework's Kubernetes client (a `kube::Client` in
    /// `ccm-controllers`), `shutdown` is cancelled when the process shuts down or loses
    /// leadership.
    pub fn new<C>(
        client: Option<C>,
        shutdown: CancellationToken,
        cluster_name: impl Into<String>,
    ) -> Self
    where
        C: Any + Send + Sync,
    {
        InitContext {
            client: client.map(|c| Arc::new(c) as Arc<dyn Any + Send + Sync>),
            shutdown,
            cluster_name: cluster_name.into(),
        }
    }

    /// The Kubernetes client, downcast to the type the framework stored (`kube::Client`).
    pub fn client<C>(&self) -> Option<C>
    where
        C: Any + Clone,
    {
        self.client.as_ref()?.downcast_ref::<C>().cloned()
    }

    /// Cancelled when the process shuts down or stops leading. Background tasks the provider
    /// starts in `initialize` must stop when it fires (`shutdown().cancelled().await`).
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// The value of `--cluster-name`, passed to every load-balancer and route call.
    pub fn cluster_name(&self) -> &str {
        &self.cluster_name
    }
}

/// A cloud provider: the entry point the framework builds from the registry.
///
/// Implement the capability traits your cloud supports on your type (or on separate types) and
/// return them from the matching methods; every capability defaults to `None` (unsupported). The
/// Rust counterpart of Go's `cloudprovider.Interface`, where `LoadBalancer() (LoadBalancer, bool)`
/// becomes `load_balancer() -> Option<&dyn LoadBalancer>`.
///
/// What the framework does with the answers:
/// - `instances_v2` or `instances` is needed for the cloud-node and node-lifecycle controllers;
///   when both are `None` they are not started (logged, not fatal). `instances_v2` wins when both
///   are offered, and then [`zones`](CloudProvider::zones) is never called.
/// - `load_balancer` `None` means the service controller is not started (unless
///   `load_balancer_for_class` offers an implementation for every declared class).
/// - `load_balancer_classes` says which Services the service controller serves: by default
///   those without `spec.loadBalancerClass`, as in Go.
/// - `routes` `None` means the route controller is not started.
/// - `instances_batch` is optional and used only together with `instances_v2`: where it helps
///   (many Nodes to look up at once), the framework asks it instead of one `instances_v2` call
///   per Node, and falls back to per-Node calls when it is `None`.
/// - `load_balancer_hosts_batch` is optional and used only together with `load_balancer`: when
///   the eligible Nodes change, the service controller replaces the hosts of many load balancers
///   in one call instead of one `update_load_balancer` per load balancer.
/// - `clusters` is never called by a framework controller.
#[async_trait]
pub trait CloudProvider: Send + Sync + 'static {
    /// The provider's name, e.g. `acme`. Used to build provider IDs (`acme://<id>`) on the
    /// legacy [`Instances`] path and in log lines. Should equal the registered name.
    fn provider_name(&self) -> &str;

    /// The provider-ID schemes this provider answers for: the `<scheme>` of
    /// `<scheme>://<instance>` in the `spec.providerID` of the Nodes of its cloud. Defaults to
    /// [`provider_name`](CloudProvider::provider_name) alone, which is what Go's providers
    /// write (`aws://`, `gce://`, `azure://`, `hcloud://`, ...).
    ///
    /// The framework manages only its own Nodes: a Node whose provider ID has another scheme
    /// belongs to another cloud (e.g. bare metal beside cloud Nodes, each kind initialised by
    /// its own cloud-controller-manager). No controller touches it and no provider method is
    /// called for it: it is never initialised, deleted, tainted, made a load-balancer host,
    /// routed or given a pod CIDR. A Node without a provider ID, or one without `://`, is
    /// treated as ours (operators narrow that with `--managed-node-selector`).
    ///
    /// Override it when your cloud's Nodes carry more than one scheme, e.g. a provider renamed
    /// from `acme-legacy` that still finds the instances of old Nodes:
    ///
    /// ```
    /// # use ccm_core::CloudProvider;
    /// # struct Acme;
    /// # #[ccm_core::async_trait]
    /// # impl CloudProvider for Acme {
    /// fn provider_name(&self) -> &str {
    ///     "acme"
    /// }
    ///
    /// fn provider_id_schemes(&self) -> Vec<&str> {
    ///     vec!["acme", "acme-legacy"]
    /// }
    /// # }
    /// ```
    ///
    /// Each scheme must be a valid provider name (lowercase letters, digits, `-`, `_`, `.`;
    /// see [`ProviderId`](crate::ProviderId)), and the provider IDs the provider hands out
    /// must use one of them: the conformance suite of `ccm-testing` checks both. Asked once,
    /// at start.
    fn provider_id_schemes(&self) -> Vec<&str> {
        vec![self.provider_name()]
    }

    /// Whether the provider tags cloud resources with a cluster ID. When false, the framework
    /// refuses to start unless `--allow-untagged-cloud` is given (as Go's template does).
    /// Defaults to true.
    fn has_cluster_id(&self) -> bool {
        true
    }

    /// Called once, after leadership is won (at once when leader election is off) and before
    /// any controller starts. May start background tasks; they must stop when
    /// [`InitContext::shutdown`] fires. An error aborts startup (the process exits non-zero).
    async fn initialize(&self, ctx: InitContext) -> CloudResult<()> {
        let _ = ctx;
        Ok(())
    }

    /// The instance capability (preferred): one call per node initialisation.
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        None
    }

    /// The optional batch instance capability: many Nodes in one cloud call. Used only when
    /// [`CloudProvider::instances_v2`] is offered too (for the Nodes a batch leaves unknown, the
    /// framework may fall back to per-Node `instances_v2` calls). Defaults to `None`.
    fn instances_batch(&self) -> Option<&dyn InstancesBatch> {
        None
    }

    /// The legacy v1 instance capability, used only when [`CloudProvider::instances_v2`] is
    /// `None`.
    fn instances(&self) -> Option<&dyn Instances> {
        None
    }

    /// The deprecated zone capability, used only on the legacy [`Instances`] path.
    fn zones(&self) -> Option<&dyn Zones> {
        None
    }

    /// The load-balancer capability, for `type: LoadBalancer` Services: the implementation
    /// of Services without a class, and of every class when
    /// [`load_balancer_for_class`](CloudProvider::load_balancer_for_class) is not overridden.
    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        None
    }

    /// The optional batch load-balancer capability: the hosts of many load balancers replaced
    /// in one cloud call. Used only when [`CloudProvider::load_balancer`] is offered too.
    /// Defaults to `None`.
    fn load_balancer_hosts_batch(&self) -> Option<&dyn LoadBalancerHostsBatch> {
        None
    }

    /// The load-balancer classes the provider serves, and whether it serves Services without
    /// `spec.loadBalancerClass`. The default, [`LoadBalancerClasses::without_class`], is Go's
    /// behaviour: Services without a class only (a Service of any class is left to the
    /// controller of that class). Read once, at startup.
    ///
    /// The operator may narrow or rename what one binary serves with
    /// `--load-balancer-classes` (two instances of one CCM can each serve one class); the
    /// framework then asks [`load_balancer_for_class`](CloudProvider::load_balancer_for_class)
    /// with the class *declared here* that the operator mapped the Service's class to.
    fn load_balancer_classes(&self) -> LoadBalancerClasses {
        LoadBalancerClasses::default()
    }

    /// The load-balancer implementation of one declared class (`None`: Services without a
    /// class), for a provider that serves classes with different implementations (say a
    /// network and an application load balancer). Called only with an entry of
    /// [`load_balancer_classes`](CloudProvider::load_balancer_classes). Defaults to
    /// [`load_balancer`](CloudProvider::load_balancer) for every class: a provider with one
    /// implementation overrides nothing but `load_balancer_classes`.
    ///
    /// Pick the implementation from `class`, not from the Service's
    /// `spec.loadBalancerClass`: an operator's `--load-balancer-classes` may serve a declared
    /// class under another name.
    fn load_balancer_for_class(&self, class: Option<&str>) -> Option<&dyn LoadBalancer> {
        let _ = class;
        self.load_balancer()
    }

    /// The `ipMode` of the ingress points of one declared class's load balancers
    /// (`None`: Services without a class), see [`IpModes`]: the mode the framework writes on
    /// ingress entries with an `ip` when the status from
    /// [`ensure_load_balancer`](LoadBalancer::ensure_load_balancer) gives none, and whether a
    /// Service may ask for `Proxy` with [`ANNOTATION_IP_MODE`](crate::ANNOTATION_IP_MODE).
    /// Defaults to [`IpModes::vip`]: `VIP` only, Kubernetes' default. Called with an entry of
    /// [`load_balancer_classes`](CloudProvider::load_balancer_classes), on every ensure.
    fn load_balancer_ip_modes(&self, class: Option<&str>) -> IpModes {
        let _ = class;
        IpModes::vip()
    }

    /// The hosts batch of one declared class's implementation (see
    /// [`load_balancer_for_class`](CloudProvider::load_balancer_for_class)). Defaults to
    /// [`load_balancer_hosts_batch`](CloudProvider::load_balancer_hosts_batch) for every
    /// class. The framework never puts Services of two classes in one batch call. Override it
    /// when `load_balancer_for_class` returns different implementations and the batch serves
    /// only some of them (return `None` for the others: they get single
    /// `update_load_balancer` calls).
    fn load_balancer_hosts_batch_for_class(
        &self,
        class: Option<&str>,
    ) -> Option<&dyn LoadBalancerHostsBatch> {
        let _ = class;
        self.load_balancer_hosts_batch()
    }

    /// The route capability, for pod-CIDR routes in the cloud's route table.
    fn routes(&self) -> Option<&dyn Routes> {
        None
    }

    /// The cluster-listing capability (never called by the framework's controllers).
    fn clusters(&self) -> Option<&dyn Clusters> {
        None
    }
}

/// Instance lookups keyed by the Node (Go's `InstancesV2`).
///
/// Implementations should identify the instance by `spec.providerID` when set
/// ([`NodeView::provider_id`]) and fall back to the Node's name (or labels/annotations)
/// otherwise.
///
/// # Why a [`NodeView`] and not a `Node`
///
/// Go passes `*v1.Node`. Here every method takes the framework's cached view of the Node, as
/// [`InstancesBatch`] does: a provider that offers both identifies an instance with one
/// function of a `&NodeView`, the framework hands over the Node it caches without rebuilding a
/// k8s-openapi `Node` for each call (the node-lifecycle monitor asks about every NotReady Node
/// each period), and the accessors read what a provider needs (`provider_id()`, `name()`,
/// `label(..)`, `system_uuid()`) without unwrapping `Option`s. A provider with code written for
/// k8s-openapi's `Node` calls [`NodeView::to_node`] (a copy, some 5 µs per Node).
#[async_trait]
pub trait InstancesV2: Send + Sync {
    /// Whether the Node's instance still exists in the cloud.
    ///
    /// - `Ok(true)`: it exists. A stopped, sleeping or shut-down instance **exists**: return true.
    /// - `Ok(false)`: it is gone for good. The node-lifecycle controller then deletes the Node
    ///   object (after a second `Ok(false)` at least `--node-deletion-grace-period` later; Go
    ///   deletes at once). Never answer false because of an authorisation, network or
    ///   rate-limit failure: return an error.
    /// - `Err(_)`: unknown; the Node is left alone and checked again next period.
    ///   [`CloudError::InstanceNotFound`] is an error here too, not "gone".
    ///
    /// Called only for Nodes whose `Ready` condition is not `True`.
    async fn instance_exists(&self, node: &NodeView) -> CloudResult<bool>;

    /// Whether the Node's instance is shut down (exists but is stopped).
    ///
    /// `Ok(true)` makes the node-lifecycle controller add the
    /// `node.cloudprovider.kubernetes.io/shutdown:NoSchedule` taint; the taint is removed when the
    /// Node is `Ready` again. [`CloudError::NotImplemented`] counts as "not shut down"; other
    /// errors leave the Node alone.
    async fn instance_shutdown(&self, node: &NodeView) -> CloudResult<bool>;

    /// The instance's metadata: provider ID, type, addresses, zone, region, extra labels.
    ///
    /// Called once to initialise a Node that carries the
    /// `node.cloudprovider.kubernetes.io/uninitialized` taint, and every
    /// `--node-status-update-frequency` (default 5m) to refresh addresses. Any error keeps the
    /// Node tainted and retries with backoff ([`CloudError::Retry`] sets the delay). The provider
    /// ID must be stable; it may be empty only if the Node already has one.
    async fn instance_metadata(&self, node: &NodeView) -> CloudResult<InstanceMetadata>;
}

/// Batched instance lookups: existence, shutdown state and metadata of many Nodes in one cloud
/// call (an extension of Go's `InstancesV2`, which has no batch form).
///
/// Go's `InstancesV2` asks one question about one Node per call (`InstanceExists`,
/// `InstanceShutdown`, `InstanceMetadata`), so initialising N Nodes costs N calls, and a cloud
/// that allows 20 describe calls per second needs N / 20 seconds whatever the CCM's speed.
/// Real clouds answer many instances per call (describe by a list of IDs, list with a filter);
/// this capability lets the framework use that. It is optional: offer it from
/// [`CloudProvider::instances_batch`] when your cloud has such a call, alongside
/// [`InstancesV2`] (which stays required: the framework still uses single calls where a batch
/// does not help or a Node's batch answer is unknown).
///
/// # The contract
///
/// One call, [`describe_instances`](InstancesBatch::describe_instances), answers for every Node
/// given, each with an [`InstanceAnswer`]. The answers must agree with the single
/// [`InstancesV2`] calls made at the same moment (the conformance suite checks it):
///
/// - [`InstanceAnswer::Found`] / [`InstanceAnswer::Shutdown`]: exists, running or shut down,
///   with the metadata `instance_metadata` would return (same stable provider ID);
/// - [`InstanceAnswer::NotFound`]: gone for good, as `instance_exists` answering `Ok(false)`;
///   the node-lifecycle controller deletes the Node with the same rules (and grace period) as
///   for the single call. Answer it only when the cloud *said* the instance does not exist;
/// - [`InstanceAnswer::Error`]: unknown for this Node (e.g. the cloud could not describe this
///   one instance). The Node is left alone and asked again later; a
///   [`CloudError::Retry`] here delays only this Node.
///
/// **A Node missing from the answer is unknown, never gone.** A requested Node whose name has no
/// entry in the returned map is treated exactly as [`InstanceAnswer::Error`]: it is never
/// deleted, never tainted, never initialised from the batch; the framework asks about it again
/// (in a later batch or with a single `InstancesV2` call). So a provider whose cloud pages its
/// answers or drops unknown IDs silently must translate "not in the page" into nothing (missing)
/// and only an explicit "does not exist" into `NotFound`. (AWS `DescribeInstances` by IDs, for
/// one, fails as a whole when one ID is unknown; `examples/aws-ccm` describes with an
/// `instance-id` filter, which leaves unknown IDs out, leaves those Nodes out of the answer, and
/// lets the single call get the explicit "not found".)
///
/// **Errors of the whole call** say nothing about any Node: the whole batch is retried, no Node
/// is deleted or changed. [`CloudError::Retry`] (the cloud's 429 + Retry-After) delays the
/// **whole batch** by its `after` (every Node in it waits, none is asked alone in the meantime,
/// which would only spend more quota); other errors retry the batch's Nodes with backoff.
/// [`CloudError::NotImplemented`] from the whole call makes the framework use single calls.
///
/// **Batch size**: the framework never passes more than
/// [`max_batch_size`](InstancesBatch::max_batch_size) Nodes in one call (it splits larger sets
/// into several calls), never the same Node twice, and never an empty slice.
///
/// **Keys**: answers are keyed by the Node's `metadata.name`. Identify each instance as
/// `instance_metadata` does: by `spec.providerID` when set, else by the name (or labels).
///
/// Like every provider call, one batch call costs one token of the framework's cloud-call
/// budget (`--cloud-api-qps`), however many HTTP requests it sends (one per page, say), and is
/// subject to `--cloud-api-timeout`; its metrics operation label is `describe_instances`.
///
/// ```
/// use std::sync::Arc;
///
/// use ccm_core::async_trait;
/// use ccm_core::{CloudResult, InstanceAnswer, InstanceAnswers, InstanceMetadata, InstancesBatch, NodeView};
///
/// /// A cloud whose describe call takes up to 100 IDs.
/// struct Acme;
///
/// #[async_trait]
/// impl InstancesBatch for Acme {
///     fn max_batch_size(&self) -> usize {
///         100
///     }
///     async fn describe_instances(&self, nodes: &[NodeView]) -> CloudResult<InstanceAnswers> {
///         // A real provider sends one describe request for all `nodes` here, then maps each
///         // instance in the reply back to its Node. Instances the cloud explicitly reports as
///         // terminated become `NotFound`; IDs absent from the reply are left out (unknown).
///         let mut answers = InstanceAnswers::new();
///         for node in nodes {
///             let name = node.name().to_owned();
///             let metadata = InstanceMetadata {
///                 provider_id: format!("acme://{name}"),
///                 ..Default::default()
///             };
///             answers.insert(name, InstanceAnswer::Found(metadata));
///         }
///         Ok(answers)
///     }
/// }
/// ```
#[async_trait]
pub trait InstancesBatch: Send + Sync {
    /// The most Nodes one [`describe_instances`](InstancesBatch::describe_instances) call
    /// accepts (provider-declared, e.g. the page or filter limit of the cloud's describe call).
    /// The framework never exceeds it; `0` is treated as `1`.
    fn max_batch_size(&self) -> usize;

    /// Existence, shutdown state and metadata of every Node in `nodes`, in one cloud call.
    ///
    /// See the [trait documentation](InstancesBatch) for the meaning of each answer, the rule
    /// for Nodes missing from the answer (unknown, never gone), and what an error of the whole
    /// call does. `nodes` holds 1 to [`max_batch_size`](InstancesBatch::max_batch_size)
    /// distinct Nodes: the framework's cached views of them, shared rather than copied
    /// ([`NodeView`]: a batch is many Nodes, so no k8s-openapi `Node` is rebuilt for it; call
    /// [`NodeView::to_node`] on one if you need it).
    async fn describe_instances(&self, nodes: &[NodeView]) -> CloudResult<InstanceAnswers>;
}

/// Legacy instance lookups keyed by node name or provider ID (Go's v1 `Instances`).
///
/// Used only when the provider offers no [`InstancesV2`]; initialising a Node then takes three to
/// six calls instead of one. Prefer `InstancesV2` for new providers.
#[async_trait]
pub trait Instances: Send + Sync {
    /// The addresses of the instance registered under `node_name`. Fallback for
    /// [`Instances::node_addresses_by_provider_id`].
    async fn node_addresses(&self, node_name: &str) -> CloudResult<Vec<NodeAddress>>;

    /// The addresses of the instance with this provider ID. Tried first; on any error the
    /// framework falls back to [`Instances::node_addresses`]; both failing keeps the Node
    /// tainted.
    async fn node_addresses_by_provider_id(
        &self,
        provider_id: &str,
    ) -> CloudResult<Vec<NodeAddress>>;

    /// The cloud's instance ID (without the `<provider>://` prefix) for `node_name`.
    ///
    /// The framework builds `spec.providerID` as `<provider_name>://<id>`. Return
    /// [`CloudError::InstanceNotFound`] when no such instance exists; **not** for a stopped
    /// instance. [`CloudError::NotImplemented`] leaves `spec.providerID` empty and lets
    /// initialisation continue; any other error (including `InstanceNotFound`) keeps the Node
    /// tainted and retries.
    async fn instance_id(&self, node_name: &str) -> CloudResult<String>;

    /// The instance type for `node_name`. Fallback for
    /// [`Instances::instance_type_by_provider_id`].
    async fn instance_type(&self, node_name: &str) -> CloudResult<String>;

    /// The instance type for a provider ID. Tried first; on error the framework falls back to
    /// [`Instances::instance_type`].
    async fn instance_type_by_provider_id(&self, provider_id: &str) -> CloudResult<String>;

    /// Adds an SSH key to every instance. Never called by the framework; defaults to
    /// [`CloudError::NotImplemented`].
    async fn add_ssh_key_to_all_instances(&self, user: &str, key_data: &[u8]) -> CloudResult<()> {
        let _ = (user, key_data);
        Err(CloudError::NotImplemented)
    }

    /// The node name of the machine with this hostname. Never called by the framework (it only
    /// makes sense on the node itself); defaults to [`CloudError::NotImplemented`].
    async fn current_node_name(&self, hostname: &str) -> CloudResult<String> {
        let _ = hostname;
        Err(CloudError::NotImplemented)
    }

    /// Whether the instance with this provider ID exists. Same contract as
    /// [`InstancesV2::instance_exists`]: `Ok(false)` leads to the Node's deletion, stopped
    /// instances exist, errors never delete.
    async fn instance_exists_by_provider_id(&self, provider_id: &str) -> CloudResult<bool>;

    /// Whether the instance with this provider ID is shut down. Same contract as
    /// [`InstancesV2::instance_shutdown`]; [`CloudError::NotImplemented`] means "not shut down".
    async fn instance_shutdown_by_provider_id(&self, provider_id: &str) -> CloudResult<bool>;
}

/// Deprecated zone lookups (Go's `Zones`), used only with the legacy [`Instances`] capability.
#[async_trait]
pub trait Zones: Send + Sync {
    /// The zone of the machine the code runs on. Never called by the framework (a CCM does not
    /// run on the node it describes); defaults to [`CloudError::NotImplemented`].
    async fn get_zone(&self) -> CloudResult<Zone> {
        Err(CloudError::NotImplemented)
    }

    /// The zone of the instance with this provider ID. Tried first when initialising a Node on
    /// the legacy path; on error the framework falls back to [`Zones::get_zone_by_node_name`].
    async fn get_zone_by_provider_id(&self, provider_id: &str) -> CloudResult<Zone>;

    /// The zone of the instance registered under `node_name`. Both lookups failing keeps the
    /// Node tainted and retries.
    async fn get_zone_by_node_name(&self, node_name: &str) -> CloudResult<Zone>;
}

/// Cloud load balancers for `type: LoadBalancer` Services (Go's `LoadBalancer`).
///
/// The framework calls these only for Services it serves (`spec.type: LoadBalancer` and a
/// `spec.loadBalancerClass` the provider declares in
/// [`CloudProvider::load_balancer_classes`]; by default no class, as in Go), after it has put the `service.kubernetes.io/load-balancer-cleanup`
/// finalizer on the Service. Treat the Service as read-only. `cluster_name` is `--cluster-name`;
/// include it in the names or tags of what you create so two clusters in one account never
/// adopt each other's load balancers.
#[async_trait]
pub trait LoadBalancer: Send + Sync {
    /// The status of the Service's load balancer, or `None` if none created by this controller
    /// exists.
    ///
    /// Called before deleting (to decide whether to emit `DeletingLoadBalancer`) and after a
    /// failed [`LoadBalancer::update_load_balancer`] (an error for a load balancer that no longer
    /// exists is ignored).
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>>;

    /// Optional, read-only: the names of the Nodes currently in the load balancer's backend
    /// (sorted or not), or `None` if no load balancer of this Service exists.
    ///
    /// Called only by the shadow mode (`--shadow`), which never calls a mutating method: it
    /// compares these hosts with the ones it would pass to
    /// [`LoadBalancer::ensure_load_balancer`] or [`LoadBalancer::update_load_balancer`] and
    /// reports a difference. The default, [`CloudError::NotImplemented`], makes the shadow
    /// skip the hosts comparison (it still compares the status and finalizer).
    async fn get_load_balancer_hosts(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<Vec<String>>> {
        let _ = (cluster_name, service);
        Err(CloudError::NotImplemented)
    }

    /// The name of the Service's load balancer. Never called by the framework; defaults to
    /// [`default_load_balancer_name`](crate::default_load_balancer_name).
    fn get_load_balancer_name(&self, cluster_name: &str, service: &Service) -> String {
        let _ = cluster_name;
        crate::default_load_balancer_name(service)
    }

    /// Creates the load balancer or brings it up to date (ports, source ranges, annotations,
    /// hosts) and returns its status, which the framework writes to `status.loadBalancer`.
    ///
    /// Must be idempotent: it is called for every handled Service on every start and leader
    /// change, and on every relevant Service change. `hosts` are the eligible Nodes (not being
    /// deleted, not excluded by `node.kubernetes.io/exclude-from-external-load-balancers`, not
    /// tainted `ToBeDeletedByClusterAutoscaler`); it may be empty. A Service annotated
    /// `service.ccm-rs.io/backend-node-selector` gets only those its label selector matches
    /// (the same for `update_load_balancer`). They are the framework's
    /// cached [`NodeView`]s, shared rather than copied (Go passes `[]*v1.Node` from its
    /// informer): clone a view (an `Arc`) if you need one later. A host list holds every
    /// eligible Node, 100,000 in a large cluster, which is why it is views and not k8s-openapi
    /// `Node`s: the framework's cache holds only the compact views, and rebuilding a `Node` per
    /// host would cost some 5 KB and 5 µs each, per call. Views carry metadata, spec,
    /// `status.addresses`, the kept `status.nodeInfo` fields and the `Ready`/`NetworkUnavailable`
    /// conditions, not the fields no cloud needs (`managedFields`, images, capacity, volumes).
    /// Errors: [`CloudError::Retry`]
    /// requeues after its delay, [`CloudError::ImplementedElsewhere`] is a success without a
    /// status write, anything else emits `SyncLoadBalancerFailed` and retries with exponential
    /// backoff (5 s to 300 s).
    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        hosts: &[NodeView],
    ) -> CloudResult<LoadBalancerStatus>;

    /// Replaces the load balancer's backend hosts; nothing else changed.
    ///
    /// Called when the eligible node set changes (coalesced over `--node-sync-window`). On
    /// error (other than a load balancer that no longer exists), the framework emits
    /// `UpdateLoadBalancerFailed` and falls back to a full
    /// [`LoadBalancer::ensure_load_balancer`]. [`CloudError::ImplementedElsewhere`] is a success.
    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        hosts: &[NodeView],
    ) -> CloudResult<()>;

    /// Deletes the Service's load balancer and everything created for it.
    ///
    /// Must succeed (`Ok(())`) when nothing exists, and be thorough ("get may say it's gone
    /// while parts linger"). Called when the Service is deleted, stops being a LoadBalancer, or
    /// was re-created under the same name; the finalizer is removed only after it succeeds.
    /// Must **not** return [`CloudError::ImplementedElsewhere`].
    async fn ensure_load_balancer_deleted(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<()>;
}

/// Optional: replace the backend hosts of many load balancers in one cloud call. Offer it from
/// [`CloudProvider::load_balancer_hosts_batch`] when your cloud can (load balancers that share
/// one backend pool, instance group or target group per cluster; an API taking many listeners
/// or pools in one request), alongside [`LoadBalancer`], which stays required.
///
/// Go's service controller calls `UpdateLoadBalancer` once per load balancer whenever the
/// eligible Nodes change, so a cluster with 1,000 LoadBalancer Services spends 1,000 calls of
/// its cloud quota on every Node that joins or leaves. With this capability the framework's
/// node sync sends the same change as `ceil(load balancers / max_batch_size)` calls.
///
/// # The contract
///
/// [`update_load_balancer_hosts`](LoadBalancerHostsBatch::update_load_balancer_hosts) does for
/// every Service given what [`LoadBalancer::update_load_balancer`] would do with the same
/// `hosts`: every load balancer in one call gets the same host list (the eligible Nodes at the
/// moment of the call, narrowed by the Services' `service.ccm-rs.io/backend-node-selector`: a
/// call carries Services of one selector only). It answers per Service, keyed `namespace/name`, with what
/// `update_load_balancer` would have answered for that Service alone, and the framework treats
/// each answer exactly so: `Ok(())` and [`CloudError::ImplementedElsewhere`] are a success,
/// [`CloudError::Retry`] retries that Service's load balancer after its delay, any other error
/// emits `UpdateLoadBalancerFailed` and falls back to a full `ensure_load_balancer` of it
/// (unless [`LoadBalancer::get_load_balancer`] then says it no longer exists: nothing to do).
///
/// **A Service missing from the answer was not updated**: the framework updates it in the same
/// pass with a single `update_load_balancer` call. Entries for Services that were not asked
/// about are ignored.
///
/// **Errors of the whole call** say that no load balancer was updated:
/// [`CloudError::Retry`] (the cloud's 429 + Retry-After) ends that node sync, and the next one
/// runs after `after` and not before (the Node changes arriving meanwhile wait for it);
/// [`CloudError::NotImplemented`] makes the framework use single `update_load_balancer` calls
/// for as long as the controller runs (a restart or a new leader asks again); any other error
/// makes it update that batch's load balancers with single calls at once.
///
/// **Batch size**: the framework never passes more than
/// [`max_batch_size`](LoadBalancerHostsBatch::max_batch_size) Services in one call, never the
/// same Service twice, and never an empty slice; `hosts` may be empty (no eligible Node).
///
/// One call costs one token of the framework's cloud-call budget (`--cloud-api-qps`) and is
/// subject to `--cloud-api-timeout`; its metrics operation label is
/// `update_load_balancer_hosts`.
///
/// ```
/// use std::sync::Arc;
///
/// use ccm_core::async_trait;
/// use ccm_core::{CloudResult, LoadBalancerHostsAnswers, LoadBalancerHostsBatch, NodeView, Service};
///
/// /// A cloud whose load balancers of one cluster share one backend pool.
/// struct Acme;
///
/// #[async_trait]
/// impl LoadBalancerHostsBatch for Acme {
///     fn max_batch_size(&self) -> usize {
///         500
///     }
///     async fn update_load_balancer_hosts(
///         &self,
///         cluster_name: &str,
///         services: &[Arc<Service>],
///         hosts: &[NodeView],
///     ) -> CloudResult<LoadBalancerHostsAnswers> {
///         // A real provider replaces the members of the cluster's pool (one request) here,
///         // then answers for each Service whose load balancer uses that pool.
///         let _ = (cluster_name, hosts);
///         let mut answers = LoadBalancerHostsAnswers::new();
///         for service in services {
///             let namespace = service.metadata.namespace.clone().unwrap_or_default();
///             let name = service.metadata.name.clone().unwrap_or_default();
///             answers.insert(format!("{namespace}/{name}"), Ok(()));
///         }
///         Ok(answers)
///     }
/// }
/// ```
#[async_trait]
pub trait LoadBalancerHostsBatch: Send + Sync {
    /// The most Services one
    /// [`update_load_balancer_hosts`](LoadBalancerHostsBatch::update_load_balancer_hosts) call
    /// accepts. The framework never exceeds it; `0` is treated as `1`.
    fn max_batch_size(&self) -> usize;

    /// Replaces the backend hosts of the load balancer of every Service in `services` with
    /// `hosts`, in one cloud call.
    ///
    /// See the [trait documentation](LoadBalancerHostsBatch) for the answer per Service, the
    /// rule for Services missing from the answer (not updated, asked again with a single call)
    /// and what an error of the whole call does. `services` holds 1 to
    /// [`max_batch_size`](LoadBalancerHostsBatch::max_batch_size) distinct Services, each
    /// handled by this controller (as for `update_load_balancer`); `hosts` are the eligible
    /// Nodes, the framework's cached [`NodeView`]s shared rather than copied (as for
    /// [`LoadBalancer::ensure_load_balancer`]).
    async fn update_load_balancer_hosts(
        &self,
        cluster_name: &str,
        services: &[Arc<Service>],
        hosts: &[NodeView],
    ) -> CloudResult<LoadBalancerHostsAnswers>;
}

/// Pod-CIDR routes in the cloud's route table (Go's `Routes`).
#[async_trait]
pub trait Routes: Send + Sync {
    /// Every route managed for this cluster. The route controller calls it once per reconcile.
    /// Set [`Route::enable_node_addresses`] on the results if you track
    /// [`Route::target_node_addresses`].
    async fn list_routes(&self, cluster_name: &str) -> CloudResult<Vec<Route>>;

    /// Creates a route. `name_hint` is the Node's UID (stable and unique); `route.name` is
    /// ignored. Creating a route that already exists should succeed.
    async fn create_route(
        &self,
        cluster_name: &str,
        name_hint: &str,
        route: &Route,
    ) -> CloudResult<()>;

    /// Deletes a route, as returned by [`Routes::list_routes`]. Deleting a route that no
    /// longer exists should succeed.
    async fn delete_route(&self, cluster_name: &str, route: &Route) -> CloudResult<()>;
}

/// Cluster listing (Go's `Clusters`). Never called by the framework's controllers; offered for
/// completeness and for vendors' own controllers.
#[async_trait]
pub trait Clusters: Send + Sync {
    /// The names of the clusters the provider knows.
    async fn list_clusters(&self) -> CloudResult<Vec<String>>;

    /// The address of the control plane of `cluster_name`.
    async fn master(&self, cluster_name: &str) -> CloudResult<String>;
}
