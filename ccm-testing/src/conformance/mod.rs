//! The provider conformance suite: prove a provider keeps the `ccm-core` contract before it
//! meets a cluster.
//!
//! Kubernetes has no provider-neutral test suite (kubernetes/kubernetes#73794); vendors learn
//! in production that `instance_exists` must not say "gone" for a stopped machine, or that
//! `ensure_load_balancer_deleted` must succeed when nothing is left. This module makes the
//! contract of Go's `k8s.io/cloud-provider` (reference: `go-cloud-provider.md` §1) executable.
//!
//! A vendor runs it from its own tests, against its real cloud or its own fake:
//!
//! ```
//! use ccm_core::{Node, ObjectMeta, Service};
//! use ccm_testing::conformance::{Check, ConformanceInput, Suite};
//! use ccm_testing::fake_cloud::FakeCloud;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let node = |name: &str| Node {
//!     metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
//!     ..Default::default()
//! };
//! let mut service = Service::default();
//! service.metadata.name = Some("conformance-lb".into());
//! service.metadata.namespace = Some("default".into());
//! service.metadata.uid = Some("6f1d3c2a-0000-4000-8000-000000000001".into());
//!
//! let cloud = FakeCloud::builder().missing_node("gone-.*").shutdown_node("stopped-.*").build();
//! let input = ConformanceInput::new("my-cluster", vec![node("worker-1"), node("worker-2")])
//!     .missing_node(node("gone-1"))
//!     .shutdown_node(node("stopped-1"))
//!     .service(service)
//!     .route_cidr("10.244.250.0/24")
//!     .ipv6_route_cidr("fd00:10:244:fa::/64");
//! let suite = Suite::new(cloud.provider(), input)
//!     // Skip what your account cannot do, e.g. creating routes:
//!     .skip(Check::ConcurrentCallsAreSafe);
//!
//! let report = suite.run().await;
//! assert!(report.is_success(), "{report}");
//! assert!(report.skipped().any(|r| r.check == Check::ConcurrentCallsAreSafe));
//!
//! // Or one check at a time:
//! let result = suite.run_check(Check::InstanceExistsFalseForUnknown).await;
//! assert!(result.outcome.is_passed(), "{result}");
//! # }
//! ```
//!
//! Each check is named after the contract it enforces ([`Check`], whose variants document the
//! reason). A check is skipped, with the reason in the report, when the provider does not offer
//! the capability it needs or the input lacks what it needs (e.g. no Service). The [`Report`]
//! shows, for each failed check, what was expected and what was observed.
//!
//! What the suite creates (a load balancer for the given Service, routes inside the given CIDR)
//! it deletes again at the end of each check; cleanup failures are noted in the check's result.
//!
//! The suite runs inside a Tokio runtime (`#[tokio::test]`, single- or multi-threaded); the
//! concurrency check spawns tasks on it. Checks run one after the other.
//!
//! Every provider call is made under a time limit ([`ConformanceInput::call_timeout`]), a
//! [`CloudError::Retry`] answer is honoured (the call is repeated
//! after the requested delay, up to [`ConformanceInput::retry_budget`]), and a panicking provider
//! fails the check instead of aborting the suite.

mod checks;
mod report;

pub use report::{CheckResult, Outcome, Report, SkipKind};

use std::collections::BTreeSet;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ccm_core::{CloudError, CloudProvider, CloudResult, Node, NodeView, Service};
use futures::FutureExt;

/// A probe reporting which backend hosts (node names) the cloud holds for a Service's load
/// balancer, or `None` if it holds none. See [`ConformanceInput::lb_hosts_probe`].
pub type LbHostsProbe =
    Arc<dyn Fn(Service) -> Pin<Box<dyn Future<Output = Option<Vec<String>>> + Send>> + Send + Sync>;

