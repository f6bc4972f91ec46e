//! Kubernetes Events, as the Go controllers emit them (same reasons, same types, correlated as
//! client-go's `EventCorrelator`), written off the reconcile path.
//!
//! As client-go's `record.EventBroadcaster`: [`EventRecorder::normal`] and
//! [`EventRecorder::warning`] only put the Event in a bounded queue
//! ([`DEFAULT_QUEUE_CAPACITY`], client-go's `maxQueuedEvents`) and return; one task per process,
//! the [`EventWriter`], writes them. A controller never waits for an Event write, so a slow or
//! failing events API cannot hold up node initialisation or load-balancer updates. When the
//! queue is full a Normal Event is dropped, as client-go drops it (`DropIfChannelFull`): counted
//! in `event_recorder_events_total{result="dropped"}` and logged (one warning every 10 s at most).
//! Under a burst Normal Events are sampled, Warnings never dropped, and the writer yields to the
//! controllers' writes when the API server is the bottleneck (`events/pacing.rs`).
//!
//! Every Warning is also logged at WARN when it is recorded, with the component, the object,
//! the reason and the note (which carries the error), at most once per [`WARN_LOG_INTERVAL`]
//! per component, object and reason (the next line says how many were not logged), so a
//! failing object shows in `kubectl logs` without flooding it (`events/warn_log.rs`).
//!
//! # Correlation
//!
//! Before writing, the writer correlates each Event as client-go's `EventCorrelator` does (see
//! `correlator.rs`): an identical repeat (same component, object, type, reason and note) is
//! counted on the Event already written instead of creating another; from the tenth different
//! note of similar Events (same component, object, type and reason) within ten minutes they
//! are combined into one Event noted `(combined from similar events): <note>`; and per
//! component and object a token bucket (burst 25, one more every five minutes) holds back
//! spam, counted as `filtered`. Events are `events.k8s.io/v1` Events (shown by
//! `kubectl describe` as core/v1 ones), named `<object>.<hex nanoseconds>` as client-go names
//! them; a repeat is a merge PATCH of the Event's `series` (`count`, `lastObservedTime`),
//! the `events.k8s.io/v1` form of core/v1's `count`/`lastTimestamp`. Events are best effort
//! and never fail a reconcile.
//!
//! # Concurrency
//!
//! client-go writes one Event at a time; that managed about 40 Events/s against a real API
//! server, too slow for the burst of a few thousand Nodes registering together. The writer
//! keeps up to [`MAX_IN_FLIGHT`] writes in flight instead (see there why that number), each in
//! its own task. Writes of the same Event (same correlation key) are never in flight together:
//! a repeat recorded while its Event is being written waits, and repeats that pile up meanwhile
//! become one PATCH with the latest count (each of them counted as `written` once it lands).
//! Events of different objects or reasons are therefore no longer written in the order they
//! were recorded, only those of one Event are.
//!
//! The runtime gives the writer, for each controller, an API client of its own (the
//! controller's identity, its own connections and its own
//! `--kube-api-qps`/`--kube-api-burst` token bucket, as a Go CCM gives each controller's
//! recorder the client of that controller), so Event writes never wait for, or take tokens
//! from, the controllers' own requests; with at most [`MAX_IN_FLIGHT`] writes in flight they
//! hold at most that many connections.
//!
//! # Retries
//!
//! As client-go's `recordToSink`, a failed write is tried again, up to [`MAX_TRIES_PER_EVENT`]
//! tries in all, sleeping [`DEFAULT_SLEEP_DURATION`] between tries; the first sleep is a random
//! fraction of it, so that many processes do not retry in step after an API server outage
//! (both are configurable with [`EventWriter::with_retries`]). A retrying write keeps its slot:
//! the other writes go on in the remaining ones. Each further attempt is counted in
//! `event_recorder_events_total{result="retried"}`; an Event given up on counts once as
//! `failed`.
//!
//! Which errors are retried: client-go retries transport errors (the server could not be
//! reached, or its answer could not be read) and gives up at once on a request it could not
//! build and on any error status the server answered. We deliberately also retry `429 Too Many
//! Requests` and every `5xx`: client-go's REST client has already retried those (when they carry
//! `Retry-After`) before `recordToSink` sees them, while kube's client retries only 429, 503 and
//! 504, so a 500 (an etcd timeout, say) would otherwise lose the Event. Every other `4xx` is
//! final, as in client-go: `409 AlreadyExists`, `400`/`422` (an invalid Event), `403` (no
//! permission, or the namespace is terminating), `404` on a create (the namespace is gone). A
//! `404` on the PATCH of a repeat means the Event is gone (deleted, or expired on the server):
//! as client-go, the writer creates it anew at once, under the same name and with its count
//! (that attempt counts as `retried`, not as a try).
//!
//! # Shutdown
//!
//! When told to stop, the writer keeps writing what is queued until a flush deadline. A write
//! in flight at the deadline is abandoned; a retry whose sleep would end after the deadline is
//! not made (so retries never extend shutdown). An Event the server already refused at least
//! once and that is given up on this way counts as `failed`; an Event never (fully) attempted
//! counts as `dropped`, as do the Events still queued.
mod correlator;
mod pacing;
mod warn_log;
mod writes;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use writes::Writes;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Client, Resource};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::task::{Id, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::machinery::metrics::MetricsRegistry;
use correlator::{Correlated, Correlator, Write};
pub use warn_log::WARN_LOG_INTERVAL;

/// Events queued at most before new ones are dropped (client-go's `maxQueuedEvents`).
pub(crate) const DEFAULT_QUEUE_CAPACITY: usize = 1000;
/// How long the writer keeps writing queued Events after it was told to stop.
pub const DEFAULT_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Tries per Event before the writer gives up on it (client-go's `maxTriesPerEvent`).
pub const MAX_TRIES_PER_EVENT: u32 = 12;
/// Sleep between two tries of an Event; the first sleep is a random fraction of it
/// (client-go's `defaultSleepDuration`).
pub(crate) const DEFAULT_SLEEP_DURATION: Duration = Duration::from_secs(10);

/// Event writes in flight at most. Thirty-two: Events must keep pace with the controllers that
/// record them, or the queue overflows: a node burst records one `Synced` per Node at the rate
/// the node workers initialise them, and with 16 in flight the in-process node-burst dropped
/// Events where 32 dropped none (`docs/performance.md`, section "Events (issue 16)"). Yet 32
/// are under a sixth of kube-apiserver's default `--max-mutating-requests-inflight` (200), and
/// a third of the node workers' writes.
pub const MAX_IN_FLIGHT: usize = 32;

/// At most one warning per this interval about dropped or failed Events.
const LOG_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// One Event waiting to be written.
struct Queued {
    component: Arc<str>,
    /// The client to write it with (`None`: the writer's).
    client: Option<Client>,
    type_: EventType,
    reason: String,
    note: String,
    regarding: ObjectReference,
    /// When it was recorded.
    at: Timestamp,
}

/// Logs at most once per [`LOG_INTERVAL`], counting what it kept quiet about.
#[derive(Debug, Default)]
struct LogLimiter {
    last: Option<Instant>,
    suppressed: u64,
}

impl LogLimiter {
    /// `Some(suppressed since the last log)` when a log is due now.
    fn allow(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < LOG_INTERVAL)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// What the recorders and the writer share.
struct Shared {
    tx: mpsc::Sender<Queued>,
    capacity: usize,
    counts: Family<ResultLabel, Counter>,
    drop_log: Mutex<LogLimiter>,
    /// Every Warning Event is also logged, rate-limited per object (`warn_log.rs`).
    warnings: warn_log::WarningLog,
    /// Sampling under a burst, the Warnings' overflow, the writes-in-flight limit.
    pacing: pacing::Pacing<Queued>,
}

impl Shared {
    fn count(&self, result: &'static str, n: u64) {
        self.counts.get_or_create(&ResultLabel { result }).inc_by(n);
    }

    fn dropped(&self, queued: &Queued, why: &str) {
        self.count("dropped", 1);
        let due = self
            .drop_log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .allow();
        if let Some(suppressed) = due {
            tracing::warn!(
                component = %queued.component,
                reason = %queued.reason,
                object = queued.regarding.name.as_deref().unwrap_or_default(),
                suppressed,
                capacity = self.capacity,
                "dropped an event: {why} (further drops in the next {LOG_INTERVAL:?} are only counted in event_recorder_events_total{{result=\"dropped\"}})"
            );
        }
    }
}

/// The process's Event queue: hands out [`EventRecorder`]s; its [`EventWriter`] writes what
/// they queue. Cheap to clone.
#[derive(Clone)]
pub struct EventBroadcaster {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for EventBroadcaster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventBroadcaster")
            .field("capacity", &self.shared.capacity)
            .field("queued", &self.queued())
            .finish_non_exhaustive()
    }
}

impl EventBroadcaster {
    /// A queue of 1,000 Events, reported as from `instance` (the
    /// leader-election identity, or the hostname), and its writer, which does nothing until
    /// [`EventWriter::run`] is spawned. Registers `event_recorder_events` in `metrics` (once
    /// per registry).
    pub fn new(client: Client, instance: &str, metrics: &MetricsRegistry) -> (Self, EventWriter) {
        Self::with_capacity(client, instance, metrics, DEFAULT_QUEUE_CAPACITY)
    }

    /// Like [`EventBroadcaster::new`] with a queue of `capacity` Events (at least 1).
    pub fn with_capacity(
        client: Client,
        instance: &str,
        metrics: &MetricsRegistry,
        capacity: usize,
    ) -> (Self, EventWriter) {
        let capacity = capacity.max(1);
        let (tx, rx) = mpsc::channel(capacity);
        let counts = Family::<ResultLabel, Counter>::default();
        for result in [
            "written", "retried", "failed", "dropped", "filtered", "sampled",
        ] {
            let _ = counts.get_or_create(&ResultLabel { result });
        }
        metrics.register(
            "event_recorder_events",
            "Events by result: written (created, or a repeat patched into its series), retried (each further attempt after a failed one), failed (given up on: the API server refused it for good, could not be reached within the tries, or the flush deadline came during its retries), dropped (the queue was full, the writer had stopped, or the flush deadline came before it was written), filtered (held back by the per-object spam filter, as client-go's), sampled (a Normal Event skipped under a burst)",
            counts.clone(),
        );
        let shared = Arc::new(Shared {
            tx,
            capacity,
            counts,
            drop_log: Mutex::new(LogLimiter::default()),
            warnings: warn_log::WarningLog::default(),
            pacing: pacing::Pacing::new(MAX_IN_FLIGHT, metrics),
        });
        let writer = EventWriter {
            rx,
            client,
            instance: instance.to_owned(),
            shared: shared.clone(),
            correlator: Correlator::default(),
            max_tries: MAX_TRIES_PER_EVENT,
            sleep: DEFAULT_SLEEP_DURATION,
            max_in_flight: MAX_IN_FLIGHT,
        };
        (EventBroadcaster { shared }, writer)
    }

    /// A recorder reporting as `component` (Go's event source component, e.g.
    /// `cloud-node-controller`).
    pub fn recorder(&self, component: &str) -> EventRecorder {
        EventRecorder {
            component: Arc::from(component),
            client: None,
            shared: self.shared.clone(),
        }
    }

    /// A recorder reporting as `component` whose Events are written with `client` (the
    /// recording controller's, so that they carry its identity, as in Go) instead of the
    /// writer's.
    pub fn recorder_with_client(&self, component: &str, client: Client) -> EventRecorder {
        EventRecorder {
            component: Arc::from(component),
            client: Some(client),
            shared: self.shared.clone(),
        }
    }

    /// How many Events the queue holds at most.
    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }

    /// How many Events wait in the queue now.
    pub fn queued(&self) -> usize {
        self.shared.capacity - self.shared.tx.capacity()
    }

    /// Resolves once the writer has stopped (flushed, or dropped): Events recorded from then
    /// on are dropped.
    pub async fn stopped(&self) {
        self.shared.tx.closed().await;
    }
}

/// Queues Events for one controller component (e.g. `cloud-node-controller`). Cheap to clone.
#[derive(Clone)]
pub struct EventRecorder {
    component: Arc<str>,
    client: Option<Client>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder")
            .field("component", &self.component)
            .finish_non_exhaustive()
    }
}

