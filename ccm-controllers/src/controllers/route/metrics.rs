//! The route controller's metrics.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use crate::machinery::metrics::MetricsRegistry;

/// The route controller's metrics.
#[derive(Clone, Debug)]
pub(super) struct RouteMetrics {
    pub(super) syncs: Counter,
    pub(super) duration: Histogram,
}

impl RouteMetrics {
    pub(super) fn register(registry: &MetricsRegistry) -> Self {
        let m = RouteMetrics {
            syncs: Counter::default(),
            // 10 ms … ~160 s.
            duration: Histogram::new(exponential_buckets(0.01, 2.0, 15)),
        };
        registry.register(
            "route_controller_route_sync",
            "A metric counting the amount of times routes have been synced with the cloud provider.",
            m.syncs.clone(),
        );
        registry.register(
            "route_controller_route_sync_duration_seconds",
            "How long one route reconcile takes (listing routes, creates, deletes, conditions).",
            m.duration.clone(),
        );
        m
    }
}
