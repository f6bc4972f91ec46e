//! Delegated authentication (TokenReview) and authorisation (SubjectAccessReview) as a tower
//! layer, with Go's caches, always-allow paths and refusal on review errors.

use std::collections::BTreeMap;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, Request, StatusCode, header};
use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use moka::Expiry;
use moka::future::Cache;
use rand::Rng;
use sha2::{Digest, Sha256};

use super::args::SecureServingArgs;

/// Go's `system:masters` shortcut: members skip the SubjectAccessReview
/// (`DelegatingAuthorizationOptions.AlwaysAllowGroups` default).
const ALWAYS_ALLOW_GROUP: &str = "system:masters";
/// Added to every authenticated user, as Go's `AuthenticatedGroupAdder` does.
pub(crate) const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// Go's review deadline (`TokenRequestTimeout`, authorisation `ClientTimeout`).
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// Bounds so that a flood of random tokens cannot grow memory without limit.
const TOKEN_CACHE_CAPACITY: u64 = 10_000;
const AUTHZ_CACHE_CAPACITY: u64 = 8_192;

/// The caller as the API server described it in the TokenReview.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct UserInfo {
    /// User name (`system:serviceaccount:ns:name` for a ServiceAccount).
    pub username: String,
    /// User UID.
    pub uid: String,
    /// Groups, including `system:authenticated`.
    pub groups: Vec<String>,
    /// Extra attributes.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The user of the verified client certificate of the connection a request came on; set by
/// the accept loop, read by the authentication layer.
#[derive(Debug, Clone)]
pub(crate) struct ClientCertUser(pub(crate) UserInfo);

/// The outcome of a SubjectAccessReview.
#[derive(Debug, Clone)]
struct Decision {
    allowed: bool,
    reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct AuthzKey {
    user: UserInfo,
    path: String,
    verb: String,
}

/// Per-entry TTL: allowed vs denied decisions (Go's authorized / unauthorized TTLs).
struct DecisionExpiry {
    allowed: Duration,
    denied: Duration,
}

impl Expiry<AuthzKey, Decision> for DecisionExpiry {
    fn expire_after_create(&self, _: &AuthzKey, d: &Decision, _: Instant) -> Option<Duration> {
        Some(if d.allowed { self.allowed } else { self.denied })
    }
}

/// `--authorization-always-allow-paths`: exact paths, or prefixes ending in `*`.
#[derive(Debug, Clone, Default)]
pub(crate) struct AlwaysAllow {
    exact: Vec<String>,
    prefixes: Vec<String>,
}

impl AlwaysAllow {
    /// Validates the paths as Go does: only a trailing `*` is allowed.
    pub(crate) fn new(paths: &[String]) -> Result<Self, String> {
        let mut out = Self::default();
        for p in paths.iter().map(|p| p.trim()).filter(|p| !p.is_empty()) {
            match p.strip_suffix('*') {
                Some(prefix) if prefix.contains('*') => {
                    return Err(format!("only a trailing * is allowed in {p:?}"));
                }
                Some(prefix) => out.prefixes.push(prefix.to_owned()),
                None if p.contains('*') => {
                    return Err(format!("only a trailing * is allowed in {p:?}"));
                }
                None => out.exact.push(p.to_owned()),
            }
        }
        Ok(out)
    }

    pub(crate) fn matches(&self, path: &str) -> bool {
        self.exact.iter().any(|p| p == path) || self.prefixes.iter().any(|p| path.starts_with(p))
    }
}

/// Why a review could not be completed.
#[derive(Debug, thiserror::Error)]
enum ReviewError {
    #[error("{0}")]
    Api(#[from] kube::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("the API server returned no status")]
    NoStatus,
    #[error("token review error: {0}")]
    Rejected(String),
}

/// Delegated authentication and authorisation against the API server.
///
/// Cheap to clone. Wrap a router with [`DelegatedAuth::layer`].
#[derive(Clone)]
pub struct DelegatedAuth {
    inner: Arc<Inner>,
}

struct Inner {
    authn: Api<TokenReview>,
    authz: Api<SubjectAccessReview>,
    tokens: Option<Cache<[u8; 32], Option<UserInfo>>>,
    decisions: Option<Cache<AuthzKey, Decision>>,
    always_allow: AlwaysAllow,
}

impl std::fmt::Debug for DelegatedAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelegatedAuth")
            .field("always_allow", &self.inner.always_allow)
            .finish_non_exhaustive()
    }
}