impl EventRecorder {
    /// Queues a `Normal` event on `object`; never waits (see the module documentation).
    pub fn normal<K>(&self, object: &K, reason: &str, note: impl Into<String>)
    where
        K: Resource<DynamicType = ()>,
    {
        self.enqueue(object, EventType::Normal, reason, note.into());
    }

    /// Queues a `Warning` event on `object`; never waits (see the module documentation).
    /// Also logs it at WARN with the object and the note, at most once per
    /// [`WARN_LOG_INTERVAL`] per object and reason (see the module documentation).
    pub fn warning<K>(&self, object: &K, reason: &str, note: impl Into<String>)
    where
        K: Resource<DynamicType = ()>,
    {
        let note = note.into();
        self.shared
            .warnings
            .log(&self.component, &object.object_ref(&()), reason, &note);
        self.enqueue(object, EventType::Warning, reason, note);
    }

    fn enqueue<K>(&self, object: &K, type_: EventType, reason: &str, note: String)
    where
        K: Resource<DynamicType = ()>,
    {
        let waiting = self.shared.capacity - self.shared.tx.capacity();
        let pacing = &self.shared.pacing;
        if matches!(type_, EventType::Normal)
            && !pacing.admit_normal(&self.component, reason, waiting, self.shared.capacity)
        {
            return self.shared.count("sampled", 1);
        }
        let queued = Queued {
            component: self.component.clone(),
            client: self.client.clone(),
            type_,
            reason: reason.to_owned(),
            note,
            regarding: object.object_ref(&()),
            at: Timestamp::now(),
        };
        match self.shared.tx.try_send(queued) {
            Ok(()) => {}
            Err(TrySendError::Full(queued)) if matches!(queued.type_, EventType::Warning) => {
                pacing.overflow(queued)
            }
            Err(TrySendError::Full(queued)) => {
                self.shared.dropped(&queued, "the event queue is full")
            }
            Err(TrySendError::Closed(queued)) => {
                self.shared.dropped(&queued, "the event writer has stopped")
            }
        }
    }
}

