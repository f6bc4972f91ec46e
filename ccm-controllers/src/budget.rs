//! The cloud-call budget: one wrapper around the provider that every controller calls through.
//!
//! [`BudgetedProvider`] implements [`CloudProvider`] and every capability trait, forwarding to
//! the inner provider's capability only when the inner provider has it (so
//! `budgeted.load_balancer().is_none()` exactly when the provider has no load balancers). Every
//! call passes, in order:
//!
//! 1. the token bucket (`--cloud-api-qps`, `--cloud-api-burst`; unlimited by default), shared by
//!    all controllers: a burst of calls waits for tokens instead of tripping the cloud's own
//!    rate limit;
//! 2. the per-call timeout (`--cloud-api-timeout`): the provider's future is dropped and the
//!    call fails with [`CloudError::Other`] naming the operation and the timeout;
//! 3. metrics: `cloud_provider_requests_total{operation,result}` and
//!    `cloud_provider_request_duration_seconds{operation}` (provider time, without the wait for
//!    a token), where `operation` is the snake_case trait method name and `result` is `success`
//!    or [`CloudError::kind`].
//!
//! `CloudError::Retry` is handled consistently: the budget never retries by itself (a retry
//! inside the budget would hold a worker and a token); the error reaches the controller, which
//! requeues the object after exactly `after`. A zero `after` is raised to
//! [`MIN_RETRY_AFTER`] so a provider cannot make a controller hot-loop.
//!
//! The budget also counts calls in flight, so a graceful shutdown can wait for them
//! ([`BudgetedProvider::wait_idle`]).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ccm_core::{
    CloudError, CloudProvider, CloudResult, Clusters, InitContext, InstanceAnswer, InstanceAnswers,
    InstanceMetadata, Instances, InstancesBatch, InstancesV2, LoadBalancer, LoadBalancerStatus,
    Node, NodeAddress, Route, Routes, Service, Zone, Zones,
};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::metrics::MetricsRegistry;

/// The smallest `CloudError::Retry` delay passed on to controllers.
pub const MIN_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A token bucket with client-go's (`golang.org/x/time/rate`) semantics: `qps` tokens per second
/// refill a bucket of `burst` tokens; a caller takes one token, or reserves the next one and
/// sleeps until it is due. Reservations are served in call order.
///
/// Hand-written (about 30 lines) rather than `governor`: it must run on tokio's clock so tests
/// can use paused time, and it is shared between the cloud budget and the Kubernetes client
/// layer; `governor` uses its own clock (`quanta`) and has no async wait on tokio's timer.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket. `qps` must be > 0 and `burst` >= 1 (the flags are validated before).
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            qps: if qps > 0.0 { qps } else { f64::MIN_POSITIVE },
            burst,
            state: Mutex::new(BucketState {
                tokens: burst,
                last: Instant::now(),
            }),
        }
    }

    /// Takes a token now or reserves the next one; returns how long to wait before using it.
    pub fn reserve(&self) -> Duration {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(s.last).as_secs_f64();
        s.tokens = (s.tokens + elapsed * self.qps).min(self.burst);
        s.last = now;
        s.tokens -= 1.0;
        if s.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-s.tokens / self.qps)
        }
    }

    /// Waits for a token.
    pub async fn acquire(&self) {
        let wait = self.reserve();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// What the budget enforces.
#[derive(Clone, Debug, Default)]
pub struct BudgetConfig {
    /// `(qps, burst)` of the token bucket; `None` is unlimited.
    pub rate_limit: Option<(f64, u32)>,
    /// Per-call timeout; `None` is no timeout.
    pub timeout: Option<Duration>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    operation: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation: &'static str,
}

/// The shared state of the budget: limiter, timeout, metrics and the in-flight count.
#[derive(Debug)]
pub(crate) struct Budget {
    limiter: Option<TokenBucket>,
    timeout: Option<Duration>,
    requests: Family<CallLabels, Counter>,
    durations: Family<OperationLabel, Histogram>,
    in_flight: watch::Sender<usize>,
}

struct InFlight<'a>(&'a watch::Sender<usize>);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Budget {
    fn new(config: &BudgetConfig, metrics: &MetricsRegistry) -> Self {
        let requests = Family::<CallLabels, Counter>::default();
        let durations = Family::<OperationLabel, Histogram>::new_with_constructor(|| {
            // 5 ms … 82 s.
            Histogram::new(exponential_buckets(0.005, 2.0, 15))
        });
        metrics.register(
            "cloud_provider_requests",
            "Cloud provider calls by operation (snake_case method name) and result (success or the CloudError kind)",
            requests.clone(),
        );
        metrics.register(
            "cloud_provider_request_duration_seconds",
            "Duration of cloud provider calls by operation, without the wait for a rate-limit token",
            durations.clone(),
        );
        Budget {
            limiter: config
                .rate_limit
                .map(|(qps, burst)| TokenBucket::new(qps, burst)),
            timeout: config.timeout,
            requests,
            durations,
            in_flight: watch::channel(0).0,
        }
    }

