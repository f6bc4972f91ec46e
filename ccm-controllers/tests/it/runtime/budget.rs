//! The cloud-call budget on its own (tokio paused time: no wall-clock timing): the QPS limit
//! under a burst, the timeout, `Retry`, and capability forwarding.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ccm_controllers::{BudgetConfig, BudgetedProvider, MetricsRegistry};
use ccm_core::{
    CloudError, CloudProvider, CloudResult, LoadBalancer, LoadBalancerStatus, NodeView, Service,
};
use tokio::time::Instant;

struct Recorder {
    calls: Mutex<Vec<Instant>>,
    latency: Duration,
    answer: fn() -> CloudResult<()>,
}

#[async_trait]
impl CloudProvider for Recorder {
    fn provider_name(&self) -> &str {
        "recorder"
    }
    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        Some(self)
    }
}

#[async_trait]
impl LoadBalancer for Recorder {
    async fn get_load_balancer(
        &self,
        _: &str,
        _: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        Ok(None)
    }
    async fn ensure_load_balancer(
        &self,
        _: &str,
        _: &Service,
        _: &[NodeView],
    ) -> CloudResult<LoadBalancerStatus> {
        Ok(LoadBalancerStatus::default())
    }
    async fn update_load_balancer(&self, _: &str, _: &Service, _: &[NodeView]) -> CloudResult<()> {
        self.calls.lock().unwrap().push(Instant::now());
        tokio::time::sleep(self.latency).await;
        (self.answer)()
    }
    async fn ensure_load_balancer_deleted(&self, _: &str, _: &Service) -> CloudResult<()> {
        Ok(())
    }
}

fn recorder(latency: Duration, answer: fn() -> CloudResult<()>) -> Arc<Recorder> {
    Arc::new(Recorder {
        calls: Mutex::new(Vec::new()),
        latency,
        answer,
    })
}

#[tokio::test(start_paused = true)]
async fn cloud_qps_limit_holds_under_a_burst() {
    let inner = recorder(Duration::from_millis(10), || Ok(()));
    let metrics = MetricsRegistry::new();
    let budgeted = BudgetedProvider::new(
        inner.clone(),
        &{
            let mut config = BudgetConfig::default();
            config.rate_limit = Some((5.0, 3));
            config.timeout = None;
            config
        },
        &metrics,
    );
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..60 {
        let b = budgeted.clone();
        tasks.spawn(async move {
            b.load_balancer()
                .unwrap()
                .update_load_balancer("c", &Service::default(), &[])
                .await
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap().unwrap();
    }
    let calls: Vec<Duration> = inner
        .calls
        .lock()
        .unwrap()
        .iter()
        .map(|t| t.duration_since(start))
        .collect();
    assert_eq!(calls.len(), 60);
    // Count calls per 1 s window: the first window holds the burst (3) plus 5/s; every later
    // window at most 5 (+1 for a token landing on the boundary).
    let last = calls.iter().max().unwrap().as_secs();
    for w in 0..=last {
        let n = calls.iter().filter(|c| c.as_secs() == w).count();
        let limit = if w == 0 { 3 + 5 } else { 5 + 1 };
        assert!(n <= limit, "window {w}s: {n} calls > {limit}");
    }
    // And over any 2 s span after the burst, at most 2 x 5 + 1.
    for w in 1..last {
        let n = calls
            .iter()
            .filter(|c| c.as_secs() == w || c.as_secs() == w + 1)
            .count();
        assert!(n <= 11, "2 s from {w}s: {n}");
    }
    // 60 calls at 5/s with a burst of 3 need (60 - 3) / 5 = 11.4 s.
    assert!(calls.iter().max().unwrap() >= &Duration::from_millis(11_400));
    let text = metrics.encode().unwrap();
    assert!(text.contains(
        "cloud_provider_requests_total{operation=\"update_load_balancer\",result=\"success\"} 60"
    ));
}

#[tokio::test(start_paused = true)]
async fn budget_timeout_retry_and_capabilities() {
    let metrics = MetricsRegistry::new();
    let slow = recorder(Duration::from_secs(600), || Ok(()));
    let budgeted = BudgetedProvider::new(
        slow,
        &{
            let mut config = BudgetConfig::default();
            config.rate_limit = None;
            config.timeout = Some(Duration::from_secs(30));
            config
        },
        &metrics,
    );
    // Only the capabilities of the inner provider are offered.
    assert!(budgeted.load_balancer().is_some());
    assert!(budgeted.instances_v2().is_none());
    assert!(budgeted.instances().is_none());
    assert!(budgeted.routes().is_none());
    assert!(budgeted.zones().is_none());
    assert!(budgeted.clusters().is_none());
    assert_eq!(budgeted.provider_name(), "recorder");
    let err = budgeted
        .load_balancer()
        .unwrap()
        .update_load_balancer("c", &Service::default(), &[])
        .await
        .unwrap_err();
    assert!(matches!(err, CloudError::Other(_)));
    assert_eq!(
        err.to_string(),
        "cloud call update_load_balancer timed out after 30s (--cloud-api-timeout)"
    );
    assert_eq!(budgeted.in_flight(), 0);

    let metrics2 = MetricsRegistry::new();
    let retrying = recorder(Duration::ZERO, || {
        Err(CloudError::retry(Duration::ZERO, "busy"))
    });
    let budgeted2 = BudgetedProvider::new(retrying, &BudgetConfig::default(), &metrics2);
    let err = budgeted2
        .load_balancer()
        .unwrap()
        .update_load_balancer("c", &Service::default(), &[])
        .await
        .unwrap_err();
    assert_eq!(err.retry_after(), Some(ccm_controllers::MIN_RETRY_AFTER));
    let text = metrics.encode().unwrap();
    assert!(text.contains(
        "cloud_provider_requests_total{operation=\"update_load_balancer\",result=\"error\"} 1"
    ));
    let text2 = metrics2.encode().unwrap();
    assert!(text2.contains(
        "cloud_provider_requests_total{operation=\"update_load_balancer\",result=\"retry\"} 1"
    ));
}
