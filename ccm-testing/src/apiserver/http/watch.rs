//! Watch streams: initial events, live changes filtered per watch, bookmarks, the timeout,
//! and the error event of an expired resourceVersion.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use super::responses::to_partial;
use crate::apiserver::Inner;
use crate::apiserver::resources::ResourceInfo;
use crate::apiserver::state::{Change, EventType, ListOptions, StoredObject, change_kind};
use crate::apiserver::status::ApiError;

/// What a watch sends before its live changes: its initial events, one line at a time from
/// the shared objects, then (`sendInitialEvents`) the end-of-initial-events bookmark.
enum Queued {
    Event(EventType, Arc<StoredObject>),
    InitialEventsEnd,
}

/// Per-watch state for the response stream.
struct WatchStream {
    inner: Arc<Inner>,
    info: &'static ResourceInfo,
    ns: Option<String>,
    opts: ListOptions,
    rx: tokio::sync::broadcast::Receiver<Arc<Change>>,
    close_rx: tokio::sync::watch::Receiver<u64>,
    queue: VecDeque<Queued>,
    deadline: Instant,
    bookmarks: bool,
    next_bookmark: Instant,
    last_rv: u64,
    meta_only: bool,
    done: bool,
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        self.inner.watch_closed(&self.info.qualified());
    }
}

impl WatchStream {
    fn line(&self, ty: &str, obj: Value) -> Bytes {
        let obj = if self.meta_only && ty != "ERROR" {
            to_partial(&obj)
        } else {
            obj
        };
        let mut s = json!({ "type": ty, "object": obj }).to_string();
        s.push('\n');
        Bytes::from(s)
    }

    /// An event about `obj`: its text as stored for every full-object watch of a resource
    /// that presents the stored form (one copy into the line, no serialisation).
    fn event(&self, ty: EventType, obj: &StoredObject) -> Bytes {
        if self.meta_only {
            return self.line(ty.as_str(), obj.presented_value(self.info));
        }
        let object = obj.presented(self.info);
        let ty = ty.as_str();
        Bytes::from(format!("{{\"type\":\"{ty}\",\"object\":{object}}}\n"))
    }

    fn bookmark(&self, annotations: Option<Value>) -> Bytes {
        let mut meta = json!({ "resourceVersion": self.last_rv.to_string() });
        if let Some(a) = annotations {
            meta["annotations"] = a;
        }
        self.line(
            "BOOKMARK",
            json!({ "kind": self.info.kind, "apiVersion": self.info.api_version(), "metadata": meta }),
        )
    }

    async fn next_line(&mut self) -> Option<Bytes> {
        match self.queue.pop_front() {
            Some(Queued::Event(ty, obj)) => return Some(self.event(ty, &obj)),
            Some(Queued::InitialEventsEnd) => {
                return Some(self.bookmark(Some(json!({ "k8s.io/initial-events-end": "true" }))));
            }
            None => {}
        }
        if self.done {
            return None;
        }
        loop {
            let interval = self.inner.bookmark_interval();
            tokio::select! {
                _ = tokio::time::sleep_until(self.deadline) => {
                    self.done = true;
                    return self.bookmarks.then(|| self.bookmark(None));
                }
                _ = tokio::time::sleep_until(self.next_bookmark), if self.bookmarks => {
                    self.next_bookmark = Instant::now() + interval;
                    return Some(self.bookmark(None));
                }
                r = self.close_rx.changed() => {
                    let _ = r;
                    self.done = true;
                    return None;
                }
                r = self.rx.recv() => match r {
                    Ok(change) => {
                        if change.rv <= self.last_rv {
                            continue;
                        }
                        self.last_rv = change.rv;
                        let Some(ty) = change_kind(self.info, self.ns.as_deref(), &self.opts, &change) else {
                            continue;
                        };
                        // The text was serialised once, when the object was written.
                        return Some(self.event(ty, &change.object));
                    }
                    Err(RecvError::Lagged(_)) => {
                        self.done = true;
                        let e = ApiError::expired("The resourceVersion for the provided watch is too old.");
                        return Some(self.line("ERROR", e.to_status()));
                    }
                    Err(RecvError::Closed) => return None,
                }
            }
        }
    }
}

pub(super) fn watch_response(
    inner: &Arc<Inner>,
    info: &'static ResourceInfo,
    ns: Option<&str>,
    opts: ListOptions,
    query: &[(String, String)],
    meta_only: bool,
) -> Result<Response, ApiError> {
    let param = |k: &str| {
        query
            .iter()
            .find(|(qk, _)| qk == k)
            .map(|(_, v)| v.as_str())
    };
    let rv = match param("resourceVersion") {
        None | Some("") => None,
        Some(s) => Some(
            s.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s:?}")))?,
        ),
    };
    let bookmarks = param("allowWatchBookmarks") == Some("true");
    let send_initial = param("sendInitialEvents") == Some("true");
    if send_initial && !inner.watch_list() {
        return Err(ApiError::new(
            422,
            "Invalid",
            "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
        ));
    }
    if send_initial && !bookmarks {
        return Err(ApiError::new(
            422,
            "Invalid",
            "ListOptions.meta.k8s.io \"\" is invalid: allowWatchBookmarks: Required value: sendInitialEvents requires allowWatchBookmarks=true",
        ));
    }
    if send_initial && param("resourceVersionMatch") != Some("NotOlderThan") {
        return Err(ApiError::new(
            422,
            "Invalid",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ));
    }
    let timeout = param("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(Duration::from_secs(1800), Duration::from_secs);
    let close_rx = inner.close_rx();
    let watched = inner.state().watch(info, ns, &opts, rv, send_initial);
    let mut queue = VecDeque::new();
    let (rx, start_rv) = match watched {
        Ok((initial, rx, start_rv)) => {
            queue.extend(initial.into_iter().map(|(ty, obj)| Queued::Event(ty, obj)));
            if send_initial && bookmarks {
                queue.push_back(Queued::InitialEventsEnd);
            }
            (rx, start_rv)
        }
        // kube-apiserver answers 200 and sends the 410 as an ERROR event.
        Err(e) => return Ok(watch_error_response(&e)),
    };
    let interval = inner.bookmark_interval();
    inner.watch_opened(&info.qualified());
    let ws = WatchStream {
        inner: inner.clone(),
        info,
        ns: ns.map(str::to_string),
        opts,
        rx,
        close_rx,
        queue,
        deadline: Instant::now() + timeout,
        bookmarks,
        next_bookmark: Instant::now() + interval,
        last_rv: start_rv,
        meta_only,
        done: false,
    };
    let stream = futures::stream::unfold(ws, |mut ws| async move {
        ws.next_line()
            .await
            .map(|line| (Ok::<Bytes, Infallible>(line), ws))
    });
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// A watch response carrying a single `ERROR` event.
pub(super) fn watch_error_response(e: &ApiError) -> Response {
    let mut s = json!({ "type": "ERROR", "object": e.to_status() }).to_string();
    s.push('\n');
    let mut resp = Response::new(Body::from(s));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}