/// Writes the queued Events: correlates each one (see the module documentation) and keeps up
/// to [`MAX_IN_FLIGHT`] writes in flight, retrying failed ones. Spawn [`EventWriter::run`]
/// once per [`EventBroadcaster`].
pub struct EventWriter {
    rx: mpsc::Receiver<Queued>,
    client: Client,
    instance: String,
    shared: Arc<Shared>,
    correlator: Correlator,
    max_tries: u32,
    sleep: Duration,
    max_in_flight: usize,
}

impl std::fmt::Debug for EventWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventWriter")
            .field("instance", &self.instance)
            .field("max_tries", &self.max_tries)
            .field("sleep", &self.sleep)
            .field("max_in_flight", &self.max_in_flight)
            .finish_non_exhaustive()
    }
}

/// One write: the Event as recorded (its latest observation) and what the correlator made
/// of it.
struct Job {
    queued: Queued,
    write: Write,
    /// Recorded Events this write stands for (repeats that piled up while the Event was
    /// being written are folded into one write).
    observations: u64,
}

/// The writes in flight, and per correlation key the repeat waiting for its Event's write to
/// finish.
#[derive(Default)]
struct InFlight {
    tasks: JoinSet<()>,
    keys: HashMap<Id, u64>,
    waiting: HashMap<u64, Option<Job>>,
}