/// What the suite needs to know about the cloud under test.
#[derive(Clone)]
#[non_exhaustive]
pub struct ConformanceInput {
    /// The cluster name passed to every load-balancer and route call.
    pub cluster_name: String,
    /// Nodes whose instances exist and are running (at least one; two or more let the
    /// concurrency and load-balancer host checks see more). Shared as the framework hands
    /// hosts to a provider (`&[NodeView]`).
    pub existing_nodes: Vec<NodeView>,
    /// A Node whose instance does not exist. Give it a `spec.providerID` to also check the
    /// legacy `*_by_provider_id` lookups.
    pub missing_node: Option<NodeView>,
    /// A Node whose instance exists but is shut down (stopped).
    pub shutdown_node: Option<NodeView>,
    /// A Service (namespace, name, uid, ports set) of `type: LoadBalancer` the suite may create
    /// a load balancer for. It must not have a load balancer when the suite starts.
    pub service: Option<Service>,
    /// A CIDR the suite may create routes in (e.g. an unused `/24` of the cluster CIDR). The
    /// round-trip checks use it whole; the concurrency check splits it. It must be unused: a
    /// check finding a route in it fails, and cleanup deletes every route inside it.
    pub route_cidr: Option<String>,
    /// An unused IPv6 CIDR the suite may create routes in, next to an IPv4
    /// [`ConformanceInput::route_cidr`], for the dual-stack check
    /// ([`Check::RoutesDualStackSameNameHintBothKept`]), which is skipped without it. Like
    /// `route_cidr`, cleanup deletes every route inside it.
    pub ipv6_route_cidr: Option<String>,
    /// Reports the backend hosts the cloud holds for a Service's load balancer, so the
    /// `update_load_balancer` check can verify the hosts really changed. Without it, that check
    /// verifies only that the update succeeds and the load balancer still exists.
    pub lb_hosts_probe: Option<LbHostsProbe>,
    /// The limit of each provider call (default 60 s).
    pub call_timeout: Duration,
    /// How long the suite keeps repeating a call answered with `CloudError::Retry`
    /// (default 5 min).
    pub retry_budget: Duration,
    /// How long cancelled calls run before their future is dropped (default 1 ms; a
    /// cancellation right after the first poll is always tried too).
    pub cancel_after: Duration,
    /// How many calls the concurrency check makes at once (default 8).
    pub parallelism: usize,
}

impl fmt::Debug for ConformanceInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConformanceInput")
            .field("cluster_name", &self.cluster_name)
            .field(
                "existing_nodes",
                &self
                    .existing_nodes
                    .iter()
                    .map(|n| n.name().to_owned())
                    .collect::<Vec<_>>(),
            )
            .field(
                "missing_node",
                &self.missing_node.as_ref().map(NodeView::name),
            )
            .field(
                "shutdown_node",
                &self.shutdown_node.as_ref().map(NodeView::name),
            )
            .field("service", &self.service.as_ref().map(|s| &s.metadata.name))
            .field("route_cidr", &self.route_cidr)
            .field("ipv6_route_cidr", &self.ipv6_route_cidr)
            .field("lb_hosts_probe", &self.lb_hosts_probe.is_some())
            .field("call_timeout", &self.call_timeout)
            .field("retry_budget", &self.retry_budget)
            .field("cancel_after", &self.cancel_after)
            .field("parallelism", &self.parallelism)
            .finish()
    }
}

impl ConformanceInput {
    /// Input with the cluster name and the running nodes; add the rest with the other methods.
    pub fn new(cluster_name: impl Into<String>, existing_nodes: Vec<Node>) -> Self {
        ConformanceInput {
            cluster_name: cluster_name.into(),
            existing_nodes: existing_nodes.into_iter().map(NodeView::from).collect(),
            missing_node: None,
            shutdown_node: None,
            service: None,
            route_cidr: None,
            ipv6_route_cidr: None,
            lb_hosts_probe: None,
            call_timeout: Duration::from_secs(60),
            retry_budget: Duration::from_secs(300),
            cancel_after: Duration::from_millis(1),
            parallelism: 8,
        }
    }

    /// Sets [`ConformanceInput::missing_node`].
    pub fn missing_node(mut self, node: Node) -> Self {
        self.missing_node = Some(NodeView::from(node));
        self
    }

    /// Sets [`ConformanceInput::shutdown_node`].
    pub fn shutdown_node(mut self, node: Node) -> Self {
        self.shutdown_node = Some(NodeView::from(node));
        self
    }

    /// Sets [`ConformanceInput::service`].
    pub fn service(mut self, service: Service) -> Self {
        self.service = Some(service);
        self
    }

    /// Sets [`ConformanceInput::route_cidr`].
    pub fn route_cidr(mut self, cidr: impl Into<String>) -> Self {
        self.route_cidr = Some(cidr.into());
        self
    }

