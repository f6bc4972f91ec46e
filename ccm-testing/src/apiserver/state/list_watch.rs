//! Reads: GET, LIST (with `limit`/`continue` snapshots and `resourceVersionMatch=Exact`) and
//! WATCH (history replay, and the per-watch filter of live changes).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::{
    Change, EventType, Key, ListOptions, Snapshot, State, WatchStart, meta_str, with_type_meta,
};
use crate::apiserver::resources::ResourceInfo;
use crate::apiserver::status::ApiError;

impl State {
    pub(crate) fn get(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        let key = (ns.unwrap_or_default().to_string(), name.to_string());
        self.stores
            .get(info.storage)
            .and_then(|s| s.get(&key))
            .map(|s| with_type_meta(info, info.present(&s.obj)))
            .ok_or_else(|| ApiError::not_found(info, name))
    }

    pub(super) fn matching(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> Vec<Value> {
        let Some(store) = self.stores.get(info.storage) else {
            return Vec::new();
        };
        store
            .iter()
            .filter(|((k_ns, _), _)| ns.is_none_or(|n| n == k_ns))
            .filter(|(_, s)| opts.fields.matches(info, &s.obj) && opts.labels.matches(&s.obj))
            .map(|(_, s)| info.present(&s.obj))
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
    ) -> Result<Vec<Value>, ApiError> {
        if v > self.rv {
            return Err(too_large(v, self.rv));
        }
        if v < self.compacted_rv {
            return Err(ApiError::expired(format!(
                "too old resource version: {v} ({})",
                self.compacted_rv + 1
            )));
        }
        let mut objects: BTreeMap<Key, Value> = self
            .stores
            .get(info.storage)
            .map(|s| {
                s.iter()
                    .map(|(k, st)| (k.clone(), st.obj.clone()))
                    .collect()
            })
            .unwrap_or_default();
        for c in self.history.iter().rev().take_while(|c| c.rv > v) {
            if c.storage != info.storage {
                continue;
            }
            let key = (
                c.namespace.clone(),
                meta_str(&c.object, "name").unwrap_or_default().to_string(),
            );
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
            .iter()
            .filter(|((k_ns, _), _)| ns.is_none_or(|n| n == k_ns))
            .filter(|(_, o)| opts.fields.matches(info, o) && opts.labels.matches(o))
            .map(|(_, o)| info.present(o))
            .collect())
    }

    /// A list response (kind `<Kind>List`).
    pub(crate) fn list(
        &mut self,
        info: &ResourceInfo,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> Result<Value, ApiError> {
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
        let page: Vec<Value> = items
            .get(offset..end)
            .map(<[Value]>::to_vec)
            .unwrap_or_default();
        let mut metadata = json!({ "resourceVersion": rv.to_string() });
        if end < total {
            let id = match &opts.continue_token {
                Some(token) => parse_continue(token)?.0,
                None => {
                    let id = self.next_snapshot;
                    self.next_snapshot += 1;
                    self.snapshots.insert(id, Snapshot { rv, items });
                    id
                }
            };
            metadata["continue"] = json!(format!("{id}-{end}"));
            metadata["remainingItemCount"] = json!(total - end);
        } else if let Some(token) = &opts.continue_token {
            let (id, _) = parse_continue(token)?;
            self.snapshots.remove(&id);
        }
        Ok(json!({
            "kind": format!("{}List", info.kind),
            "apiVersion": info.api_version(),
            "metadata": metadata,
            "items": page,
        }))
    }

    /// The initial events of a watch, and a receiver for the live ones, taken atomically.
    ///
    /// `rv`: `None` or `"0"` starts with synthetic ADDED events for the current state;
    /// `Some(n)` replays the history after `n`, or fails with 410 Expired if compacted.
    pub(crate) fn watch(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        opts: &ListOptions,
        rv: Option<u64>,
        send_initial: bool,
    ) -> Result<WatchStart, ApiError> {
        let rx = self.tx.subscribe();
        let mut initial = Vec::new();
        match rv {
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
                for c in self.history.iter().filter(|c| c.rv > n) {
                    if let Some(ev) = filter_change(info, ns, opts, c) {
                        initial.push((ev.0, ev.1, c.rv));
                    }
                }
            }
            _ => {
                for obj in self.matching(info, ns, opts) {
                    let orv = meta_str(&obj, "resourceVersion")
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(self.rv);
                    initial.push((EventType::Added, with_type_meta(info, obj), orv));
                }
            }
        }
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

/// Filters a change for one watch: selector transitions become ADDED / DELETED as
/// kube-apiserver's watch cache does. Returns the event in the watched resource's form.
pub(crate) fn filter_change(
    info: &ResourceInfo,
    ns: Option<&str>,
    opts: &ListOptions,
    c: &Change,
) -> Option<(EventType, Value)> {
    let kind = change_kind(info, ns, opts, c)?;
    Some((kind, with_type_meta(info, info.present(&c.object))))
}

/// What a watch of `info` in `ns` with `opts` sees of change `c`: `None` when nothing, else
/// the event type (selector transitions turn `MODIFIED` into `ADDED`/`DELETED`).
pub(crate) fn change_kind(
    info: &ResourceInfo,
    ns: Option<&str>,
    opts: &ListOptions,
    c: &Change,
) -> Option<EventType> {
    if c.storage != info.storage {
        return None;
    }
    if let Some(ns) = ns
        && ns != c.namespace
    {
        return None;
    }
    // Labels live in metadata, the same in every representation.
    let matches = |o: &Value| opts.fields.matches(info, o) && opts.labels.matches(o);
    let now = matches(&c.object);
    let before = c.old.as_ref().is_some_and(matches);
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
