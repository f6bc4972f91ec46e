//! Which Event write a recorded Event becomes: client-go's `EventCorrelator`
//! (`tools/record/events_cache.go`), applied by the writer before it writes. Pure: no I/O, the
//! time is passed in.
//!
//! For each recorded Event, in Go's order:
//!
//! 1. **Aggregation** (`EventAggregator`): Events of one component on one object with the same
//!    type and reason but different notes are "similar". Once [`AGGREGATE_MAX_EVENTS`]
//!    different notes were seen within [`AGGREGATE_INTERVAL`], each further similar Event is
//!    replaced by one Event noted `(combined from similar events): <note>`, and all of them
//!    are counted on that one Event.
//! 2. **Deduplication** (`EventLogger`): an Event identical to one already written (same
//!    component, object, type, reason and note, or the same combined Event) is not created
//!    again: the existing Event's count goes up by one (in `events.k8s.io/v1`, its `series`).
//! 3. **Spam filter** (`EventSourceObjectSpamFilter`): per component and object, a token
//!    bucket of [`SPAM_BURST`] Events refilled by one every [`SPAM_REFILL`]; an Event (new or
//!    repeat) finding it empty is not written. As in Go the repeat is still counted by step 2,
//!    so the next repeat written carries the full count.
//!
//! Each step keeps an LRU of at most [`CACHE_ENTRIES`] keys (Go's `maxLruCacheEntries`), so
//! the memory is bounded whatever is recorded. Keys are 64-bit hashes of the fields named
//! above.
use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::num::NonZeroUsize;
use std::time::Duration;

use jiff::Timestamp;
use lru::LruCache;

use super::Queued;

/// Entries kept per cache (client-go's `maxLruCacheEntries`).
pub(super) const CACHE_ENTRIES: usize = 4096;
/// Different notes of similar Events before they are combined (client-go's
/// `defaultAggregateMaxEvents`).
pub(super) const AGGREGATE_MAX_EVENTS: usize = 10;
/// Similar Events further apart than this start counting afresh (client-go's
/// `defaultAggregateIntervalInSeconds`).
pub(super) const AGGREGATE_INTERVAL: Duration = Duration::from_secs(600);
/// Events per component and object written at once before the spam filter holds them back
/// (client-go's `defaultSpamBurst`).
pub(super) const SPAM_BURST: f64 = 25.0;
/// One more Event per component and object is let through per this interval (client-go's
/// `defaultSpamQPS`, 1/300).
pub(super) const SPAM_REFILL: Duration = Duration::from_secs(300);
/// The note of a combined Event starts with this (client-go's `EventAggregatorByReasonMessageFunc`).
pub(super) const COMBINED_PREFIX: &str = "(combined from similar events): ";
/// The longest note `events.k8s.io/v1` accepts, in bytes; longer notes are cut.
pub(super) const NOTE_MAX_BYTES: usize = 1024;

/// One Event write decided by the [`Correlator`].
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Write {
    /// The deduplication key: writes with the same key go to the same Event.
    pub key: u64,
    /// The Event's name: `<object name>.<first time in hex nanoseconds>`, as client-go.
    pub name: String,
    /// Its note (for a combined Event, the prefixed note it was created with).
    pub note: String,
    /// How many times it was observed: 1 creates the Event, more patch its series.
    pub count: i32,
    /// When it was first observed (the Event's `eventTime`).
    pub first: Timestamp,
    /// When it was last observed (the series' `lastObservedTime`).
    pub last: Timestamp,
}

/// What to do with a recorded Event.
#[derive(Debug, PartialEq)]
pub(super) enum Correlated {
    /// Write it.
    Write(Write),
    /// The spam filter holds it back.
    Filtered,
}

/// The Event a deduplication key was last written as.
struct Observed {
    name: String,
    note: String,
    count: i32,
    first: Timestamp,
}

/// The different notes of similar Events seen in the current interval.
struct Similar {
    notes: HashSet<u64>,
    last: Timestamp,
}

/// A token bucket refilled continuously (as `golang.org/x/time/rate`), checked without
/// waiting. Ten lines, so written here rather than keyed in an LRU of a rate-limit crate.
struct Bucket {
    tokens: f64,
    at: Timestamp,
}

