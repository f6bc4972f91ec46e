//! Events that never slow the cluster: what the Event writer does when Events come faster than
//! the API server should take them.
//!
//! - **Warnings go first.** A Warning is not queued behind Normal Events: it waits in a list
//!   of its own, which the writer empties before it takes the next Normal Event, with slots of
//!   its own (up to [`MAX_IN_FLIGHT`](super::MAX_IN_FLIGHT) Warning writes in flight,
//!   whatever the Normal writes hold). It is never dropped for a full queue (only the flush
//!   deadline at shutdown drops one), never budgeted, never summarised (`budget.rs`).
//! - **Yielding to the controllers' writes.** The writer keeps at most
//!   [`MAX_IN_FLIGHT`](super::MAX_IN_FLIGHT) Normal writes in flight, but when the API server is the
//!   bottleneck it keeps fewer, so the controllers' own writes (which Events have no business
//!   delaying) get the server's capacity: a write answered `429` or `5xx`, or taking more than
//!   [`CONGESTED_FACTOR`] times the fastest recent write (and at least [`CONGESTED_FLOOR`]),
//!   halves the writes in flight (at most once per [`DECREASE_INTERVAL`], never below one);
//!   every write that was not slow adds back one over the current limit's worth of writes
//!   (TCP's additive increase). The limit is the gauge `event_recorder_in_flight_limit`.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::machinery::metrics::MetricsRegistry;

/// A write this many times slower than the fastest recent one says the server is the
/// bottleneck.
pub(crate) const CONGESTED_FACTOR: u32 = 4;
/// ... as long as it is slower than this too.
pub(crate) const CONGESTED_FLOOR: Duration = Duration::from_millis(100);
/// At most one halving of the writes in flight per this interval.
pub(crate) const DECREASE_INTERVAL: Duration = Duration::from_millis(250);
/// The fastest write is forgotten after this long (the server's speed changes).
const BASELINE_WINDOW: Duration = Duration::from_secs(30);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each holder leaves the data consistent; a panic elsewhere does not change that.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The Warnings' own list and the Normal writes-in-flight limit of one writer.
pub(super) struct Pacing<T> {
    warnings: Mutex<VecDeque<T>>,
    warned: Notify,
    congestion: Mutex<Congestion>,
    limit_gauge: Gauge<f64, AtomicU64>,
    held_gauge: Gauge,
}

impl<T> Pacing<T> {
    pub(super) fn new(max_in_flight: usize, metrics: &MetricsRegistry) -> Self {
        let limit_gauge = Gauge::<f64, AtomicU64>::default();
        metrics.register(
            "event_recorder_in_flight_limit",
            "Normal Event writes the writer keeps in flight at most now: lower while the API server is slow or answers 429/5xx, so the controllers' own writes go first (Warnings have slots of their own)",
            limit_gauge.clone(),
        );
        limit_gauge.set(max_in_flight as f64);
        let held_gauge = Gauge::default();
        metrics.register(
            "event_recorder_held",
            "Normal Event writes held back for now: repeats waiting for the end of their Event's 30 s repeat window, and summary Events waiting for their burst to end",
            held_gauge.clone(),
        );
        Pacing {
            warnings: Mutex::new(VecDeque::new()),
            warned: Notify::new(),
            congestion: Mutex::new(Congestion::new(max_in_flight)),
            limit_gauge,
            held_gauge,
        }
    }

    /// Sets the writes held back now (the gauge `event_recorder_held`).
    pub(super) fn set_held(&self, held: usize) {
        self.held_gauge.set(i64::try_from(held).unwrap_or(i64::MAX));
    }

    /// Queues a Warning ahead of every Normal Event.
    pub(super) fn push_warning(&self, warning: T) {
        lock(&self.warnings).push_back(warning);
        self.warned.notify_one();
    }

    /// The oldest Warning waiting.
    pub(super) fn take_warning(&self) -> Option<T> {
        lock(&self.warnings).pop_front()
    }

    /// Warnings waiting.
    pub(super) fn warnings_waiting(&self) -> usize {
        lock(&self.warnings).len()
    }

    /// Resolves when a Warning was queued.
    pub(super) async fn warning_queued(&self) {
        self.warned.notified().await;
    }

    /// Writes in flight allowed now.
    pub(super) fn limit(&self) -> usize {
        lock(&self.congestion).limit()
    }

    /// One write took `took`; `overloaded` when the server answered `429` or `5xx`.
    pub(super) fn observe(&self, took: Duration, overloaded: bool) {
        let limit = {
            let mut c = lock(&self.congestion);
            c.observe(Instant::now(), took, overloaded);
            c.limit
        };
        self.limit_gauge.set(limit);
    }
}

/// The writes-in-flight limit (AIMD): pure state, fed with the time of each observation.
#[derive(Debug)]
pub(crate) struct Congestion {
    max: usize,
    limit: f64,
    /// The fastest write since `baseline_since`.
    baseline: Option<Duration>,
    baseline_since: Option<Instant>,
    last_decrease: Option<Instant>,
}

impl Congestion {
    pub(crate) fn new(max: usize) -> Self {
        Congestion {
            max: max.max(1),
            limit: max.max(1) as f64,
            baseline: None,
            baseline_since: None,
            last_decrease: None,
        }
    }

    /// Writes in flight allowed now (at least one).
    pub(crate) fn limit(&self) -> usize {
        (self.limit.floor() as usize).clamp(1, self.max)
    }

    pub(crate) fn observe(&mut self, now: Instant, took: Duration, overloaded: bool) {
        let stale = self
            .baseline_since
            .is_none_or(|since| now.saturating_duration_since(since) > BASELINE_WINDOW);
        let baseline = match self.baseline {
            Some(b) if !stale => b.min(took),
            _ => {
                self.baseline_since = Some(now);
                took
            }
        };
        self.baseline = Some(baseline);
        let slow = took > (baseline * CONGESTED_FACTOR).max(CONGESTED_FLOOR);
        if overloaded || slow {
            let due = self
                .last_decrease
                .is_none_or(|at| now.saturating_duration_since(at) >= DECREASE_INTERVAL);
            if due {
                self.limit = (self.limit / 2.0).max(1.0);
                self.last_decrease = Some(now);
            }
        } else {
            self.limit = (self.limit + 1.0 / self.limit).min(self.max as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAST: Duration = Duration::from_millis(2);

    #[tokio::test(start_paused = true)]
    async fn slow_or_overloaded_writes_halve_the_writes_in_flight_and_fast_ones_restore_them() {
        let mut c = Congestion::new(32);
        c.observe(Instant::now(), FAST, false);
        assert_eq!(c.limit(), 32);
        // The server slows down: 32 → 16, and not again within the interval.
        c.observe(Instant::now(), Duration::from_millis(300), false);
        c.observe(Instant::now(), Duration::from_millis(300), false);
        assert_eq!(c.limit(), 16);
        for _ in 0..5 {
            tokio::time::advance(DECREASE_INTERVAL).await;
            c.observe(Instant::now(), FAST, true); // 429
        }
        assert_eq!(c.limit(), 1, "never below one");
        // Slow, but under the floor: not a sign of a bottleneck.
        c.observe(Instant::now(), Duration::from_millis(50), false);
        assert_eq!(c.limit(), 2);
        // Additive increase: about one more per limit's worth of fast writes.
        for _ in 0..200 {
            c.observe(Instant::now(), FAST, false);
        }
        assert!(c.limit() >= 19 && c.limit() < 32, "{}", c.limit());
        for _ in 0..2000 {
            c.observe(Instant::now(), FAST, false);
        }
        assert_eq!(c.limit(), 32);
    }
}
