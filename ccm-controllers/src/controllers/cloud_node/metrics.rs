//! Metrics of the cloud-node controller.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use ccm_core::well_known::TAINT_UNINITIALIZED;
use ccm_core::{Node, NodeView};
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use crate::machinery::informer::Informer;
use crate::machinery::metrics::MetricsRegistry;
use crate::machinery::ownership::Ownership;

/// Labels of the reconcile counters: what was reconciled and how it ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReconcileLabels {
    /// `initialize`, `labels`, `addresses` or `cloud_labels`.
    pub(crate) kind: &'static str,
    /// `success`, `error` or `retry`.
    pub(crate) result: &'static str,
}

/// Labels of the reconcile duration histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KindLabel {
    /// `initialize`, `labels` or `addresses`.
    pub(crate) kind: &'static str,
}

/// Go's node-controller histograms plus reconcile counts and durations.
#[derive(Clone, Debug)]
pub(crate) struct CloudNodeMetrics {
    taint_removal_delay: Histogram,
    initial_sync_delay: Histogram,
    reconciles: Family<ReconcileLabels, Counter>,
    durations: Family<KindLabel, Histogram>,
    cloud_labels: Family<CloudLabel, Counter>,
    init_write_limit: Gauge<f64, AtomicU64>,
}

/// Labels of the counter of labels brought in step with the cloud.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CloudLabel {
    /// The label key for the well-known labels, `additional` for a provider's own.
    pub(crate) label: &'static str,
}

/// Go's buckets for the two node histograms: 1 s × 4^n, 6 buckets (1 s … 1024 s).
fn delay_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(1.0, 4.0, 6)
}

impl CloudNodeMetrics {
    /// Creates the metrics and registers them in `registry` (once per `run`).
    pub(crate) fn register(registry: &MetricsRegistry) -> Self {
        let m = CloudNodeMetrics {
            taint_removal_delay: Histogram::new(delay_buckets()),
            initial_sync_delay: Histogram::new(delay_buckets()),
            reconciles: Family::default(),
            cloud_labels: Family::default(),
            init_write_limit: Gauge::<f64, AtomicU64>::default(),
            durations: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 4.0, 10))
            }),
        };
        registry.register(
            "node_controller_cloud_provider_taint_removal_delay_seconds",
            "Number of seconds after node creation when NodeController removed the cloud-provider taint of a single node.",
            m.taint_removal_delay.clone(),
        );
        registry.register(
            "node_controller_initial_node_sync_delay_seconds",
            "Number of seconds after node creation when NodeController finished the initial synchronization of a single node.",
            m.initial_sync_delay.clone(),
        );
        registry.register(
            "node_controller_reconciles",
            "Reconciles of the cloud-node controller by kind (initialize, labels, addresses) and result (success, error, retry).",
            m.reconciles.clone(),
        );
        registry.register(
            "node_controller_reconcile_duration_seconds",
            "Duration of cloud-node controller reconciles by kind, including cloud calls and API writes.",
            m.durations.clone(),
        );
        registry.register(
            "node_controller_cloud_label_updates",
            "Node labels the status refresh changed to bring them in step with the cloud (--reconcile-cloud-labels), by label (the key for zone, region and instance type, GA and beta; additional for a provider's own labels).",
            m.cloud_labels.clone(),
        );
        registry.register(
            "node_controller_initialization_writes_limit",
            "Node initialisations allowed to write at once: --concurrent-node-syncs while the API server answers the controller's writes at its usual latency, fewer while they queue, so that Node registrations go first; below 1, one at a time for that share of the time (down to 1/16).",
            m.init_write_limit.clone(),
        );
        m
    }

    /// The gauge of the initialisations' write limit (set by their `WritePacer`).
    pub(crate) fn init_write_limit(&self) -> Gauge<f64, AtomicU64> {
        self.init_write_limit.clone()
    }

    /// Counts one label brought in step with the cloud.
    pub(crate) fn cloud_label_updated(&self, label: &'static str) {
        self.cloud_labels.get_or_create(&CloudLabel { label }).inc();
    }

    /// Counts one reconcile and its duration.
    pub(crate) fn reconciled(&self, kind: &'static str, result: &'static str, took: Duration) {
        self.reconciles
            .get_or_create(&ReconcileLabels { kind, result })
            .inc();
        self.durations
            .get_or_create(&KindLabel { kind })
            .observe(took.as_secs_f64());
    }

    /// Records the taint-removal delay of `node` (seconds since its creation).
    pub(crate) fn taint_removed(&self, node: &Node) {
        if let Some(age) = age_seconds(node) {
            self.taint_removal_delay.observe(age);
        }
    }

    /// Records the initial-sync delay of `node` (seconds since its creation).
    pub(crate) fn initial_sync_done(&self, node: &Node) {
        if let Some(age) = age_seconds(node) {
            self.initial_sync_delay.observe(age);
        }
    }
}

