//! Kubernetes Events, as the Go controllers emit them (same reasons, same types, correlated as
//! client-go's `EventCorrelator`), written off the reconcile path.
//!
//! As client-go's `record.EventBroadcaster`: [`EventRecorder::normal`] and
//! [`EventRecorder::warning`] only put the Event in a bounded queue
//! ([`DEFAULT_QUEUE_CAPACITY`], client-go's `maxQueuedEvents`) and return; one task per process,
//! the [`EventWriter`], writes them. A controller never waits for an Event write, so a slow or
//! failing events API cannot hold up node initialisation or load-balancer updates. When the
//! queue is full a Normal Event is not written, as client-go drops it (`DropIfChannelFull`), but
//! told by a summary Event (below); only when that is not possible either is it dropped:
//! counted in `event_recorder_events_total{result="dropped"}` and logged (one warning every
//! 10 s at most).
//!
//! # Events never slow the cluster
//!
//! Events are the lowest-priority writes of the process:
//!
//! - Normal Events have a budget of their own ([`NormalEventBudget`], `events/budget.rs`):
//!   100 at once, then 10 per second, all controllers together. A Normal Event over budget is
//!   not written but folded into a summary Event (one per component, reason, kind and
//!   namespace, written on the last object held back once the burst is over); a repeat of an
//!   Event already written is patched at most once per 30 s, with its full series count.
//! - Warnings are never budgeted, summarised, sampled or dropped for a full queue, and never
//!   wait behind Normal Events: they have a list and write slots of their own, served first
//!   (`events/pacing.rs`).
//! - Normal writes in flight shrink when the API server slows down (`events/pacing.rs`).
//!
//! A Normal Event that finds the queue full goes to its summary too (dropped only when
//! 1,024 summaries wait, `budget.rs`). Every Normal Event that is not
//! written, whatever the cause, is counted in
//! `event_recorder_normal_events_not_written_total{component,reason,cause}`, `cause` one of
//! `budget` (in a summary), `queue_full`, `spam_filter`, `failed` and `shutdown`.
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
mod budget;
mod correlator;
mod flight;
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
pub use budget::NormalEventBudget;
use budget::{Budget, Summaries, SummaryKey};
use correlator::{Correlated, Correlator, Write};
use flight::{Held, InFlight};
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NotWrittenLabels {
    component: String,
    reason: String,
    cause: &'static str,
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
    /// Normal Events not written, by component, reason and cause.
    not_written: Family<NotWrittenLabels, Counter>,
    drop_log: Mutex<LogLimiter>,
    /// Every Warning Event is also logged, rate-limited per object (`warn_log.rs`).
    warnings: warn_log::WarningLog,
    /// The Warnings' own list, the Normal writes-in-flight limit.
    pacing: pacing::Pacing<Queued>,
    /// The summaries waiting: of Normal Events over budget (the writer) or that found the
    /// queue full (the recorders).
    summaries: Mutex<Summaries>,
}

impl Shared {
    fn count(&self, result: &'static str, n: u64) {
        self.counts.get_or_create(&ResultLabel { result }).inc_by(n);
    }

    /// Counts `n` observations of `queued` not written for `cause`, when it is a Normal
    /// Event.
    fn not_written(&self, queued: &Queued, cause: &'static str, n: u64) {
        if matches!(queued.type_, EventType::Normal) && n > 0 {
            self.not_written
                .get_or_create(&NotWrittenLabels {
                    component: queued.component.to_string(),
                    reason: queued.reason.clone(),
                    cause,
                })
                .inc_by(n);
        }
    }

