//! The process's metrics registry and the metric families shared by every controller.
//!
//! Metrics use `prometheus-client` with one explicit registry per runtime (no global state, so
//! tests running several runtimes in one process see their own figures). Note that
//! `prometheus-client` appends `_total` to counter names itself: register a counter as
//! `workqueue_adds` to expose `workqueue_adds_total`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};

/// A metrics registry shared by the runtime, its controllers and the `/metrics` endpoint.
#[derive(Default)]
pub struct MetricsRegistry {
    registry: Mutex<Registry>,
}

impl std::fmt::Debug for MetricsRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsRegistry").finish_non_exhaustive()
    }
}

impl MetricsRegistry {
    /// An empty registry.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Registers a metric (register each name once per registry). Counters get `_total`
    /// appended on exposition.
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        self.registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .register(name, help, metric);
    }

    /// The registry in OpenMetrics text format, as served on `/metrics`.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        prometheus_client::encoding::text::encode(&mut out, &registry)?;
        Ok(out)
    }
}

/// The `name` label of the work-queue metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct QueueLabel {
    /// The queue's name (Go's: `Nodes`, `service`, `node`, `Routes`).
    pub name: String,
}

/// Buckets of Go's work-queue duration histograms: 1 µs × 10^n, n = 0..9.
fn workqueue_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(1e-6, 10.0, 10)
}

/// Client-go's work-queue metric family (`workqueue_depth`, `workqueue_adds_total`,
/// `workqueue_retries_total`, `workqueue_queue_duration_seconds`,
/// `workqueue_work_duration_seconds`), labelled by queue name.
#[derive(Clone, Debug)]
pub struct WorkQueueMetrics {
    depth: Family<QueueLabel, Gauge>,
    adds: Family<QueueLabel, Counter>,
    retries: Family<QueueLabel, Counter>,
    queue_duration: Family<QueueLabel, Histogram>,
    work_duration: Family<QueueLabel, Histogram>,
}

impl WorkQueueMetrics {
    /// Creates the family and registers it (once per registry).
    pub fn register(registry: &MetricsRegistry) -> Self {
        let hist = || {
            Family::<QueueLabel, Histogram>::new_with_constructor(|| {
                Histogram::new(workqueue_buckets())
            })
        };
        let m = WorkQueueMetrics {
            depth: Family::default(),
            adds: Family::default(),
            retries: Family::default(),
            queue_duration: Family::new_with_constructor(|| Histogram::new(workqueue_buckets())),
            work_duration: hist(),
        };
        registry.register(
            "workqueue_depth",
            "Current depth of workqueue",
            m.depth.clone(),
        );
        registry.register(
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            m.adds.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            m.retries.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            m.queue_duration.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            m.work_duration.clone(),
        );
        m
    }

    fn label(name: &str) -> QueueLabel {
        QueueLabel {
            name: name.to_owned(),
        }
    }

    pub(crate) fn depth(&self, name: &str, depth: usize) {
        self.depth
            .get_or_create(&Self::label(name))
            .set(i64::try_from(depth).unwrap_or(i64::MAX));
    }

    pub(crate) fn adds(&self, name: &str) {
        self.adds.get_or_create(&Self::label(name)).inc();
    }

    pub(crate) fn retries(&self, name: &str) {
        self.retries.get_or_create(&Self::label(name)).inc();
    }

    pub(crate) fn queue_duration(&self, name: &str, d: Duration) {
        self.queue_duration
            .get_or_create(&Self::label(name))
            .observe(d.as_secs_f64());
    }

    pub(crate) fn work_duration(&self, name: &str, d: Duration) {
        self.work_duration
            .get_or_create(&Self::label(name))
            .observe(d.as_secs_f64());
    }
}