impl DelegatedAuth {
    /// Builds the authenticator/authoriser from the flags. `authn_client` creates the
    /// TokenReviews, `authz_client` the SubjectAccessReviews (usually both the CCM's client).
    pub fn new(
        args: &SecureServingArgs,
        authn_client: kube::Client,
        authz_client: kube::Client,
    ) -> Result<Self, super::Error> {
        let always_allow =
            AlwaysAllow::new(&args.authorization_always_allow_paths).map_err(|e| {
                super::Error::InvalidFlag(format!("--authorization-always-allow-paths: {e}"))
            })?;
        let token_ttl = args.authentication_token_webhook_cache_ttl;
        let tokens = (!token_ttl.is_zero()).then(|| {
            Cache::builder()
                .max_capacity(TOKEN_CACHE_CAPACITY)
                .time_to_live(token_ttl)
                .build()
        });
        let (allowed, denied) = (
            args.authorization_webhook_cache_authorized_ttl,
            args.authorization_webhook_cache_unauthorized_ttl,
        );
        let decisions = (!(allowed.is_zero() && denied.is_zero())).then(|| {
            Cache::builder()
                .max_capacity(AUTHZ_CACHE_CAPACITY)
                .expire_after(DecisionExpiry { allowed, denied })
                .build()
        });
        Ok(Self {
            inner: Arc::new(Inner {
                authn: Api::all(authn_client),
                authz: Api::all(authz_client),
                tokens,
                decisions,
                always_allow,
            }),
        })
    }

    /// A tower layer that authenticates and authorises every request before the wrapped
    /// service sees it. On success the [`UserInfo`] is in the request extensions (absent on
    /// always-allowed paths) and the `Authorization` header is removed, as Go does.
    pub fn layer(&self) -> DelegatedAuthLayer {
        DelegatedAuthLayer { auth: self.clone() }
    }

    /// Authenticates a bearer token: `Ok(Some(user))`, `Ok(None)` when the API server says the
    /// token is not valid, `Err` when the review failed (never cached).
    async fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, Arc<ReviewError>> {
        let Some(cache) = &self.inner.tokens else {
            return self.review_token(token).await.map_err(Arc::new);
        };
        // Tokens are cached under their SHA-256 so that no token is kept in memory.
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        cache.try_get_with(key, self.review_token(token)).await
    }

