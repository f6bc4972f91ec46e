//! The Kubernetes clients: configuration from `--kubeconfig` / `--master` / in-cluster, one
//! client per controller ([`ClientFactory`]: Go's controller client builders, with
//! `--use-service-account-credentials` each controller's ServiceAccount tokens), the
//! `--kube-api-qps` / `--kube-api-burst` token bucket, client request metrics and the user agent.
//!
//! kube has no client-go style QPS/burst limiter, so two tower layers are added with
//! `ClientBuilder::with_layer`:
//!
//! - [`RateLimitLayer`] (outer): a [`TokenBucket`] with client-go semantics, waited on in
//!   `poll_ready`. `kube::Client` puts a `Buffer` in front of the stack, so requests queue in call
//!   order while one waits for its token. A watch counts as one request.
//! - [`RequestMetricsLayer`] (inner, after the limiter as in client-go):
//!   `rest_client_requests_total{code,method,host}` and
//!   `rest_client_request_duration_seconds{verb,host}` (time to response headers).
//! - [`ConnectionLivenessLayer`] (innermost): every connection's liveness bound and the report
//!   of the dead ones (`liveness.rs`).

mod liveness;
mod token;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response, header::USER_AGENT};
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

use crate::machinery::budget::TokenBucket;
use crate::machinery::metrics::MetricsRegistry;
use crate::machinery::shadow::Shadow;
use crate::machinery::shadow::write_guard::WriteGuardLayer;
use crate::options::Options;

pub(crate) use liveness::READ_IDLE_TIMEOUT;
pub(crate) use liveness::{ClientLiveness, ConnectionLivenessLayer, WatchLiveness};
pub(crate) use token::{BearerTokenLayer, ServiceAccountTokens, TOKEN_EXPIRATION_SECONDS};

/// The Kubernetes client could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// `--kubeconfig` could not be read or used.
    #[error("--kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The path given.
        path: String,
        /// What failed.
        message: String,
    },
    /// `--master` is not a URL.
    #[error("invalid value for --master: {0}")]
    Master(String),
    /// No configuration was found.
    #[error(
        "no Kubernetes configuration: not running in a cluster and no kubeconfig found; pass --kubeconfig or --master ({0})"
    )]
    NoConfig(String),
    /// The client could not be constructed from the configuration.
    #[error("cannot build the Kubernetes client: {0}")]
    Build(String),
    /// `--use-service-account-credentials`: the ServiceAccount could not be created, or no
    /// token could be had from its TokenRequest API.
    #[error(
        "--use-service-account-credentials: cannot get a token of ServiceAccount {name} (the CCM's own identity needs get and create on serviceaccounts and create on serviceaccounts/token in kube-system): {message}"
    )]
    ServiceAccount {
        /// `namespace/name`.
        name: String,
        /// What failed.
        message: String,
    },
}

/// Loads the client configuration as Go's `clientcmd.BuildConfigFromFlags` does: `--kubeconfig`
/// (with `--master` overriding its server), else `--master` alone, else in-cluster, else the
/// default kubeconfig (`$KUBECONFIG`, `~/.kube/config`).
pub(crate) async fn load_config(options: &Options) -> Result<Config, ClientError> {
    let master = match &options.kube.master {
        Some(m) if !m.is_empty() => Some(
            m.parse::<http::Uri>()
                .map_err(|e| ClientError::Master(format!("{m:?}: {e}")))?,
        ),
        _ => None,
    };
    // An empty `--kubeconfig=` means none, as in Go.
    let kubeconfig = options
        .kube
        .kubeconfig
        .as_ref()
        .filter(|p| !p.as_os_str().is_empty());
    let mut config = match (kubeconfig, &master) {
        (Some(path), _) => {
            let err = |message: String| ClientError::Kubeconfig {
                path: path.display().to_string(),
                message,
            };
            let kubeconfig = Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| err(e.to_string()))?
        }
        (None, Some(master)) => Config::new(master.clone()),
        (None, None) => match Config::incluster() {
            Ok(c) => c,
            Err(in_cluster) => Config::infer().await.map_err(|e| {
                ClientError::NoConfig(format!("in-cluster: {in_cluster}; kubeconfig: {e}"))
            })?,
        },
    };
    if let Some(master) = master {
        config.cluster_url = master;
    }
    Ok(config)
}

