//! The Normal Events' budget: Normal Events are the lowest-priority writes of the process, so a
//! burst (thousands of Nodes registering, a node sync touching every load balancer) costs the
//! API server a bounded number of Event writes, whatever its size. Pure: no I/O, the time is
//! passed in.
//!
//! - **A budget of their own.** A new Normal Event (a create) takes a token of a bucket of
//!   [`NormalEventBudget::burst`] tokens refilled at [`NormalEventBudget::qps`] per second,
//!   shared by every controller of the process. The controllers' own writes never take from
//!   it (the Event writer has clients of its own), and Warnings never do.
//! - **A summary instead of the Events over budget.** A Normal Event that finds the bucket
//!   empty is not written: it is counted in
//!   `event_recorder_normal_events_not_written_total{component,reason,cause="budget"}` and
//!   folded into the summary of its component, reason, kind and namespace. Once no Event of
//!   that summary was held back for [`NormalEventBudget::summary_quiet`] (the burst is over),
//!   or [`NormalEventBudget::summary_max_age`] after its first one (a burst that goes on), one
//!   summary Event is written on the last object held back, with the same reason, saying how
//!   many Events it stands for, the first and last object and time and the last note (see
//!   [`summary_note`]). Summaries take no token: there is at most one per component, reason,
//!   kind and namespace per `summary_quiet`, and at most [`SUMMARY_KEYS`] wait at once.
//! - **A repeat waits for its window.** A repeat of an Event already written (the correlator's
//!   series count) is patched at most once per [`NormalEventBudget::series_interval`] per
//!   Event: repeats within the window are folded into one PATCH with the latest count, written
//!   when the window ends (repeats take no token: the window bounds them, one PATCH per Event
//!   per window). An "UpdatedLoadBalancer" per load balancer per node-sync pass is then one create
//!   and one PATCH per load balancer per window, with the full count, instead of a PATCH per
//!   pass.
//!
//! Warnings pass none of this: they are never held back, summarised or delayed.
use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use lru::LruCache;
use tokio::time::Instant;

/// Summaries waiting at most at once; a Normal Event over budget whose summary would be one
/// more is only counted.
pub(crate) const SUMMARY_KEYS: usize = 1024;
/// Events whose last write is remembered for the repeat window (as the correlator's caches).
const RECENT_ENTRIES: usize = 4096;

/// How the Event writer budgets Normal Events (see `events/budget.rs`). Warnings are never
/// budgeted.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct NormalEventBudget {
    /// New Normal Events written per second, all controllers together, once the burst is
    /// spent. Default 10 (Go's recorder, which drops what its queue of 1,000 cannot hold,
    /// delivered about 20 per second of a 10,000-Node burst).
    pub qps: f64,
    /// New Normal Events written at once before the rate applies. Default 100.
    pub burst: u32,
    /// A repeat of a Normal Event already written is patched at most once per this interval.
    /// Default 30 s.
    pub series_interval: Duration,
    /// A summary is written once none of its Events was held back for this long. Default 5 s.
    pub summary_quiet: Duration,
    /// ... or this long after the first of them, whichever comes first. Default 60 s.
    pub summary_max_age: Duration,
}

impl Default for NormalEventBudget {
    fn default() -> Self {
        NormalEventBudget {
            qps: 10.0,
            burst: 100,
            series_interval: Duration::from_secs(30),
            summary_quiet: Duration::from_secs(5),
            summary_max_age: Duration::from_secs(60),
        }
    }
}

impl NormalEventBudget {
    /// No budget: every Normal Event is written at once and every repeat patched at once (the
    /// behaviour before 0.4, and client-go's when its queue does not overflow).
    pub fn unlimited() -> Self {
        NormalEventBudget {
            qps: f64::INFINITY,
            burst: u32::MAX,
            series_interval: Duration::ZERO,
            ..NormalEventBudget::default()
        }
    }

    /// This budget with `qps` new Normal Events per second and `burst` at once.
    pub fn with_rate(mut self, qps: f64, burst: u32) -> Self {
        self.qps = qps;
        self.burst = burst;
        self
    }

    /// This budget with repeats patched at most once per `interval`.
    pub fn with_series_interval(mut self, interval: Duration) -> Self {
        self.series_interval = interval;
        self
    }

    /// This budget with summaries written `quiet` after the last Event held back, or
    /// `max_age` after the first.
    pub fn with_summary_delays(mut self, quiet: Duration, max_age: Duration) -> Self {
        self.summary_quiet = quiet;
        self.summary_max_age = max_age;
        self
    }
}

/// What a summary is about: Events of one component and reason on objects of one kind in one
/// namespace.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct SummaryKey {
    pub component: Arc<str>,
    pub reason: String,
    pub kind: String,
    pub namespace: Option<String>,
}

