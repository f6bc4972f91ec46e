//! The budget as a whole: the AIMD pacer against a cloud's quota, and the batch capability
//! through the budget.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ccm_core::{
    CloudError, CloudProvider, CloudResult, InstanceAnswer, InstanceAnswers, InstanceMetadata,
    InstancesBatch, InstancesV2, LoadBalancer, LoadBalancerHostsAnswers, LoadBalancerHostsBatch,
    LoadBalancerStatus, Node, NodeView, Service,
};
use tokio::time::Instant;

use super::{BudgetConfig, BudgetedProvider, MIN_RETRY_AFTER};
use crate::machinery::metrics::MetricsRegistry;

/// A cloud allowing `qps` calls per second (burst `qps`), answering Retry with the time
/// until a token frees beyond it, as a real cloud's 429 + Retry-After.
struct QuotaCloud {
    quota: TokenBucketState,
    accepted: std::sync::atomic::AtomicUsize,
    rejected: std::sync::atomic::AtomicUsize,
}

struct TokenBucketState {
    qps: f64,
    state: Mutex<(f64, Instant)>,
}

impl QuotaCloud {
    fn new(qps: f64) -> Self {
        QuotaCloud {
            quota: TokenBucketState {
                qps,
                state: Mutex::new((qps, Instant::now())),
            },
            accepted: Default::default(),
            rejected: Default::default(),
        }
    }

    fn take(&self) -> CloudResult<()> {
        use std::sync::atomic::Ordering::Relaxed;
        let q = &self.quota;
        let mut s = q.state.lock().unwrap();
        let now = Instant::now();
        s.0 = (s.0 + now.duration_since(s.1).as_secs_f64() * q.qps).min(q.qps);
        s.1 = now;
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            self.accepted.fetch_add(1, Relaxed);
            Ok(())
        } else {
            self.rejected.fetch_add(1, Relaxed);
            Err(CloudError::Retry {
                after: Duration::from_secs_f64((1.0 - s.0) / q.qps),
                message: "quota exceeded".into(),
            })
        }
    }
}

struct QuotaProvider(Arc<QuotaCloud>);

impl CloudProvider for QuotaProvider {
    fn provider_name(&self) -> &str {
        "quota"
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }
}

#[async_trait]
impl InstancesV2 for QuotaProvider {
    async fn instance_exists(&self, _: &NodeView) -> CloudResult<bool> {
        self.0.take().map(|()| true)
    }
    async fn instance_shutdown(&self, _: &NodeView) -> CloudResult<bool> {
        self.0.take().map(|()| false)
    }
    async fn instance_metadata(&self, _: &NodeView) -> CloudResult<InstanceMetadata> {
        self.0.take().map(|()| InstanceMetadata::default())
    }
}