/// The namespace of the controllers' ServiceAccounts (`--use-service-account-credentials`).
pub(crate) const SERVICE_ACCOUNT_NAMESPACE: &str = "kube-system";
/// The client name of the root client (leader election, serving, the provider's
/// `initialize`), the last part of its user agent.
pub(crate) const ROOT_CLIENT_NAME: &str = "cloud-controller-manager";
/// The client name of the shared informers' client, which always has the root credentials.
pub(crate) const INFORMERS_CLIENT_NAME: &str = "shared-informers";

/// The user agent of client `name`, shaped as client-go's `rest.AddUserAgent` makes it:
/// `cloud-controller-manager/<version> (<os>/<arch>) kubernetes/unknown/<name>`
/// (client-go's default user agent, whose last part is the Kubernetes commit, unknown here,
/// then `/` and the client's name). With `--use-service-account-credentials` a controller's
/// name is its ServiceAccount's user name, as in Go
/// (`.../system:serviceaccount:kube-system:node-controller`).
pub fn user_agent(version: &str, name: &str) -> String {
    let os = std::env::consts::OS;
    // Go's GOARCH names for the common targets.
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    };
    format!("cloud-controller-manager/{version} ({os}/{arch}) kubernetes/unknown/{name}")
}

/// Builds the API clients of a CCM process, one per client name, as Go's controller client
/// builders do: each has its own `--kube-api-qps`/`--kube-api-burst` token bucket and
/// connections, the request metrics (counted together), and a user agent ending in its name
/// ([`user_agent`]).
///
/// Without `--use-service-account-credentials` every client has the root credentials (those
/// of `--kubeconfig`, or in-cluster). With it, [`ClientFactory::client_for`] gives a client
/// that authenticates as ServiceAccount `kube-system/<name>` (created if missing) with tokens
/// of its TokenRequest API (`ServiceAccountTokens`); the root client asks for them. The
/// root and informer clients keep the root credentials either way. Cheap to clone.
#[derive(Clone)]
pub struct ClientFactory {
    inner: Arc<FactoryInner>,
}

struct FactoryInner {
    /// The root configuration, user agent not set.
    config: Config,
    qps: f64,
    burst: u32,
    version: String,
    metrics_layer: RequestMetricsLayer,
    liveness: ConnectionLivenessLayer,
    service_accounts: bool,
    root: Client,
    /// The token source of each ServiceAccount, shared by its clients.
    tokens: tokio::sync::Mutex<HashMap<String, ServiceAccountTokens>>,
    /// The Event writer's client of each name.
    event_clients: tokio::sync::Mutex<HashMap<String, Client>>,
    /// Shadow mode: every client's writes pass the write guard.
    shadow: Option<Arc<Shadow>>,
}

impl FactoryInner {
    /// The write guard of client `name`, in shadow mode.
    fn guard(&self, name: &str) -> Option<WriteGuardLayer> {
        self.shadow
            .as_ref()
            .map(|s| WriteGuardLayer::new(s.clone(), name))
    }
}

impl std::fmt::Debug for ClientFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientFactory")
            .field("service_accounts", &self.inner.service_accounts)
            .finish_non_exhaustive()
    }
}

impl ClientFactory {
    /// A factory for clients of `config` (the root credentials); `service_accounts` is
    /// `--use-service-account-credentials`. Registers the request metrics in `metrics`.
    pub fn new(
        config: Config,
        qps: f64,
        burst: u32,
        version: &str,
        metrics: &MetricsRegistry,
        service_accounts: bool,
    ) -> Result<Self, ClientError> {
        Self::with_shadow(config, qps, burst, version, metrics, service_accounts, None)
    }

