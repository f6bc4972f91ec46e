//! The service load-balancer controller (`service-lb-controller`, Go's
//! `k8s.io/cloud-provider/controllers/service`).
//!
//! For every `type: LoadBalancer` Service of a load-balancer class it serves it keeps a cloud
//! load balancer through the provider's [`LoadBalancer`](ccm_core::LoadBalancer) capability,
//! writes its address to `status.loadBalancer.ingress`, and deletes it when the Service goes.
//!
//! # Load-balancer classes
//!
//! The classes served are the provider's
//! [`load_balancer_classes`](ccm_core::CloudProvider::load_balancer_classes) (by default
//! Services without `spec.loadBalancerClass` only, as Go), or the operator's
//! `--load-balancer-classes` ([`ServiceConfig::load_balancer_classes`]), which may narrow them
//! or serve a declared class's implementation under another class name. Each Service is served
//! by the implementation of its class
//! ([`load_balancer_for_class`](ccm_core::CloudProvider::load_balancer_for_class)). A
//! LoadBalancer Service of a class not served is never touched (finalizer, cloud calls,
//! status, node sync), even when it carries the cleanup finalizer: every instance of this
//! framework uses that one finalizer, so only the class says whose a Service is. The rules are
//! in `classes.rs` and `plan::decide`.
//!
//! # Backends chosen per Service
//!
//! Beyond Go: a served Service's annotation `service.ccm-rs.io/backend-node-selector` holds a
//! label selector (`kubectl -l` syntax, parsed as `--managed-node-selector`); its load balancer
//! gets the eligible hosts that match it, on ensure and node sync (a hosts batch carries one
//! selector's load balancers). Node label changes start a pass only when they move a host in or
//! out of a selector in use. An invalid selector: Warning `InvalidBackendNodeSelector`, the
//! condition `False` with that reason (with `--load-balancer-status-conditions`), and no cloud
//! call for the Service. The rules are in `plan/backends.rs`; docs/controllers.md has the table.
//!
//! # How it works
//!
//! - **Service queue** (`service`, backoff 5 s → 300 s): Service adds, relevant updates
//!   (`plan::update_trigger`), pending cleanups and deletions are queued by `namespace/name`.
//!   A worker decides (`plan::decide`) per Service:
//!   - *ensure*: event `EnsuringLoadBalancer`; the finalizer
//!     `service.kubernetes.io/load-balancer-cleanup` is added **before** anything is created in
//!     the cloud; `ensure_load_balancer` with the eligible hosts (§4.5, `plan::eligible_hosts`;
//!     0 hosts → Warning `UnAvailableLoadBalancer`, ensure still called); event
//!     `EnsuredLoadBalancer`; `status.loadBalancer.ingress` is written through the status
//!     subresource only when it changed.
//!   - *delete* (Service being deleted, no longer a LoadBalancer, given a class, or still
//!     carrying the finalizer): `get_load_balancer`; if it exists, `DeletingLoadBalancer` and
//!     `ensure_load_balancer_deleted`; the finalizer is removed only afterwards;
//!     `DeletedLoadBalancer`.
//!   - a Service re-created under the same name (new UID) first has the old load balancer
//!     deleted; a Service that vanished while the controller had a record of its load balancer
//!     (e.g. its finalizer was removed by hand) has it deleted too.
//! - **Node sync**: Node adds, deletes and updates that change load-balancer eligibility or
//!   `spec.providerID` (`plan::node_update_needs_sync`) are coalesced: a pass runs once no
//!   change arrived for [`ServiceConfig::node_sync_window`] (at the latest five windows after
//!   the first change of a burst), and every change until then joins that one pass. Additions
//!   alone wait for a window that widens up to [`ServiceConfig::node_sync_max_window`] while
//!   Nodes keep joining (`plan::NodeSyncTimer`), unless the provider's hosts batch carries
//!   every load balancer in at most 3 calls (then each join gets a pass within the base window;
//!   joins within one window share it). While some of this CCM's Nodes await their
//!   initialisation (uninitialised taint), additions wait for them, up to the largest window
//!   (`plan::NodeSyncTimer::joining`). A pass
//!   gives each load balancer whose eligible host set changed since it was last synced
//!   (`plan::nodes_sufficiently_equal`) exactly one `update_load_balancer`, on
//!   [`ServiceConfig::workers`] parallel workers, or, when the provider offers
//!   [`LoadBalancerHostsBatch`](ccm_core::LoadBalancerHostsBatch), one place in an
//!   `update_load_balancer_hosts` call of up to `max_batch_size` load balancers. A failed
//!   update emits `UpdateLoadBalancerFailed` and falls back to a full ensure of that Service.
//! - **Per-load-balancer ordering**: the service worker and the node-sync pass take the same
//!   per-Service lock, so no two cloud calls for one load balancer ever run at once.
//! - **Errors**: [`CloudError::Retry`](ccm_core::CloudError::Retry) from any call (ensure,
//!   delete, get, update) requeues the Service after exactly its delay, without a failure event;
//!   other errors emit `SyncLoadBalancerFailed` (ensure path) or `DeleteLoadBalancerFailed`
//!   (delete path) and retry with the per-Service backoff.
//!
//! # Where this differs from Go (deliberately)
//!
//! - Node changes are coalesced over `--node-sync-window` and processed by `workers` parallel
//!   workers (Go: one node worker, one pass per node event); see [`ServiceConfig`].
//! - `Retry` is honoured on every path (Go: only on ensure) and emits no warning event.
//! - A Node update triggers a sync when its full eligibility flips (Go: only the exclusion
//!   label), so autoscaler-tainted Nodes leave load balancers at once.
//! - A LoadBalancer Service of a class not served is left alone even while being deleted with
//!   our finalizer (Go cleans up any Service being deleted with its finalizer: with classes,
//!   the finalizer is shared by the instances serving them, see above); one this controller
//!   handled before it became another class's (through a type change) has its load balancer
//!   deleted, as Go does. A Service that lacks
//!   the finalizer and was never handled is not sent to the cloud on deletion or type change
//!   (see `plan::decide`); a Service that vanished while handled is cleaned up even if it no
//!   longer wanted a load balancer when last seen.
//! - Failures of the delete path (get, delete, finalizer removal) emit
//!   `DeleteLoadBalancerFailed` (Go: `SyncLoadBalancerFailed` on the finalizer path).
//! - Finalizer writes are JSON patches of the status subresource (as Go, so the same RBAC
//!   works) guarded by `test`s of exactly what the decision read (UID, type, class, deletion,
//!   the finalizer entries), not of the resourceVersion: a write to anything else never costs
//!   a round trip. A failed test is retried on a fresh GET (`services get`, which Go's
//!   unguarded strategic-merge patch does not need).

