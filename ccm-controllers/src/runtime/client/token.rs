//! Service-account tokens for `--use-service-account-credentials=true`, as Go's
//! `DynamicControllerClientBuilder` gets them: the ServiceAccount is created in `kube-system` if
//! missing, tokens come from its TokenRequest API (`serviceaccounts/<name>/token`, through the
//! root client), asking for [`TOKEN_EXPIRATION_SECONDS`].
//!
//! Where we differ from Go, deliberately: Go refreshes lazily (the first request after 80 % of
//! the lifetime fetches a new token and waits for it) and, when that refresh fails, goes on
//! sending the old token even once it has expired. Here a task refreshes each token in the
//! background at 80 % of its lifetime, retrying with backoff when that fails; a request uses
//! the current token only while it is valid (with a margin) and otherwise waits for the next
//! one, so no request ever carries an expired token. The lifetime is the server's answer
//! (`spec.expirationSeconds`, which `--service-account-max-token-expiration` may have
//! shortened), counted from just before the request was sent, so clock skew between this
//! process and the API server does not matter (Go compares the server's expiration timestamp
//! with the local clock).
//!
//! Hand-written: kube's own token refresh (`RefreshableToken`) only reads tokens from files or
//! exec plugins; nothing in kube or tower asks the TokenRequest API.

use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Future;
use http::header::AUTHORIZATION;
use http::{HeaderValue, Request};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tower::{Layer, Service};

/// The lifetime asked for each token (Go's `defaultExpirationSeconds`, one hour).
pub(crate) const TOKEN_EXPIRATION_SECONDS: i64 = 3600;
/// The share of a token's lifetime after which it is replaced (Go refreshes with 20 % left).
pub(crate) const REFRESH_AT_PERCENT: u32 = 80;

/// Go's backoff for getting a token at startup: 0.5 s, doubling, four tries.
const STARTUP_TRIES: u32 = 4;
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// The longest sleep between two failed refreshes.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A token is not sent when less than this is left of it (or a tenth of its lifetime, if
/// shorter): the request must reach the server, possibly after a retry, before it expires.
const EXPIRY_MARGIN: Duration = Duration::from_secs(10);

/// One token and when to stop using it.
#[derive(Clone, Debug)]
struct Token {
    header: HeaderValue,
    /// When the background task replaces it.
    refresh_at: Instant,
    /// When it is no longer sent.
    usable_until: Instant,
}

impl Token {
    fn usable(&self) -> bool {
        Instant::now() < self.usable_until
    }
}

/// The tokens of one ServiceAccount, kept fresh by a background task that ends when the last
/// clone is dropped. Cheap to clone; every client of the account shares one.
#[derive(Clone)]
pub(crate) struct ServiceAccountTokens {
    shared: Arc<Shared>,
}

struct Shared {
    namespace: String,
    name: String,
    /// The root client, which asks for the tokens.
    root: Client,
    expiration_seconds: i64,
    current: watch::Sender<Token>,
}

impl std::fmt::Debug for ServiceAccountTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountTokens")
            .field("namespace", &self.shared.namespace)
            .field("name", &self.shared.name)
            .finish_non_exhaustive()
    }
}