/// 50 workers calling as fast as they can (a Retry answer requeues the worker's object
/// after the delay, as the controllers do) against a cloud allowing 20 calls per second:
/// the calls reaching the cloud settle at the quota and almost none is rejected (measured:
/// `docs/performance.md`, section "The cloud-call budget under a quota"). Without the pacer
/// each of the 50 workers would call again as soon as its 1 s delay passed, most of them to
/// be rejected again.
#[tokio::test(start_paused = true)]
async fn the_budget_converges_below_a_quota() {
    use std::sync::atomic::Ordering::Relaxed;
    const QUOTA: f64 = 20.0;
    let cloud = Arc::new(QuotaCloud::new(QUOTA));
    let metrics = MetricsRegistry::new();
    let budgeted = BudgetedProvider::new(
        Arc::new(QuotaProvider(cloud.clone())),
        &BudgetConfig::default(),
        &metrics,
    );
    let node = Node::default();
    let run = |secs: u64| {
        let (budgeted, node) = (budgeted.clone(), node.clone());
        async move {
            let deadline = Instant::now() + Duration::from_secs(secs);
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..50 {
                let (budgeted, node) = (budgeted.clone(), node.clone());
                tasks.spawn(async move {
                    let v2 = budgeted.instances_v2().unwrap();
                    while Instant::now() < deadline {
                        match v2
                            .instance_metadata(&ccm_core::NodeView::from_node(&node))
                            .await
                        {
                            Err(CloudError::Retry { after, .. }) => tokio::time::sleep(after).await,
                            Ok(_) => {}
                            Err(e) => panic!("{e}"),
                        }
                    }
                });
            }
            tasks.join_all().await;
        }
    };
    // Warm-up: the first overload is learned.
    run(10).await;
    let (accepted0, rejected0) = (cloud.accepted.load(Relaxed), cloud.rejected.load(Relaxed));
    let started = Instant::now();
    run(120).await;
    let accepted = cloud.accepted.load(Relaxed) - accepted0;
    let rejected = cloud.rejected.load(Relaxed) - rejected0;
    let seconds = started.elapsed().as_secs_f64();
    let accepted_qps = accepted as f64 / seconds;
    let rejected_share = rejected as f64 / (accepted + rejected) as f64;
    assert!(
        rejected_share <= 0.05,
        "{rejected} of {} calls rejected",
        accepted + rejected
    );
    // The calls reaching the cloud settle at the quota (its burst lets the rate probe a
    // little above it between rejections), and the quota is used, not starved.
    let attempted_qps = (accepted + rejected) as f64 / seconds;
    assert!(attempted_qps <= QUOTA * 1.05, "{attempted_qps} calls/s");
    assert!(accepted_qps >= QUOTA * 0.5, "{accepted_qps} calls/s");
    let text = metrics.encode().unwrap();
    let gauge = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("cloud_provider_rate_limit_qps{operation=\"instance_metadata\"} ")
        })
        .map(|v| v.parse::<f64>().unwrap())
        .expect("the rate gauge");
    assert!(gauge > 0.0, "the operation is reported slowed down");
}

/// A provider with `InstancesV2` and `InstancesBatch`; its batch call answers what `answer`
/// says after `delay`.
struct Batching {
    max: usize,
    delay: Duration,
    calls: AtomicUsize,
    answer: fn(&[NodeView]) -> CloudResult<InstanceAnswers>,
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
    async fn instance_exists(&self, _node: &NodeView) -> CloudResult<bool> {
        Ok(true)
    }
    async fn instance_shutdown(&self, _node: &NodeView) -> CloudResult<bool> {
        Ok(false)
    }
    async fn instance_metadata(&self, _node: &NodeView) -> CloudResult<InstanceMetadata> {
        Ok(InstanceMetadata::default())
    }
}

#[async_trait]
impl InstancesBatch for Batching {
    fn max_batch_size(&self) -> usize {
        self.max
    }
    async fn describe_instances(&self, nodes: &[NodeView]) -> CloudResult<InstanceAnswers> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        (self.answer)(nodes)
    }
}

fn node(name: &str) -> NodeView {
    let mut node = Node::default();
    node.metadata.name = Some(name.to_owned());
    NodeView::from(node)
}

