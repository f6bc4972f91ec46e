//! Kubernetes Events, as the Go controllers emit them (same reasons, same types), written off
//! the reconcile path.
//!
//! As client-go's `record.EventBroadcaster`: [`EventRecorder::normal`] and
//! [`EventRecorder::warning`] only put the Event in a bounded queue
//! ([`DEFAULT_QUEUE_CAPACITY`], client-go's `maxQueuedEvents`) and return; one task per process,
//! the [`EventWriter`], writes them in order. A controller never waits for an Event write (an
//! API request that also takes a token from the client's rate limiter), so a slow or failing
//! events API cannot hold up node initialisation or load-balancer updates. When the queue is
//! full the Event is dropped, as client-go drops it (`DropIfChannelFull`): counted in
//! `event_recorder_events_total{result="dropped"}` and logged (at most one warning every 10 s).
//!
//! The writer publishes through kube's `Recorder`, which writes `events.k8s.io/v1` Events
//! (shown by `kubectl describe` like core/v1 ones) and folds a repeat of the same (object,
//! reason) within six minutes into the first Event's series (a PATCH instead of a new Event).
//! Events are best effort and never fail a reconcile.
//!
//! # Retries
//!
//! As client-go's `recordToSink`, a failed write is tried again, up to [`MAX_TRIES_PER_EVENT`]
//! tries in all, sleeping [`DEFAULT_SLEEP_DURATION`] between tries; the first sleep is a random
//! fraction of it, so that many processes do not retry in step after an API server outage
//! (both are configurable with [`EventWriter::with_retries`]). As in client-go the retries are
//! made inline by the single writer: the Events queued behind a retrying one wait (at most
//! tries × sleep), so Events stay in order. Each further attempt is counted in
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
//! `404` on the PATCH of a series means the series' first Event is gone: as client-go, the
//! writer creates the Event anew at once (that attempt counts as `retried`, not as a try).
//!
//! # Shutdown
//!
//! When told to stop, the writer keeps writing what is queued until a flush deadline. A write
//! in flight at the deadline is abandoned; a retry whose sleep would end after the deadline is
//! not made (so retries never extend shutdown). An Event the server already refused at least
//! once and that is given up on this way counts as `failed`; an Event never (fully) attempted
//! counts as `dropped`, as do the Events still queued.
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::MetricsRegistry;

/// Events queued at most before new ones are dropped (client-go's `maxQueuedEvents`).
pub const DEFAULT_QUEUE_CAPACITY: usize = 1000;
/// How long the writer keeps writing queued Events after it was told to stop.
pub const DEFAULT_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Tries per Event before the writer gives up on it (client-go's `maxTriesPerEvent`).
pub const MAX_TRIES_PER_EVENT: u32 = 12;
/// Sleep between two tries of an Event; the first sleep is a random fraction of it
/// (client-go's `defaultSleepDuration`).
pub const DEFAULT_SLEEP_DURATION: Duration = Duration::from_secs(10);

/// kube's `Recorder` keeps every Event it wrote in the last six minutes (its `CACHE_TTL`) to
/// fold repeats into a series; entries are evicted only by age, when it publishes.
const SERIES_TTL: Duration = Duration::from_secs(6 * 60);
/// Distinct (object, reason) series kept per component before the `Recorder` is replaced by a
/// fresh one (its cache with it). Go's event correlator keeps an LRU of 4,096 entries.
const SERIES_CACHE_ENTRIES: usize = 4096;
/// At most one warning per this interval about dropped or failed Events.
const LOG_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// One Event waiting to be written.
struct Queued {
    component: Arc<str>,
    type_: EventType,
    reason: String,
    note: String,
    regarding: ObjectReference,
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
    /// A queue of [`DEFAULT_QUEUE_CAPACITY`] Events, reported as from `instance` (the
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
        for result in ["written", "retried", "failed", "dropped"] {
            let _ = counts.get_or_create(&ResultLabel { result });
        }
        metrics.register(
            "event_recorder_events",
            "Events by result: written (created, or a repeat patched into its series), retried (each further attempt after a failed one), failed (given up on: the API server refused it for good, could not be reached within the tries, or the flush deadline came during its retries), dropped (the queue was full, the writer had stopped, or the flush deadline came before it was written)",
            counts.clone(),
        );
        let shared = Arc::new(Shared {
            tx,
            capacity,
            counts,
            drop_log: Mutex::new(LogLimiter::default()),
        });
        let writer = EventWriter {
            rx,
            client,
            instance: instance.to_owned(),
            shared: shared.clone(),
            series: HashMap::new(),
            fail_log: LogLimiter::default(),
            max_tries: MAX_TRIES_PER_EVENT,
            sleep: DEFAULT_SLEEP_DURATION,
        };
        (EventBroadcaster { shared }, writer)
    }

    /// A recorder reporting as `component` (Go's event source component, e.g.
    /// `cloud-node-controller`).
    pub fn recorder(&self, component: &str) -> EventRecorder {
        EventRecorder {
            component: Arc::from(component),
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
    pub fn warning<K>(&self, object: &K, reason: &str, note: impl Into<String>)
    where
        K: Resource<DynamicType = ()>,
    {
        self.enqueue(object, EventType::Warning, reason, note.into());
    }

    fn enqueue<K>(&self, object: &K, type_: EventType, reason: &str, note: String)
    where
        K: Resource<DynamicType = ()>,
    {
        let queued = Queued {
            component: self.component.clone(),
            type_,
            reason: reason.to_owned(),
            note,
            regarding: object.object_ref(&()),
        };
        match self.shared.tx.try_send(queued) {
            Ok(()) => {}
            Err(TrySendError::Full(queued)) => {
                self.shared.dropped(&queued, "the event queue is full")
            }
            Err(TrySendError::Closed(queued)) => {
                self.shared.dropped(&queued, "the event writer has stopped")
            }
        }
    }
}

/// kube's `Recorder` of one component, and the series keys it holds (kube does not expose
/// its cache's size, so the writer mirrors it to bound it).
struct Series {
    recorder: Recorder,
    /// Hash of the series key → when it was last written.
    seen: HashMap<u64, Instant>,
}

/// Writes the queued Events, in order, one at a time (as client-go's single recording
/// goroutine), retrying failed writes (see the module documentation). Spawn
/// [`EventWriter::run`] once per [`EventBroadcaster`].
pub struct EventWriter {
    rx: mpsc::Receiver<Queued>,
    client: Client,
    instance: String,
    shared: Arc<Shared>,
    series: HashMap<Arc<str>, Series>,
    fail_log: LogLimiter,
    max_tries: u32,
    sleep: Duration,
}

impl std::fmt::Debug for EventWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventWriter")
            .field("instance", &self.instance)
            .field("max_tries", &self.max_tries)
            .field("sleep", &self.sleep)
            .finish_non_exhaustive()
    }
}