/// Seconds since the node's `creationTimestamp` (never negative), when it has one.
fn age_seconds(node: &Node) -> Option<f64> {
    age_since(node.metadata.creation_timestamp.as_ref()?)
}

/// Seconds since `created` (never negative).
fn age_since(
    created: &ccm_core::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> Option<f64> {
    let created = created.0;
    let age = jiff::Timestamp::now().duration_since(created);
    Some(age.as_secs_f64().max(0.0))
}

/// What a gauge of [`UninitialisedNodes`] reports.
#[derive(Clone, Copy, Debug)]
enum Uninitialised {
    /// How many Nodes carry the taint.
    Count,
    /// The age of the oldest of them (0 when there is none).
    OldestAge,
}

/// The Nodes still carrying `node.cloudprovider.kubernetes.io/uninitialized`, read from the
/// Node informer's store at each scrape (one pass over the store's views: about a
/// millisecond at 100,000 Nodes). Go exposes no such gauge: its taint-removal histogram only
/// shows a Node once it is initialised, so a Node that never is stays invisible there.
///
/// Only Nodes this cloud-controller-manager owns count (`machinery/ownership.rs`): another
/// cloud's Node waiting for its own cloud-controller-manager is not ours to initialise, so it
/// must not fire our "Nodes uninitialised for too long" alert.
struct UninitialisedNodes {
    nodes: Informer<Node, NodeView>,
    ownership: Arc<Ownership>,
    measure: Uninitialised,
}

impl std::fmt::Debug for UninitialisedNodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UninitialisedNodes")
            .field("measure", &self.measure)
            .finish_non_exhaustive()
    }
}

impl EncodeMetric for UninitialisedNodes {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let nodes = self.nodes.list();
        let tainted = nodes
            .iter()
            .filter(|n| n.has_taint(TAINT_UNINITIALIZED) && self.ownership.owns(*n));
        let value = match self.measure {
            Uninitialised::Count => tainted.count() as f64,
            Uninitialised::OldestAge => tainted
                .filter_map(|n| n.creation_timestamp().and_then(age_since))
                .fold(0.0, f64::max),
        };
        encoder.encode_gauge(&value)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

/// Registers `node_controller_uninitialized_nodes` and
/// `node_controller_oldest_uninitialized_node_age_seconds`, computed at each scrape from the
/// Nodes in `nodes` that `ownership` says are ours (once per `run`).
pub(crate) fn register_uninitialised(
    registry: &MetricsRegistry,
    nodes: &Informer<Node, NodeView>,
    ownership: &Arc<Ownership>,
) {
    registry.register(
        "node_controller_uninitialized_nodes",
        "Nodes of this cloud-controller-manager (not foreign ones) that still carry the node.cloudprovider.kubernetes.io/uninitialized taint",
        UninitialisedNodes {
            nodes: nodes.clone(),
            ownership: ownership.clone(),
            measure: Uninitialised::Count,
        },
    );
    registry.register(
        "node_controller_oldest_uninitialized_node_age_seconds",
        "Seconds since the creation of the oldest Node of this cloud-controller-manager (not a foreign one) that still carries the node.cloudprovider.kubernetes.io/uninitialized taint; 0 when every one is initialised",
        UninitialisedNodes {
            nodes: nodes.clone(),
            ownership: ownership.clone(),
            measure: Uninitialised::OldestAge,
        },
    );
}