    /// Folds a Normal Event that is not written (`cause`) into its summary; `false` when too
    /// many summaries wait (then it is not counted here).
    fn summarise(&self, queued: &Queued, cause: &'static str) -> bool {
        let key = SummaryKey {
            component: queued.component.clone(),
            reason: queued.reason.clone(),
            kind: queued.regarding.kind.clone().unwrap_or_default(),
            namespace: queued.regarding.namespace.clone(),
        };
        let held = self
            .summaries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .hold_back(
                key,
                &queued.regarding,
                &queued.note,
                queued.client.as_ref(),
                queued.at,
                Instant::now(),
            );
        if held {
            self.count("summarised", 1);
            self.not_written(queued, cause, 1);
        }
        held
    }

    fn summaries(&self) -> std::sync::MutexGuard<'_, Summaries> {
        self.summaries.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn dropped(&self, queued: &Queued, cause: &'static str, why: &str) {
        self.count("dropped", 1);
        self.not_written(queued, cause, 1);
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
            "written",
            "retried",
            "failed",
            "dropped",
            "filtered",
            "summarised",
            "summaries",
        ] {
            let _ = counts.get_or_create(&ResultLabel { result });
        }
        metrics.register(
            "event_recorder_events",
            "Events by result: written (created, or a repeat patched into its series), retried (each further attempt after a failed one), failed (given up on: the API server refused it for good, could not be reached within the tries, or the flush deadline came during its retries), dropped (the queue was full, the writer had stopped, or the flush deadline came before it was written), filtered (held back by the per-object spam filter, as client-go's), summarised (a Normal Event over the Normal Event budget, told in a summary Event instead), summaries (summary Events written)",
            counts.clone(),
        );
        let not_written = Family::<NotWrittenLabels, Counter>::default();
        metrics.register(
            "event_recorder_normal_events_not_written",
            "Normal Events not written, by component, reason and cause: budget (over the Normal Event budget; a summary Event tells them), queue_full, spam_filter (client-go's per-object filter), failed (the API server refused it or could not be reached within the tries), shutdown (the flush deadline came first)",
            not_written.clone(),
        );
        let shared = Arc::new(Shared {
            tx,
            capacity,
            counts,
            not_written,
            drop_log: Mutex::new(LogLimiter::default()),
            warnings: warn_log::WarningLog::default(),
            pacing: pacing::Pacing::new(MAX_IN_FLIGHT, metrics),
            summaries: Mutex::new(Summaries::default()),
        });
        let writer = EventWriter {
            rx,
            client,
            instance: instance.to_owned(),
            shared: shared.clone(),
            correlator: Correlator::default(),
            budget: NormalEventBudget::default(),
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

    /// How many Events wait to be written now (the Normal queue and the Warnings' list).
    pub fn queued(&self) -> usize {
        self.shared.capacity - self.shared.tx.capacity() + self.shared.pacing.warnings_waiting()
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
        let queued = Queued {
            component: self.component.clone(),
            client: self.client.clone(),
            type_,
            reason: reason.to_owned(),
            note,
            regarding: object.object_ref(&()),
            at: Timestamp::now(),
        };
        if matches!(queued.type_, EventType::Warning) {
            // Never behind Normal Events, never dropped for a full queue.
            if self.shared.tx.is_closed() {
                return self
                    .shared
                    .dropped(&queued, "shutdown", "the event writer has stopped");
            }
            return self.shared.pacing.push_warning(queued);
        }
        match self.shared.tx.try_send(queued) {
            Ok(()) => {}
            // Told by its summary, unless too many summaries wait.
            Err(TrySendError::Full(queued)) => {
                if !self.shared.summarise(&queued, "queue_full") {
                    self.shared
                        .dropped(&queued, "queue_full", "the event queue is full")
                }
            }
            Err(TrySendError::Closed(queued)) => {
                self.shared
                    .dropped(&queued, "shutdown", "the event writer has stopped")
            }
        }
    }
}

/// Writes the queued Events: correlates each one (see the module documentation), budgets
/// the Normal ones and keeps up to [`MAX_IN_FLIGHT`] Normal writes (and as many Warning
/// writes) in flight, retrying failed ones. Spawn [`EventWriter::run`] once per
/// [`EventBroadcaster`].
pub struct EventWriter {
    rx: mpsc::Receiver<Queued>,
    client: Client,
    instance: String,
    shared: Arc<Shared>,
    correlator: Correlator,
    budget: NormalEventBudget,
    max_tries: u32,
    sleep: Duration,
    max_in_flight: usize,
}

impl std::fmt::Debug for EventWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventWriter")
            .field("instance", &self.instance)
            .field("budget", &self.budget)
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
    /// being written, or during its repeat window, are folded into one write); 0 for a
    /// summary.
    observations: u64,
}