impl EventWriter {
    /// Tries each Event at most `max_tries` times (at least 1: no retry), sleeping
    /// `sleep_duration` between tries, the first sleep a random fraction of it. Defaults:
    /// [`MAX_TRIES_PER_EVENT`] and [`DEFAULT_SLEEP_DURATION`], client-go's values.
    pub fn with_retries(mut self, max_tries: u32, sleep_duration: Duration) -> Self {
        self.max_tries = max_tries.max(1);
        self.sleep = sleep_duration;
        self
    }

    /// Writes queued Events until `stop` fires; then writes what is still queued for at most
    /// `flush_timeout` (a write in flight or retrying when `stop` fires gets the same deadline)
    /// and returns. Events left over, and Events recorded afterwards, are dropped and counted.
    pub async fn run(mut self, stop: CancellationToken, flush_timeout: Duration) {
        let mut deadline: Option<Instant> = None;
        while deadline.is_none() {
            let queued = tokio::select! {
                biased;
                () = stop.cancelled() => break,
                queued = self.rx.recv() => match queued {
                    Some(queued) => queued,
                    // Every sender is gone: nothing can be queued any more.
                    None => return,
                },
                // Idle for longer than kube's series TTL: every cached entry has expired, so
                // fresh recorders behave the same and the memory is returned.
                () = tokio::time::sleep(SERIES_TTL), if !self.series.is_empty() => {
                    self.series.clear();
                    continue;
                }
            };
            self.write(queued, &stop, flush_timeout, &mut deadline)
                .await;
        }
        let deadline = deadline.unwrap_or_else(|| Instant::now() + flush_timeout);
        let mut flushed = 0u64;
        while Instant::now() < deadline {
            let Ok(queued) = self.rx.try_recv() else {
                break;
            };
            self.write(queued, &stop, flush_timeout, &mut Some(deadline))
                .await;
            flushed += 1;
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

    /// Writes one Event, retrying as the module documentation says. Without a `deadline` the
    /// write runs until done unless `stop` fires, which sets the deadline to now +
    /// `flush_timeout`; with one, an attempt is abandoned when it passes and no retry sleep
    /// goes past it.
    async fn write(
        &mut self,
        queued: Queued,
        stop: &CancellationToken,
        flush_timeout: Duration,
        deadline: &mut Option<Instant>,
    ) {
        let key = series_key(&queued);
        let mut tries = 0u32;
        let mut attempted = false;
        loop {
            let recorder = self.recorder_for(&queued.component, key);
            let patching = self
                .series
                .get(&queued.component)
                .is_some_and(|s| s.seen.contains_key(&key));
            let Some(result) = self
                .attempt(recorder, &queued, stop, flush_timeout, deadline)
                .await
            else {
                self.abandoned(
                    &queued,
                    attempted,
                    "abandoned an event write at the flush deadline",
                );
                return;
            };
            attempted = true;
            let error = match result {
                Ok(()) => {
                    self.shared.count("written", 1);
                    if let Some(series) = self.series.get_mut(&queued.component) {
                        series.seen.insert(key, Instant::now());
                    }
                    return;
                }
                Err(error) => error,
            };
            if matches!(&error, kube::Error::Api(s) if s.is_not_found()) {
                // The series' first Event is gone (deleted, or expired on the server): kube
                // would keep patching it until its cache entry expires. Start over.
                self.series.remove(&queued.component);
                if patching {
                    // client-go creates the Event anew in the same try.
                    self.shared.count("retried", 1);
                    continue;
                }
            }
            tries += 1;
            if !retryable(&error) {
                self.failed(&queued, &error, "will not retry");
                return;
            }
            if tries >= self.max_tries {
                self.failed(&queued, &error, "retry limit exceeded");
                return;
            }
            // Randomise the first sleep, as client-go, so that clients do not retry in step.
            let delay = if tries == 1 {
                self.sleep.mul_f64(rand::random::<f64>())
            } else {
                self.sleep
            };
            let wake = Instant::now() + delay;
            if deadline.is_none() {
                tokio::select! {
                    biased;
                    () = tokio::time::sleep_until(wake) => {}
                    () = stop.cancelled() => *deadline = Some(Instant::now() + flush_timeout),
                }
            }
            if deadline.is_some_and(|d| wake > d) {
                self.failed(
                    &queued,
                    &error,
                    "the flush deadline comes before the next try",
                );
                return;
            }
            let max_tries = self.max_tries;
            self.warn_failure(
                &queued,
                &error,
                format_args!("retrying in {delay:?} (try {tries} of {max_tries})"),
            );
            tokio::time::sleep_until(wake).await;
            self.shared.count("retried", 1);
        }
    }

    /// One publish of `queued`; `None` when it was abandoned at the deadline.
    async fn attempt(
        &self,
        recorder: Recorder,
        queued: &Queued,
        stop: &CancellationToken,
        flush_timeout: Duration,
        deadline: &mut Option<Instant>,
    ) -> Option<Result<(), kube::Error>> {
        let event = Event {
            type_: queued.type_,
            reason: queued.reason.clone(),
            note: Some(queued.note.clone()),
            action: queued.reason.clone(),
            secondary: None,
        };
        let regarding = queued.regarding.clone();
        let publish = async move { recorder.publish(&event, &regarding).await };
        tokio::pin!(publish);
        match *deadline {
            Some(d) => tokio::time::timeout_at(d, publish).await.ok(),
            None => tokio::select! {
                biased;
                result = &mut publish => Some(result),
                () = stop.cancelled() => {
                    let d = Instant::now() + flush_timeout;
                    *deadline = Some(d);
                    tokio::time::timeout_at(d, publish).await.ok()
                }
            },
        }
    }

    /// Counts and logs an Event given up on after a failed attempt.
    fn failed(&mut self, queued: &Queued, error: &kube::Error, why: &str) {
        self.shared.count("failed", 1);
        self.warn_failure(queued, error, format_args!("{why}"));
    }

    /// Logs a failed write of `queued` and what happens to it next (`outcome`), at most once
    /// per [`LOG_INTERVAL`]: the failures in between are only counted.
    fn warn_failure(
        &mut self,
        queued: &Queued,
        error: &kube::Error,
        outcome: std::fmt::Arguments<'_>,
    ) {
        if let Some(suppressed) = self.fail_log.allow() {
            tracing::warn!(
                component = %queued.component,
                reason = %queued.reason,
                object = queued.regarding.name.as_deref().unwrap_or_default(),
                %error,
                suppressed,
                "failed to publish event, {outcome} (failures in the next {LOG_INTERVAL:?} are only counted in event_recorder_events_total)"
            );
        }
    }

    /// Counts and logs an Event whose write was cut short by the flush deadline: `failed` if
    /// an earlier attempt had failed, else `dropped`.
    fn abandoned(&self, queued: &Queued, attempted: bool, why: &str) {
        self.shared
            .count(if attempted { "failed" } else { "dropped" }, 1);
        tracing::warn!(
            component = %queued.component,
            reason = %queued.reason,
            object = queued.regarding.name.as_deref().unwrap_or_default(),
            "{why}"
        );
    }

    /// The component's recorder, replaced by a fresh one when writing a new series would take
    /// its cache past [`SERIES_CACHE_ENTRIES`].
    fn recorder_for(&mut self, component: &Arc<str>, key: u64) -> Recorder {
        let now = Instant::now();
        let (client, instance) = (&self.client, &self.instance);
        let fresh = || Series {
            recorder: Recorder::new(
                client.clone(),
                Reporter {
                    controller: component.to_string(),
                    instance: Some(instance.clone()),
                },
            ),
            seen: HashMap::new(),
        };
        let series = self.series.entry(component.clone()).or_insert_with(fresh);
        // The same eviction kube's Recorder runs on its cache before each publish.
        series
            .seen
            .retain(|_, written| now.duration_since(*written) < SERIES_TTL);
        if !series.seen.contains_key(&key) && series.seen.len() >= SERIES_CACHE_ENTRIES {
            tracing::debug!(
                component = %component,
                entries = series.seen.len(),
                "event series cache full; starting a fresh one"
            );
            *series = fresh();
        }
        series.recorder.clone()
    }
}

/// Whether trying the write again may succeed (see the module documentation): transport
/// errors, unreadable answers, `429` and `5xx` are retried; a request that could not be built
/// and every other error status are not.
fn retryable(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        kube::Error::BuildRequest(_) | kube::Error::HttpError(_) => false,
        _ => true,
    }
}

/// The fields of kube's series key that vary within one component's recorder: type, reason
/// (also the action) and the object (reporter and the absent related object are the same).
fn series_key(queued: &Queued) -> u64 {
    let mut h = DefaultHasher::new();
    matches!(queued.type_, EventType::Warning).hash(&mut h);
    queued.reason.hash(&mut h);
    let r = &queued.regarding;
    (&r.api_version, &r.kind, &r.name, &r.namespace, &r.uid).hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_log_limiter_allows_one_log_per_interval_and_counts_the_rest() {
        let mut l = LogLimiter::default();
        assert_eq!(l.allow(), Some(0));
        assert_eq!(l.allow(), None);
        assert_eq!(l.allow(), None);
        tokio::time::advance(LOG_INTERVAL).await;
        assert_eq!(l.allow(), Some(2));
        assert_eq!(l.allow(), None);
    }

    fn queued(reason: &str, name: &str, uid: &str) -> Queued {
        Queued {
            component: Arc::from("c"),
            type_: EventType::Normal,
            reason: reason.into(),
            note: "note".into(),
            regarding: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(name.into()),
                uid: Some(uid.into()),
                ..ObjectReference::default()
            },
        }
    }