    /// Sets [`ConformanceInput::ipv6_route_cidr`].
    pub fn ipv6_route_cidr(mut self, cidr: impl Into<String>) -> Self {
        self.ipv6_route_cidr = Some(cidr.into());
        self
    }

    /// Sets [`ConformanceInput::lb_hosts_probe`].
    pub fn lb_hosts_probe<F, Fut>(mut self, probe: F) -> Self
    where
        F: Fn(Service) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Option<Vec<String>>> + Send + 'static,
    {
        self.lb_hosts_probe = Some(Arc::new(move |svc| Box::pin(probe(svc))));
        self
    }

    /// Sets [`ConformanceInput::call_timeout`].
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Sets [`ConformanceInput::retry_budget`].
    pub fn retry_budget(mut self, budget: Duration) -> Self {
        self.retry_budget = budget;
        self
    }

    /// Sets [`ConformanceInput::cancel_after`].
    pub fn cancel_after(mut self, after: Duration) -> Self {
        self.cancel_after = after;
        self
    }

    /// Sets [`ConformanceInput::parallelism`].
    pub fn parallelism(mut self, parallelism: usize) -> Self {
        self.parallelism = parallelism.max(1);
        self
    }
}

/// The checks of the suite, each named after the contract it enforces.
///
/// The references are to `go-cloud-provider.md` §1 (the Go `cloudprovider` interfaces), whose
/// contract the `ccm-core` traits carry over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Check {
    /// `instance_metadata` (or, on the legacy path, `node_addresses` + `instance_type`) gives
    /// the same answer on repeated calls for the same Node.
    ///
    /// Why: §1.4, the provider ID "must stay stable"; the cloud-node controller refreshes
    /// addresses every `--node-status-update-frequency`, so an answer that flaps rewrites
    /// `status.addresses` and labels in a loop.
    InstanceMetadataStable,
    /// The provider declares its provider-ID schemes (`provider_id_schemes()`: at least one,
    /// each a valid provider name), and the provider ID of every existing Node parses as
    /// `<scheme>://<id>` ([`ccm_core::ProviderId`]) with one of them (on the legacy path,
    /// `provider_name()`, with which the framework builds it).
    ///
    /// Why: §1.1, `ProviderName` builds provider IDs `<name>://<instanceID>`; §1.4, the format
    /// `<provider>://<id>` is what `spec.providerID` holds, and it is written once and never
    /// changed. A malformed one makes every later lookup by provider ID fail, and one of an
    /// undeclared scheme makes the framework take the Node for another cloud's and leave it
    /// alone (docs/controllers.md, "Which Nodes are ours").
    ProviderIdWellFormed,
    /// `instance_exists` (and `instance_exists_by_provider_id`) answers `Ok(false)`, not an
    /// error, for an instance that does not exist.
    ///
    /// Why: §1.3/§1.4, `false,nil` is the only answer that lets the node-lifecycle controller
    /// delete the Node of a deleted machine; an error (including `InstanceNotFound`) leaves
    /// the dead Node in the cluster for ever.
    InstanceExistsFalseForUnknown,
    /// `instance_exists` answers `Ok(true)` for running instances and for a shut-down one.
    ///
    /// Why: §1.3, "stopped instances must return true": `false` deletes the Node object, and a
    /// stopped machine's Node (with its labels, taints and pods) must survive a reboot.
    InstanceExistsTrueForExistingAndShutDown,
    /// `instance_shutdown` answers true for the shut-down instance, false (or
    /// `NotImplemented`) for running ones, and never true for an instance that does not exist.
    ///
    /// Why: §1.3, shutdown is the "exists but stopped" state that earns the
    /// `node.cloudprovider.kubernetes.io/shutdown` taint; `NotImplemented` is read as "not shut
    /// down". A gone instance reported shut down keeps a dead Node tainted instead of deleted.
    InstanceShutdownConsistentWithExists,
    /// When the provider offers `Zones`, the zone lookups of every existing Node answer a
    /// non-empty zone (failure domain) and region.
    ///
    /// Why: §1.5, the legacy node controller writes `topology.kubernetes.io/zone` and
    /// `/region` from `Zones`; a provider claiming zones with empty answers leaves every Node
    /// without topology labels, silently breaking zone spreading.
    ZonesNonEmpty,
    /// With `InstancesV2`, the labels `instance_metadata` answers for every existing Node can
    /// be written to a Node: zone, region and instance type are valid label values, and each
    /// additional label has a valid key (a qualified name) outside the `kubernetes.io` /
    /// `k8s.io` namespaces and a valid value.
    ///
    /// Why: the cloud-node controller writes these labels at initialisation and, with
    /// `--reconcile-cloud-labels`, again at every status refresh (docs/controllers.md, "Labels
    /// kept in step with the cloud"). An invalid value is refused by the API server: the Node
    /// stays uninitialised, or the refresh fails every period; a reserved key is discarded
    /// with a warning every time.
    InstanceLabelsValid,
    /// `ensure_load_balancer` called twice with the same input succeeds both times with the
    /// same status, and the status has at least one ingress with an IP or a hostname.
    ///
    /// Why: §1.2, EnsureLoadBalancer "must be idempotent (called on every startup/leader
    /// change for every LB service...)" and "a non-nil status is required on success".
    EnsureLoadBalancerIdempotentWithIngress,
    /// `get_load_balancer` reports the load balancer after `ensure_load_balancer` and not
    /// before it nor after `ensure_load_balancer_deleted`.
    ///
    /// Why: §1.2, GetLoadBalancer "must return exists=true only if an LB created by the
    /// service controller exists"; the service controller uses it to decide whether there is
    /// anything to delete.
    GetLoadBalancerReportsExactlyBetweenEnsureAndDelete,
    /// `update_load_balancer` with another host set succeeds, the load balancer still exists,
    /// and (when [`ConformanceInput::lb_hosts_probe`] is given) its hosts are the new set.
    ///
    /// Why: §1.2, UpdateLoadBalancer is called when "only the backend host set changed"; it is
    /// the only call the service controller makes on node churn.
    UpdateLoadBalancerChangesHosts,
    /// `ensure_load_balancer_deleted` succeeds when nothing exists, succeeds twice in a row,
    /// and never answers `ImplementedElsewhere`.
    ///
    /// Why: §1.2, EnsureLoadBalancerDeleted "must return nil if the LB does not exist or was
    /// deleted" and "must not return ImplementedElsewhere"; the Service's finalizer is removed
    /// only after it succeeds, so a failure blocks the Service's deletion for ever.
    EnsureLoadBalancerDeletedIdempotent,
    /// A route created with `create_route` is listed by `list_routes` (same destination CIDR
    /// and target node) and gone after `delete_route`.
    ///
    /// Why: §1.6, the route controller lists, compares by CIDR and target, and deletes what
    /// `list_routes` returned; a route that does not round-trip is re-created or deleted in a
    /// loop.
    RoutesRoundTrip,
    /// Creating a route that already exists succeeds and does not duplicate it.
    ///
    /// Why: §1.6 and the route controller's reconcile: after a restart or a lost answer the
    /// controller creates routes it cannot know exist.
    RoutesCreateExistingSucceeds,
    /// Deleting a route that does not exist (never created, or already deleted) succeeds.
    ///
    /// Why: §1.6, `DeleteRoute` takes a route as returned by `ListRoutes`, which can be gone by
    /// the time it is deleted (two reconciles, a cloud-side cleanup).
    RoutesDeleteMissingSucceeds,
    /// Two routes created with the same name hint and target node, one to an IPv4 and one to an
    /// IPv6 CIDR ([`ConformanceInput::route_cidr`] and [`ConformanceInput::ipv6_route_cidr`]),
    /// are both listed with their own CIDRs; deleting the IPv4 one leaves the IPv6 one, creating
    /// the IPv6 one again does not duplicate it, and deleting it leaves neither.
    ///
    /// Why: §1.6, the framework passes the Node UID as `nameHint`, and §5.3 step 3, the route
    /// controller creates one route per pod CIDR, "so dual-stack nodes get one route per
    /// family": both routes of a dual-stack Node carry the same hint. A provider that keys
    /// routes by the hint alone overwrites the IPv4 route with the IPv6 one, and the controller
    /// re-creates the missing one on every reconcile, each overwriting the other.
    RoutesDualStackSameNameHintBothKept,
    /// When both `instances` (v1) and `instances_v2` are offered, they agree: provider ID,
    /// instance type, addresses, existence, shutdown state and (with `Zones`) zone and region.
    ///
    /// Why: §1.1/§1.4, InstancesV2 replaces InstanceID + NodeAddresses + InstanceType + Zone;
    /// a framework picks one path, so the two must describe the same instance.
    LegacyV1ConsistentWithV2,
    /// The legacy `instance_id` answers `InstanceNotFound` for an instance that does not
    /// exist.
    ///
    /// Why: §1.3, InstanceID: "if the instance does not exist → InstanceNotFound"; any other
    /// answer either invents a provider ID for a dead machine or hides the deletion.
    LegacyInstanceIdNotFoundForUnknown,
    /// Dropping a call's future part-way (the framework's cancellation: shutdown, per-call
    /// timeout) neither panics nor leaves inconsistent state. Every method of every offered
    /// capability is cancelled right after its first poll and after
    /// [`ConformanceInput::cancel_after`]; then: reads (instance, batch, legacy, zone lookups) answer
    /// as before; after a cancelled `ensure_load_balancer`, `update_load_balancer`,
    /// `update_load_balancer_hosts` or `ensure_load_balancer_deleted`, completed calls still work and an ensure followed by a
    /// delete leaves the load balancer as it was before; after a cancelled `create_route` or
    /// `delete_route`, deleting what is listed leaves no route.
    ///
    /// Why: the Go contract passes a `context.Context` to every method (§1) that callers cancel;
    /// in Rust the framework drops the future, which a provider must survive.
    CancellationLeavesConsistentState,
    /// Parallel calls give the answers sequential calls give: `instance_metadata` for several
    /// Nodes at once (each answer equal to the sequential one), `ensure_load_balancer` on one
    /// Service from several tasks while others call `get_load_balancer` (all succeed, one load
    /// balancer results, one delete removes it), and several routes created and deleted at once
    /// (each listed exactly once, none left).
    ///
    /// Why: the framework runs several workers per controller (`--concurrent-service-syncs`,
    /// node workers) against one provider; §1 methods are called from many goroutines in Go.
    ConcurrentCallsAreSafe,
    /// When the provider offers `InstancesBatch` (with `InstancesV2`), `describe_instances` of
    /// every Node of the input answers what the single calls answer: `NotFound` exactly when
    /// `instance_exists` is false, `Shutdown`/`Found` as `instance_shutdown` says, and the
    /// metadata `instance_metadata` returns; never `NotFound` (or `Shutdown`) for a running
    /// Node, never `Found` for the missing one. A Node left out of the answer or answered
    /// `Error` is unknown, which the contract allows (noted in the result).
    ///
    /// Why: a batch answer replaces the three `InstancesV2` calls (§1.4) for many Nodes at
    /// once; `NotFound` deletes the Node like `InstanceExists` answering `false,nil`, so a
    /// batch that confuses "not in this page" with "gone" deletes live Nodes.
    BatchAgreesWithSingleCalls,
    /// `describe_instances` answers each Node the same whether it is asked with the others, in
    /// reverse order, or alone (known answers only; an unknown answer may differ).
    ///
    /// Why: the framework groups Nodes as they arrive (initialisation bursts, refresh
    /// periods); a provider that maps replies back to Nodes by position instead of by ID gives
    /// one Node's metadata (provider ID, addresses) to another.
    BatchSameAnswerWhateverTheGrouping,
    /// `max_batch_size()` is at least 1, and a batch of that many Nodes (as many as the input
    /// has, up to it) is answered without failing.
    ///
    /// Why: the framework splits lookups into batches of the declared size; a provider that
    /// declares more than its cloud accepts fails every full batch.
    BatchMaxSizeHonoured,
    /// When the provider offers `LoadBalancerHostsBatch` (with `LoadBalancer`),
    /// `update_load_balancer_hosts` of the input's Service, whose load balancer exists, answers
    /// for it (keyed `namespace/name`) what `update_load_balancer` answers: success, after
    /// which the load balancer still exists and (with [`ConformanceInput::lb_hosts_probe`]) has
    /// exactly the new hosts, twice with different host sets. `max_batch_size()` is at least 1.
    ///
    /// Why: the framework's node sync sends every load balancer's new hosts through the batch
    /// when it is offered and treats each answer as the single call's; a batch that answers
    /// success without changing the hosts leaves new Nodes out of every load balancer, and a
    /// Service missing from the answer costs a single call on every node sync.
    LoadBalancerHostsBatchAgreesWithUpdate,
    /// What the provider declares in `load_balancer_classes` holds: at least one entry, every
    /// class a valid `spec.loadBalancerClass`, an implementation (`load_balancer_for_class`)
    /// for every entry, and each declared class's implementation creates, reports and deletes
    /// the load balancer of a Service of that class (the input Service given the class).
    ///
    /// Why: the service controller serves exactly the declared classes and refuses to start
    /// with an invalid one; a declared class without an implementation stops the controller,
    /// and one whose implementation does not work leaves every Service of the class without
    /// its load balancer (Go has no classes: §4.2 serves Services without a class only).
    LoadBalancerClassesDeclared,
    /// The `ipMode`s of the input Service's load balancer are ones the API server accepts and
    /// the provider declares: `load_balancer_ip_modes` of the Service's class allows its own
    /// default, and every ingress entry `ensure_load_balancer` returns with an `ipMode` has an
    /// `ip`, a mode of `VIP` or `Proxy`, and one the class declares (its default or an allowed
    /// mode).
    ///
    /// Why: KEP-1860, the API server rejects an `ipMode` other than `VIP`/`Proxy` and one on an
    /// entry without an `ip`: the whole status write fails and the Service never shows its
    /// load balancer. A load balancer that proxies but says `VIP` (or the reverse) makes
    /// kube-proxy route in-cluster traffic past it (or through it for nothing). Go passes the
    /// provider's status through unchecked.
    LoadBalancerIngressIpModesValid,
}

