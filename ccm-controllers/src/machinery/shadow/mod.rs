//! Shadow mode (`--shadow`): the same runtime and the same controllers, run beside the
//! cloud-controller-manager a cluster already has, changing nothing and reporting every
//! difference. It is a mode of the I/O edges, never a second copy of the controllers:
//!
//! - the **write guard** (`write_guard.rs`, the forms in `dry_run.rs`), a tower layer on
//!   every Kubernetes client of the process, sends each write (`POST`, `PUT`, `PATCH`,
//!   `DELETE`) as a dry run, with `dryRun: All` where kube-apiserver reads that write's options
//!   (the query of a create, update or patch; the `DeleteOptions` body of a delete, and the
//!   query too), so validation and admission still run and nothing persists; it answers an
//!   Event write itself without sending it, and never sends a write it cannot make a dry run;
//! - the **cloud guard** (`cloud_guard.rs`), inside the cloud-call budget, never sends a
//!   mutating provider call (`ensure_load_balancer`, `update_load_balancer`, the hosts batch,
//!   `ensure_load_balancer_deleted`, `create_route`, `delete_route`): it answers from read-only
//!   calls (`get_load_balancer`, `get_load_balancer_hosts`, through the budget) and reports
//!   what the call would have changed;
//! - the runtime takes no Lease (no leader election) and gives the shadow a lower default
//!   cloud budget.
//!
//! What a controller would write is compared with what the cluster shows (`fields.rs`): each
//! differing field of an object the incumbent already reconciled is a [`Divergence`]. An object
//! the incumbent is still reconciling (an uninitialised Node, a `LoadBalancer` Service without
//! its finalizer, anything being deleted; a route for a grace period) is "pending" until it
//! settles or `--shadow-pending-grace` passes. The recorder keeps the current divergences,
//! logs each new and each resolved one once, and exposes them as metrics, as JSON on the
//! secure port (`report.rs`) and in the one-shot report.

mod cloud_guard;
mod dry_run;
pub(crate) mod fields;
pub(crate) mod progress;
mod recorder;
pub(crate) mod report;
mod watch;
pub(crate) mod write_guard;

use ccm_core::NodeView;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Service};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::Serialize;
use serde_json::Value;
use tokio::time::Instant;

use crate::machinery::informer::Informer;
use crate::machinery::metrics::MetricsRegistry;
use crate::machinery::ownership::Ownership;

/// The controller name of cloud divergences found by the service controller's calls.
pub(crate) const SERVICE_CONTROLLER: &str = "service-controller";
/// The controller name of cloud divergences found by the route controller's calls.
pub(crate) const ROUTE_CONTROLLER: &str = "route-controller";

/// One planned change to an object the incumbent already reconciled.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Divergence {
    /// The controller (its client name) that would make the change.
    pub controller: String,
    /// `Node`, `Service` or `Route`.
    pub kind: String,
    /// The object: a Node's name, a Service's `namespace/name`, a route's name.
    pub object: String,
    /// The field, e.g. `metadata.labels[topology.kubernetes.io/zone]`, `loadBalancer.hosts`.
    pub field: String,
    /// Alias fields that differ exactly as `field` does, folded into this divergence (a
    /// deprecated beta label beside its GA label, e.g.
    /// `metadata.labels[failure-domain.beta.kubernetes.io/zone]`); empty when none.
    pub also: Vec<String>,
    /// What the cluster (or the cloud) shows now: the incumbent's value; `null` when absent.
    pub incumbent: Value,
    /// What this runtime would write; `null` when it would remove the field.
    pub ours: Value,
    /// When the shadow first saw it (RFC 3339).
    pub since: String,
}

impl Divergence {
    /// `field` and the alias fields folded into it.
    pub(crate) fn fields(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.field).chain(&self.also)
    }
}

/// The identity of a divergence: controller, kind, object, field.
type Key = (String, String, String, String);

fn key_of(d: &Divergence) -> Key {
    (
        d.controller.clone(),
        d.kind.clone(),
        d.object.clone(),
        d.field.clone(),
    )
}

