//! The node-IPAM controller (`node-ipam-controller`, Go alias `nodeipam`): gives every Node
//! its pod CIDRs (`spec.podCIDR`, `spec.podCIDRs`) out of `--cluster-cidr`, as the controller
//! Kubernetes' own `cmd/cloud-controller-manager` adds, with `--allocate-node-cidrs=true` and
//! `--cidr-allocator-type=RangeAllocator` (the default).
//!
//! - One CIDR per cluster CIDR (dual stack: one IPv4 and one IPv6), of the size
//!   `--node-cidr-mask-size[-ipv4|-ipv6]` (Go's defaults /24 and /64), never one overlapping
//!   `--service-cluster-ip-range`.
//! - At start, before anything is allocated, the pool is rebuilt from every Node's
//!   `spec.podCIDRs` (a consistent list), so a restarted or newly elected CCM never gives out
//!   a CIDR a Node already has.
//! - A Node's CIDRs go back to the pool when it is deleted.
//! - An exhausted range: a `CIDRNotAvailable` Event on the Node (Go's, type Normal), an error
//!   log naming the range, and retries with backoff (a released CIDR is then picked up).
//! - Metrics: Go's `node_ipam_controller_cidrset_*` (usage, allocations, releases, tries) and
//!   `node_ipam_controller_cirdset_max_cidrs` (Go's spelling).
//!
//! Deliberate differences from Go: the write is a JSON patch that tests the Node's UID and the
//! absence of pod CIDRs (Go relies on the API server refusing a change); a Node whose pod CIDR
//! lies outside every cluster CIDR gets a Warning `InvalidPodCIDR` Event and is skipped (Go
//! stops the controller); when a write fails, the reserved CIDRs stay with the Node and the
//! retry writes the same ones (Go releases them and may give them to another Node while the
//! first write might still land); when one family is exhausted, the block already taken from
//! the other family goes back.
//!
//! A vendor's allocator (e.g. a cloud allocator) plugs in with
//! [`Builder::cidr_allocator`](crate::Builder::cidr_allocator) under its
//! `--cidr-allocator-type` name.

mod metrics;
mod patch;
pub(crate) mod plan;
mod sync;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use ccm_core::NodeView;
use ipnet::IpNet;

use crate::machinery::context::ControllerContext;
use crate::machinery::error::ControllerError;
use crate::machinery::informer::Change;
use crate::machinery::workqueue::{Backoff, WorkQueue};

use self::metrics::PoolMetrics;
use self::plan::Pool;
use self::sync::Reconciler;

pub use self::plan::{DEFAULT_NODE_MASK_V4, DEFAULT_NODE_MASK_V6};
pub use self::sync::{
    REASON_CIDR_ASSIGNMENT_FAILED, REASON_CIDR_NOT_AVAILABLE, REASON_INVALID_POD_CIDR,
};

/// The controller's canonical name (Go's `names.NodeIpamController`).
pub const NAME: &str = "node-ipam-controller";
/// Its alias in `--controllers` (Go's).
pub const ALIAS: &str = "nodeipam";
/// The component of its Events (Go's range allocator records as `cidrAllocator`).
pub const EVENT_COMPONENT: &str = "cidrAllocator";
/// The name of its work queue.
pub const QUEUE_NAME: &str = "node_ipam";
/// The built-in allocator's `--cidr-allocator-type` (the default).
pub const RANGE_ALLOCATOR: &str = "RangeAllocator";
/// Parallel Node writes (Go's `cidrUpdateWorkers`).
pub const DEFAULT_WORKERS: usize = 30;

/// Configuration of the node-IPAM controller (from `--cluster-cidr`, the node mask flags,
/// `--service-cluster-ip-range` and `--cidr-allocator-type`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeIpamConfig {
    /// The cluster CIDRs: one, or one IPv4 and one IPv6.
    pub cluster_cidrs: Vec<IpNet>,
    /// The node CIDR mask size of each cluster CIDR (same order).
    pub node_mask_sizes: Vec<u8>,
    /// Service ranges kept out of the pool (primary and secondary).
    pub service_cidrs: Vec<IpNet>,
    /// `--cidr-allocator-type`.
    pub allocator_type: String,
    /// Parallel Node writes; at least 1.
    pub workers: usize,
}

impl Default for NodeIpamConfig {
    fn default() -> Self {
        NodeIpamConfig {
            cluster_cidrs: Vec::new(),
            node_mask_sizes: Vec::new(),
            service_cidrs: Vec::new(),
            allocator_type: RANGE_ALLOCATOR.to_owned(),
            workers: DEFAULT_WORKERS,
        }
    }
}

