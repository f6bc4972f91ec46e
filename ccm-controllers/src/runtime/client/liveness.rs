//! The liveness bound of every connection to the API server, and what an operator sees when a
//! connection is found dead.
//!
//! A connection can die silently: a NAT, a conntrack table or a load balancer in front of the
//! API server drops its flow, or the backend behind an L7 proxy hangs, and no FIN or RST ever
//! comes (the proxy's kernel may even keep acknowledging). Only the application layer can tell.
//! The bound has two parts (docs/controllers.md, "Connections to the API server"):
//!
//! - every client's connections have a read-idle timeout of [`READ_IDLE_TIMEOUT`]
//!   (`kube::Config::read_timeout`, counted from the last write of a request): a request whose
//!   answer does not start, or a response body that stops, for that long fails with
//!   `TimedOut` and its connection is closed, so the retry goes to a new connection. A pooled
//!   connection idle that long is closed as well;
//! - the shared informers ask the API server to end each watch after
//!   [`WATCH_TIMEOUT_SECONDS`](crate::machinery::informer::WATCH_TIMEOUT_SECONDS) (with
//!   bookmarks), less than the read bound, so a live watch always shows bytes within the bound
//!   and the watcher resumes it from its resourceVersion at once.
//!
//! [`ConnectionLivenessLayer`] reports what the timeout finds: one WARN line per dead connection
//! (the client, the request, how long it was silent), the counter
//! `rest_client_dead_connections_total{host,kind}`, and for watches the [`WatchLiveness`] that
//! `/readyz` reads.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Frame, SizeHint};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::time::Instant;
use tower::{BoxError, Layer, Service};

use crate::machinery::metrics::MetricsRegistry;

/// How long a connection to the API server may stay silent while a request waits on it
/// (for its response to start, or for the next bytes of its body) before it is presumed dead,
/// closed, and the request failed so that it is retried on a new connection.
///
/// 13 s: above the shared informers' server-side watch timeout (10 s, plus 3 s for the API
/// server's close to arrive), below kube's own watch-idle timeout (15 s, which would reconnect
/// without a word). A response that legitimately takes longer to start (kube-apiserver's own
/// request timeout is 60 s) is cut and retried; the measurements and the trade-off are in
/// docs/controllers.md.
pub(crate) const READ_IDLE_TIMEOUT: Duration = Duration::from_secs(13);

/// Whether a request is a watch, and thus counted and reported as one.
fn is_watch<B>(req: &Request<B>) -> bool {
    req.uri()
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"))
}

/// Whether `error` (or one of its sources) is the read-idle timeout.
fn is_read_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// When each watched path (e.g. `/api/v1/nodes`) last lost its watch to a dead connection and
/// has had no live watch since: what `/readyz` reads. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub(crate) struct WatchLiveness {
    down_since: Arc<Mutex<HashMap<String, Instant>>>,
}

impl WatchLiveness {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.down_since.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A watch of `path` lost its connection (first loss since its last live watch counts).
    pub(crate) fn down(&self, path: &str) {
        self.lock()
            .entry(path.to_owned())
            .or_insert_with(Instant::now);
    }

    /// A watch of `path` got its response from the API server.
    fn up(&self, path: &str) {
        self.lock().remove(path);
    }