pub(crate) mod classes;
mod cloud;
pub(crate) mod metrics;
mod patch;
pub(crate) mod plan;
mod sync;

use std::time::Duration;

use self::classes::ServedClasses;
pub use self::classes::{NO_CLASS, ServedClass};
use crate::machinery::context::ControllerContext;
use crate::machinery::error::ControllerError;

/// The controller's canonical name (`--controllers` value).
pub const NAME: &str = "service-lb-controller";
/// The Go alias of the controller name.
pub const ALIAS: &str = "service";
/// The event source component.
pub const EVENT_COMPONENT: &str = "service-controller";
/// The work queue's name (the `name` label of the work-queue metrics).
pub const QUEUE_NAME: &str = "service";

/// Default of [`ServiceConfig::workers`].
///
/// Go's default for `--concurrent-service-syncs` is 1, which makes a cluster with hundreds of
/// load balancers take tens of minutes to converge after a restart (reference §9 item 7).
/// `cargo bench -p ccm-controllers --bench service_lb` measures the time until 200
/// LoadBalancer Services have their ingress after a start, by worker count and cloud latency
/// (figures: docs/performance.md, "Worker defaults").
///
/// With a slow cloud, throughput grows with workers (FakeCloud has no rate limit); with a fast
/// one the API server is the bottleneck and more workers gain nothing. 10 takes the bulk of
/// the gain (about 10× Go's default) while keeping at most 10 concurrent mutating calls on the
/// provider's load-balancer API, which real clouds rate-limit at a few to a few tens of
/// requests per second; beyond that, the extra half second on 200 load balancers is not worth
/// tripping a vendor's rate limit. Raise it with `--concurrent-service-syncs` (and bound the
/// cloud with `--cloud-api-qps`).
pub const DEFAULT_WORKERS: usize = 10;

/// Default of [`ServiceConfig::node_sync_window`]: 1 s.
pub const DEFAULT_NODE_SYNC_WINDOW: Duration = Duration::from_secs(1);