/// A change a guard saw a controller plan, before the pending rule is applied.
#[derive(Clone, Debug)]
pub(crate) struct Planned {
    pub controller: String,
    pub kind: &'static str,
    pub object: String,
    pub field: String,
    /// Alias fields folded into `field` (see [`fields::fold_aliases`]).
    pub also: Vec<String>,
    pub incumbent: Value,
    pub ours: Value,
    /// The incumbent is still reconciling the object.
    pub pending: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DivergenceLabels {
    controller: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabels {
    resource: String,
    verb: String,
    result: &'static str,
}

/// The shadow's metrics.
struct ShadowMetrics {
    current: Family<DivergenceLabels, Gauge>,
    seen: Family<DivergenceLabels, Counter>,
    pending: Family<DivergenceLabels, Gauge>,
    compared: Family<KindLabel, Gauge>,
    writes: Family<WriteLabels, Counter>,
    refused_cloud_calls: Family<OperationLabel, Counter>,
}

impl ShadowMetrics {
    fn register(metrics: &MetricsRegistry) -> Self {
        let m = ShadowMetrics {
            current: Family::default(),
            seen: Family::default(),
            pending: Family::default(),
            compared: Family::default(),
            writes: Family::default(),
            refused_cloud_calls: Family::default(),
        };
        metrics.register(
            "shadow_divergences",
            "Current divergences of the shadow from the incumbent, by controller and kind",
            m.current.clone(),
        );
        metrics.register(
            "shadow_divergences_seen",
            "Divergences the shadow has found since it started, by controller and kind",
            m.seen.clone(),
        );
        metrics.register(
            "shadow_pending",
            "Planned changes to objects the incumbent is still reconciling (not divergences yet)",
            m.pending.clone(),
        );
        metrics.register(
            "shadow_objects_compared",
            "Objects the shadow's controllers have planned for and compared, by kind",
            m.compared.clone(),
        );
        metrics.register(
            "shadow_dry_run_writes",
            "API writes of the shadow by resource, verb and result: dry_run (sent as a dry run), rejected (the dry run was refused), forbidden (a dry-run delete the identity may not make, reported as a divergence), not_sent (Events), refused (not sent: it could not be made a dry run)",
            m.writes.clone(),
        );
        metrics.register(
            "shadow_refused_cloud_calls",
            "Mutating cloud calls the shadow did not send, by operation",
            m.refused_cloud_calls.clone(),
        );
        m
    }
}

/// What the recorder holds.
#[derive(Default)]
struct State {
    divergences: HashMap<Key, Divergence>,
    /// Planned changes to pending objects, with when the object was first seen pending.
    pending: HashMap<Key, (Planned, Instant)>,
    /// When each pending object (`kind/object`) was first seen pending.
    pending_since: HashMap<(String, String), Instant>,
    /// The Nodes with a would-delete divergence, with how many controllers report it.
    would_delete: HashMap<String, usize>,
}

/// The shadow mode's shared state: the recorder of divergences, its metrics and settings.
/// Cheap to share (`Arc`).
pub(crate) struct Shadow {
    state: Mutex<State>,
    metrics: ShadowMetrics,
    /// How long a pending object's planned changes wait before they count as divergences.
    grace: Duration,
    /// The shared informers, once the runtime started them.
    stores: OnceLock<(Informer<Node, NodeView>, Informer<Service>)>,
    /// The provider does not implement `get_load_balancer_hosts` (logged once).
    hosts_unknown: std::sync::atomic::AtomicBool,
    /// Which Nodes are ours, once the runtime started the controllers: the report lists the
    /// foreign ones.
    ownership: OnceLock<Arc<Ownership>>,
    /// A dry-run delete was forbidden (logged once).
    delete_forbidden: std::sync::atomic::AtomicBool,
    /// What the controllers compared, object by object (`progress.rs`).
    progress: Mutex<progress::ProgressMap>,
    /// Set when a one-shot run ended before everything was compared.
    cutoff: OnceLock<progress::Cutoff>,
}

impl std::fmt::Debug for Shadow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shadow")
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}

impl Shadow {
    /// A recorder whose pending objects wait `grace`; registers the metrics in `metrics`.
    pub(crate) fn new(grace: Duration, metrics: &MetricsRegistry) -> Arc<Self> {
        Arc::new(Shadow {
            state: Mutex::new(State::default()),
            metrics: ShadowMetrics::register(metrics),
            grace,
            stores: OnceLock::new(),
            hosts_unknown: std::sync::atomic::AtomicBool::new(false),
            ownership: OnceLock::new(),
            delete_forbidden: std::sync::atomic::AtomicBool::new(false),
            progress: Mutex::new(HashMap::new()),
            cutoff: OnceLock::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current divergences, sorted by kind, object, field.
    pub(crate) fn divergences(&self) -> Vec<Divergence> {
        let mut all: Vec<Divergence> = self.lock().divergences.values().cloned().collect();
        all.sort_by(|a, b| {
            (&a.kind, &a.object, &a.field, &a.controller).cmp(&(
                &b.kind,
                &b.object,
                &b.field,
                &b.controller,
            ))
        });
        all
    }

    /// Whether `node` has a current would-delete divergence (`(node deleted)`): the
    /// lifecycle controller found its instance gone and holds it until the Node changes.
    pub(crate) fn would_delete(&self, node: &str) -> bool {
        self.lock().would_delete.contains_key(node)
    }

    /// The number of planned changes still pending.
    pub(crate) fn pending_count(&self) -> usize {
        self.lock().pending.len()
    }

    /// The cached Node `name`, once the informers run.
    fn cached_node(&self, name: &str) -> Option<Arc<Node>> {
        self.stores
            .get()
            .and_then(|(nodes, _)| nodes.get(name))
            .map(|view| Arc::new(view.to_node()))
    }

    /// The cached Service `namespace/name`, once the informers run.
    fn cached_service(&self, namespace: &str, name: &str) -> Option<Arc<Service>> {
        self.stores
            .get()
            .and_then(|(_, services)| services.get_namespaced(namespace, name))
    }

    /// Counts one API write the guard handled.
    fn count_write(&self, resource: &str, verb: &str, result: &'static str) {
        self.metrics
            .writes
            .get_or_create(&WriteLabels {
                resource: resource.to_owned(),
                verb: verb.to_owned(),
                result,
            })
            .inc();
    }

    /// Logs, once per process, that the API server forbade a dry-run delete (the shadow's
    /// identity may not delete: the recommended shadow RBAC); each one is still a divergence.
    fn note_forbidden_delete(&self, controller: &str, resource: &str) {
        if !self
            .delete_forbidden
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::info!(
                controller,
                resource,
                "shadow: the API server forbade a dry-run delete (this identity may not delete, as the recommended shadow RBAC has it); each planned deletion is reported as a divergence and counted in shadow_dry_run_writes_total{{result=\"forbidden\"}}"
            );
        }
    }

    /// Counts one mutating cloud call the guard did not send.
    fn count_refused(&self, operation: &str) {
        self.metrics
            .refused_cloud_calls
            .get_or_create(&OperationLabel {
                operation: operation.to_owned(),
            })
            .inc();
    }
}