    async fn review_token(&self, token: &str) -> Result<Option<UserInfo>, ReviewError> {
        // Built from JSON: `spec.token` is optional up to Kubernetes 1.35 and required from
        // 1.36 in k8s-openapi, and one code must build for every supported version.
        let review: TokenReview = serde_json::from_value(serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }))
        .map_err(|e| ReviewError::Rejected(format!("cannot build the TokenReview: {e}")))?;
        let api = &self.inner.authn;
        let pp = PostParams::default();
        let answer = with_retry(|| api.create(&pp, &review)).await?;
        let status = answer.status.ok_or(ReviewError::NoStatus)?;
        if status.authenticated != Some(true) {
            // Go: a review that carries an error is an error (not cached), otherwise "invalid".
            return match status.error.filter(|e| !e.is_empty()) {
                Some(e) => Err(ReviewError::Rejected(e)),
                None => Ok(None),
            };
        }
        let user = status.user.unwrap_or_default();
        let mut groups = user.groups.unwrap_or_default();
        if !groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
            groups.push(AUTHENTICATED_GROUP.to_owned());
        }
        Ok(Some(UserInfo {
            username: user.username.unwrap_or_default(),
            uid: user.uid.unwrap_or_default(),
            groups,
            extra: user.extra.unwrap_or_default(),
        }))
    }

    async fn authorize(
        &self,
        user: &UserInfo,
        path: &str,
        verb: &str,
    ) -> Result<Decision, Arc<ReviewError>> {
        let key = AuthzKey {
            user: user.clone(),
            path: path.to_owned(),
            verb: verb.to_owned(),
        };
        match &self.inner.decisions {
            Some(cache) => {
                cache
                    .try_get_with(key.clone(), self.review_access(&key))
                    .await
            }
            None => self.review_access(&key).await.map_err(Arc::new),
        }
    }

    async fn review_access(&self, key: &AuthzKey) -> Result<Decision, ReviewError> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(key.user.username.clone()),
                uid: Some(key.user.uid.clone()).filter(|u| !u.is_empty()),
                groups: Some(key.user.groups.clone()),
                extra: Some(key.user.extra.clone()).filter(|e| !e.is_empty()),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(key.path.clone()),
                    verb: Some(key.verb.clone()),
                }),
                resource_attributes: None,
            },
            ..SubjectAccessReview::default()
        };
        let api = &self.inner.authz;
        let pp = PostParams::default();
        let answer = with_retry(|| api.create(&pp, &review)).await?;
        let status = answer.status.ok_or(ReviewError::NoStatus)?;
        let reason = status
            .reason
            .filter(|r| !r.is_empty())
            .or(status.evaluation_error)
            .unwrap_or_default();
        Ok(Decision {
            allowed: status.allowed && status.denied != Some(true),
            reason,
        })
    }

    /// Runs authentication and authorisation for one request. `Ok` lets it through (with the
    /// user, unless the path is always allowed), `Err` is the response to send instead.
    async fn check(
        &self,
        method: &http::Method,
        path: &str,
        headers: &HeaderMap,
        cert_user: Option<UserInfo>,
    ) -> Result<Option<UserInfo>, Response> {
        if self.inner.always_allow.matches(path) {
            return Ok(None);
        }
        // Go's order: a verified client certificate first, then the bearer token.
        let user = match cert_user {
            Some(user) => user,
            None => self.authenticate_request(path, headers).await?,
        };
        if user.groups.iter().any(|g| g == ALWAYS_ALLOW_GROUP) {
            return Ok(Some(user));
        }
        // Go's RequestInfo for a non-resource path: the verb is the lower-cased HTTP method.
        let verb = method.as_str().to_ascii_lowercase();
        match self.authorize(&user, path, &verb).await {
            Ok(d) if d.allowed => Ok(Some(user)),
            Ok(d) => {
                tracing::debug!(path, user = %user.username, reason = %d.reason, "forbidden");
                Err(forbidden(&user.username, &verb, path, &d.reason))
            }
            Err(e) => {
                tracing::error!(path, user = %user.username, error = %e, "authorization review failed");
                Err((
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("Internal Server Error: {path:?}: authorization review failed: {e}"),
                )
                    .into_response())
            }
        }
    }
}

impl DelegatedAuth {
    async fn authenticate_request(
        &self,
        path: &str,
        headers: &HeaderMap,
    ) -> Result<UserInfo, Response> {
        let Some(token) = bearer_token(headers) else {
            tracing::debug!(path, "request without a bearer token refused");
            return Err(unauthorized());
        };
        match self.authenticate(token).await {
            Ok(Some(user)) => Ok(user),
            Ok(None) => {
                tracing::debug!(path, "invalid bearer token");
                Err(unauthorized())
            }
            Err(e) => {
                tracing::error!(path, error = %e, "Unable to authenticate the request");
                Err(unauthorized())
            }
        }
    }
}

