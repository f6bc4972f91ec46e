//! The period the periodic address refresh achieves.
//!
//! The refresh's cloud calls go in the budget's lowest lane (after initialisation and the
//! lifecycle checks, `machinery/budget/lanes.rs`), so under a quota a pass over every Node
//! can take longer than `--node-status-update-frequency`. The next pass then starts when the
//! last one ended: the period stretches, and initialisation is never starved. What the refresh
//! achieved is the gauge `node_controller_address_refresh_period_seconds` (the time from one
//! pass's start to the next's); the configured period is the gauge
//! `node_controller_address_refresh_configured_period_seconds`, so that an alert compares the
//! two.
//!
//! A pass is watched while it runs, not only when it ends: at 100,000 Nodes under a 20 calls/s
//! quota without the batch a pass takes 5,000 s, and an operator told only at its end would
//! wait 83 minutes for the warning while the gauge still said 300 s. Once a running pass is
//! past the period, the gauge shows the time the pass has taken so far when that is more than
//! the last pass achieved (the gauge never dips below the last measured period mid-pass), and
//! a warning goes out with the pass's progress and the period projected from it. The
//! projection stays out of the gauge: while initialisation and ensures take the quota first
//! (the 10,000 start-up ensures of a 100,000-Node cluster: 500 s at 20 calls/s) the refresh
//! barely moves and its pace says days, not what the pass will take once it has the quota.
//! The first stretched pass to end logs the period it measured. So a controller run logs at
//! most two warnings: the early one and the measured one.

use std::time::Duration;

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::gauge::Gauge;

use crate::machinery::metrics::MetricsRegistry;

/// Tracks the refresh passes of one controller run.
#[derive(Debug)]
pub(super) struct RefreshPeriod {
    configured: Duration,
    achieved: Gauge<f64, AtomicU64>,
    /// What the last finished pass achieved (the configured period before the first).
    last: Duration,
    /// A running pass's overrun was warned.
    warned_running: bool,
    /// A finished pass's overrun was warned.
    warned_done: bool,
}

/// The start of both warnings (the scale bench looks for it).
const WARNING: &str = "the periodic address refresh does not fit --node-status-update-frequency \
                       under the cloud-call budget (it yields to initialisation and lifecycle checks)";

impl RefreshPeriod {
    pub(super) fn register(registry: &MetricsRegistry, configured: Duration) -> Self {
        let achieved = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "node_controller_address_refresh_period_seconds",
            "The period the periodic address refresh achieved: --node-status-update-frequency, or longer when a pass over every Node did not fit it under the cloud-call budget; while a pass runs past it, at least the time that pass has taken so far",
            achieved.clone(),
        );
        achieved.set(configured.as_secs_f64());
        // The period the achieved one is compared with (an alert rule divides one by the
        // other), as a gauge: a rule cannot read the flag.
        let target = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "node_controller_address_refresh_configured_period_seconds",
            "The period the periodic address refresh is configured to achieve: --node-status-update-frequency",
            target.clone(),
        );
        target.set(configured.as_secs_f64());
        RefreshPeriod {
            configured,
            achieved,
            last: configured,
            warned_running: false,
            warned_done: false,
        }
    }

    /// A pass over `nodes` Nodes took `took`. Returns true when it logged the warning: the
    /// first pass that did not fit the period, with the period it measured.
    pub(super) fn pass_done(&mut self, took: Duration, nodes: usize, batching: bool) -> bool {
        let achieved = took.max(self.configured);
        self.last = achieved;
        self.achieved.set(achieved.as_secs_f64());
        if took <= self.configured || self.warned_done {
            return false;
        }
        self.warned_done = true;
        tracing::warn!(
            nodes,
            configured = %humantime(self.configured),
            achieved = %humantime(achieved),
            "{WARNING}: each Node's addresses were refreshed about every {} instead of every {}; \
             to fix, {}",
            humantime(achieved),
            humantime(self.configured),
            fix(batching),
        );
        true
    }

    /// A pass over `nodes` Nodes is still running after `elapsed`, with `done` of them
    /// refreshed. Past the period, the gauge shows `elapsed` when that is more than the last
    /// pass achieved, and the first time the warning is logged with the progress and the
    /// period projected from it. Returns true when it logged the warning.
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
        self.achieved.set(elapsed.max(self.last).as_secs_f64());
        if self.warned_running || self.warned_done {
            return false;
        }
        self.warned_running = true;
        let pace = if done == 0 {
            "no Node refreshed yet".to_owned()
        } else {
            // At least `elapsed`; finite and at most `nodes` times it (`done` ≥ 1).
            let projected = elapsed.mul_f64(nodes.max(done) as f64 / done as f64);
            format!(
                "about {} for the whole pass at this pace",
                humantime(projected)
            )
        };
        tracing::warn!(
            nodes,
            refreshed = done,
            configured = %humantime(self.configured),
            elapsed = %humantime(elapsed),
            "{WARNING}: the running pass has refreshed {done} of {nodes} Nodes in {} ({pace}; it \
             gets the quota only after initialisation and lifecycle checks), against a period of \
             {}; to fix, {}",
            humantime(elapsed),
            humantime(self.configured),
            fix(batching),
        );
        true
    }
}

/// What an operator or vendor can do about a refresh that does not fit its period.
fn fix(batching: bool) -> &'static str {
    if batching {
        "raise the cloud's quota (or --cloud-api-qps) or the provider's \
         InstancesBatch::max_batch_size, or lengthen --node-status-update-frequency"
    } else {
        "implement the InstancesBatch capability (describe_instances: many Nodes per call) in \
         the provider, or raise the cloud's quota, or lengthen --node-status-update-frequency"
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
        // Both periods are exposed: the achieved one and the configured one it is held to.
        let text = registry.encode().unwrap();
        for line in [
            "node_controller_address_refresh_period_seconds 300.0",
            "node_controller_address_refresh_configured_period_seconds 300.0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing in:\n{text}"
            );
        }
    }

    /// 100,000 Nodes at 20 calls/s: the pass would take 5,000 s. Within the period nothing
    /// shows; past it the gauge follows the pass's time and the warning goes out then, not 83
    /// minutes later when the pass ends; the end logs the measured period once more.
    #[test]
    fn a_running_pass_past_the_period_shows_its_time_and_warns_early() {
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
        // The end of the pass sets what it achieved and logs it, once.
        assert!(refresh.pass_done(Duration::from_secs(4_200), 100_000, false));
        assert_eq!(refresh.achieved.get(), 4_200.0);
        // The next pass, past the period again: the gauge never dips below the last pass.
        assert!(!refresh.running(Duration::from_secs(400), 10_000, 100_000, false));
        assert_eq!(refresh.achieved.get(), 4_200.0);
        assert!(!refresh.pass_done(Duration::from_secs(4_100), 100_000, false));
        assert_eq!(refresh.achieved.get(), 4_100.0);
        // Nothing refreshed yet (initialisation and ensures took the quota): the time elapsed.
        let mut stalled = RefreshPeriod::register(&MetricsRegistry::new(), period);
        assert!(stalled.running(Duration::from_secs(400), 0, 100_000, true));
        assert_eq!(stalled.achieved.get(), 400.0);
    }
}