impl Bucket {
    fn take(&mut self, now: Timestamp) -> bool {
        let elapsed = now.duration_since(self.at).as_secs_f64().max(0.0);
        self.at = now.max(self.at);
        self.tokens = (self.tokens + elapsed / SPAM_REFILL.as_secs_f64()).min(SPAM_BURST);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// client-go's `EventCorrelator` for one writer (see the module documentation).
pub(super) struct Correlator {
    similar: LruCache<u64, Similar>,
    observed: LruCache<u64, Observed>,
    spam: LruCache<u64, Bucket>,
}

impl Default for Correlator {
    fn default() -> Self {
        let entries = NonZeroUsize::new(CACHE_ENTRIES).unwrap_or(NonZeroUsize::MIN);
        Correlator {
            similar: LruCache::new(entries),
            observed: LruCache::new(entries),
            spam: LruCache::new(entries),
        }
    }
}

fn hash(value: impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// The component and object an Event is about (Go's spam key, and part of the others).
fn object_key(queued: &Queued) -> u64 {
    let r = &queued.regarding;
    hash((
        &*queued.component,
        &r.api_version,
        &r.kind,
        &r.name,
        &r.namespace,
        &r.uid,
    ))
}

/// `note` cut to at most [`NOTE_MAX_BYTES`], at a character boundary.
fn cut(mut note: String) -> String {
    if note.len() > NOTE_MAX_BYTES {
        let mut end = NOTE_MAX_BYTES;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
    }
    note
}

impl Correlator {
    /// Forgets the Event written under deduplication key `key` (it was not written after
    /// all): the next identical Event creates it.
    pub(super) fn forget(&mut self, key: u64) {
        self.observed.pop(&key);
    }

    /// Correlates `queued`, recorded at `now`.
    pub(super) fn correlate(&mut self, queued: &Queued, now: Timestamp) -> Correlated {
        let object = object_key(queued);
        let warning = matches!(queued.type_, kube::runtime::events::EventType::Warning);
        let similar_key = hash((object, warning, &queued.reason));

        // 1. Aggregation.
        let note_key = hash(&queued.note);
        let similar = self.similar.get_or_insert_mut(similar_key, || Similar {
            notes: HashSet::new(),
            last: now,
        });
        if now.duration_since(similar.last).unsigned_abs() > AGGREGATE_INTERVAL {
            similar.notes.clear();
        }
        similar.last = now;
        similar.notes.insert(note_key);
        let (key, note) = if similar.notes.len() < AGGREGATE_MAX_EVENTS {
            (hash((similar_key, Some(note_key))), queued.note.clone())
        } else {
            // Keep the set at its bound, as Go (`PopAny`).
            if let Some(any) = similar.notes.iter().next().copied() {
                similar.notes.remove(&any);
            }
            (
                hash((similar_key, None::<u64>)),
                format!("{COMBINED_PREFIX}{}", queued.note),
            )
        };

        // 2. Deduplication.
        let write = match self.observed.get_mut(&key) {
            Some(seen) => {
                seen.count = seen.count.saturating_add(1);
                Write {
                    key,
                    name: seen.name.clone(),
                    note: seen.note.clone(),
                    count: seen.count,
                    first: seen.first,
                    last: now,
                }
            }
            None => {
                let object_name = queued
                    .regarding
                    .name
                    .as_deref()
                    .unwrap_or(&queued.component);
                let name = format!("{object_name}.{:x}", now.as_nanosecond());
                let note = cut(note);
                self.observed.put(
                    key,
                    Observed {
                        name: name.clone(),
                        note: note.clone(),
                        count: 1,
                        first: now,
                    },
                );
                Write {
                    key,
                    name,
                    note,
                    count: 1,
                    first: now,
                    last: now,
                }
            }
        };

        // 3. Spam filter.
        let bucket = self.spam.get_or_insert_mut(object, || Bucket {
            tokens: SPAM_BURST,
            at: now,
        });
        if bucket.take(now) {
            Correlated::Write(write)
        } else {
            Correlated::Filtered
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::ObjectReference;
    use kube::runtime::events::EventType;

    use super::*;

    fn queued(reason: &str, name: &str, note: &str) -> Queued {
        Queued {
            component: Arc::from("c"),
            client: None,
            type_: EventType::Normal,
            reason: reason.into(),
            note: note.into(),
            regarding: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                ..ObjectReference::default()
            },
            at: Timestamp::UNIX_EPOCH,
        }
    }

    fn write(c: Correlated) -> Write {
        match c {
            Correlated::Write(w) => w,
            Correlated::Filtered => panic!("filtered"),
        }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    #[test]
    fn an_identical_event_counts_on_the_first_one() {
        let mut c = Correlator::default();
        let first = write(c.correlate(&queued("Synced", "n1", "ok"), at(0)));
        assert_eq!(first.count, 1);
        assert_eq!(first.name, format!("n1.{:x}", at(0).as_nanosecond()));
        let again = write(c.correlate(&queued("Synced", "n1", "ok"), at(5)));
        assert_eq!(
            (again.key, &again.name, again.count),
            (first.key, &first.name, 2)
        );
        assert_eq!((again.first, again.last), (at(0), at(5)));
        // Another note, type, reason or object is another Event.
        for other in [
            queued("Synced", "n1", "other"),
            queued("Other", "n1", "ok"),
            queued("Synced", "n2", "ok"),
        ] {
            let w = write(c.correlate(&other, at(6)));
            assert_eq!(w.count, 1);
            assert_ne!(w.key, first.key);
        }
        let mut warning = queued("Synced", "n1", "ok");
        warning.type_ = EventType::Warning;
        assert_eq!(write(c.correlate(&warning, at(6))).count, 1);
    }

    #[test]
    fn the_tenth_different_note_and_later_ones_are_combined_into_one_event() {
        let mut c = Correlator::default();
        let notes: Vec<Write> = (0..9)
            .map(|i| write(c.correlate(&queued("Failed", "s", &format!("e{i}")), at(i))))
            .collect();
        assert!(
            notes
                .iter()
                .all(|w| w.count == 1 && !w.note.starts_with('('))
        );
        let combined = write(c.correlate(&queued("Failed", "s", "e9"), at(9)));
        assert_eq!(combined.note, format!("{COMBINED_PREFIX}e9"));
        assert_eq!(combined.count, 1);
        let more = write(c.correlate(&queued("Failed", "s", "e10"), at(10)));
        assert_eq!((more.key, more.count), (combined.key, 2));
        // The Event keeps the note it was created with (events.k8s.io/v1 notes are immutable).
        assert_eq!(more.note, combined.note);
        let again = write(c.correlate(&queued("Failed", "s", "e11"), at(11)));
        assert_eq!((again.key, again.count), (combined.key, 3));
        // After a quiet interval the notes count afresh.
        let later = AGGREGATE_INTERVAL.as_secs() as i64 + 20;
        let fresh = write(c.correlate(&queued("Failed", "s", "e12"), at(later)));
        assert_ne!(fresh.key, combined.key);
        assert_eq!(fresh.note, "e12");
    }

    #[test]
    fn the_spam_filter_lets_a_burst_through_then_one_per_refill() {
        let mut c = Correlator::default();
        for i in 0..SPAM_BURST as i64 {
            assert!(matches!(
                c.correlate(&queued(&format!("R{i}"), "s", "n"), at(0)),
                Correlated::Write(_)
            ));
        }
        assert_eq!(
            c.correlate(&queued("R", "s", "n"), at(1)),
            Correlated::Filtered
        );
        // Another object has its own bucket.
        assert!(matches!(
            c.correlate(&queued("R", "other", "n"), at(1)),
            Correlated::Write(_)
        ));
        let refill = SPAM_REFILL.as_secs() as i64;
        let w = write(c.correlate(&queued("R", "s", "n"), at(refill + 1)));
        // The filtered repeat was counted: the written one carries it.
        assert_eq!(w.count, 2);
        assert_eq!(
            c.correlate(&queued("R", "s", "n"), at(refill + 2)),
            Correlated::Filtered
        );
    }

    #[test]
    fn caches_are_bounded() {
        let mut c = Correlator::default();
        for i in 0..(CACHE_ENTRIES + 10) {
            let _ = c.correlate(&queued("Synced", &format!("n{i}"), "ok"), at(0));
        }
        assert_eq!(c.observed.len(), CACHE_ENTRIES);
        assert_eq!(c.similar.len(), CACHE_ENTRIES);
        assert_eq!(c.spam.len(), CACHE_ENTRIES);
    }

    #[test]
    fn a_long_note_is_cut_at_a_character_boundary() {
        let mut c = Correlator::default();
        let long = "é".repeat(NOTE_MAX_BYTES);
        let w = write(c.correlate(&queued("R", "s", &long), at(0)));
        assert!(w.note.len() <= NOTE_MAX_BYTES && w.note.len() >= NOTE_MAX_BYTES - 1);
    }
}