    async fn call<T, F>(&self, operation: &'static str, call: F) -> CloudResult<T>
    where
        F: Future<Output = CloudResult<T>>,
    {
        self.in_flight.send_modify(|n| *n += 1);
        let _guard = InFlight(&self.in_flight);
        if let Some(limiter) = &self.limiter {
            limiter.acquire().await;
        }
        let start = Instant::now();
        let result = match self.timeout {
            Some(timeout) => match tokio::time::timeout(timeout, call).await {
                Ok(result) => result,
                Err(_) => Err(CloudError::msg(format!(
                    "cloud call {operation} timed out after {} (--cloud-api-timeout)",
                    crate::options::format_go_duration(timeout)
                ))),
            },
            None => call.await,
        };
        self.durations
            .get_or_create(&OperationLabel { operation })
            .observe(start.elapsed().as_secs_f64());
        let result = match result {
            Err(CloudError::Retry { after, message }) if after < MIN_RETRY_AFTER => {
                Err(CloudError::Retry {
                    after: MIN_RETRY_AFTER,
                    message,
                })
            }
            other => other,
        };
        let label = match &result {
            Ok(_) => "success",
            Err(e) => e.kind(),
        };
        self.requests
            .get_or_create(&CallLabels {
                operation,
                result: label,
            })
            .inc();
        result
    }
}

/// The provider wrapped in the cloud-call budget. Build it once at startup and hand it to every
/// controller (the runtime does this; [`ControllerContext::cloud`](crate::ControllerContext)
/// is one).
pub struct BudgetedProvider {
    inner: Arc<dyn CloudProvider>,
    budget: Arc<Budget>,
    caps: Caps,
}

/// One wrapper per capability, each holding the inner provider and the shared budget.
struct Caps {
    instances_v2: Cap,
    instances: Cap,
    zones: Cap,
    load_balancer: Cap,
    routes: Cap,
    clusters: Cap,
    instances_batch: Cap,
}

struct Cap {
    inner: Arc<dyn CloudProvider>,
    budget: Arc<Budget>,
}

impl std::fmt::Debug for BudgetedProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetedProvider")
            .field("provider", &self.inner.provider_name())
            .field("budget", &self.budget)
            .finish()
    }
}

impl BudgetedProvider {
    /// Wraps `inner`, registering the budget's metrics in `metrics`.
    pub fn new(
        inner: Arc<dyn CloudProvider>,
        config: &BudgetConfig,
        metrics: &MetricsRegistry,
    ) -> Arc<Self> {
        let budget = Arc::new(Budget::new(config, metrics));
        let cap = || Cap {
            inner: inner.clone(),
            budget: budget.clone(),
        };
        let caps = Caps {
            instances_v2: cap(),
            instances: cap(),
            zones: cap(),
            load_balancer: cap(),
            routes: cap(),
            clusters: cap(),
            instances_batch: cap(),
        };
        Arc::new(BudgetedProvider {
            inner,
            budget,
            caps,
        })
    }

    /// The wrapped provider.
    pub fn inner(&self) -> &Arc<dyn CloudProvider> {
        &self.inner
    }

    /// Cloud calls currently in flight (including those waiting for a token).
    pub fn in_flight(&self) -> usize {
        *self.budget.in_flight.borrow()
    }

