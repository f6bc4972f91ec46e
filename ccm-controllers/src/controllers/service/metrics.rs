//! The service controller's metrics, with Go's names (§4.4 / §8.1 of the reference).

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use crate::machinery::metrics::MetricsRegistry;

/// Go's buckets for the node-sync histograms: 1 s × 2^n, n = 0..14 (1 s … 16384 s).
fn node_sync_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(1.0, 2.0, 15)
}

/// The service controller's metric family.
#[derive(Clone, Debug)]
pub(crate) struct ServiceMetrics {
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
        m
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
        let text = registry.encode().unwrap();
        for needle in [
            "service_controller_loadbalancer_sync_total 1",
            "service_controller_nodesync_error_total 1",
            "service_controller_nodesync_latency_seconds_bucket{le=\"2.0\"} 1",
            "service_controller_nodesync_latency_seconds_bucket{le=\"16384.0\"} 1",
            "service_controller_update_loadbalancer_host_latency_seconds_count 1",
        ] {
            assert!(text.contains(needle), "{needle} missing in:\n{text}");
        }
        assert!(!text.contains("le=\"32768.0\""));
    }
}
