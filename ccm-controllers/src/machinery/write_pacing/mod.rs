//! Writes that give way while the API server is busy: an adaptive limit on how many of a
//! writer's requests are in flight, set from the latency of those requests (AIMD, as TCP does
//! for a network path). Two writers use it, each with its own [`CongestionRule`]:
//!
//! - **Normal Events** (`machinery/events/pacing.rs`): the lowest-priority writes of all.
//! - **Node initialisation** (`controllers/cloud_node/sync.rs`, issue 43). In a Node burst
//!   every kubelet registers (a create, then a status write) while the cloud-node controller
//!   initialises the Nodes already there (two writes each). The API server does both on the
//!   same CPUs, so initialising at full speed slowed the registrations themselves: the bench's
//!   creation of 1,000 Nodes took 2.4 times as long beside the CCM as without it, and 1.1 times
//!   as long with the CCM's writes held to one at a time. The initialisation writes are the
//!   ones that can wait: a tainted Node is not scheduled before it is initialised, but a Node
//!   that is not registered is not there at all.
//!
//! [`LatencyLimit`] is the rule (pure). The writes' recent latency (an average weighted to the
//! newest) is *slow* when it is above the rule's factor times its lowest value of the recent
//! window plus a slack: requests are queueing at the API server. Slow writes, or a `429`/`5xx`
//! answer, halve the limit (at most once per the recent latency, so that the writes already in
//! flight when the queue formed count once); other writes raise it again, up to the writer's
//! maximum. The lowest recent latency is the API server's unloaded latency for these writes,
//! whatever the cluster's network and object sizes make it (a cluster far away has a high
//! baseline, not a slow one). A rule may let the limit go below one write in flight: one write
//! at a time, and a gap after each of `(1 / limit - 1)` times the recent latency (bounded), so
//! that the writer is busy only that share of the time while the queue lasts. The writer always
//! makes progress.
//!
//! What it cannot tell: a writer whose first writes already meet a loaded API server has a
//! loaded baseline and holds nothing back until quieter writes lower it. In a cluster's
//! bring-up the CCM initialises the control-plane Nodes it runs on before the workers register;
//! a CCM restarted in the middle of a burst initialises at full speed, as before.
//!
//! [`WritePacer`] applies a limit with a semaphore whose permits follow it.

use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

mod limit;

pub(crate) use limit::{CongestionRule, Increase, LatencyLimit};

/// How the writer tells a busy API server from its Normal writes (`machinery/events/pacing.rs`):
/// a write more than 4 times slower than the fastest recent one, and slower than 100 ms; each
/// write alone (no smoothing); at most one halving per 250 ms; the fastest write of the last
/// 15 to 30 s; one more write in flight per limit's worth of writes that were not slow.
/// It starts at its maximum.
pub(crate) const EVENT_WRITES: CongestionRule = CongestionRule {
    factor: 4.0,
    slack: Duration::ZERO,
    floor: Duration::from_millis(100),
    smoothing: 1.0,
    decrease_interval: Duration::from_millis(250),
    baseline_window: Duration::from_secs(30),
    increase: Increase::PerLimitOfWrites,
    start: usize::MAX,
    lowest: 1.0,
    longest_gap: Duration::ZERO,
};

/// How the initialisation writes tell a busy API server (`controllers/cloud_node/sync.rs`): their
/// recent latency (weighted 1/4 to the newest write) above twice its lowest value of the last
/// 5 to 10 minutes plus 5 ms; then halved at most once per that latency, down to 1/16: one
/// initialisation writing at a time, busy a sixteenth of the time (the gap after its writes at
/// most 250 ms, so that the end of a queue is seen within a quarter of a second). It starts at
/// 4 writes in flight and gets one more per write that was not slow while every slot was taken (up to `--concurrent-node-syncs`), so that the Nodes waiting are
/// initialised at once when the queue is gone, and a burst that starts after a quiet time meets
/// a narrow limit.
pub(crate) const NODE_INITIALISATION_WRITES: CongestionRule = CongestionRule {
    factor: 2.0,
    slack: Duration::from_millis(5),
    floor: Duration::ZERO,
    smoothing: 0.25,
    decrease_interval: Duration::ZERO,
    baseline_window: Duration::from_secs(600),
    increase: Increase::PerWrite,
    start: 4,
    lowest: 1.0 / 16.0,
    longest_gap: Duration::from_millis(250),
};

