//! The service controller's metrics: Go's (§4.4 / §8.1 of the reference), with Go's names
//! and labels, and two of ours that carry the load-balancer class.
//!
//! The class is a label only on our own metrics: its values are the classes this controller
//! serves (`""` for Services without a class), a handful set by the provider and the operator,
//! never one per Service, so the series stay few. Go's metrics keep their label sets, so
//! existing dashboards and alerts read the same.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use crate::machinery::metrics::MetricsRegistry;

/// Go's buckets for the node-sync histograms: 1 s × 2^n, n = 0..14 (1 s … 16384 s).
fn node_sync_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(1.0, 2.0, 15)
}

/// The labels of `service_controller_served_load_balancer_class`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ServedClassLabels {
    /// The Services' `spec.loadBalancerClass` (`""`: Services without a class).
    pub(crate) class: String,
    /// The provider's declared class whose implementation serves them (`""`: its
    /// implementation for Services without a class).
    pub(crate) provider_class: String,
}

/// The labels of `service_controller_load_balancer_operations_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OperationLabels {
    /// The Service's `spec.loadBalancerClass` (`""`: without a class, or no longer a
    /// LoadBalancer).
    pub(crate) class: String,
    /// `ensure`, `update` (hosts, node sync) or `delete`.
    pub(crate) operation: &'static str,
    /// `success`, `error` or `retry` (the provider asked to be called again later).
    pub(crate) result: &'static str,
}

/// The service controller's metric family.
#[derive(Clone, Debug)]
pub(crate) struct ServiceMetrics {
    /// `service_controller_served_load_balancer_class{class,provider_class}`: 1 for each
    /// class served (which instance serves what, when several share a cluster).
    pub(crate) served_classes: Family<ServedClassLabels, Gauge>,
    /// `service_controller_load_balancer_operations_total{class,operation,result}`: the
    /// outcome of each ensure, host update and delete of a load balancer, by class.
    pub(crate) operations: Family<OperationLabels, Counter>,
    /// `service_controller_loadbalancer_sync_total`: every `update_load_balancer` attempt.
    pub(crate) loadbalancer_sync: Counter,
    /// `service_controller_nodesync_error_total`: failed host updates.
    pub(crate) nodesync_error: Counter,
    /// `service_controller_nodesync_latency_seconds`: duration of one node-sync pass.
    pub(crate) nodesync_latency: Histogram,
    /// `service_controller_update_loadbalancer_host_latency_seconds`: duration of one host
    /// update call: `update_load_balancer`, or `update_load_balancer_hosts` for a batch.
    pub(crate) update_host_latency: Histogram,
}

impl ServiceMetrics {
    /// Creates the metrics and registers them in `registry` (once per controller run).
    pub(crate) fn register(registry: &MetricsRegistry) -> Self {
        let m = ServiceMetrics {
            served_classes: Family::default(),
            operations: Family::default(),
            loadbalancer_sync: Counter::default(),
            nodesync_error: Counter::default(),
            nodesync_latency: Histogram::new(node_sync_buckets()),
            update_host_latency: Histogram::new(node_sync_buckets()),
        };
        // prometheus-client appends `_total` to counters.
        registry.register(
            "service_controller_loadbalancer_sync",
            "A metric counting the amount of times any load balancer has been configured, as an effect of service/node changes on the cluster",
            m.loadbalancer_sync.clone(),
        );
        registry.register(
            "service_controller_nodesync_error",
            "A metric counting the amount of times any load balancer has been configured and errored, as an effect of node changes on the cluster",
            m.nodesync_error.clone(),
        );
        registry.register(
            "service_controller_nodesync_latency_seconds",
            "A metric measuring the latency for nodesync which updates loadbalancer hosts on cluster node updates",
            m.nodesync_latency.clone(),
        );
        registry.register(
            "service_controller_update_loadbalancer_host_latency_seconds",
            "A metric measuring the latency for updating each load balancer hosts",
            m.update_host_latency.clone(),
        );
        registry.register(
            "service_controller_served_load_balancer_class",
            "The load-balancer classes this controller serves (1 each; class \"\" is Services without a class), with the provider class whose implementation serves them",
            m.served_classes.clone(),
        );
        registry.register(
            "service_controller_load_balancer_operations",
            "Load-balancer ensures, host updates and deletions by Service load-balancer class and result (success, error, retry)",
            m.operations.clone(),
        );
        m
    }

    /// Counts one load-balancer operation of a Service of `class`.
    pub(crate) fn operation(
        &self,
        class: Option<&str>,
        operation: &'static str,
        result: &'static str,
    ) {
        self.operations
            .get_or_create(&OperationLabels {
                class: class.unwrap_or_default().to_owned(),
                operation,
                result,
            })
            .inc();
    }

    pub(crate) fn observe(histogram: &Histogram, d: Duration) {
        histogram.observe(d.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_go_names() {
        let registry = MetricsRegistry::new();
        let m = ServiceMetrics::register(&registry);
        m.loadbalancer_sync.inc();
        m.nodesync_error.inc();
        ServiceMetrics::observe(&m.nodesync_latency, Duration::from_millis(1500));
        ServiceMetrics::observe(&m.update_host_latency, Duration::from_millis(10));
        m.operation(Some("acme.example/a"), "ensure", "success");
        m.operation(None, "delete", "error");
        let text = registry.encode().unwrap();
        for needle in [
            "service_controller_loadbalancer_sync_total 1",
            "service_controller_nodesync_error_total 1",
            "service_controller_nodesync_latency_seconds_bucket{le=\"2.0\"} 1",
            "service_controller_nodesync_latency_seconds_bucket{le=\"16384.0\"} 1",
            "service_controller_update_loadbalancer_host_latency_seconds_count 1",
            "service_controller_load_balancer_operations_total{class=\"acme.example/a\",operation=\"ensure\",result=\"success\"} 1",
            "service_controller_load_balancer_operations_total{class=\"\",operation=\"delete\",result=\"error\"} 1",
        ] {
            assert!(text.contains(needle), "{needle} missing in:\n{text}");
        }
        assert!(!text.contains("le=\"32768.0\""));
    }
}