    /// As [`ClientFactory::new`]; with `shadow`, every client sends its writes as dry runs
    /// and no Event (shadow mode, `machinery/shadow`).
    pub(crate) fn with_shadow(
        config: Config,
        qps: f64,
        burst: u32,
        version: &str,
        metrics: &MetricsRegistry,
        service_accounts: bool,
        shadow: Option<Arc<Shadow>>,
    ) -> Result<Self, ClientError> {
        let host = config
            .cluster_url
            .authority()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let metrics_layer = RequestMetricsLayer::new(host.clone(), metrics);
        let liveness = ConnectionLivenessLayer::new(host, READ_IDLE_TIMEOUT, metrics);
        let root = build_with(
            config.clone(),
            &user_agent(version, ROOT_CLIENT_NAME),
            qps,
            burst,
            &metrics_layer,
            liveness.for_client(ROOT_CLIENT_NAME),
            None,
            shadow
                .as_ref()
                .map(|s| WriteGuardLayer::new(s.clone(), ROOT_CLIENT_NAME)),
        )?;
        Ok(ClientFactory {
            inner: Arc::new(FactoryInner {
                config,
                qps,
                burst,
                version: version.to_owned(),
                metrics_layer,
                liveness,
                service_accounts,
                root,
                tokens: tokio::sync::Mutex::new(HashMap::new()),
                event_clients: tokio::sync::Mutex::new(HashMap::new()),
                shadow,
            }),
        })
    }

    /// Whether controllers get ServiceAccount credentials (`--use-service-account-credentials`).
    pub fn uses_service_accounts(&self) -> bool {
        self.inner.service_accounts
    }

    /// Whether each watched path has a live watch (for `/readyz`).
    pub(crate) fn watch_liveness(&self) -> WatchLiveness {
        self.inner.liveness.watches()
    }

    /// The root client (user agent `.../cloud-controller-manager`): leader election, serving,
    /// the provider's `initialize`, and the TokenRequests.
    pub fn root(&self) -> Client {
        self.inner.root.clone()
    }

    /// A new client with the root credentials whose user agent ends in `name` (e.g.
    /// `shared-informers`), whatever `--use-service-account-credentials` says.
    pub fn root_credentials_client(&self, name: &str) -> Result<Client, ClientError> {
        let i = &self.inner;
        build_with(
            i.config.clone(),
            &user_agent(&i.version, name),
            i.qps,
            i.burst,
            &i.metrics_layer,
            i.liveness.for_client(name),
            None,
            i.guard(name),
        )
    }

    /// A new client for the controller client `name` (Go's `ClientBuilder.ClientOrDie(name)`),
    /// with a token bucket of its own: with the root credentials and a user agent ending in
    /// `name`, or with `--use-service-account-credentials` as ServiceAccount
    /// `kube-system/<name>` (created if missing; fails if no token can be had, after four
    /// tries over about 7 s). Call it once per controller, not per request.
    pub async fn client_for(&self, name: &str) -> Result<Client, ClientError> {
        let i = &self.inner;
        if !i.service_accounts {
            return self.root_credentials_client(name);
        }
        let tokens = self.tokens_of(name).await?;
        // No credentials of the root configuration (token, client certificate, exec plugin,
        // impersonation): Go's `rest.AnonymousClientConfig`.
        let mut config = i.config.clone();
        config.auth_info = kube::config::AuthInfo::default();
        build_with(
            config,
            &user_agent(&i.version, &tokens.username()),
            i.qps,
            i.burst,
            &i.metrics_layer,
            i.liveness.for_client(name),
            Some(tokens),
            i.guard(name),
        )
    }

    /// The client that writes the Events of controller client `name`: the same identity as
    /// [`ClientFactory::client_for`] gives (Go records each controller's Events with that
    /// controller's client), its own connections and token bucket (so Event writes never wait
    /// for the controller's requests), one per name.
    pub async fn event_client_for(&self, name: &str) -> Result<Client, ClientError> {
        let mut clients = self.inner.event_clients.lock().await;
        if let Some(client) = clients.get(name) {
            return Ok(client.clone());
        }
        let client = self.client_for(name).await?;
        clients.insert(name.to_owned(), client.clone());
        Ok(client)
    }

