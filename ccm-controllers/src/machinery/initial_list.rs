//! How a shared informer gets its initial state: a streaming list where the API server offers
//! one, pages of a list where it does not.
//!
//! A streaming list (the WatchList feature, KEP-3157) is a watch with `sendInitialEvents=true`,
//! `resourceVersionMatch=NotOlderThan` and `allowWatchBookmarks=true`: the server sends the
//! current objects as `ADDED` events, one at a time, then a `BOOKMARK` annotated
//! `k8s.io/initial-events-end: "true"`, and the same watch goes on with the changes. Nothing
//! decodes a page of objects at once and no list snapshot is kept on the server, which is what
//! the first list at 100,000 Nodes (at start and after every failover) costs on both sides.
//! kube's watcher implements the client side (`watcher::Config::streaming_lists`); this module
//! decides when to use it.
//!
//! Kubernetes v1.33 is the oldest server we support, and there the WatchList feature may be
//! off: kube-apiserver then rejects the watch with `422 Invalid` ("sendInitialEvents is
//! forbidden for watch unless the WatchList feature gate is enabled"). A server that does not
//! know the parameter at all ignores it and never sends the end bookmark, so the watch ends
//! (its timeout) and kube's watcher starts the initial list again without having finished one.
//! In both cases the informer falls back, for the rest of the process, to kube's paginated
//! list followed by a watch (client-go's reflector does the same), and logs it once. A `403`
//! (RBAC) or `429` is no answer about the feature and is only retried with backoff, as before.

use std::pin::Pin;

use futures::stream::{self, BoxStream};
use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

type Events<K> = BoxStream<'static, Result<Event<K>, watcher::Error>>;

/// Why the informer stopped asking for streaming lists.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fallback {
    /// The watch with `sendInitialEvents=true` was answered with this status code.
    Rejected(u16),
    /// The initial watch ended twice in a row without the `initial-events-end` bookmark.
    NoEndBookmark,
}

/// Where a streaming informer stands, fed one watcher event at a time.
#[derive(Debug, Default)]
struct Detector {
    /// An initial watch started (`Init`) and has not finished (`InitDone`).
    in_initial: bool,
}

impl Detector {
    /// Whether `item`, seen while streaming, says the server does not offer streaming lists.
    fn observe<K>(&mut self, item: &Result<Event<K>, watcher::Error>) -> Option<Fallback> {
        match item {
            Ok(Event::Init) => {
                let again = self.in_initial;
                self.in_initial = true;
                again.then_some(Fallback::NoEndBookmark)
            }
            Ok(Event::InitDone) => {
                self.in_initial = false;
                None
            }
            Err(watcher::Error::WatchStartFailed(kube::Error::Api(status)))
                if rejects_streaming(status.code) =>
            {
                Some(Fallback::Rejected(status.code))
            }
            _ => None,
        }
    }
}

/// Status codes with which a server turns down `sendInitialEvents` itself: 400 and 422 (the
/// parameter or its `resourceVersionMatch` refused), 404, 405 and 501 (no such watch). Not
/// 403, 410, 429 or 5xx: those say nothing about the feature.
fn rejects_streaming(code: u16) -> bool {
    matches!(code, 400 | 404 | 405 | 422 | 501)
}

/// The watcher events of an informer over `api` with `config`: a streaming initial list
/// first, paginated lists (with `config`'s page size and list semantic) from the moment the
/// server shows it does not offer streaming. Errors are retried with kube's default backoff.
pub(crate) fn watch_events<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource + Clone + std::fmt::Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default,
{
    let streaming: Events<K> = watcher::watcher(api.clone(), config.clone().streaming_lists())
        .default_backoff()
        .boxed();
    with_fallback(streaming, move || {
        watcher::watcher(api, config).default_backoff().boxed()
    })
}