    /// The watched paths without a live watch for longer than `bound`, with how long.
    pub(crate) fn down_longer_than(&self, bound: Duration) -> Vec<(String, Duration)> {
        let now = Instant::now();
        let mut down: Vec<(String, Duration)> = self
            .lock()
            .iter()
            .map(|(path, since)| (path.clone(), now.saturating_duration_since(*since)))
            .filter(|(_, d)| *d > bound)
            .collect();
        down.sort();
        down
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeadLabels {
    host: String,
    /// `watch` or `request`.
    kind: String,
}

/// A tower layer that reports the connections [`READ_IDLE_TIMEOUT`] finds dead.
#[derive(Clone, Debug)]
pub(crate) struct ConnectionLivenessLayer {
    inner: Arc<LivenessInner>,
}

#[derive(Debug)]
struct LivenessInner {
    host: String,
    bound: Duration,
    dead: Family<DeadLabels, Counter>,
    watches: WatchLiveness,
}

impl ConnectionLivenessLayer {
    /// Registers `rest_client_dead_connections_total` in `metrics` (once per registry); `host`
    /// is the API server's `host:port`, `bound` the read-idle timeout of the clients.
    pub(crate) fn new(host: String, bound: Duration, metrics: &MetricsRegistry) -> Self {
        let dead = Family::<DeadLabels, Counter>::default();
        metrics.register(
            "rest_client_dead_connections",
            "Connections to the API server found dead (silent for longer than the read-idle bound while a request or watch waited on them), by host and kind (watch or request)",
            dead.clone(),
        );
        // Both series exist from the start (at 0), so that an alert's `increase()` sees the
        // first dead connection and a scrape shows the counter before anything went wrong.
        for kind in ["watch", "request"] {
            let _ = dead.get_or_create(&DeadLabels {
                host: host.clone(),
                kind: kind.to_owned(),
            });
        }
        ConnectionLivenessLayer {
            inner: Arc::new(LivenessInner {
                host,
                bound,
                dead,
                watches: WatchLiveness::default(),
            }),
        }
    }

    /// The watch liveness this layer keeps, for `/readyz`.
    pub(crate) fn watches(&self) -> WatchLiveness {
        self.inner.watches.clone()
    }

    /// This layer for the client `client` (its name, for the log line).
    pub(crate) fn for_client(&self, client: &str) -> ClientLiveness {
        ClientLiveness {
            inner: self.inner.clone(),
            client: client.into(),
        }
    }
}

/// [`ConnectionLivenessLayer`] for one client.
#[derive(Clone, Debug)]
pub(crate) struct ClientLiveness {
    inner: Arc<LivenessInner>,
    client: Arc<str>,
}

/// What a dead connection was used for.
#[derive(Clone, Debug)]
struct Use {
    inner: Arc<LivenessInner>,
    client: Arc<str>,
    method: String,
    path: String,
    watch: bool,
}

impl Use {
    /// Reports a dead connection found while `stage` (`waiting for the response`, `reading the
    /// response body`).
    fn dead(&self, stage: &str) {
        let kind = if self.watch { "watch" } else { "request" };
        tracing::warn!(
            client = %self.client,
            kind,
            method = %self.method,
            path = %self.path,
            silent_for = ?self.inner.bound,
            "connection to the API server {} presumed dead: silent for {:?} while {stage}; closed, the {kind} goes on over a new connection",
            self.inner.host,
            self.inner.bound,
        );
        self.inner
            .dead
            .get_or_create(&DeadLabels {
                host: self.inner.host.clone(),
                kind: kind.to_owned(),
            })
            .inc();
        if self.watch {
            self.inner.watches.down(&self.path);
        }
    }
}

impl<S> Layer<S> for ClientLiveness {
    type Service = Liveness<S>;
    fn layer(&self, inner: S) -> Liveness<S> {
        Liveness {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`ClientLiveness`].
#[derive(Debug)]
pub(crate) struct Liveness<S> {
    inner: S,
    layer: ClientLiveness,
}

type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> Service<Request<B>> for Liveness<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + Unpin + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<LivenessBody<RB>>;
    type Error = BoxError;
    type Future = BoxFut<Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let used = Use {
            inner: self.layer.inner.clone(),
            client: self.layer.client.clone(),
            method: req.method().as_str().to_owned(),
            path: req.uri().path().to_owned(),
            watch: is_watch(&req),
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            match fut.await {
                Ok(resp) => {
                    if used.watch && resp.status().is_success() {
                        used.inner.watches.up(&used.path);
                    }
                    Ok(resp.map(|body| LivenessBody {
                        inner: body,
                        used: Some(used),
                    }))
                }
                Err(e) => {
                    let e: BoxError = e.into();
                    if is_read_timeout(e.as_ref()) {
                        used.dead("waiting for the response");
                    }
                    Err(e)
                }
            }
        })
    }
}

/// A response body that reports a read-idle timeout as a dead connection.
pub(crate) struct LivenessBody<B> {
    inner: B,
    used: Option<Use>,
}

impl<B> Body for LivenessBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Err(e))) => {
                let e: BoxError = e.into();
                if is_read_timeout(e.as_ref())
                    && let Some(used) = this.used.take()
                {
                    used.dead("reading the response body");
                }
                Poll::Ready(Some(Err(e)))
            }
            other => other.map(|f| f.map(|r| r.map_err(Into::into))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timed_out_read_is_found_through_the_sources() {
        #[derive(Debug, thiserror::Error)]
        #[error("client error")]
        struct Wrapper(#[source] std::io::Error);
        let e = Wrapper(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(is_read_timeout(&e));
        let other = Wrapper(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(!is_read_timeout(&other));
    }

    #[test]
    fn watches_are_told_from_requests() {
        let watch = Request::get("/api/v1/nodes?allowWatchBookmarks=true&watch=true")
            .body(())
            .unwrap_or_default();
        let list = Request::get("/api/v1/nodes?limit=50")
            .body(())
            .unwrap_or_default();
        assert!(is_watch(&watch));
        assert!(!is_watch(&list));
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_is_down_from_its_first_loss_until_it_is_live_again() {
        let w = WatchLiveness::default();
        w.down("/api/v1/nodes");
        tokio::time::advance(Duration::from_secs(5)).await;
        w.down("/api/v1/nodes"); // a second loss does not restart the clock
        tokio::time::advance(Duration::from_secs(10)).await;
        let down = w.down_longer_than(READ_IDLE_TIMEOUT);
        assert_eq!(down.len(), 1);
        assert_eq!(down[0].0, "/api/v1/nodes");
        w.up("/api/v1/nodes");
        assert!(w.down_longer_than(Duration::ZERO).is_empty());
    }
}