    async fn tokens_of(&self, name: &str) -> Result<ServiceAccountTokens, ClientError> {
        let mut tokens = self.inner.tokens.lock().await;
        if let Some(t) = tokens.get(name) {
            return Ok(t.clone());
        }
        let t = ServiceAccountTokens::start(
            self.root(),
            SERVICE_ACCOUNT_NAMESPACE,
            name,
            TOKEN_EXPIRATION_SECONDS,
        )
        .await
        .map_err(|e| ClientError::ServiceAccount {
            name: format!("{SERVICE_ACCOUNT_NAMESPACE}/{name}"),
            message: e.to_string(),
        })?;
        tokens.insert(name.to_owned(), t.clone());
        Ok(t)
    }
}

/// One client: `agent`, its own token bucket, the shared request metrics, the connections'
/// liveness bound ([`READ_IDLE_TIMEOUT`], reported by `liveness`) and, with `tokens`, their
/// bearer token on every request (set after the token bucket let the request go, so a
/// request that waited long still gets a fresh token).
#[allow(clippy::too_many_arguments)] // one call per kind of client, each naming every part
fn build_with(
    mut config: Config,
    agent: &str,
    qps: f64,
    burst: u32,
    metrics_layer: &RequestMetricsLayer,
    liveness: ClientLiveness,
    tokens: Option<ServiceAccountTokens>,
    guard: Option<WriteGuardLayer>,
) -> Result<Client, ClientError> {
    let agent = HeaderValue::from_str(agent)
        .map_err(|e| ClientError::Build(format!("user agent {agent:?}: {e}")))?;
    config.headers.retain(|(name, _)| name != USER_AGENT);
    config.headers.push((USER_AGENT, agent));
    // The liveness bound: a connection silent for this long while a request waits on it is
    // closed and the request fails (and is retried on a new connection). Counted from the
    // request's last write, not from when a pooled connection went idle.
    config.read_timeout = Some(READ_IDLE_TIMEOUT);
    config.reset_reader_on_write = true;
    let limit = RateLimitLayer::new(Arc::new(TokenBucket::new(qps, burst)));
    let builder = ClientBuilder::try_from(config)
        .map_err(|e| ClientError::Build(e.to_string()))?
        .with_layer(&liveness);
    // Shadow mode: the write guard is the outermost layer, so every request of every client
    // passes it (see `machinery/shadow`).
    Ok(match (tokens, guard) {
        (Some(tokens), Some(guard)) => builder
            .with_layer(&BearerTokenLayer::new(tokens))
            .with_layer(metrics_layer)
            .with_layer(&limit)
            .with_layer(&guard)
            .build(),
        (Some(tokens), None) => builder
            .with_layer(&BearerTokenLayer::new(tokens))
            .with_layer(metrics_layer)
            .with_layer(&limit)
            .build(),
        (None, Some(guard)) => builder
            .with_layer(metrics_layer)
            .with_layer(&limit)
            .with_layer(&guard)
            .build(),
        (None, None) => builder.with_layer(metrics_layer).with_layer(&limit).build(),
    })
}

/// A tower layer applying a [`TokenBucket`] to every request.
#[derive(Clone, Debug)]
pub(crate) struct RateLimitLayer {
    bucket: Arc<TokenBucket>,
}

impl RateLimitLayer {
    /// A layer sharing `bucket`.
    pub(crate) fn new(bucket: Arc<TokenBucket>) -> Self {
        RateLimitLayer { bucket }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;
    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            bucket: self.bucket.clone(),
            state: LimitState::Empty,
        }
    }
}

/// The service of [`RateLimitLayer`].
#[derive(Debug)]
pub(crate) struct RateLimit<S> {
    inner: S,
    bucket: Arc<TokenBucket>,
    state: LimitState,
}

#[derive(Debug)]
enum LimitState {
    Empty,
    Waiting(Pin<Box<Sleep>>),
    Ready,
}