impl InFlight {
    fn len(&self) -> usize {
        self.tasks.len()
    }

    fn start(&mut self, writes: &Arc<Writes>, job: Job) {
        let key = job.write.key;
        let handle = self.tasks.spawn(writes.clone().write(job));
        self.keys.insert(handle.id(), key);
        self.waiting.insert(key, None);
    }

    /// Starts `job`, or folds it into the repeat waiting for its Event's write.
    fn add(&mut self, writes: &Arc<Writes>, mut job: Job) {
        match self.waiting.get_mut(&job.write.key) {
            None => self.start(writes, job),
            Some(waiting) => {
                if let Some(earlier) = waiting.take() {
                    job.observations += earlier.observations;
                }
                *waiting = Some(job);
            }
        }
    }

    /// Waits for a write to finish; returns the repeat that waited for it, if any (`None`
    /// also when nothing is in flight).
    async fn finished(&mut self) -> Option<Job> {
        let id = match self.tasks.join_next_with_id().await? {
            Ok((id, ())) => id,
            // The write task panicked or was aborted; its slot and key are free again.
            Err(e) => e.id(),
        };
        let key = self.keys.remove(&id)?;
        self.waiting.remove(&key).flatten()
    }
}

impl EventWriter {
    /// Tries each Event at most `max_tries` times (at least 1: no retry), sleeping
    /// `sleep_duration` between tries, the first sleep a random fraction of it. Defaults:
    /// [`MAX_TRIES_PER_EVENT`] and 10 s, client-go's values.
    pub fn with_retries(mut self, max_tries: u32, sleep_duration: Duration) -> Self {
        self.max_tries = max_tries.max(1);
        self.sleep = sleep_duration;
        self
    }

