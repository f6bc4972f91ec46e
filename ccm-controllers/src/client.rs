//! The Kubernetes client: configuration from `--kubeconfig` / `--master` / in-cluster, the
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

use crate::budget::TokenBucket;
use crate::metrics::MetricsRegistry;
use crate::options::Options;

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
}

/// Loads the client configuration as Go's `clientcmd.BuildConfigFromFlags` does: `--kubeconfig`
/// (with `--master` overriding its server), else `--master` alone, else in-cluster, else the
/// default kubeconfig (`$KUBECONFIG`, `~/.kube/config`).
pub async fn load_config(options: &Options) -> Result<Config, ClientError> {
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

/// Builds the client from `config` with the user agent `cloud-controller-manager/<version>`,
/// the QPS/burst token bucket and the request metrics.
pub fn build_client(
    config: Config,
    qps: f64,
    burst: u32,
    version: &str,
    metrics: &MetricsRegistry,
) -> Result<Client, ClientError> {
    Ok(build_clients(config, qps, burst, version, metrics)?.controllers)
}

/// The API clients of a CCM process, built by [`build_clients`].
#[derive(Clone)]
pub struct Clients {
    /// The controllers' client (informers, object writes, leader election).
    pub controllers: Client,
    /// The Event writer's client: its own connections and its own token bucket, so that
    /// Event writes never queue behind, or take tokens from, the controllers' requests (a Go
    /// CCM likewise records each controller's Events through that controller's own client).
    pub events: Client,
}

/// Builds [`Clients`] from `config`: each as [`build_client`] builds one (same user agent,
/// same `qps`/`burst`), with a token bucket and a connection pool each; the request metrics
/// count both.
pub fn build_clients(
    mut config: Config,
    qps: f64,
    burst: u32,
    version: &str,
    metrics: &MetricsRegistry,
) -> Result<Clients, ClientError> {
    let agent = format!("cloud-controller-manager/{version}");
    let agent = HeaderValue::from_str(&agent)
        .map_err(|e| ClientError::Build(format!("user agent {agent:?}: {e}")))?;
    config.headers.retain(|(name, _)| name != USER_AGENT);
    config.headers.push((USER_AGENT, agent));
    let host = config
        .cluster_url
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let metrics_layer = RequestMetricsLayer::new(host, metrics);
    let build = |config: Config| -> Result<Client, ClientError> {
        let limit = RateLimitLayer::new(Arc::new(TokenBucket::new(qps, burst)));
        let builder =
            ClientBuilder::try_from(config).map_err(|e| ClientError::Build(e.to_string()))?;
        Ok(builder
            .with_layer(&metrics_layer)
            .with_layer(&limit)
            .build())
    };
    Ok(Clients {
        controllers: build(config.clone())?,
        events: build(config)?,
    })
}

/// A tower layer applying a [`TokenBucket`] to every request.
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    bucket: Arc<TokenBucket>,
}

impl RateLimitLayer {
    /// A layer sharing `bucket`.
    pub fn new(bucket: Arc<TokenBucket>) -> Self {
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
pub struct RateLimit<S> {
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
pub struct RequestMetricsLayer {
    host: Arc<str>,
    requests: Family<RequestLabels, Counter>,
    durations: Family<DurationLabels, Histogram>,
}

impl RequestMetricsLayer {
    /// Registers `rest_client_requests_total` and `rest_client_request_duration_seconds` in
    /// `metrics` (once per registry); `host` is the API server's `host:port`.
    pub fn new(host: String, metrics: &MetricsRegistry) -> Self {
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
pub struct RequestMetrics<S> {
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
        // --kube-api-qps=20 --kube-api-burst=30 (the defaults): 100 requests at once.
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