/// Go's bearer-token extraction: `Authorization: Bearer <token>` (scheme case-insensitive);
/// anything else counts as no credentials.
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let mut parts = value.splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Go's backoff for webhook reviews (`DefaultAuthWebhookRetryBackoff`: 500 ms × 1.5, jitter
/// 0.2, 5 steps), retrying transport errors, 429 and 5xx, all within [`REVIEW_TIMEOUT`].
async fn with_retry<T, F, Fut>(mut call: F) -> Result<T, ReviewError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let attempts = async {
        let mut delay = Duration::from_millis(500);
        let mut steps = 5;
        loop {
            match call().await {
                Ok(v) => return Ok(v),
                Err(e) if steps > 1 && retriable(&e) => {
                    steps -= 1;
                    let jitter = rand::rng().random_range(0.0..0.2);
                    tokio::time::sleep(delay.mul_f64(1.0 + jitter)).await;
                    delay = delay.mul_f64(1.5);
                }
                Err(e) => return Err(ReviewError::Api(e)),
            }
        }
    };
    tokio::time::timeout(REVIEW_TIMEOUT, attempts)
        .await
        .unwrap_or(Err(ReviewError::Timeout(REVIEW_TIMEOUT)))
}

fn retriable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// A Kubernetes `Status` body, as Go's `responsewriters.ErrorNegotiated` writes it.
fn status_response(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": {},
        "code": code.as_u16(),
    });
    (code, axum::Json(body)).into_response()
}

fn unauthorized() -> Response {
    status_response(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized")
}

fn forbidden(user: &str, verb: &str, path: &str, reason: &str) -> Response {
    let mut message = format!("forbidden: User {user:?} cannot {verb} path {path:?}");
    if !reason.is_empty() {
        message.push_str(": ");
        message.push_str(reason);
    }
    status_response(StatusCode::FORBIDDEN, "Forbidden", &message)
}

/// The tower [`Layer`](tower::Layer) returned by [`DelegatedAuth::layer`].
#[derive(Clone, Debug)]
pub struct DelegatedAuthLayer {
    auth: DelegatedAuth,
}

impl<S> tower::Layer<S> for DelegatedAuthLayer {
    type Service = DelegatedAuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DelegatedAuthService {
            auth: self.auth.clone(),
            inner,
        }
    }
}

/// The service produced by [`DelegatedAuthLayer`].
#[derive(Clone, Debug)]
pub struct DelegatedAuthService<S> {
    auth: DelegatedAuth,
    inner: S,
}

impl<S> tower::Service<Request<Body>> for DelegatedAuthService<S>
where
    S: tower::Service<Request<Body>, Response = Response> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        // The clone that was driven to readiness is the one that serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let auth = self.auth.clone();
        Box::pin(async move {
            let (method, path) = (req.method().clone(), req.uri().path().to_owned());
            let cert_user = req
                .extensions()
                .get::<ClientCertUser>()
                .map(|c| c.0.clone());
            match auth.check(&method, &path, req.headers(), cert_user).await {
                Ok(user) => {
                    if let Some(user) = user {
                        req.headers_mut().remove(header::AUTHORIZATION);
                        req.extensions_mut().insert(user);
                    }
                    inner.call(req).await
                }
                Err(response) => Ok(response),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn always_allow_paths() {
        let a = AlwaysAllow::new(&["/healthz".into(), "/debug/*".into(), " ".into()]).unwrap();
        assert!(a.matches("/healthz"));
        assert!(!a.matches("/healthz/ping"));
        assert!(a.matches("/debug/pprof"));
        assert!(!a.matches("/metrics"));
        assert!(AlwaysAllow::new(&["/a*b".into()]).is_err());
        assert!(AlwaysAllow::new(&["/a**".into()]).is_err());
    }

    #[test]
    fn bearer_parsing_follows_go() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer_token(&h), None);
        h.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(bearer_token(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, "bearer abc extra".parse().unwrap());
        assert_eq!(bearer_token(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer_token(&h), None);
        h.insert(header::AUTHORIZATION, "Bearer".parse().unwrap());
        assert_eq!(bearer_token(&h), None);
    }

    #[test]
    fn forbidden_message_matches_go() {
        let r = forbidden("system:serviceaccount:m:p", "get", "/metrics", "");
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
    }
}