    /// Keeps at most `n` writes in flight (at least 1). Default: [`MAX_IN_FLIGHT`].
    pub fn with_max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// Writes queued Events until `stop` fires; then writes what is still queued for at most
    /// `flush_timeout` (writes in flight or retrying when `stop` fires get the same deadline)
    /// and returns. Events left over, and Events recorded afterwards, are dropped and counted.
    pub async fn run(mut self, stop: CancellationToken, flush_timeout: Duration) {
        // Also fired here when every sender is gone, so the writes in flight get the deadline.
        let stop = stop.child_token();
        let writes = Arc::new(Writes {
            client: self.client.clone(),
            instance: self.instance.clone(),
            shared: self.shared.clone(),
            fail_log: Mutex::new(LogLimiter::default()),
            max_tries: self.max_tries,
            sleep: self.sleep,
            stop: stop.clone(),
            flush_timeout,
            flush_deadline: OnceLock::new(),
        });
        let mut flight = InFlight::default();
        loop {
            let limit = self.max_in_flight.min(self.shared.pacing.limit());
            while flight.len() < limit
                && let Some(warning) = self.shared.pacing.take_overflow()
            {
                self.dispatch(warning, &writes, &mut flight);
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                waiting = flight.finished(), if flight.len() > 0 => {
                    if let Some(waiting) = waiting {
                        flight.add(&writes, waiting);
                    }
                }
                () = self.shared.pacing.overflowed(), if flight.len() < limit => {}
                queued = self.rx.recv(), if flight.len() < limit => match queued {
                    Some(queued) => self.dispatch(queued, &writes, &mut flight),
                    // Every sender is gone: nothing can be queued any more.
                    None => {
                        stop.cancel();
                        break;
                    }
                },
            }
        }
        let deadline = writes.deadline();
        let mut flushed = 0u64;
        while Instant::now() < deadline {
            if flight.len() < self.max_in_flight {
                let next = self.shared.pacing.take_overflow();
                if let Some(queued) = next.or_else(|| self.rx.try_recv().ok()) {
                    self.dispatch(queued, &writes, &mut flight);
                    flushed += 1;
                    continue;
                }
                if flight.len() == 0 {
                    break;
                }
            }
            tokio::select! {
                waiting = flight.finished() => {
                    if let Some(waiting) = waiting {
                        flight.add(&writes, waiting);
                    }
                }
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        // The writes still in flight end at the deadline by themselves (and count
        // themselves); the repeats waiting for them are not written.
        while flight.len() > 0 {
            if let Some(waiting) = flight.finished().await {
                self.shared.count("dropped", waiting.observations);
            }
        }
        self.rx.close();
        let mut left = 0u64;
        while self.rx.try_recv().is_ok() {
            left += 1;
        }
        if left > 0 {
            self.shared.count("dropped", left);
            tracing::warn!(
                flushed,
                left,
                "event writer stopped: {left} queued events were not written within the flush deadline"
            );
        } else {
            tracing::debug!(flushed, "event writer stopped; queued events flushed");
        }
    }

    /// Correlates `queued` and starts (or folds) its write, unless the spam filter holds it.
    fn dispatch(&mut self, queued: Queued, writes: &Arc<Writes>, flight: &mut InFlight) {
        match self.correlator.correlate(&queued, queued.at) {
            Correlated::Filtered => {
                self.shared.count("filtered", 1);
                tracing::debug!(
                    component = %queued.component,
                    reason = %queued.reason,
                    object = queued.regarding.name.as_deref().unwrap_or_default(),
                    "event held back by the spam filter"
                );
            }
            Correlated::Write(write) => flight.add(
                writes,
                Job {
                    queued,
                    write,
                    observations: 1,
                },
            ),
        }
    }
}

#[cfg(test)]
mod tests;
