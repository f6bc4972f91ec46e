//! The period the periodic address refresh achieves.
//!
//! The refresh's cloud calls go in the budget's lowest lane (after initialisation and the
//! lifecycle checks, `machinery/budget/lanes.rs`), so under a quota a pass over every Node
//! can take longer than `--node-status-update-frequency`. The next pass then starts when the
//! last one ended: the period stretches, and initialisation is never starved. What the refresh
//! achieved is the gauge `node_controller_address_refresh_period_seconds` (the time from one
//! pass's start to the next's), and the first stretched pass logs one warning naming that
//! period and the fix.
//!
//! A pass is watched while it runs, not only when it ends: at 100,000 Nodes under a 20 calls/s
//! quota without the batch a pass takes 5,000 s, and an operator told only at its end would
//! wait 83 minutes for the warning while the gauge still said 300 s. Once a running pass is
//! past the period, the gauge shows the time the pass has taken so far (a lower bound of the
//! period it achieves, growing until the pass ends) and the warning goes out, once per
//! controller run, with the pass's progress and the period projected from it. The projection
//! stays out of the gauge: while initialisation and ensures take the quota first (the 10,000
//! start-up ensures of a 100,000-Node cluster: 500 s at 20 calls/s) the refresh barely moves
//! and its pace says days, not what the pass will take once it has the quota.

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
        if took <= self.configured {
            return false;
        }
        self.warn_once(achieved, nodes, batching, None)
    }

    /// A pass over `nodes` Nodes is still running after `elapsed`, with `done` of them
    /// refreshed. Past the period, the gauge shows `elapsed` (the period achieved is at least
    /// that), and the first time the warning is logged with the progress and the period
    /// projected from it. Returns true when it logged the warning.
    pub(super) fn running(
        &mut self,
        elapsed: Duration,
        done: usize,
        nodes: usize,
        batching: bool,
    ) -> bool {
        if elapsed <= self.configured {
            return false;
        }
        let projected = if done == 0 {
            elapsed
        } else {
            elapsed.mul_f64(nodes.max(done) as f64 / done as f64)
        };
        self.achieved.set(elapsed.as_secs_f64());
        self.warn_once(
            projected.max(elapsed),
            nodes,
            batching,
            Some((done, elapsed)),
        )
    }

    /// Logs the warning unless it was logged before in this controller run; `progress` is the
    /// running pass's Nodes refreshed and time so far, when the period is a projection.
    fn warn_once(
        &mut self,
        achieved: Duration,
        nodes: usize,
        batching: bool,
        progress: Option<(usize, Duration)>,
    ) -> bool {
        if self.warned {
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
        let so_far = match progress {
            Some((done, elapsed)) => format!(
                " (projected from the running pass, which refreshed {done} of {nodes} Nodes in \
                 {}; it gets the quota only after initialisation and lifecycle checks)",
                humantime(elapsed)
            ),
            None => String::new(),
        };
        tracing::warn!(
            nodes,
            configured = %humantime(self.configured),
            achieved = %humantime(achieved),
            "the periodic address refresh does not fit --node-status-update-frequency under \
             the cloud-call budget (it yields to initialisation and lifecycle checks): each \
             Node's addresses are refreshed about every {}{so_far} instead of every {}; to \
             fix, {fix}",
            humantime(achieved),
            humantime(self.configured),
        );
        true
    }
}

/// How often a running refresh pass is checked against the period.
pub(super) const RUNNING_CHECK: Duration = Duration::from_secs(5);

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

    /// 100,000 Nodes at 20 calls/s: the pass would take 5,000 s. Within the period nothing
    /// shows; past it the gauge follows the pass's time and the warning goes out then, not 83
    /// minutes later when the pass ends.
    #[test]
    fn a_running_pass_past_the_period_shows_its_projected_period_and_warns_once() {
        let registry = MetricsRegistry::new();
        let period = Duration::from_secs(300);
        let mut refresh = RefreshPeriod::register(&registry, period);
        assert!(!refresh.running(Duration::from_secs(299), 5_980, 100_000, false));
        assert_eq!(refresh.achieved.get(), 300.0);
        // Past it: the gauge shows what the pass took so far (a lower bound), and it warns.
        assert!(refresh.running(Duration::from_secs(305), 6_100, 100_000, false));
        assert_eq!(refresh.achieved.get(), 305.0);
        // Later checks follow the time without warning again.
        assert!(!refresh.running(Duration::from_secs(1_000), 25_000, 100_000, false));
        assert_eq!(refresh.achieved.get(), 1_000.0);
        // Nothing refreshed yet (initialisation and ensures took the quota): the time elapsed.
        let mut stalled = RefreshPeriod::register(&MetricsRegistry::new(), period);
        assert!(stalled.running(Duration::from_secs(400), 0, 100_000, true));
        assert_eq!(stalled.achieved.get(), 400.0);
        // The end of the pass sets what it achieved, and does not warn a second time.
        assert!(!refresh.pass_done(Duration::from_secs(4_200), 100_000, false));
        assert_eq!(refresh.achieved.get(), 4_200.0);
    }
}