impl ServiceAccountTokens {
    /// Creates ServiceAccount `namespace/name` if missing and gets its first token, both with
    /// `root`, trying four times over about 7 s as Go does; then starts the background refresh.
    /// `expiration_seconds` is the lifetime asked for ([`TOKEN_EXPIRATION_SECONDS`]).
    pub(crate) async fn start(
        root: Client,
        namespace: &str,
        name: &str,
        expiration_seconds: i64,
    ) -> Result<Self, kube::Error> {
        let mut delay = FIRST_BACKOFF;
        let mut tries = 0;
        let first = loop {
            tries += 1;
            let attempt = async {
                get_or_create_account(&root, namespace, name).await?;
                request_token(&root, namespace, name, expiration_seconds).await
            };
            match attempt.await {
                Ok(token) => break token,
                Err(e) if tries >= STARTUP_TRIES => return Err(e),
                Err(e) => {
                    tracing::warn!(service_account = %format!("{namespace}/{name}"), error = %e, "getting a service account token failed; retrying in {delay:?}");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
            }
        };
        let (current, _) = watch::channel(first);
        let shared = Arc::new(Shared {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            root,
            expiration_seconds,
            current,
        });
        tokio::spawn(refresh(Arc::downgrade(&shared)));
        Ok(ServiceAccountTokens { shared })
    }

    /// The user name the tokens authenticate as: `system:serviceaccount:<ns>:<name>`.
    pub(crate) fn username(&self) -> String {
        service_account_username(&self.shared.namespace, &self.shared.name)
    }

    /// The current token's `Authorization` header, waiting for a new token while the current
    /// one is no longer usable.
    async fn header(shared: Arc<Shared>) -> HeaderValue {
        let mut rx = shared.current.subscribe();
        loop {
            {
                let token = rx.borrow_and_update();
                if token.usable() {
                    return token.header.clone();
                }
            }
            // The sender lives in `shared`, which this future holds: `changed` cannot fail
            // while it runs, but never spin if it did.
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// `system:serviceaccount:<namespace>:<name>`, the user a ServiceAccount's tokens
/// authenticate as.
pub(crate) fn service_account_username(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// Replaces the token at [`REFRESH_AT_PERCENT`] of its lifetime, retrying failures with
/// backoff, until the tokens are dropped.
async fn refresh(shared: Weak<Shared>) {
    loop {
        let Some(refresh_at) = shared.upgrade().map(|s| s.current.borrow().refresh_at) else {
            return;
        };
        tokio::time::sleep_until(refresh_at).await;
        let mut delay = FIRST_BACKOFF;
        loop {
            let Some(s) = shared.upgrade() else { return };
            match request_token(&s.root, &s.namespace, &s.name, s.expiration_seconds).await {
                Ok(token) => {
                    tracing::debug!(service_account = %format!("{}/{}", s.namespace, s.name), "service account token refreshed");
                    s.current.send_replace(token);
                    break;
                }
                Err(e) => {
                    let expired = !s.current.borrow().usable();
                    tracing::warn!(
                        service_account = %format!("{}/{}", s.namespace, s.name),
                        error = %e,
                        expired,
                        "refreshing the service account token failed; retrying in {delay:?}{}",
                        if expired { " (its requests wait for a new token)" } else { "" }
                    );
                    drop(s);
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
}

/// Get-or-create, as Go's `getOrCreateServiceAccount` (a create that lost a race is fine).
async fn get_or_create_account(
    root: &Client,
    namespace: &str,
    name: &str,
) -> Result<(), kube::Error> {
    let api: Api<ServiceAccount> = Api::namespaced(root.clone(), namespace);
    if api.get_opt(name).await?.is_some() {
        return Ok(());
    }
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    match api.create(&PostParams::default(), &account).await {
        Ok(_) => {
            tracing::info!(service_account = %format!("{namespace}/{name}"), "created service account");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// One TokenRequest; the lifetime counts from just before it was sent.
async fn request_token(
    root: &Client,
    namespace: &str,
    name: &str,
    expiration_seconds: i64,
) -> Result<Token, kube::Error> {
    let api: Api<ServiceAccount> = Api::namespaced(root.clone(), namespace);
    let sent = Instant::now();
    let invalid = |what: &str| {
        kube::Error::Service(
            format!("the TokenRequest of {namespace}/{name} answered {what}").into(),
        )
    };
    // Built and read as JSON: which of TokenRequest's fields are optional differs between the
    // Kubernetes versions k8s-openapi compiles for (`spec`, `spec.audiences` and
    // `status.token` from 1.36), and one code must build for all of them.
    let request: TokenRequest = serde_json::from_value(serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": expiration_seconds, "audiences": []},
    }))
    .map_err(|e| kube::Error::Service(e.into()))?;
    let answer = api
        .create_token_request(name, &PostParams::default(), &request)
        .await?;
    let answer = serde_json::to_value(&answer).map_err(|e| kube::Error::Service(e.into()))?;
    let token = answer["status"]["token"]
        .as_str()
        .filter(|t| !t.is_empty())
        .ok_or_else(|| invalid("no status.token"))?;
    let seconds = answer["spec"]["expirationSeconds"]
        .as_i64()
        .filter(|s| *s > 0)
        .ok_or_else(|| invalid("no spec.expirationSeconds"))?;
    let header = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| invalid("a token that is not a valid header value"))?;
    Ok(token_timing(header, sent, seconds))
}

/// When to refresh and stop sending a token of `seconds` lifetime asked for at `sent`. One
/// second is taken off: the server counts expiry in whole seconds.
fn token_timing(mut header: HeaderValue, sent: Instant, seconds: i64) -> Token {
    header.set_sensitive(true);
    let lifetime = Duration::from_secs(u64::try_from(seconds).unwrap_or(1))
        .saturating_sub(Duration::from_secs(1))
        .max(Duration::from_millis(100));
    let margin = EXPIRY_MARGIN.min(lifetime / 10);
    Token {
        header,
        refresh_at: sent + lifetime * REFRESH_AT_PERCENT / 100,
        usable_until: sent + lifetime - margin,
    }
}

/// A tower layer setting `Authorization: Bearer <token>` from [`ServiceAccountTokens`] on every
/// request; a request waits (in `poll_ready`) while there is no usable token.
#[derive(Clone, Debug)]
pub(crate) struct BearerTokenLayer {
    tokens: ServiceAccountTokens,
}

impl BearerTokenLayer {
    /// A layer using `tokens`.
    pub(crate) fn new(tokens: ServiceAccountTokens) -> Self {
        BearerTokenLayer { tokens }
    }
}

impl<S> Layer<S> for BearerTokenLayer {
    type Service = BearerToken<S>;
    fn layer(&self, inner: S) -> BearerToken<S> {
        BearerToken {
            inner,
            tokens: self.tokens.clone(),
            state: TokenState::Empty,
        }
    }
}

/// The service of [`BearerTokenLayer`].
pub(crate) struct BearerToken<S> {
    inner: S,
    tokens: ServiceAccountTokens,
    state: TokenState,
}

impl<S> std::fmt::Debug for BearerToken<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BearerToken")
            .field("tokens", &self.tokens)
            .finish_non_exhaustive()
    }
}

enum TokenState {
    Empty,
    Waiting(Pin<Box<dyn Future<Output = HeaderValue> + Send>>),
    Ready(HeaderValue),
}

impl<S, B> Service<Request<B>> for BearerToken<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        loop {
            match &mut self.state {
                TokenState::Empty => {
                    let token = self.tokens.shared.current.borrow().clone();
                    self.state = if token.usable() {
                        TokenState::Ready(token.header)
                    } else {
                        TokenState::Waiting(Box::pin(ServiceAccountTokens::header(
                            self.tokens.shared.clone(),
                        )))
                    };
                }
                TokenState::Waiting(wait) => match wait.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(header) => self.state = TokenState::Ready(header),
                },
                TokenState::Ready(_) => return self.inner.poll_ready(cx),
            }
        }
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if let TokenState::Ready(header) = std::mem::replace(&mut self.state, TokenState::Empty) {
            req.headers_mut().insert(AUTHORIZATION, header);
        }
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_token_is_refreshed_at_80_percent_and_not_sent_in_its_last_tenth() {
        let sent = Instant::now();
        let t = token_timing(HeaderValue::from_static("Bearer x"), sent, 3601);
        assert_eq!(t.refresh_at - sent, Duration::from_secs(2880));
        assert_eq!(t.usable_until - sent, Duration::from_secs(3590));
        assert!(t.header.is_sensitive());
        // A short (capped) lifetime: 5 s counted as 4 s; refresh at 3.2 s, unusable from 3.6 s.
        let t = token_timing(HeaderValue::from_static("Bearer x"), sent, 5);
        assert_eq!(t.refresh_at - sent, Duration::from_millis(3200));
        assert_eq!(t.usable_until - sent, Duration::from_millis(3600));
        assert!(t.usable());
        tokio::time::advance(Duration::from_millis(3600)).await;
        assert!(!t.usable());
    }
}