    /// Waits until no cloud call is in flight, or `deadline` passes. True if idle.
    pub async fn wait_idle(&self, deadline: Duration) -> bool {
        let mut rx = self.budget.in_flight.subscribe();
        tokio::time::timeout(deadline, rx.wait_for(|n| *n == 0))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

fn missing() -> CloudError {
    // Unreachable through the capability accessors (they return None when the inner provider
    // lacks the capability); kept total instead of panicking.
    CloudError::NotImplemented
}

#[async_trait]
impl CloudProvider for BudgetedProvider {
    fn provider_name(&self) -> &str {
        self.inner.provider_name()
    }

    fn has_cluster_id(&self) -> bool {
        self.inner.has_cluster_id()
    }

    async fn initialize(&self, ctx: InitContext) -> CloudResult<()> {
        self.budget
            .call("initialize", self.inner.initialize(ctx))
            .await
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        self.inner
            .instances_v2()
            .map(|_| &self.caps.instances_v2 as &dyn InstancesV2)
    }

    fn instances(&self) -> Option<&dyn Instances> {
        self.inner
            .instances()
            .map(|_| &self.caps.instances as &dyn Instances)
    }

    fn zones(&self) -> Option<&dyn Zones> {
        self.inner.zones().map(|_| &self.caps.zones as &dyn Zones)
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        self.inner
            .load_balancer()
            .map(|_| &self.caps.load_balancer as &dyn LoadBalancer)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        self.inner
            .routes()
            .map(|_| &self.caps.routes as &dyn Routes)
    }

    fn clusters(&self) -> Option<&dyn Clusters> {
        self.inner
            .clusters()
            .map(|_| &self.caps.clusters as &dyn Clusters)
    }

    fn instances_batch(&self) -> Option<&dyn InstancesBatch> {
        self.inner
            .instances_batch()
            .map(|_| &self.caps.instances_batch as &dyn InstancesBatch)
    }
}

/// Forwards one capability method through the budget.
macro_rules! budgeted {
    ($self:ident, $cap:ident, $op:ident ( $($arg:expr),* )) => {
        $self
            .budget
            .call(stringify!($op), async {
                match $self.inner.$cap() {
                    Some(c) => c.$op($($arg),*).await,
                    None => Err(missing()),
                }
            })
            .await
    };
}

#[async_trait]
impl InstancesV2 for Cap {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        budgeted!(self, instances_v2, instance_exists(node))
    }
    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        budgeted!(self, instances_v2, instance_shutdown(node))
    }
    async fn instance_metadata(&self, node: &Node) -> CloudResult<InstanceMetadata> {
        budgeted!(self, instances_v2, instance_metadata(node))
    }
}

#[async_trait]
impl Instances for Cap {
    async fn node_addresses(&self, node_name: &str) -> CloudResult<Vec<NodeAddress>> {
        budgeted!(self, instances, node_addresses(node_name))
    }
    async fn node_addresses_by_provider_id(
        &self,
        provider_id: &str,
    ) -> CloudResult<Vec<NodeAddress>> {
        budgeted!(self, instances, node_addresses_by_provider_id(provider_id))
    }
    async fn instance_id(&self, node_name: &str) -> CloudResult<String> {
        budgeted!(self, instances, instance_id(node_name))
    }
    async fn instance_type(&self, node_name: &str) -> CloudResult<String> {
        budgeted!(self, instances, instance_type(node_name))
    }
    async fn instance_type_by_provider_id(&self, provider_id: &str) -> CloudResult<String> {
        budgeted!(self, instances, instance_type_by_provider_id(provider_id))
    }
    async fn add_ssh_key_to_all_instances(&self, user: &str, key_data: &[u8]) -> CloudResult<()> {
        budgeted!(
            self,
            instances,
            add_ssh_key_to_all_instances(user, key_data)
        )
    }
    async fn current_node_name(&self, hostname: &str) -> CloudResult<String> {
        budgeted!(self, instances, current_node_name(hostname))
    }
    async fn instance_exists_by_provider_id(&self, provider_id: &str) -> CloudResult<bool> {
        budgeted!(self, instances, instance_exists_by_provider_id(provider_id))
    }
    async fn instance_shutdown_by_provider_id(&self, provider_id: &str) -> CloudResult<bool> {
        budgeted!(
            self,
            instances,
            instance_shutdown_by_provider_id(provider_id)
        )
    }
}