/// The Normal Events held back under one [`SummaryKey`].
#[derive(Clone)]
pub(super) struct Summary {
    /// How many.
    pub count: u64,
    /// The first one's object name and time.
    pub first_object: String,
    pub first_at: Timestamp,
    /// The last one's object (the summary Event regards it), note and time.
    pub last_object: ObjectReference,
    pub last_note: String,
    pub last_at: Timestamp,
    /// The client the last one was to be written with (the summary is written with it).
    pub last_client: Option<kube::Client>,
    opened: Instant,
    refused: Instant,
}

/// The summaries waiting, shared by the writer (Events over budget) and the recorders
/// (Normal Events that find the queue full).
#[derive(Default)]
pub(super) struct Summaries {
    map: HashMap<SummaryKey, Summary>,
}

/// The budget's state in the writer (see the module documentation).
pub(super) struct Budget {
    config: NormalEventBudget,
    tokens: f64,
    at: Instant,
    /// When each Event's last write (create or PATCH) was started, by correlation key.
    recent: LruCache<u64, Instant>,
}

impl Budget {
    pub(super) fn new(config: NormalEventBudget, now: Instant) -> Self {
        Budget {
            config,
            tokens: f64::from(config.burst),
            at: now,
            recent: LruCache::new(NonZeroUsize::new(RECENT_ENTRIES).unwrap_or(NonZeroUsize::MIN)),
        }
    }

    pub(super) fn config(&self) -> &NormalEventBudget {
        &self.config
    }