impl Check {
    /// Every check, in the order [`Suite::run`] runs them.
    pub const ALL: &'static [Check] = &[
        Check::InstanceMetadataStable,
        Check::ProviderIdWellFormed,
        Check::InstanceExistsFalseForUnknown,
        Check::InstanceExistsTrueForExistingAndShutDown,
        Check::InstanceShutdownConsistentWithExists,
        Check::ZonesNonEmpty,
        Check::InstanceLabelsValid,
        Check::LegacyV1ConsistentWithV2,
        Check::LegacyInstanceIdNotFoundForUnknown,
        Check::EnsureLoadBalancerIdempotentWithIngress,
        Check::GetLoadBalancerReportsExactlyBetweenEnsureAndDelete,
        Check::UpdateLoadBalancerChangesHosts,
        Check::EnsureLoadBalancerDeletedIdempotent,
        Check::RoutesRoundTrip,
        Check::RoutesCreateExistingSucceeds,
        Check::RoutesDeleteMissingSucceeds,
        Check::RoutesDualStackSameNameHintBothKept,
        Check::CancellationLeavesConsistentState,
        Check::ConcurrentCallsAreSafe,
        Check::BatchAgreesWithSingleCalls,
        Check::BatchSameAnswerWhateverTheGrouping,
        Check::BatchMaxSizeHonoured,
        Check::LoadBalancerHostsBatchAgreesWithUpdate,
        Check::LoadBalancerClassesDeclared,
        Check::LoadBalancerIngressIpModesValid,
    ];

    /// The check's snake_case name, as shown in the report.
    pub fn name(self) -> &'static str {
        match self {
            Check::InstanceMetadataStable => "instance_metadata_stable",
            Check::ProviderIdWellFormed => "provider_id_well_formed",
            Check::InstanceExistsFalseForUnknown => "instance_exists_false_for_unknown",
            Check::InstanceExistsTrueForExistingAndShutDown => {
                "instance_exists_true_for_existing_and_shut_down"
            }
            Check::InstanceShutdownConsistentWithExists => {
                "instance_shutdown_consistent_with_exists"
            }
            Check::ZonesNonEmpty => "zones_non_empty",
            Check::InstanceLabelsValid => "instance_labels_valid",
            Check::EnsureLoadBalancerIdempotentWithIngress => {
                "ensure_load_balancer_idempotent_with_ingress"
            }
            Check::GetLoadBalancerReportsExactlyBetweenEnsureAndDelete => {
                "get_load_balancer_reports_exactly_between_ensure_and_delete"
            }
            Check::UpdateLoadBalancerChangesHosts => "update_load_balancer_changes_hosts",
            Check::EnsureLoadBalancerDeletedIdempotent => "ensure_load_balancer_deleted_idempotent",
            Check::RoutesRoundTrip => "routes_round_trip",
            Check::RoutesCreateExistingSucceeds => "routes_create_existing_succeeds",
            Check::RoutesDeleteMissingSucceeds => "routes_delete_missing_succeeds",
            Check::RoutesDualStackSameNameHintBothKept => {
                "routes_dual_stack_same_name_hint_both_kept"
            }
            Check::LegacyV1ConsistentWithV2 => "legacy_v1_consistent_with_v2",
            Check::LegacyInstanceIdNotFoundForUnknown => "legacy_instance_id_not_found_for_unknown",
            Check::CancellationLeavesConsistentState => "cancellation_leaves_consistent_state",
            Check::ConcurrentCallsAreSafe => "concurrent_calls_are_safe",
            Check::BatchAgreesWithSingleCalls => "batch_agrees_with_single_calls",
            Check::BatchSameAnswerWhateverTheGrouping => "batch_same_answer_whatever_the_grouping",
            Check::BatchMaxSizeHonoured => "batch_max_size_honoured",
            Check::LoadBalancerHostsBatchAgreesWithUpdate => {
                "load_balancer_hosts_batch_agrees_with_update"
            }
            Check::LoadBalancerClassesDeclared => "load_balancer_classes_declared",
            Check::LoadBalancerIngressIpModesValid => "load_balancer_ingress_ip_modes_valid",
        }
    }

    /// The check with this snake_case name.
    pub fn from_name(name: &str) -> Option<Check> {
        Check::ALL.iter().copied().find(|c| c.name() == name)
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The conformance suite for one provider.
pub struct Suite {
    provider: Arc<dyn CloudProvider>,
    input: ConformanceInput,
    skipped: BTreeSet<Check>,
}

impl fmt::Debug for Suite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Suite")
            .field("provider", &self.provider.provider_name())
            .field("input", &self.input)
            .field("skipped", &self.skipped)
            .finish()
    }
}