fn all_found(nodes: &[NodeView]) -> CloudResult<InstanceAnswers> {
    Ok(nodes
        .iter()
        .map(|n| {
            let name = n.name().to_owned();
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
    answer: fn(&[NodeView]) -> CloudResult<InstanceAnswers>,
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
    let nodes: Vec<NodeView> = (0..100).map(|i| node(&format!("n{i}"))).collect();
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

/// The wait for a token is measured per operation: the first call of a 1 qps, burst-1 budget
/// goes at once, the second waits one second (the saturation signal the alert rules read).
#[tokio::test(start_paused = true)]
async fn the_wait_for_the_budget_is_measured() {
    let metrics = MetricsRegistry::new();
    let budgeted = BudgetedProvider::new(
        batching(10, Duration::ZERO, all_found),
        &BudgetConfig {
            rate_limit: Some((1.0, 1)),
            ..Default::default()
        },
        &metrics,
    );
    let batch = budgeted.instances_batch().unwrap();
    let nodes: Vec<NodeView> = (0..3).map(|i| node(&format!("n{i}"))).collect();
    batch.describe_instances(&nodes).await.unwrap();
    batch.describe_instances(&nodes).await.unwrap();
    let text = metrics.encode().unwrap();
    let wait = "cloud_provider_rate_limiter_duration_seconds";
    let op = "operation=\"describe_instances\"";
    for (series, count) in [
        (format!("{wait}_count{{{op}}}"), 2),
        // The first went at once (under 1 ms), the second waited a whole token.
        (format!("{wait}_bucket{{le=\"0.001\",{op}}}"), 1),
        (format!("{wait}_bucket{{le=\"0.256\",{op}}}"), 1),
        (format!("{wait}_bucket{{le=\"1.024\",{op}}}"), 2),
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{series} ")))
            .unwrap_or_else(|| panic!("{series} missing in:\n{text}"));
        assert_eq!(line, format!("{series} {count}"), "{text}");
    }
    let sum: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{wait}_sum{{{op}}} ")))
        .unwrap()
        .parse()
        .unwrap();
    assert!((0.99..1.01).contains(&sum), "waited {sum} s in all");
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

/// A provider whose `update_load_balancer_hosts` answers every Service `Retry` after 1 ms and
/// declares a batch size of 0.
struct LbBatching;

impl CloudProvider for LbBatching {
    fn provider_name(&self) -> &str {
        "lb-batching"
    }
    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        Some(self)
    }
    fn load_balancer_hosts_batch(&self) -> Option<&dyn LoadBalancerHostsBatch> {
        Some(self)
    }
}

#[async_trait]
impl LoadBalancer for LbBatching {
    async fn get_load_balancer(
        &self,
        _cluster_name: &str,
        _service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        Ok(None)
    }
    async fn ensure_load_balancer(
        &self,
        _cluster_name: &str,
        _service: &Service,
        _hosts: &[NodeView],
    ) -> CloudResult<LoadBalancerStatus> {
        Ok(LoadBalancerStatus::default())
    }
    async fn update_load_balancer(
        &self,
        _cluster_name: &str,
        _service: &Service,
        _hosts: &[NodeView],
    ) -> CloudResult<()> {
        Ok(())
    }
    async fn ensure_load_balancer_deleted(
        &self,
        _cluster_name: &str,
        _service: &Service,
    ) -> CloudResult<()> {
        Ok(())
    }
}

#[async_trait]
impl LoadBalancerHostsBatch for LbBatching {
    fn max_batch_size(&self) -> usize {
        0
    }
    async fn update_load_balancer_hosts(
        &self,
        _cluster_name: &str,
        services: &[Arc<Service>],
        _hosts: &[NodeView],
    ) -> CloudResult<LoadBalancerHostsAnswers> {
        Ok(services
            .iter()
            .map(|s| {
                let retry = CloudError::Retry {
                    after: Duration::from_millis(1),
                    message: "busy".into(),
                };
                (s.metadata.name.clone().unwrap_or_default(), Err(retry))
            })
            .collect())
    }
}

/// The batch load-balancer call goes through the budget under its own operation, its declared
/// size of 0 counts as 1, and a per-Service `Retry` is raised to the floor of a whole call's.
#[tokio::test]
async fn hosts_batch_is_budgeted_under_its_own_operation() {
    let metrics = MetricsRegistry::new();
    let budgeted = BudgetedProvider::new(Arc::new(LbBatching), &BudgetConfig::default(), &metrics);
    let batch = budgeted.load_balancer_hosts_batch().unwrap();
    assert_eq!(batch.max_batch_size(), 1);
    let mut web = Service::default();
    web.metadata.name = Some("web".into());
    let answers = batch
        .update_load_balancer_hosts("c1", &[Arc::new(web)], &[])
        .await
        .unwrap();
    let after = answers["web"].as_ref().unwrap_err().retry_after();
    assert_eq!(after, Some(MIN_RETRY_AFTER));
    let text = metrics.encode().unwrap();
    assert!(
        text.contains(
            "cloud_provider_requests_total{operation=\"update_load_balancer_hosts\",result=\"success\"} 1"
        ),
        "{text}"
    );
}