/// Configuration of the service controller.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServiceConfig {
    /// `--concurrent-service-syncs`: Services synced in parallel, and load balancers updated in
    /// parallel by a node-sync pass. Must be at least 1 (Go silently accepts 0 and then never
    /// syncs). Default [`DEFAULT_WORKERS`].
    pub workers: usize,
    /// `--node-sync-window`: node changes less than this apart are coalesced into one
    /// node-sync pass, which runs once no change arrived for this long (at the latest five
    /// windows after the first change of a burst); a burst of N node changes costs each load
    /// balancer one `update_load_balancer`, not N. Zero runs a pass per batch of changes as
    /// soon as it arrives. Default 1 s.
    pub node_sync_window: Duration,
    /// `--node-sync-max-window`: while Nodes keep joining (an addition within this long of the
    /// last pass that carried additions), the window for additions doubles from
    /// `node_sync_window` up to this (see `plan::NodeSyncTimer`), so a trickle of joins
    /// costs each load balancer one update per window, not one per Node; removals still go out
    /// within `node_sync_window`. Default [`DEFAULT_NODE_SYNC_MAX_WINDOW`]; a value below
    /// `node_sync_window` means no widening. The window does not widen either while the
    /// provider's [`LoadBalancerHostsBatch`](ccm_core::LoadBalancerHostsBatch) carries every
    /// load balancer in at most 3 calls: a pass then costs too little to be worth a Node's wait.
    pub node_sync_max_window: Duration,
    /// `--load-balancer-classes`: the classes served, each with the provider's declared class
    /// whose implementation serves it. `None` (the default, and Go's behaviour): every class
    /// the provider declares in
    /// [`load_balancer_classes`](ccm_core::CloudProvider::load_balancer_classes), under its own
    /// name. Each `provider_class` must be one the provider declares.
    pub load_balancer_classes: Option<Vec<ServedClass>>,
    /// `--load-balancer-status-conditions`: also write the load balancer's state in the
    /// Service's `status.conditions` (the `LoadBalancerProvisioned` condition, docs/controllers.md),
    /// in the same status patch as the ingress. Default `false` (Go writes no condition).
    pub status_conditions: bool,
}

/// Default of [`ServiceConfig::node_sync_max_window`]: 8 s. From the 1 s base the window
/// doubles 1, 2, 4, 8 s: a Node joining during a steady trickle waits at most 8 s (plus the
/// pass) for its load balancers, within the 10 s issue 19 sets for the last join, and a
/// trickle costs each load balancer one update per 8 s instead of one per Node.
pub const DEFAULT_NODE_SYNC_MAX_WINDOW: Duration = Duration::from_secs(8);

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            workers: DEFAULT_WORKERS,
            node_sync_window: DEFAULT_NODE_SYNC_WINDOW,
            node_sync_max_window: DEFAULT_NODE_SYNC_MAX_WINDOW,
            load_balancer_classes: None,
            status_conditions: false,
        }
    }
}

impl ServiceConfig {
    /// Checks the configuration, naming the offending flag.
    pub fn validate(&self) -> Result<(), ControllerError> {
        if self.workers == 0 {
            return Err(ControllerError::Config {
                controller: NAME,
                message: "--concurrent-service-syncs must be at least 1, got 0".to_owned(),
            });
        }
        Ok(())
    }
}

/// The classes `config` serves with `provider`: its `load_balancer_classes`, or else what the
/// provider declares. The error names the problem (an undeclared or invalid class).
pub fn check_load_balancer_classes(
    provider: &dyn ccm_core::CloudProvider,
    config: &ServiceConfig,
) -> Result<(), ControllerError> {
    served_classes(provider, config).map(|_| ())
}

fn served_classes(
    provider: &dyn ccm_core::CloudProvider,
    config: &ServiceConfig,
) -> Result<ServedClasses, ControllerError> {
    ServedClasses::resolve(
        &provider.load_balancer_classes(),
        config.load_balancer_classes.as_deref(),
    )
    .map_err(|message| ControllerError::Config {
        controller: NAME,
        message,
    })
}

/// Runs the service controller until `ctx.shutdown` fires, then lets in-flight syncs finish.
///
/// Returns [`ControllerError::MissingCapability`] when the provider has no load-balancer
/// implementation for a class served, [`ControllerError::Config`] for an invalid `config`
/// (including a class the provider does not declare), and [`ControllerError::NotSynced`] if
/// the shared informers stop before their first list.
pub async fn run(ctx: ControllerContext, config: ServiceConfig) -> Result<(), ControllerError> {
    config.validate()?;
    let classes = served_classes(ctx.cloud.as_ref(), &config)?;
    for provider_class in classes.provider_classes() {
        if ctx.cloud.load_balancer_for_class(provider_class).is_none() {
            return Err(ControllerError::MissingCapability {
                controller: NAME,
                capability: match provider_class {
                    None => "load_balancer",
                    Some(_) => "load_balancer_for_class",
                },
            });
        }
    }
    sync::run(ctx, config, classes).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_validation() {
        let c = ServiceConfig::default();
        assert_eq!(c.workers, 10);
        assert_eq!(c.node_sync_window, Duration::from_secs(1));
        assert!(c.validate().is_ok());
        let err = ServiceConfig { workers: 0, ..c }.validate().unwrap_err();
        assert!(
            err.to_string().contains("--concurrent-service-syncs"),
            "{err}"
        );
    }
}