impl Job {
    fn is_warning(&self) -> bool {
        matches!(self.queued.type_, EventType::Warning)
    }
}

/// The writer's state while it runs.
struct Running {
    writes: Arc<Writes>,
    flight: InFlight,
    budget: Budget,
    held: Held,
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

    /// Keeps at most `n` Normal writes (and `n` Warning writes) in flight (at least 1).
    /// Default: [`MAX_IN_FLIGHT`].
    pub fn with_max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// Budgets Normal Events with `budget` (default: [`NormalEventBudget::default`];
    /// [`NormalEventBudget::unlimited`] writes every one at once).
    pub fn with_normal_budget(mut self, budget: NormalEventBudget) -> Self {
        self.budget = budget;
        self
    }

    /// Writes queued Events until `stop` fires; then writes what is still queued, held back
    /// for a repeat window or waiting in a summary for at most `flush_timeout` (writes in
    /// flight or retrying when `stop` fires get the same deadline) and returns. Events left
    /// over, and Events recorded afterwards, are dropped and counted.
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
        let mut r = Running {
            writes,
            flight: InFlight::default(),
            budget: Budget::new(self.budget, Instant::now()),
            held: Held::default(),
        };
        loop {
            let limit = self.max_in_flight.min(self.shared.pacing.limit());
            self.start_warnings(&mut r);
            self.release_due(&mut r, Instant::now(), false);
            self.shared
                .pacing
                .set_held(r.held.len() + self.shared.summaries().len());
            let next_summary = self.shared.summaries().next(r.budget.config());
            let next_due = match (r.held.next(), next_summary) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                waiting = r.flight.finished(), if r.flight.len() > 0 => {
                    if let Some(waiting) = waiting {
                        self.repeat(waiting, &mut r);
                    }
                }
                () = self.shared.pacing.warning_queued(), if r.flight.warnings < self.max_in_flight => {}
                () = sleep_until_some(next_due), if next_due.is_some() => {}
                // Over budget, a Normal Event costs no write: take it even with every slot held
                // (else a burst would fill the queue while the budget is spent).
                queued = self.rx.recv(), if r.flight.normal() < limit || !r.budget.has_token(Instant::now()) => match queued {
                    Some(queued) => self.dispatch(queued, &mut r, false),
                    // Every sender is gone: nothing can be queued any more.
                    None => {
                        stop.cancel();
                        break;
                    }
                },
            }
        }
        let deadline = r.writes.deadline();
        // What waits for a window or a summary is written now, within the deadline.
        self.release_due(&mut r, Instant::now(), true);
        self.shared.pacing.set_held(0);
        let mut flushed = 0u64;
        while Instant::now() < deadline {
            if r.flight.len() < 2 * self.max_in_flight {
                let next = self.shared.pacing.take_warning();
                if let Some(queued) = next.or_else(|| self.rx.try_recv().ok()) {
                    self.dispatch(queued, &mut r, true);
                    flushed += 1;
                    continue;
                }
                if r.flight.len() == 0 {
                    break;
                }
            }
            tokio::select! {
                waiting = r.flight.finished() => {
                    if let Some(waiting) = waiting {
                        r.flight.add(&r.writes, waiting);
                    }
                }
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        // The writes still in flight end at the deadline by themselves (and count
        // themselves); the repeats waiting for them are not written.
        while r.flight.len() > 0 {
            if let Some(waiting) = r.flight.finished().await {
                self.shared.count("dropped", waiting.observations);
                self.shared
                    .not_written(&waiting.queued, "shutdown", waiting.observations);
            }
        }
        self.rx.close();
        let mut left = 0u64;
        while let Some(queued) = self
            .shared
            .pacing
            .take_warning()
            .or_else(|| self.rx.try_recv().ok())
        {
            left += 1;
            self.shared.not_written(&queued, "shutdown", 1);
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

    /// Starts the Warnings waiting, up to [`EventWriter::with_max_in_flight`] Warning writes
    /// in flight, whatever the Normal writes hold.
    fn start_warnings(&mut self, r: &mut Running) {
        while r.flight.warnings < self.max_in_flight
            && let Some(warning) = self.shared.pacing.take_warning()
        {
            self.dispatch(warning, r, false);
        }
    }

    /// Writes the repeats whose window ended and the summaries that are due at `now` (all of
    /// them with `all`).
    fn release_due(&mut self, r: &mut Running, now: Instant, all: bool) {
        for job in r.held.due(now, all) {
            r.budget.wrote(job.write.key, now);
            r.flight.add(&r.writes, job);
        }
        let config = *r.budget.config();
        let due = self.shared.summaries().due(now, all, &config);
        for (key, summary) in due {
            let note = budget::summary_note(&key, &summary, &config);
            let queued = Queued {
                component: key.component,
                client: summary.last_client,
                type_: EventType::Normal,
                reason: key.reason,
                note,
                regarding: summary.last_object,
                at: Timestamp::now(),
            };
            match self.correlator.correlate(&queued, queued.at) {
                Correlated::Filtered => self.shared.count("filtered", 1),
                Correlated::Write(write) => r.flight.add(
                    &r.writes,
                    Job {
                        queued,
                        write,
                        observations: 0,
                    },
                ),
            }
        }
    }

    /// A repeat of an Event already written: written once its window ends (Normal), at once
    /// (Warning).
    fn repeat(&mut self, job: Job, r: &mut Running) {
        let now = Instant::now();
        if job.is_warning() || r.flight.writing(job.write.key) {
            return r.flight.add(&r.writes, job);
        }
        match r.budget.repeat_due(job.write.key, now) {
            Some(due) => r.held.hold(due, job),
            None => {
                r.budget.wrote(job.write.key, now);
                r.flight.add(&r.writes, job);
            }
        }
    }

    /// Correlates `queued` and starts (or folds, holds or summarises) its write, unless the
    /// spam filter holds it. `flushing`: at shutdown, Normal Events are not budgeted.
    fn dispatch(&mut self, queued: Queued, r: &mut Running, flushing: bool) {
        let write = match self.correlator.correlate(&queued, queued.at) {
            Correlated::Filtered => {
                self.shared.count("filtered", 1);
                self.shared.not_written(&queued, "spam_filter", 1);
                tracing::debug!(
                    component = %queued.component,
                    reason = %queued.reason,
                    object = queued.regarding.name.as_deref().unwrap_or_default(),
                    "event held back by the spam filter"
                );
                return;
            }
            Correlated::Write(write) => write,
        };
        let job = Job {
            queued,
            write,
            observations: 1,
        };
        if job.is_warning() || flushing {
            return r.flight.add(&r.writes, job);
        }
        let now = Instant::now();
        if job.write.count > 1 {
            return self.repeat(job, r);
        }
        if r.budget.take(now) {
            r.budget.wrote(job.write.key, now);
            return r.flight.add(&r.writes, job);
        }
        // Over budget: told by its summary. The next identical Event is a create again.
        self.correlator.forget(job.write.key);
        if !self.shared.summarise(&job.queued, "budget") {
            self.shared.count("dropped", 1);
            self.shared.not_written(&job.queued, "budget", 1);
        }
    }
}

/// Sleeps until `at`; never resolves for `None`.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
