//! The period the periodic address refresh achieves.
//!
//! The refresh's cloud calls go in the budget's lowest lane (after initialisation and the
//! lifecycle checks, `machinery/budget/lanes.rs`), so under a quota a pass over every Node
//! can take longer than `--node-status-update-frequency`. The next pass then starts when the
//! last one ended: the period stretches, and initialisation is never starved. What the refresh
//! achieved is the gauge `node_controller_address_refresh_period_seconds` (the time from one
//! pass's start to the next's), and the first stretched pass logs one warning naming that
//! period and the fix.

use std::time::Duration;

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::gauge::Gauge;

use crate::machinery::metrics::MetricsRegistry;

/// Tracks the refresh passes of one controller run.
#[derive(Debug)]
pub(super) struct RefreshPeriod {
    configured: Duration,
    achieved: Gauge<f64, AtomicU64>,
    warned: bool,
}

impl RefreshPeriod {
    pub(super) fn register(registry: &MetricsRegistry, configured: Duration) -> Self {
        let achieved = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "node_controller_address_refresh_period_seconds",
            "The period the periodic address refresh achieved: --node-status-update-frequency, or longer when a pass over every Node did not fit it under the cloud-call budget",
            achieved.clone(),
        );
        achieved.set(configured.as_secs_f64());
        RefreshPeriod {
            configured,
            achieved,
            warned: false,
        }
    }

    /// A pass over `nodes` Nodes took `took`. Returns true when this is the first pass that
    /// did not fit the period (and the warning was logged).
    pub(super) fn pass_done(&mut self, took: Duration, nodes: usize, batching: bool) -> bool {
        let achieved = took.max(self.configured);
        self.achieved.set(achieved.as_secs_f64());
        if took <= self.configured || self.warned {
            return false;
        }
        self.warned = true;
        let fix = if batching {
            "raise the cloud's quota (or --cloud-api-qps) or the provider's \
             InstancesBatch::max_batch_size, or lengthen --node-status-update-frequency"
        } else {
            "implement the InstancesBatch capability (describe_instances: many Nodes per call) \
             in the provider, or raise the cloud's quota, or lengthen \
             --node-status-update-frequency"
        };
        tracing::warn!(
            nodes,
            configured = %humantime(self.configured),
            achieved = %humantime(achieved),
            "the periodic address refresh does not fit --node-status-update-frequency under \
             the cloud-call budget (it yields to initialisation and lifecycle checks): each \
             Node's addresses are refreshed about every {} instead of every {}; to fix, {fix}",
            humantime(achieved),
            humantime(self.configured),
        );
        true
    }
}

fn humantime(d: Duration) -> String {
    crate::machinery::go_syntax::format_go_duration(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_longer_than_the_period_stretches_it_and_warns_once() {
        let registry = MetricsRegistry::new();
        let period = Duration::from_secs(300);
        let mut refresh = RefreshPeriod::register(&registry, period);
        assert!(!refresh.pass_done(Duration::from_secs(30), 1000, true));
        assert_eq!(refresh.achieved.get(), 300.0);
        assert!(refresh.pass_done(Duration::from_secs(500), 100_000, false));
        assert_eq!(refresh.achieved.get(), 500.0);
        // Warned once; the gauge still follows every pass.
        assert!(!refresh.pass_done(Duration::from_secs(700), 100_000, false));
        assert_eq!(refresh.achieved.get(), 700.0);
        assert!(!refresh.pass_done(Duration::from_secs(10), 100_000, false));
        assert_eq!(refresh.achieved.get(), 300.0);
    }
}