#[async_trait]
impl Zones for Cap {
    async fn get_zone(&self) -> CloudResult<Zone> {
        budgeted!(self, zones, get_zone())
    }
    async fn get_zone_by_provider_id(&self, provider_id: &str) -> CloudResult<Zone> {
        budgeted!(self, zones, get_zone_by_provider_id(provider_id))
    }
    async fn get_zone_by_node_name(&self, node_name: &str) -> CloudResult<Zone> {
        budgeted!(self, zones, get_zone_by_node_name(node_name))
    }
}

#[async_trait]
impl LoadBalancer for Cap {
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        budgeted!(
            self,
            load_balancer,
            get_load_balancer(cluster_name, service)
        )
    }
    fn get_load_balancer_name(&self, cluster_name: &str, service: &Service) -> String {
        // Local and synchronous: no cloud call, so no budget.
        match self.inner.load_balancer() {
            Some(lb) => lb.get_load_balancer_name(cluster_name, service),
            None => ccm_core::default_load_balancer_name(service),
        }
    }
    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        hosts: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        budgeted!(
            self,
            load_balancer,
            ensure_load_balancer(cluster_name, service, hosts)
        )
    }
    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        hosts: &[Arc<Node>],
    ) -> CloudResult<()> {
        budgeted!(
            self,
            load_balancer,
            update_load_balancer(cluster_name, service, hosts)
        )
    }
    async fn ensure_load_balancer_deleted(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<()> {
        budgeted!(
            self,
            load_balancer,
            ensure_load_balancer_deleted(cluster_name, service)
        )
    }
}

#[async_trait]
impl Routes for Cap {
    async fn list_routes(&self, cluster_name: &str) -> CloudResult<Vec<Route>> {
        budgeted!(self, routes, list_routes(cluster_name))
    }
    async fn create_route(
        &self,
        cluster_name: &str,
        name_hint: &str,
        route: &Route,
    ) -> CloudResult<()> {
        budgeted!(self, routes, create_route(cluster_name, name_hint, route))
    }
    async fn delete_route(&self, cluster_name: &str, route: &Route) -> CloudResult<()> {
        budgeted!(self, routes, delete_route(cluster_name, route))
    }
}

#[async_trait]
impl Clusters for Cap {
    async fn list_clusters(&self) -> CloudResult<Vec<String>> {
        budgeted!(self, clusters, list_clusters())
    }
    async fn master(&self, cluster_name: &str) -> CloudResult<String> {
        budgeted!(self, clusters, master(cluster_name))
    }
}