impl Suite {
    /// A suite for `provider` with what it needs to know.
    pub fn new(provider: Arc<dyn CloudProvider>, input: ConformanceInput) -> Self {
        Suite {
            provider,
            input,
            skipped: BTreeSet::new(),
        }
    }

    /// Skips a check (reported as skipped "by the caller"), e.g. one needing resources the
    /// vendor cannot create in its test account.
    pub fn skip(mut self, check: Check) -> Self {
        self.skipped.insert(check);
        self
    }

    /// The input the suite runs with.
    pub fn input(&self) -> &ConformanceInput {
        &self.input
    }

    /// Runs every check not skipped, one after the other, in [`Check::ALL`] order.
    pub async fn run(&self) -> Report {
        let mut results = Vec::with_capacity(Check::ALL.len());
        for check in Check::ALL {
            results.push(self.run_check(*check).await);
        }
        Report { results }
    }

    /// Runs one check (skipped if [`Suite::skip`] named it).
    pub async fn run_check(&self, check: Check) -> CheckResult {
        if self.skipped.contains(&check) {
            return CheckResult {
                check,
                outcome: Outcome::Skipped {
                    kind: SkipKind::ByCaller,
                    reason: "skipped by the caller".into(),
                },
                notes: Vec::new(),
            };
        }
        let mut ctx = checks::Ctx::new(self);
        let outcome = match checks::run(check, &mut ctx).await {
            Ok(()) => Outcome::Passed,
            Err(checks::Stop::Failed { expected, observed }) => {
                Outcome::Failed { expected, observed }
            }
            Err(checks::Stop::Skipped(kind, reason)) => Outcome::Skipped { kind, reason },
        };
        let notes = ctx.cleanup().await;
        let result = CheckResult {
            check,
            outcome,
            notes,
        };
        tracing::info!(check = check.name(), "{result}");
        result
    }
}

/// Awaits a provider call under the suite's time limit, turning a panic into an error.
async fn guarded<T>(
    timeout: Duration,
    what: &str,
    fut: impl Future<Output = CloudResult<T>>,
) -> CloudResult<T> {
    match tokio::time::timeout(timeout, AssertUnwindSafe(fut).catch_unwind()).await {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => Err(CloudError::msg(format!(
            "{what} panicked: {}",
            panic_message(panic.as_ref())
        ))),
        Err(_) => Err(CloudError::msg(format!(
            "{what} did not answer within {timeout:?}"
        ))),
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".into()
    }
}
