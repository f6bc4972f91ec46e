//! Reads: GET, LIST (with `limit`/`continue` snapshots and `resourceVersionMatch=Exact`) and
//! WATCH (history replay, and the per-watch filter of live changes).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Change, EventType, Key, ListOptions, Snapshot, State, StoredObject, WatchStart};
use crate::apiserver::resources::ResourceInfo;
use crate::apiserver::status::ApiError;

/// One page of a list: the shared objects, the list's resourceVersion and what continues it.
#[derive(Debug)]
pub(crate) struct ListPage {
    pub(crate) rv: u64,
    pub(crate) items: Vec<Arc<StoredObject>>,
    /// `continue` and `remainingItemCount` when more pages follow.
    pub(crate) more: Option<(String, usize)>,
}

impl ListPage {
    /// The list's `metadata`.
    pub(crate) fn metadata(&self) -> Value {
        let mut metadata = json!({ "resourceVersion": self.rv.to_string() });
        if let Some((token, remaining)) = &self.more {
            metadata["continue"] = json!(token);
            metadata["remainingItemCount"] = json!(remaining);
        }
        metadata
    }
}

/// How long a `continue` token stays valid (etcd's compaction interval in kube-apiserver).
const SNAPSHOT_LIFETIME: Duration = Duration::from_secs(300);

impl ListOptions {
    /// Whether the label and field selectors select `obj`.
    pub(crate) fn matches(&self, obj: &StoredObject) -> bool {
        self.fields.matches(|f| obj.field(f)) && self.labels.matches(|k| obj.label(k))
    }
}

impl State {
    /// The object as `info` presents it, parsed (GET by the harness itself: token reviews).
    pub(crate) fn get(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        self.get_shared(info, ns, name)
            .map(|o| o.presented_value(info))
    }