#[async_trait]
impl InstancesBatch for Cap {
    fn max_batch_size(&self) -> usize {
        // Local and synchronous: no cloud call, so no budget.
        self.inner
            .instances_batch()
            .map_or(1, |b| b.max_batch_size().max(1))
    }
    async fn describe_instances(&self, nodes: &[Arc<Node>]) -> CloudResult<InstanceAnswers> {
        let mut answers = budgeted!(self, instances_batch, describe_instances(nodes))?;
        // A per-Node Retry is raised to the same floor as a Retry of a whole call.
        for answer in answers.values_mut() {
            if let InstanceAnswer::Error(CloudError::Retry { after, .. }) = answer
                && *after < MIN_RETRY_AFTER
            {
                *after = MIN_RETRY_AFTER;
            }
        }
        Ok(answers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn token_bucket_holds_qps_under_a_burst() {
        // 10 qps, burst 5: 100 simultaneous callers. In every 1 s window after the first burst
        // at most 10 get through; the first window holds burst + qps.
        let bucket = Arc::new(TokenBucket::new(10.0, 5));
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..100 {
            let b = bucket.clone();
            tasks.spawn(async move {
                b.acquire().await;
                Instant::now().duration_since(start)
            });
        }
        let mut times: Vec<Duration> = tasks.join_all().await;
        times.sort();
        let in_window = |from: f64, to: f64| {
            times
                .iter()
                .filter(|t| t.as_secs_f64() >= from && t.as_secs_f64() < to)
                .count()
        };
        assert_eq!(in_window(0.0, 1e-9), 5, "the burst goes through at once");
        for second in 0..9 {
            let n = in_window(f64::from(second), f64::from(second) + 1.0);
            assert!(n <= 15, "window {second}: {n} calls");
            if second > 0 {
                assert!(n <= 10, "window {second}: {n} calls > qps");
            }
        }
        // 100 calls at 10/s after a burst of 5 need 9.5 s of (virtual) time.
        assert!(times[99] >= Duration::from_millis(9_500), "{:?}", times[99]);
    }
}

#[cfg(test)]
mod batch_tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A provider with `InstancesV2` and `InstancesBatch`; its batch call answers what `answer`
    /// says after `delay`.
    struct Batching {
        max: usize,
        delay: Duration,
        calls: AtomicUsize,
        answer: fn(&[Arc<Node>]) -> CloudResult<InstanceAnswers>,
    }

    #[async_trait]
    impl CloudProvider for Batching {
        fn provider_name(&self) -> &str {
            "batching"
        }
        fn instances_v2(&self) -> Option<&dyn InstancesV2> {
            Some(self)
        }
        fn instances_batch(&self) -> Option<&dyn InstancesBatch> {
            Some(self)
        }
    }

    #[async_trait]
    impl InstancesV2 for Batching {
        async fn instance_exists(&self, _node: &Node) -> CloudResult<bool> {
            Ok(true)
        }
        async fn instance_shutdown(&self, _node: &Node) -> CloudResult<bool> {
            Ok(false)
        }
        async fn instance_metadata(&self, _node: &Node) -> CloudResult<InstanceMetadata> {
            Ok(InstanceMetadata::default())
        }
    }

    #[async_trait]
    impl InstancesBatch for Batching {
        fn max_batch_size(&self) -> usize {
            self.max
        }
        async fn describe_instances(&self, nodes: &[Arc<Node>]) -> CloudResult<InstanceAnswers> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            (self.answer)(nodes)
        }
    }

    fn node(name: &str) -> Arc<Node> {
        let mut node = Node::default();
        node.metadata.name = Some(name.to_owned());
        Arc::new(node)
    }

    fn all_found(nodes: &[Arc<Node>]) -> CloudResult<InstanceAnswers> {
        Ok(nodes
            .iter()
            .map(|n| {
                let name = n.metadata.name.clone().unwrap_or_default();
                let meta = InstanceMetadata {
                    provider_id: format!("batching://{name}"),
                    ..Default::default()
                };
                (name, InstanceAnswer::Found(meta))
            })
            .collect())
    }

    fn batching(
        max: usize,
        delay: Duration,
        answer: fn(&[Arc<Node>]) -> CloudResult<InstanceAnswers>,
    ) -> Arc<Batching> {
        Arc::new(Batching {
            max,
            delay,
            calls: AtomicUsize::new(0),
            answer,
        })
    }

    /// The accessor follows the inner provider, and the declared maximum is passed through
    /// (raised to 1 when the provider declares 0).
    #[test]
    fn offered_only_when_the_provider_offers_it() {
        struct Plain;
        impl CloudProvider for Plain {
            fn provider_name(&self) -> &str {
                "plain"
            }
        }
        let metrics = MetricsRegistry::new();
        let plain = BudgetedProvider::new(Arc::new(Plain), &BudgetConfig::default(), &metrics);
        assert!(plain.instances_batch().is_none());

        let metrics = MetricsRegistry::new();
        let inner = batching(250, Duration::ZERO, all_found);
        let budgeted = BudgetedProvider::new(inner, &BudgetConfig::default(), &metrics);
        assert_eq!(budgeted.instances_batch().unwrap().max_batch_size(), 250);

        let metrics = MetricsRegistry::new();
        let zero = batching(0, Duration::ZERO, all_found);
        let budgeted = BudgetedProvider::new(zero, &BudgetConfig::default(), &metrics);
        assert_eq!(budgeted.instances_batch().unwrap().max_batch_size(), 1);
    }

