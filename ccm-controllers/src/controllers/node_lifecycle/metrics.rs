//! The cloud-node-lifecycle controller's metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use crate::machinery::metrics::MetricsRegistry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug)]
pub(super) struct LifecycleMetrics {
    pub(super) checks: Family<OutcomeLabel, Counter>,
    pub(super) pass_duration: Histogram,
}

impl LifecycleMetrics {
    pub(super) fn register(registry: &MetricsRegistry) -> Self {
        let m = LifecycleMetrics {
            checks: Family::default(),
            pass_duration: Histogram::new(exponential_buckets(0.001, 4.0, 10)),
        };
        registry.register(
            "node_lifecycle_controller_checks",
            "Node checks of the cloud-node-lifecycle controller by outcome (ready, shutdown_taint_removed, exists, shutdown_taint_added, gone_first, gone_awaiting_confirmation, deleted, delete_failed, no_deletion_evidence, error; in shadow mode would_delete, and would_delete_held for a would-delete not checked again).",
            m.checks.clone(),
        );
        registry.register(
            "node_lifecycle_controller_monitor_duration_seconds",
            "Duration of one pass of the cloud-node-lifecycle controller over all nodes.",
            m.pass_duration.clone(),
        );
        m
    }

    pub(super) fn count(&self, outcome: &'static str) {
        self.count_many(outcome, 1);
    }

    /// Counts `n` checks of one outcome at once (the monitor's sweep over settled Nodes).
    pub(super) fn count_many(&self, outcome: &'static str, n: u64) {
        if n > 0 {
            self.checks
                .get_or_create(&OutcomeLabel { outcome })
                .inc_by(n);
        }
    }
}