/// `streaming`'s events until it shows the server does not stream initial lists (see
/// [`Detector`]), then `paginated()`'s, for good. The event that showed it is not passed on.
fn with_fallback<K, F>(
    streaming: Events<K>,
    paginated: F,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource + Send + 'static,
    K::DynamicType: Default,
    F: FnOnce() -> Events<K> + Send + 'static,
{
    struct St<K: 'static, F> {
        inner: Events<K>,
        detector: Option<Detector>,
        paginated: Option<F>,
    }
    let state = St {
        inner: streaming,
        detector: Some(Detector::default()),
        paginated: Some(paginated),
    };
    stream::unfold(state, |mut st| async move {
        loop {
            let item = Pin::new(&mut st.inner).next().await?;
            let fallback = st.detector.as_mut().and_then(|d| d.observe(&item));
            let Some(reason) = fallback else {
                return Some((item, st));
            };
            let Some(paginated) = st.paginated.take() else {
                return Some((item, st));
            };
            let kind = K::kind(&K::DynamicType::default()).into_owned();
            match reason {
                Fallback::Rejected(code) => tracing::info!(
                    %kind, status = code,
                    "the API server rejected a streaming list (sendInitialEvents; the WatchList \
                     feature is off or unknown): listing in pages instead"
                ),
                Fallback::NoEndBookmark => tracing::info!(
                    %kind,
                    "the API server's initial watch ended twice without the initial-events-end \
                     bookmark (it ignores sendInitialEvents): listing in pages instead"
                ),
            }
            st.detector = None;
            st.inner = paginated();
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use kube::ResourceExt;
    use kube::core::Status;

    fn rejected(code: u16) -> Result<Event<Node>, watcher::Error> {
        let status = Status::failure("no", "Invalid").with_code(code);
        Err(watcher::Error::WatchStartFailed(kube::Error::Api(
            Box::new(status),
        )))
    }

    fn node(name: &str) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.resource_version = Some("1".into());
        n
    }

    fn names(events: &[Result<Event<Node>, watcher::Error>]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                Ok(Event::Init) => "init".into(),
                Ok(Event::InitApply(n)) => format!("init-apply {}", n.name_any()),
                Ok(Event::InitDone) => "init-done".into(),
                Ok(Event::Apply(n)) => format!("apply {}", n.name_any()),
                Ok(Event::Delete(n)) => format!("delete {}", n.name_any()),
                Err(e) => format!("error {e}"),
            })
            .collect()
    }

    async fn run(
        streaming: Vec<Result<Event<Node>, watcher::Error>>,
    ) -> Vec<Result<Event<Node>, watcher::Error>> {
        let paginated = || {
            stream::iter(vec![
                Ok(Event::Init),
                Ok(Event::InitApply(node("p"))),
                Ok(Event::InitDone),
            ])
            .boxed()
        };
        with_fallback(stream::iter(streaming).boxed(), paginated)
            .collect()
            .await
    }

    #[tokio::test]
    async fn a_server_that_streams_is_never_listed() {
        let got = run(vec![
            Ok(Event::Init),
            Ok(Event::InitApply(node("a"))),
            Ok(Event::InitDone),
            Ok(Event::Apply(node("b"))),
            // A later relist that streams again is fine too.
            Ok(Event::Init),
            Ok(Event::InitDone),
        ])
        .await;
        assert_eq!(
            names(&got),
            [
                "init",
                "init-apply a",
                "init-done",
                "apply b",
                "init",
                "init-done"
            ]
        );
    }

    #[tokio::test]
    async fn a_rejected_streaming_watch_falls_back_to_pages() {
        for code in [400, 404, 405, 422, 501] {
            let got = run(vec![rejected(code), Ok(Event::Init)]).await;
            assert_eq!(
                names(&got),
                ["init", "init-apply p", "init-done"],
                "status {code}"
            );
        }
    }

    #[tokio::test]
    async fn forbidden_throttled_or_failing_servers_keep_streaming() {
        for code in [403, 410, 429, 500, 503] {
            let got = run(vec![rejected(code), Ok(Event::Init), Ok(Event::InitDone)]).await;
            assert_eq!(names(&got).len(), 3, "status {code}");
            assert_eq!(names(&got)[1..], ["init", "init-done"], "status {code}");
        }
    }

    #[tokio::test]
    async fn an_initial_watch_without_the_end_bookmark_falls_back() {
        // The server ignored sendInitialEvents: objects came, the watch timed out, and the
        // watcher started over without ever finishing the initial list.
        let got = run(vec![
            Ok(Event::Init),
            Ok(Event::InitApply(node("a"))),
            Ok(Event::Init),
            Ok(Event::InitApply(node("a"))),
        ])
        .await;
        assert_eq!(
            names(&got),
            ["init", "init-apply a", "init", "init-apply p", "init-done"]
        );
    }
}