    /// The stored object (GET).
    pub(crate) fn get_shared(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Arc<StoredObject>, ApiError> {
        let key = (ns.unwrap_or_default().to_string(), name.to_string());
        self.stores
            .get(info.storage)
            .and_then(|s| s.get(&key))
            .map(|s| s.obj.clone())
            .ok_or_else(|| ApiError::not_found(info, name))
    }

    pub(super) fn matching(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> Vec<Arc<StoredObject>> {
        let Some(store) = self.stores.get(info.storage) else {
            return Vec::new();
        };
        store
            .iter()
            .filter(|((k_ns, _), _)| ns.is_none_or(|n| n == k_ns))
            .filter(|(_, s)| opts.matches(&s.obj))
            .map(|(_, s)| s.obj.clone())
            .collect()
    }

    /// Like [`matching`](Self::matching), for the state at resourceVersion `v`: the current
    /// state with the retained history after `v` undone. 504 for a future version, 410 for
    /// one older than the history.
    pub(super) fn matching_at(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        opts: &ListOptions,
        v: u64,
    ) -> Result<Vec<Arc<StoredObject>>, ApiError> {
        if v > self.rv {
            return Err(too_large(v, self.rv));
        }
        if v < self.compacted_rv {
            return Err(ApiError::expired(format!(
                "too old resource version: {v} ({})",
                self.compacted_rv + 1
            )));
        }
        let mut objects: BTreeMap<Key, Arc<StoredObject>> = self
            .stores
            .get(info.storage)
            .map(|s| {
                s.iter()
                    .map(|(k, st)| (k.clone(), st.obj.clone()))
                    .collect()
            })
            .unwrap_or_default();
        for c in self.history.iter().rev().take_while(|c| c.rv > v) {
            if c.storage() != info.storage {
                continue;
            }
            let key = (c.namespace().to_string(), c.object.name().to_string());
            match (&c.kind, &c.old) {
                (EventType::Added, _) => {
                    objects.remove(&key);
                }
                (_, Some(old)) => {
                    objects.insert(key, old.clone());
                }
                (_, None) => {}
            }
        }
        Ok(objects
            .into_iter()
            .filter(|((k_ns, _), _)| ns.is_none_or(|n| n == k_ns))
            .filter(|(_, o)| opts.matches(o))
            .map(|(_, o)| o)
            .collect())
    }

    /// A page of a list (kind `<Kind>List`; [`ListPage`]).
    pub(crate) fn list(
        &mut self,
        info: &ResourceInfo,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> Result<ListPage, ApiError> {
        let now = Instant::now();
        self.snapshots
            .retain(|_, s| now.duration_since(s.taken) < SNAPSHOT_LIFETIME);
        let (rv, items, offset) = match &opts.continue_token {
            Some(token) => {
                let (id, offset) = parse_continue(token)?;
                let snap = self.snapshots.get(&id).ok_or_else(|| {
                    ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
                    )
                })?;
                (snap.rv, snap.items.clone(), offset)
            }
            None => match opts.exact_version {
                Some(v) => (v, Arc::new(self.matching_at(info, ns, opts, v)?), 0),
                None => (self.rv, Arc::new(self.matching(info, ns, opts)), 0),
            },
        };
        let total = items.len();
        let end = match opts.limit {
            Some(l) if l > 0 => (offset + l).min(total),
            _ => total,
        };
        let page: Vec<Arc<StoredObject>> = items
            .get(offset..end)
            .map(<[Arc<StoredObject>]>::to_vec)
            .unwrap_or_default();
        let mut more = None;
        if end < total {
            let id = match &opts.continue_token {
                Some(token) => parse_continue(token)?.0,
                None => {
                    let id = self.next_snapshot;
                    self.next_snapshot += 1;
                    self.snapshots.insert(
                        id,
                        Snapshot {
                            rv,
                            items,
                            taken: now,
                        },
                    );
                    id
                }
            };
            more = Some((format!("{id}-{end}"), total - end));
        } else if let Some(token) = &opts.continue_token {
            let (id, _) = parse_continue(token)?;
            self.snapshots.remove(&id);
        }
        Ok(ListPage {
            rv,
            items: page,
            more,
        })
    }

    /// The initial events of a watch, and a receiver for the live ones, taken atomically.
    ///
    /// `rv`: `None` or `"0"` starts with synthetic ADDED events for the current state;
    /// `Some(n)` replays the history after `n`, or fails with 410 Expired if compacted. The
    /// events hold the shared objects: nothing is copied or serialised here.
    pub(crate) fn watch(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        opts: &ListOptions,
        rv: Option<u64>,
        send_initial: bool,
    ) -> Result<WatchStart, ApiError> {
        let rx = self.tx.subscribe();
        let initial = match rv {
            Some(n) if n != 0 && !send_initial => {
                if n > self.rv {
                    return Err(too_large(n, self.rv));
                }
                if n < self.compacted_rv {
                    return Err(ApiError::expired(format!(
                        "too old resource version: {n} ({})",
                        self.compacted_rv + 1
                    )));
                }
                self.history
                    .iter()
                    .filter(|c| c.rv > n)
                    .filter_map(|c| {
                        change_kind(info, ns, opts, c).map(|kind| (kind, c.object.clone()))
                    })
                    .collect()
            }
            _ => self
                .matching(info, ns, opts)
                .into_iter()
                .map(|o| (EventType::Added, o))
                .collect(),
        };
        Ok((initial, rx, self.rv))
    }

    pub(crate) fn compacted_rv(&self) -> u64 {
        self.compacted_rv
    }
}

/// kube-apiserver's answer to a resourceVersion from the future (after its 3 s wait).
pub(crate) fn too_large(requested: u64, current: u64) -> ApiError {
    ApiError {
        details: Some(json!({
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1
        })),
        ..ApiError::new(
            504,
            "Timeout",
            format!("Too large resource version: {requested}, current: {current}"),
        )
    }
}

fn parse_continue(token: &str) -> Result<(u64, usize), ApiError> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    let (id, off) = token.split_once('-').ok_or_else(bad)?;
    Ok((
        id.parse().map_err(|_| bad())?,
        off.parse().map_err(|_| bad())?,
    ))
}

/// What a watch of `info` in `ns` with `opts` sees of change `c`: `None` when nothing, else
/// the event type (selector transitions turn `MODIFIED` into `ADDED`/`DELETED`).
pub(crate) fn change_kind(
    info: &ResourceInfo,
    ns: Option<&str>,
    opts: &ListOptions,
    c: &Change,
) -> Option<EventType> {
    if c.storage() != info.storage {
        return None;
    }
    if let Some(ns) = ns
        && ns != c.namespace()
    {
        return None;
    }
    // Labels live in metadata, the same in every representation.
    let now = opts.matches(&c.object);
    let before = c.old.as_deref().is_some_and(|o| opts.matches(o));
    let kind = match c.kind {
        EventType::Added if now => EventType::Added,
        EventType::Deleted if before || now => EventType::Deleted,
        EventType::Modified if now && before => EventType::Modified,
        EventType::Modified if now => EventType::Added,
        EventType::Modified if before => EventType::Deleted,
        _ => return None,
    };
    Some(kind)
}
