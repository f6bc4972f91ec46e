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
//!   four times the fastest recent write (and at least 100 ms), halves the writes in flight
//!   (at most once per 250 ms, never below one); every write that was not slow adds back one
//!   over the current limit's worth of writes (TCP's additive increase): [`EVENT_WRITES`], the
//!   rule of `machinery/write_pacing`, which the cloud-node controller's initialisation writes
//!   follow too with a rule of their own. The limit is the gauge
//!   `event_recorder_in_flight_limit`.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::machinery::metrics::MetricsRegistry;
use crate::machinery::write_pacing::{EVENT_WRITES, LatencyLimit};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each holder leaves the data consistent; a panic elsewhere does not change that.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The Warnings' own list and the Normal writes-in-flight limit of one writer.
pub(super) struct Pacing<T> {
    warnings: Mutex<VecDeque<T>>,
    warned: Notify,
    congestion: Mutex<LatencyLimit>,
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
            congestion: Mutex::new(LatencyLimit::new(max_in_flight, EVENT_WRITES)),
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
        lock(&self.congestion).current()
    }

    /// One write took `took`; `overloaded` when the server answered `429` or `5xx`.
    pub(super) fn observe(&self, took: Duration, overloaded: bool) {
        // Counted as limited: the writer keeps writing while it has Events, so its limit is
        // in use whenever it writes.
        let limit = lock(&self.congestion).on_sample(Instant::now(), took, overloaded, true);
        self.limit_gauge.set(limit as f64);
    }
}