fn config_error(message: impl Into<String>) -> ControllerError {
    ControllerError::Config {
        controller: NAME,
        message: message.into(),
    }
}

impl NodeIpamConfig {
    /// Checks the configuration of the range allocator with Go's rules and messages: a cluster
    /// CIDR is required, at most one per family, node masks not shorter than the cluster
    /// masks, IPv6 node masks at most 16 bits longer.
    pub fn validate(&self) -> Result<(), ControllerError> {
        self.pool().map(|_| ())
    }

    fn pool(&self) -> Result<Pool, ControllerError> {
        if self.workers == 0 {
            return Err(config_error("workers must be at least 1"));
        }
        if self.cluster_cidrs.is_empty() {
            return Err(config_error(
                "Must specify --cluster-cidr if --allocate-node-cidrs is set",
            ));
        }
        if self.cluster_cidrs.len() > 2 {
            return Err(config_error(format!(
                "len of clusters is:{} > more than max allowed of 2",
                self.cluster_cidrs.len()
            )));
        }
        if let [a, b] = self.cluster_cidrs.as_slice()
            && matches!(a, IpNet::V4(_)) == matches!(b, IpNet::V4(_))
        {
            return Err(config_error(
                "len of ClusterCIDRs==2 and they are not configured as dual stack (at least one from each IPFamily",
            ));
        }
        if self.node_mask_sizes.len() != self.cluster_cidrs.len() {
            return Err(config_error(
                "one node CIDR mask size per cluster CIDR is needed",
            ));
        }
        if let [a, b] = self.service_cidrs.as_slice()
            && matches!(a, IpNet::V4(_)) == matches!(b, IpNet::V4(_))
        {
            return Err(config_error(
                "serviceCIDR and secondaryServiceCIDR are not dualstack (from different IPfamiles)",
            ));
        }
        Pool::new(
            &self.cluster_cidrs,
            &self.node_mask_sizes,
            &self.service_cidrs,
        )
        .map_err(|e| config_error(e.to_string()))
    }
}

/// Node mask sizes for `cluster_cidrs` from `--node-cidr-mask-size`, `-ipv4` and `-ipv6`
/// (0 = not set), with Go's rules (`setNodeCIDRMaskSizes`) and defaults.
pub fn node_mask_sizes(
    cluster_cidrs: &[IpNet],
    mask: u8,
    mask_v4: u8,
    mask_v6: u8,
) -> Result<Vec<u8>, String> {
    plan::node_mask_sizes(cluster_cidrs, mask, mask_v4, mask_v6)
}

/// The future an allocator's [`CidrAllocator::run`] returns.
pub type AllocatorFuture = Pin<Box<dyn Future<Output = Result<(), ControllerError>> + Send>>;

/// A pod-CIDR allocator selected by `--cidr-allocator-type` (Go's `CIDRAllocator`). The
/// built-in one is [`RANGE_ALLOCATOR`]; a vendor registers others (e.g. `CloudAllocator`, which
/// reads each Node's range from the cloud) with
/// [`Builder::cidr_allocator`](crate::Builder::cidr_allocator).
pub trait CidrAllocator: Send + Sync + 'static {
    /// Runs the allocator until `ctx.shutdown` fires. `config` holds the parsed flags; a
    /// vendor's allocator uses what applies to it.
    fn run(&self, ctx: ControllerContext, config: NodeIpamConfig) -> AllocatorFuture;
}

/// Allocators registered by `--cidr-allocator-type` name, besides the built-in one.
#[derive(Clone, Default)]
pub struct CidrAllocators {
    by_name: HashMap<String, Arc<dyn CidrAllocator>>,
}

impl std::fmt::Debug for CidrAllocators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CidrAllocators")
            .field("names", &self.names())
            .finish()
    }
}

impl CidrAllocators {
    /// Registers `allocator` under `name` (replacing one of the same name; `RangeAllocator`
    /// replaces the built-in one).
    pub fn insert(&mut self, name: &str, allocator: Arc<dyn CidrAllocator>) {
        self.by_name.insert(name.to_owned(), allocator);
    }