    /// Takes a token for one Normal write at `now`, if there is one.
    pub(super) fn take(&mut self, now: Instant) -> bool {
        if self.has_token(now) {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Whether a token is there at `now` (without taking it): when not, a new Normal Event
    /// costs no write (it goes to its summary), so the writer takes it from the queue even
    /// while every Normal write slot is held.
    pub(super) fn has_token(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = self.at.max(now);
        let refill = if self.config.qps.is_finite() {
            elapsed * self.config.qps.max(0.0)
        } else {
            f64::INFINITY
        };
        self.tokens = (self.tokens + refill).min(f64::from(self.config.burst));
        self.tokens >= 1.0
    }

    /// When a repeat of Event `key` may be written: `None` now, else the end of its window.
    pub(super) fn repeat_due(&mut self, key: u64, now: Instant) -> Option<Instant> {
        let last = *self.recent.get(&key)?;
        let due = last + self.config.series_interval;
        (due > now).then_some(due)
    }

    /// A write of Event `key` started at `now`.
    pub(super) fn wrote(&mut self, key: u64, now: Instant) {
        if !self.config.series_interval.is_zero() {
            self.recent.put(key, now);
        }
    }
}

impl Summaries {
    /// Folds a Normal Event held back at `now` into its summary; `false` when it is only
    /// counted (too many summaries wait).
    pub(super) fn hold_back(
        &mut self,
        key: SummaryKey,
        object: &ObjectReference,
        note: &str,
        client: Option<&kube::Client>,
        at: Timestamp,
        now: Instant,
    ) -> bool {
        let full = self.map.len() >= SUMMARY_KEYS;
        match self.map.get_mut(&key) {
            Some(s) => {
                s.count += 1;
                s.last_object = object.clone();
                note.clone_into(&mut s.last_note);
                s.last_at = at;
                s.last_client = client.cloned();
                s.refused = now;
                true
            }
            None if full => false,
            None => {
                let name = object.name.clone().unwrap_or_default();
                self.map.insert(
                    key,
                    Summary {
                        count: 1,
                        first_object: name,
                        first_at: at,
                        last_object: object.clone(),
                        last_note: note.to_owned(),
                        last_at: at,
                        last_client: client.cloned(),
                        opened: now,
                        refused: now,
                    },
                );
                true
            }
        }
    }

    fn summary_due(s: &Summary, config: &NormalEventBudget) -> Instant {
        (s.refused + config.summary_quiet).min(s.opened + config.summary_max_age)
    }

    /// The summaries due at `now` (all of them with `all`, at shutdown), taken out.
    pub(super) fn due(
        &mut self,
        now: Instant,
        all: bool,
        config: &NormalEventBudget,
    ) -> Vec<(SummaryKey, Summary)> {
        let due: Vec<SummaryKey> = self
            .map
            .iter()
            .filter(|(_, s)| all || Self::summary_due(s, config) <= now)
            .map(|(k, _)| k.clone())
            .collect();
        due.into_iter()
            .filter_map(|k| self.map.remove_entry(&k))
            .collect()
    }

    /// Summaries waiting.
    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// When the next summary is due.
    pub(super) fn next(&self, config: &NormalEventBudget) -> Option<Instant> {
        self.map
            .values()
            .map(|s| Self::summary_due(s, config))
            .min()
    }
}

/// The note of a summary Event: how many Events of `reason` it stands for, on which objects,
/// when, and the last one's note. Cut to the API's limit by the correlator.
pub(super) fn summary_note(key: &SummaryKey, s: &Summary, budget: &NormalEventBudget) -> String {
    let kind = if key.kind.is_empty() {
        "object"
    } else {
        &key.kind
    };
    let last_object = s.last_object.name.as_deref().unwrap_or_default();
    let seconds = s.last_at.duration_since(s.first_at).as_secs_f64().max(0.0);
    let span = if s.count == 1 {
        format!("on {kind} {last_object} at {}", s.first_at)
    } else {
        format!(
            "on {} {kind}s from {} to {last_object}, {} to {} ({seconds:.1} s)",
            s.count, s.first_object, s.first_at, s.last_at
        )
    };
    format!(
        "{} {} Event(s) of {} not written one by one (Normal Event budget: {}/s, burst {}) {span}; the last: {}",
        s.count, key.reason, key.component, budget.qps, budget.burst, s.last_note
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(reason: &str) -> SummaryKey {
        SummaryKey {
            component: Arc::from("cloud-node-controller"),
            reason: reason.into(),
            kind: "Node".into(),
            namespace: None,
        }
    }

    fn object(name: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("Node".into()),
            name: Some(name.into()),
            ..ObjectReference::default()
        }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn the_bucket_lets_a_burst_through_then_the_rate() {
        let config = NormalEventBudget::default().with_rate(10.0, 100);
        let mut b = Budget::new(config, Instant::now());
        let now = Instant::now();
        assert_eq!((0..1000).filter(|_| b.take(now)).count(), 100);
        // Ten seconds of a burst that goes on: 100 more.
        let mut written = 0;
        for ms in (0..10_000).step_by(10) {
            written += usize::from(b.take(now + Duration::from_millis(ms + 10)));
        }
        // (100 but for the rounding of a hundred-odd tenths of a token.)
        assert!((99..=100).contains(&written), "{written}");
        let mut unlimited = Budget::new(NormalEventBudget::unlimited(), now);
        assert!((0..100_000).all(|_| unlimited.take(now)));
    }

    #[tokio::test(start_paused = true)]
    async fn events_held_back_become_one_summary_when_the_burst_is_over() {
        let config = NormalEventBudget::default().with_rate(10.0, 0);
        let mut b = Budget::new(config, Instant::now());
        let mut sums = Summaries::default();
        let t0 = Instant::now();
        for i in 0..500u64 {
            let now = t0 + Duration::from_millis(10 * i);
            assert!(!b.take(now) || i % 10 == 0);
            assert!(sums.hold_back(
                key("Synced"),
                &object(&format!("n{i}")),
                "Node synced successfully",
                None,
                at(i as i64 / 100),
                now
            ));
        }
        let last = t0 + Duration::from_millis(4990);
        assert!(sums.due(last, false, &config).is_empty(), "burst goes on");
        assert_eq!(sums.next(&config), Some(last + config.summary_quiet));
        let due = sums.due(last + config.summary_quiet, false, &config);
        assert_eq!(due.len(), 1);
        let (k, s) = &due[0];
        assert_eq!(s.count, 500);
        assert_eq!(s.first_object, "n0");
        assert_eq!(s.last_object.name.as_deref(), Some("n499"));
        let note = summary_note(k, s, &config);
        assert!(
            note.starts_with("500 Synced Event(s) of cloud-node-controller not written one by one")
                && note.contains("on 500 Nodes from n0 to n499")
                && note.ends_with("the last: Node synced successfully"),
            "{note}"
        );
        assert_eq!(sums.next(&config), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_that_goes_on_is_summarised_every_max_age() {
        let config = NormalEventBudget::default().with_rate(0.0, 0);
        let mut b = Summaries::default();
        let t0 = Instant::now();
        let mut summaries = 0;
        for s in 0..180u64 {
            let now = t0 + Duration::from_secs(s);
            b.hold_back(key("Synced"), &object("n"), "ok", None, at(0), now);
            summaries += b.due(now, false, &config).len();
        }
        assert_eq!(summaries, 2, "at 60 s and 120 s");
        // Per reason: another reason is another summary; at most SUMMARY_KEYS wait.
        for i in 0..SUMMARY_KEYS {
            b.hold_back(key(&format!("R{i}")), &object("n"), "ok", None, at(0), t0);
        }
        assert!(!b.hold_back(key("one too many"), &object("n"), "ok", None, at(0), t0));
        assert_eq!(b.due(t0, true, &config).len(), SUMMARY_KEYS);
    }

    #[tokio::test(start_paused = true)]
    async fn a_repeat_waits_for_the_end_of_its_window() {
        let config = NormalEventBudget::default();
        let mut b = Budget::new(config, Instant::now());
        let t0 = Instant::now();
        assert_eq!(b.repeat_due(7, t0), None, "never written");
        b.wrote(7, t0);
        assert_eq!(
            b.repeat_due(7, t0 + Duration::from_secs(2)),
            Some(t0 + config.series_interval)
        );
        assert_eq!(b.repeat_due(7, t0 + config.series_interval), None);
        let mut unlimited = Budget::new(NormalEventBudget::unlimited(), t0);
        unlimited.wrote(7, t0);
        assert_eq!(unlimited.repeat_due(7, t0), None);
    }
}
