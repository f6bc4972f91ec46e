//! The load balancers by host count, kept up to date as hosts change, and the debug line that
//! reports them after every call that changed some load balancer's hosts.
//!
//! A process running FakeCloud (fake-ccm in the scale benchmark) cannot be inspected from
//! outside, so what the cloud holds is logged instead: with `RUST_LOG` enabling the target
//! [`TARGET`] at `debug`, every `ensure_load_balancer`, `update_load_balancer`,
//! `update_load_balancer_hosts` or `ensure_load_balancer_deleted` call that changed a host list
//! (or created or deleted a load balancer) is followed by one line with the message
//! [`MESSAGE`] and the fields `load_balancers` (how many exist) and `by_host_count`
//! (`<host count>=<load balancers>` pairs, comma-separated, ascending; `none` without load
//! balancers), e.g. `load_balancers=200 by_host_count=50=190,51=10`. The counts cover every
//! load balancer the fake cloud holds, of any cluster name. They are kept as the calls change
//! them, so a line costs the number of distinct host counts, not load balancers × hosts.

use std::collections::BTreeMap;
use std::sync::Arc;

/// The log target of the line (enable it with e.g.
/// `RUST_LOG=info,ccm_testing::fake_cloud::host_counts=debug`).
pub(super) const TARGET: &str = "ccm_testing::fake_cloud::host_counts";

/// The message of the line; a stable text that tools search a log for.
pub(super) const MESSAGE: &str = "fake cloud: load balancers by host count";

/// How many load balancers hold how many hosts, and whether that changed since the last line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct HostCounts {
    /// Host count → load balancers with that many hosts (no zero counts).
    by_count: BTreeMap<usize, usize>,
    /// Some load balancer's hosts changed since the last [`HostCounts::log_if_changed`].
    changed: bool,
}

impl HostCounts {
    /// One load balancer's hosts went from `old` to `new` (`None`: it did not exist before, or
    /// does not exist any more). The same interned list on both sides is no change.
    pub(super) fn replace(&mut self, old: Option<&Arc<[String]>>, new: Option<&Arc<[String]>>) {
        match (old, new) {
            (None, None) => return,
            (Some(a), Some(b)) if Arc::ptr_eq(a, b) => return,
            _ => {}
        }
        if let Some(old) = old
            && let Some(n) = self.by_count.get_mut(&old.len())
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.by_count.remove(&old.len());
            }
        }
        if let Some(new) = new {
            *self.by_count.entry(new.len()).or_default() += 1;
        }
        self.changed = true;
    }

    /// Host count → load balancers with that many hosts.
    #[cfg(test)]
    pub(super) fn by_count(&self) -> &BTreeMap<usize, usize> {
        &self.by_count
    }

    /// `<host count>=<load balancers>` pairs, comma-separated, ascending (`none` when empty).
    pub(super) fn summary(&self) -> String {
        if self.by_count.is_empty() {
            return "none".to_owned();
        }
        self.by_count
            .iter()
            .map(|(hosts, lbs)| format!("{hosts}={lbs}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Logs the line when some load balancer's hosts changed since the last one. Called under
    /// the state lock, so the lines follow the order of the changes.
    pub(super) fn log_if_changed(&mut self) {
        if !std::mem::take(&mut self.changed) {
            return;
        }
        // The fields are only computed when the target is enabled at debug.
        tracing::debug!(
            target: TARGET,
            load_balancers = self.by_count.values().sum::<usize>(),
            by_host_count = %self.summary(),
            "{MESSAGE}"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::HostCounts;

    fn hosts(n: usize) -> Arc<[String]> {
        (0..n).map(|i| format!("node-{i}")).collect()
    }

    #[test]
    fn counts_follow_ensures_updates_and_deletes() {
        let mut counts = HostCounts::default();
        assert_eq!(counts.summary(), "none");
        let (three, four) = (hosts(3), hosts(4));
        // Two load balancers ensured with 3 hosts, one updated to 4.
        counts.replace(None, Some(&three));
        counts.replace(None, Some(&three));
        counts.replace(Some(&three), Some(&four));
        assert_eq!(
            counts.by_count().clone(),
            [(3, 1), (4, 1)].into_iter().collect()
        );
        assert_eq!(counts.summary(), "3=1,4=1");
        assert!(counts.changed);

        // The same interned list again is no change.
        counts.changed = false;
        counts.replace(Some(&four), Some(&four));
        assert!(!counts.changed);

        // A deleted load balancer leaves no zero count behind.
        counts.replace(Some(&three), None);
        assert_eq!(counts.summary(), "4=1");
        assert!(counts.changed);
    }
}