    /// One token per call whatever the batch size, metrics under `describe_instances`.
    #[tokio::test(start_paused = true)]
    async fn one_token_per_call_and_metrics() {
        let metrics = MetricsRegistry::new();
        let inner = batching(100, Duration::ZERO, all_found);
        let budgeted = BudgetedProvider::new(
            inner.clone(),
            &BudgetConfig {
                rate_limit: Some((1.0, 1)),
                ..Default::default()
            },
            &metrics,
        );
        let batch = budgeted.instances_batch().unwrap();
        let nodes: Vec<Arc<Node>> = (0..100).map(|i| node(&format!("n{i}"))).collect();
        let start = Instant::now();
        let first = batch.describe_instances(&nodes).await.unwrap();
        assert_eq!(first.len(), 100);
        assert_eq!(first["n7"].metadata().unwrap().provider_id, "batching://n7");
        // The burst of one token is spent: the second call waits one second at 1 qps, not 100.
        batch.describe_instances(&nodes).await.unwrap();
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(999) && waited < Duration::from_secs(2),
            "{waited:?}"
        );
        assert_eq!(inner.calls.load(Ordering::SeqCst), 2);
        let text = metrics.encode().unwrap();
        assert!(
            text.contains(
                "cloud_provider_requests_total{operation=\"describe_instances\",result=\"success\"} 2"
            ),
            "{text}"
        );
        assert!(text.contains(
            "cloud_provider_request_duration_seconds_count{operation=\"describe_instances\"} 2"
        ));
    }

    /// The per-call timeout applies; a Retry of the whole call, and of one Node, is raised to
    /// the floor.
    #[tokio::test(start_paused = true)]
    async fn timeout_and_retry() {
        let metrics = MetricsRegistry::new();
        let slow = batching(10, Duration::from_secs(600), all_found);
        let budgeted = BudgetedProvider::new(
            slow,
            &BudgetConfig {
                timeout: Some(Duration::from_secs(30)),
                ..Default::default()
            },
            &metrics,
        );
        let err = budgeted
            .instances_batch()
            .unwrap()
            .describe_instances(&[node("a")])
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "cloud call describe_instances timed out after 30s (--cloud-api-timeout)"
        );
        assert_eq!(budgeted.in_flight(), 0);

        let metrics = MetricsRegistry::new();
        let throttled = batching(10, Duration::ZERO, |_| {
            Err(CloudError::retry(Duration::ZERO, "429"))
        });
        let budgeted = BudgetedProvider::new(throttled, &BudgetConfig::default(), &metrics);
        let err = budgeted
            .instances_batch()
            .unwrap()
            .describe_instances(&[node("a")])
            .await
            .unwrap_err();
        assert_eq!(err.retry_after(), Some(MIN_RETRY_AFTER));
        assert!(metrics.encode().unwrap().contains(
            "cloud_provider_requests_total{operation=\"describe_instances\",result=\"retry\"} 1"
        ));

        let metrics = MetricsRegistry::new();
        let one_throttled = batching(10, Duration::ZERO, |nodes| {
            let mut answers = all_found(nodes)?;
            answers.insert(
                "a".into(),
                InstanceAnswer::Error(CloudError::retry(Duration::from_millis(10), "busy")),
            );
            answers.insert(
                "b".into(),
                InstanceAnswer::Error(CloudError::retry(Duration::from_secs(5), "busy")),
            );
            Ok(answers)
        });
        let budgeted = BudgetedProvider::new(one_throttled, &BudgetConfig::default(), &metrics);
        let answers = budgeted
            .instances_batch()
            .unwrap()
            .describe_instances(&[node("a"), node("b"), node("c")])
            .await
            .unwrap();
        let after = |name: &str| answers[name].error().and_then(CloudError::retry_after);
        assert_eq!(after("a"), Some(MIN_RETRY_AFTER));
        assert_eq!(after("b"), Some(Duration::from_secs(5)));
        assert_eq!(answers["c"].exists(), Some(true));
    }
}
