//! When the next node-sync pass runs: [`NodeSyncTimer`] (pure, driven with the current time).

use super::{HostChange, MAX_WINDOW_FACTOR};

/// When the next node-sync pass runs (pure: driven with the current time).
///
/// - **Removals** keep the base window (`--node-sync-window`): the pass runs once no change
///   arrived for one window, at the latest [`MAX_WINDOW_FACTOR`] windows after the first.
/// - **Additions** wait for the *addition window*, counted from the first addition since the
///   last pass and not extended by later ones. It starts at the base window and doubles, up to
///   `--node-sync-max-window`, each time an addition arrives within `--node-sync-max-window` of
///   the previous pass that carried additions (Nodes keep joining); an addition after a longer
///   pause starts again from the base. So a steady trickle of joins costs each load balancer
///   one update per (widened) window instead of one per Node, while a removal still goes out
///   within the base window.
///
/// "Keeps joining" is judged over the largest window, not the current one: judged over the
/// current window, a Node joining every 2 s against the 1 s base never widened it (each join
/// came 1 s after the pass of the previous one, never within it), and each joining Node cost
/// every load balancer an update of its own, as in Go (issue 19). It is counted from the *end*
/// of the last pass that carried additions ([`NodeSyncTimer::finished`]): a pass held by a
/// cloud quota can take longer than the largest window, and the joins that arrived while it
/// ran are only seen after it; counted from its start, they looked like joins after a pause
/// and reset the window to the base.
///
/// The window does not widen while passes are cheap ([`NodeSyncTimer::passes_are_cheap`]:
/// the provider's hosts batch carries every load balancer in at most
/// [`CHEAP_BATCHED_PASS_CALLS`](super::CHEAP_BATCHED_PASS_CALLS) calls): then each join
/// reaches every load balancer within the base window.
///
/// - **Joins under way** ([`NodeSyncTimer::joining`]: some of this CCM's Nodes still carry the
///   uninitialised taint): additions wait for them, up to `--node-sync-max-window` after the
///   first addition, and the pass runs once no Node awaits its initialisation and the addition
///   window has passed. In a bring-up, or a Node burst, the Nodes initialised one after the
///   other join every load balancer in one pass instead of one per widened window (issue 43:
///   the load balancers are made before the Nodes are initialised, so every initialised Node is
///   an addition). Unless passes are cheap.
#[derive(Clone, Debug)]
pub(crate) struct NodeSyncTimer<I> {
    base: std::time::Duration,
    max: std::time::Duration,
    addition_window: std::time::Duration,
    /// When the last pass that carried additions ended (started, while it runs).
    last_addition_pass: Option<I>,
    /// The pass running (or last run) carried additions.
    pass_carried_additions: bool,
    first_addition: Option<I>,
    first_removal: Option<I>,
    last_removal: Option<I>,
    /// A pass the provider asked to run again at this instant (a batch answered `Retry`).
    retry: Option<I>,
    /// Passes cost so few calls that additions keep the base window.
    cheap_passes: bool,
    /// Nodes await their initialisation: more additions are coming.
    joining: bool,
}

impl<I> NodeSyncTimer<I>
where
    I: Copy + Ord + std::ops::Add<std::time::Duration, Output = I>,
{
    /// A timer with the base window `base` and the largest addition window `max` (raised to
    /// `base` when smaller).
    pub(crate) fn new(base: std::time::Duration, max: std::time::Duration) -> Self {
        NodeSyncTimer {
            base,
            max: max.max(base),
            addition_window: base,
            last_addition_pass: None,
            pass_carried_additions: false,
            first_addition: None,
            first_removal: None,
            last_removal: None,
            retry: None,
            cheap_passes: false,
            joining: false,
        }
    }

    /// Whether Nodes await their initialisation (more additions are coming): additions then
    /// wait for them, up to the largest window.
    pub(crate) fn joining(&mut self, joining: bool) {
        self.joining = joining;
    }

    /// Whether a pass costs so few cloud calls (see
    /// [`CHEAP_BATCHED_PASS_CALLS`](super::CHEAP_BATCHED_PASS_CALLS)) that
    /// additions keep the base window instead of widening it. Takes effect from the next
    /// addition; the node sync sets it after every pass.
    pub(crate) fn passes_are_cheap(&mut self, cheap: bool) {
        self.cheap_passes = cheap;
    }

    /// The current addition window.
    #[cfg(test)]
    pub(crate) fn addition_window(&self) -> std::time::Duration {
        self.addition_window
    }

    /// Records a change arriving at `now`.
    pub(crate) fn change(&mut self, change: HostChange, now: I) {
        match change {
            HostChange::Addition => {
                if self.first_addition.is_none() {
                    let keeps_joining = !self.cheap_passes
                        && self
                            .last_addition_pass
                            .is_some_and(|last| now < last + self.max);
                    self.addition_window = if keeps_joining {
                        self.addition_window.saturating_mul(2).min(self.max)
                    } else {
                        self.base
                    };
                    self.first_addition = Some(now);
                }
            }
            HostChange::Removal => {
                self.first_removal.get_or_insert(now);
                self.last_removal = Some(now);
            }
        }
    }

    /// When the next pass is due; `None` while nothing is pending.
    pub(crate) fn due(&self) -> Option<I> {
        let removal = match (self.first_removal, self.last_removal) {
            (Some(first), Some(last)) => {
                Some((last + self.base).min(first + self.base.saturating_mul(MAX_WINDOW_FACTOR)))
            }
            _ => None,
        };
        let addition = self.first_addition.map(|first| {
            if self.joining && !self.cheap_passes {
                first + self.max
            } else {
                first + self.addition_window
            }
        });
        let changes = [removal, addition].into_iter().flatten().min();
        match (changes, self.retry) {
            // The provider asked not to be called before `retry`: the changes meanwhile wait
            // for it, and the pass at `retry` covers them.
            (Some(changes), Some(retry)) => Some(changes.max(retry)),
            (changes, retry) => changes.or(retry),
        }
    }

    /// The pass that just ran must run again at `at`, and none before (the provider answered
    /// `Retry` for a batch), whatever changes arrive in between.
    pub(crate) fn retry_at(&mut self, at: I) {
        self.retry = Some(self.retry.map_or(at, |r| r.max(at)));
    }

    /// A pass started at `now`: it covers every change recorded so far.
    pub(crate) fn passed(&mut self, now: I) {
        self.pass_carried_additions = self.first_addition.is_some();
        if self.pass_carried_additions {
            self.last_addition_pass = Some(now);
        }
        self.first_addition = None;
        self.first_removal = None;
        self.last_removal = None;
        self.retry = None;
    }

    /// The pass started by the last [`NodeSyncTimer::passed`] ended at `now`: whether later
    /// additions keep joining is judged from here.
    pub(crate) fn finished(&mut self, now: I) {
        if std::mem::take(&mut self.pass_carried_additions) {
            self.last_addition_pass = Some(now);
        }
    }
}