/// The limit applied: [`WritePacer::acquire`] waits for a slot (and, below one write in flight,
/// for the gap after the last write), [`WritePermit::observe`] feeds each write's latency back.
/// Slots are handed out in order of arrival.
#[derive(Debug)]
pub(crate) struct WritePacer {
    slots: Semaphore,
    state: Mutex<PacerState>,
    /// The current limit, for `/metrics` (below 1: the share of the time one write is in
    /// flight).
    gauge: Gauge<f64, AtomicU64>,
}

#[derive(Debug)]
struct PacerState {
    limit: LatencyLimit,
    /// Slots the semaphore holds in all, handed out or free: the limit once `owed` is paid.
    slots: usize,
    /// Slots to take back as handed-out ones come back (the limit went down while they were
    /// out).
    owed: usize,
    /// Below one write in flight: no write starts before this (the gap after the last one).
    next_write: Option<Instant>,
}

/// One slot of a [`WritePacer`], given back when dropped.
#[derive(Debug)]
pub(crate) struct WritePermit<'a> {
    pacer: &'a WritePacer,
    permit: Option<SemaphorePermit<'a>>,
}

impl WritePacer {
    /// A pacer allowing up to `max` writes in flight (the controller's workers) by `rule`;
    /// `gauge` shows the current limit.
    pub(crate) fn new(max: usize, rule: CongestionRule, gauge: Gauge<f64, AtomicU64>) -> Self {
        let limit = LatencyLimit::new(max, rule);
        let slots = limit.current();
        gauge.set(limit.value());
        WritePacer {
            slots: Semaphore::new(slots),
            state: Mutex::new(PacerState {
                limit,
                slots,
                owed: 0,
                next_write: None,
            }),
            gauge,
        }
    }

    fn state(&self) -> MutexGuard<'_, PacerState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a slot, then for the gap after the last write while the limit is below one.
    pub(crate) async fn acquire(&self) -> WritePermit<'_> {
        // The semaphore is never closed; were it, the write would go ahead unpaced.
        let permit = self.slots.acquire().await.ok();
        // Read once the slot is ours: the write before it set the gap as it finished.
        let next_write = self.state().next_write;
        if let Some(at) = next_write {
            tokio::time::sleep_until(at).await;
        }
        WritePermit {
            pacer: self,
            permit,
        }
    }

    /// The limit now (below 1: the share of the time one write is in flight).
    #[cfg(test)]
    pub(crate) fn limit(&self) -> f64 {
        self.state().limit.value()
    }

    fn observe(&self, latency: Duration, overloaded: bool) {
        let mut state = self.state();
        // This write's slot is still out: none free means every slot is taken.
        let limited = self.slots.available_permits() == 0;
        let now = Instant::now();
        let limit = state.limit.on_sample(now, latency, overloaded, limited);
        let gap = state.limit.gap();
        state.next_write = (!gap.is_zero()).then(|| now + gap);
        if limit > state.slots {
            let more = limit - state.slots;
            let paid = more.min(state.owed);
            state.owed -= paid;
            self.slots.add_permits(more - paid);
        } else if limit < state.slots {
            let fewer = state.slots - limit;
            let taken = self.slots.forget_permits(fewer);
            state.owed += fewer - taken;
        }
        state.slots = limit;
        self.gauge.set(state.limit.value());
    }
}

impl WritePermit<'_> {
    /// Feeds back one write made under this slot: its latency, and whether the API server
    /// answered `429` or `5xx` (`overloaded`).
    pub(crate) fn observe(&self, latency: Duration, overloaded: bool) {
        self.pacer.observe(latency, overloaded);
    }
}

impl Drop for WritePermit<'_> {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let mut state = self.pacer.state();
        if state.owed > 0 {
            state.owed -= 1;
            permit.forget();
        }
    }
}

#[cfg(test)]
mod tests;