    #[test]
    fn the_series_key_follows_type_reason_and_object_but_not_the_note() {
        let a = queued("Synced", "n1", "u1");
        let mut other_note = queued("Synced", "n1", "u1");
        other_note.note = "other".into();
        assert_eq!(series_key(&a), series_key(&other_note));
        let mut warning = queued("Synced", "n1", "u1");
        warning.type_ = EventType::Warning;
        assert_ne!(series_key(&a), series_key(&warning));
        assert_ne!(
            series_key(&a),
            series_key(&queued("SyncFailed", "n1", "u1"))
        );
        assert_ne!(series_key(&a), series_key(&queued("Synced", "n2", "u1")));
        assert_ne!(series_key(&a), series_key(&queued("Synced", "n1", "u2")));
    }

    #[tokio::test]
    async fn a_full_series_cache_starts_a_fresh_recorder_and_expired_entries_do_not_count() {
        let client =
            Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let metrics = MetricsRegistry::new();
        let (_events, mut writer) = EventBroadcaster::new(client, "test", &metrics);
        let component: Arc<str> = Arc::from("c");
        let _ = writer.recorder_for(&component, 0);
        let now = Instant::now();
        let full: HashMap<u64, Instant> =
            (0..SERIES_CACHE_ENTRIES as u64).map(|k| (k, now)).collect();
        let seen = |w: &EventWriter| w.series.get(&component).unwrap().seen.len();

        // A repeat of a cached series keeps the cache (and so its folding).
        writer.series.get_mut(&component).unwrap().seen = full.clone();
        let _ = writer.recorder_for(&component, 7);
        assert_eq!(seen(&writer), SERIES_CACHE_ENTRIES);
        // A new series at the bound: a fresh recorder with an empty cache.
        let _ = writer.recorder_for(&component, u64::MAX);
        assert_eq!(seen(&writer), 0);

        // Entries older than kube's TTL are evicted first, as kube evicts them.
        let old = now.checked_sub(SERIES_TTL).unwrap();
        let mut stale = full;
        for (k, t) in stale.iter_mut() {
            if *k % 2 == 0 {
                *t = old;
            }
        }
        writer.series.get_mut(&component).unwrap().seen = stale;
        let _ = writer.recorder_for(&component, u64::MAX);
        assert_eq!(seen(&writer), SERIES_CACHE_ENTRIES / 2);
    }
}