impl<S, B> Service<Request<B>> for RateLimit<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        loop {
            match &mut self.state {
                LimitState::Empty => {
                    let wait = self.bucket.reserve();
                    self.state = if wait.is_zero() {
                        LimitState::Ready
                    } else {
                        LimitState::Waiting(Box::pin(tokio::time::sleep(wait)))
                    };
                }
                LimitState::Waiting(sleep) => {
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    self.state = LimitState::Ready;
                }
                LimitState::Ready => return self.inner.poll_ready(cx),
            }
        }
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        self.state = LimitState::Empty;
        self.inner.call(req)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    code: String,
    method: String,
    host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DurationLabels {
    verb: String,
    host: String,
}

/// A tower layer recording client-go's request metrics.
#[derive(Clone, Debug)]
pub(crate) struct RequestMetricsLayer {
    host: Arc<str>,
    requests: Family<RequestLabels, Counter>,
    durations: Family<DurationLabels, Histogram>,
}

impl RequestMetricsLayer {
    /// Registers `rest_client_requests_total` and `rest_client_request_duration_seconds` in
    /// `metrics` (once per registry); `host` is the API server's `host:port`.
    pub(crate) fn new(host: String, metrics: &MetricsRegistry) -> Self {
        let requests = Family::<RequestLabels, Counter>::default();
        let durations = Family::<DurationLabels, Histogram>::new_with_constructor(|| {
            // client-go's buckets.
            Histogram::new([
                0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
            ])
        });
        metrics.register(
            "rest_client_requests",
            "Number of HTTP requests, partitioned by status code, method, and host",
            requests.clone(),
        );
        metrics.register(
            "rest_client_request_duration_seconds",
            "Request latency in seconds (to response headers), by verb and host",
            durations.clone(),
        );
        RequestMetricsLayer {
            host: host.into(),
            requests,
            durations,
        }
    }
}

impl<S> Layer<S> for RequestMetricsLayer {
    type Service = RequestMetrics<S>;
    fn layer(&self, inner: S) -> RequestMetrics<S> {
        RequestMetrics {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`RequestMetricsLayer`].
#[derive(Debug)]
pub(crate) struct RequestMetrics<S> {
    inner: S,
    layer: RequestMetricsLayer,
}

type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> Service<Request<B>> for RequestMetrics<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    RB: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFut<Result<Response<RB>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let method = req.method().as_str().to_owned();
        let layer = self.layer.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let start = Instant::now();
            let result = fut.await;
            let code = match &result {
                Ok(resp) => resp.status().as_u16().to_string(),
                Err(_) => "<error>".to_owned(),
            };
            let host = layer.host.to_string();
            layer
                .durations
                .get_or_create(&DurationLabels {
                    verb: method.clone(),
                    host: host.clone(),
                })
                .observe(start.elapsed().as_secs_f64());
            layer
                .requests
                .get_or_create(&RequestLabels { code, method, host })
                .inc();
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tower::ServiceExt;

    #[tokio::test(start_paused = true)]
    async fn kube_api_qps_and_burst_hold_under_a_burst() {
        // --kube-api-qps=20 --kube-api-burst=30 (Go's defaults): 100 requests at once.
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let start = Instant::now();
        let inner = tower::service_fn(move |_req: Request<()>| {
            record
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(start.elapsed());
            async { Ok::<_, std::convert::Infallible>(Response::new(())) }
        });
        let mut svc = RateLimitLayer::new(Arc::new(TokenBucket::new(20.0, 30))).layer(inner);
        for _ in 0..100 {
            let ready = svc.ready().await.unwrap_or_else(|e| match e {});
            let _ = ready.call(Request::new(())).await;
        }
        let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert_eq!(seen.len(), 100);
        assert_eq!(
            seen.iter().filter(|t| t.is_zero()).count(),
            30,
            "the burst passes at once"
        );
        for second in 1..4u64 {
            let n = seen.iter().filter(|t| t.as_secs() == second).count();
            assert!(n <= 21, "second {second}: {n} requests > qps");
        }
        // (100 - 30) / 20 = 3.5 s.
        assert!(
            seen[99] >= std::time::Duration::from_millis(3_500),
            "{:?}",
            seen[99]
        );
    }
}