    /// Every accepted `--cidr-allocator-type`, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.by_name.keys().cloned().collect();
        if !self.by_name.contains_key(RANGE_ALLOCATOR) {
            names.push(RANGE_ALLOCATOR.to_owned());
        }
        names.sort();
        names
    }

    /// Checks that `allocator_type` can be run: the built-in one or a registered one.
    pub fn check(&self, allocator_type: &str) -> Result<(), ControllerError> {
        if allocator_type == RANGE_ALLOCATOR || self.by_name.contains_key(allocator_type) {
            return Ok(());
        }
        Err(config_error(format!(
            "--cidr-allocator-type={allocator_type:?} is not available: this binary has {}; a cloud provider must register an allocator of that name (Builder::cidr_allocator) to use it",
            self.names().join(", ")
        )))
    }

    fn get(&self, allocator_type: &str) -> Option<Arc<dyn CidrAllocator>> {
        self.by_name.get(allocator_type).cloned()
    }
}

/// Runs the node-IPAM controller with the allocator `config.allocator_type` names until
/// `ctx.shutdown` fires.
pub async fn run(
    ctx: ControllerContext,
    config: NodeIpamConfig,
    allocators: &CidrAllocators,
) -> Result<(), ControllerError> {
    allocators.check(&config.allocator_type)?;
    if let Some(vendor) = allocators.get(&config.allocator_type) {
        tracing::info!(allocator = %config.allocator_type, "starting {NAME}");
        return vendor.run(ctx, config).await;
    }
    run_range_allocator(ctx, config).await
}

fn same_pod_cidrs(a: &NodeView, b: &NodeView) -> bool {
    a.pod_cidr() == b.pod_cidr() && a.pod_cidrs().eq(b.pod_cidrs())
}

/// Runs the built-in range allocator until `ctx.shutdown` fires.
pub async fn run_range_allocator(
    ctx: ControllerContext,
    config: NodeIpamConfig,
) -> Result<(), ControllerError> {
    let pool = config.pool()?;
    // Subscribe (after the first list) before reading the store, so no change falls in
    // between; the start-up pass below covers the store, so the subscription's initial state
    // is skipped.
    let changes = tokio::select! {
        () = ctx.shutdown.cancelled() => return Ok(()),
        changes = ctx.nodes.subscribe() => changes,
    };
    let Some(mut changes) = changes else {
        return Err(ControllerError::NotSynced(NAME));
    };
    changes.skip_initial();
    let metrics = PoolMetrics::register(&ctx.metrics);
    let recorder = ctx.recorder(EVENT_COMPONENT);
    let reconciler = Arc::new(Reconciler::new(ctx.clone(), pool, recorder, metrics));
    let queue: WorkQueue<String> = ctx.queue(QUEUE_NAME, Backoff::CONTROLLER);

    // Every CIDR a Node already has is marked before anything is allocated.
    let nodes = ctx.nodes.list();
    let mut without = Vec::new();
    for node in &nodes {
        if !reconciler.occupy_existing(&node.to_node()) {
            without.push(node.name().to_owned());
        }
    }
    tracing::info!(
        cluster_cidrs = ?config.cluster_cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        node_mask_sizes = ?config.node_mask_sizes,
        service_cidrs = ?config.service_cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        nodes_with_cidrs = nodes.len() - without.len(),
        nodes_without = without.len(),
        "starting {NAME} (range allocator)"
    );
    drop(nodes);
    for name in without {
        queue.add(name);
    }

    let feeder = {
        let (ctx, queue, reconciler) = (ctx.clone(), queue.clone(), reconciler.clone());
        tokio::spawn(async move {
            loop {
                let change = tokio::select! {
                    () = ctx.shutdown.cancelled() => break,
                    change = changes.recv() => change,
                };
                match change {
                    None => break,
                    Some(Change::Applied { old, new }) => {
                        // An update that left the pod CIDRs as they were (kubelet's status
                        // writes) changes nothing here; a Node waiting for a CIDR keeps its
                        // retry backoff instead of being retried on every heartbeat.
                        if old.is_some_and(|o| same_pod_cidrs(&o, &new)) {
                            continue;
                        }
                        // A Node with CIDRs is recorded at once (no allocation can come
                        // between); one without goes to the workers.
                        if !reconciler.occupy_existing(&new.to_node()) {
                            queue.add(new.name().to_owned());
                        }
                    }
                    Some(Change::Deleted(node)) => reconciler.release(node.name()),
                    Some(Change::Resync) => {
                        reconciler.release_missing();
                        for node in ctx.nodes.list() {
                            if !reconciler.occupy_existing(&node.to_node()) {
                                queue.add(node.name().to_owned());
                            }
                        }
                    }
                }
            }
        })
    };

    queue
        .run_workers(config.workers, ctx.shutdown.clone(), move |name: String| {
            let reconciler = reconciler.clone();
            async move { reconciler.sync(&name).await }
        })
        .await;
    feeder.abort();
    let _ = feeder.await;
    Ok(())
}
