//! Shadow mode (`--shadow`): a Node the controller would delete is not deleted (the delete is
//! a dry run the write guard records as a `(node deleted)` divergence), so it stays NotReady
//! and every monitor pass would find it again: ask the cloud again, send the dry-run delete
//! again and log it again, at the shadow's small cloud budget, ahead of everything else
//! waiting for that budget. Instead, a would-delete is **held**: the Node is not checked again
//! while nothing about it changed, until [`RECHECK_PERIODS`] monitor periods passed.
//!
//! What ends the hold: the Node changes in what the decision read (its UID: re-created; its
//! provider ID), it becomes `Ready` (it is settled and no longer checked at all), it is
//! deleted (by the incumbent), or the re-examination period passes. A re-examination that
//! finds the instance again resolves the divergence; one that finds it still gone renews the
//! hold without a new log line.

use std::time::Duration;

use ccm_core::NodeView;
use tokio::time::Instant;

/// A would-delete is re-examined after this many monitor periods (5 min at the default
/// `--node-monitor-period` of 5 s, Go's default `--node-status-update-frequency`).
pub(super) const RECHECK_PERIODS: u32 = 60;

/// A Node the shadow would have deleted: what the decision read, and when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Held {
    uid: String,
    provider_id: String,
    at: Instant,
}

impl Held {
    /// The would-delete of `node`, decided at `at`.
    pub(super) fn new(node: &NodeView, at: Instant) -> Self {
        Held {
            uid: node.uid().unwrap_or_default().to_owned(),
            provider_id: node.provider_id().to_owned(),
            at,
        }
    }

    /// Whether `node` is still held at `now`: the same Node (UID, provider ID) and less than
    /// the re-examination period (`RECHECK_PERIODS` × `monitor_period`) since the decision.
    pub(super) fn holds(&self, node: &NodeView, now: Instant, monitor_period: Duration) -> bool {
        self.uid == node.uid().unwrap_or_default()
            && self.provider_id == node.provider_id()
            && now.duration_since(self.at) < monitor_period.saturating_mul(RECHECK_PERIODS)
    }
}

#[cfg(test)]
mod tests {
    use ccm_testing::builders::kubelet_node;

    use super::*;

    fn view(uid: &str, provider_id: &str) -> NodeView {
        let mut node = kubelet_node("n1").provider_id(provider_id).build();
        node.metadata.uid = Some(uid.to_owned());
        NodeView::from_node(&node)
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_lasts_the_recheck_period_and_ends_when_the_node_changes() {
        let period = Duration::from_secs(5);
        let node = view("u1", "fake://i-1");
        let held = Held::new(&node, Instant::now());
        assert!(held.holds(&node, Instant::now(), period));
        tokio::time::advance(period * (RECHECK_PERIODS - 1)).await;
        assert!(held.holds(&node, Instant::now(), period));
        // Another provider ID or a re-created Node: examined again at once.
        assert!(!held.holds(&view("u1", "fake://i-2"), Instant::now(), period));
        assert!(!held.holds(&view("u2", "fake://i-1"), Instant::now(), period));
        tokio::time::advance(period).await;
        assert!(!held.holds(&node, Instant::now(), period));
    }
}
