//! One cloud call through the budget: the priority lanes, the token bucket, the operation's
//! AIMD pacer, the timeout, the metrics and the in-flight count.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use ccm_core::{CloudError, CloudResult};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use tokio::sync::watch;
use tokio::time::Instant;

use super::aimd::AimdRate;
use super::token_bucket::TokenBucket;
use super::{BudgetConfig, MIN_RETRY_AFTER};
use crate::machinery::metrics::MetricsRegistry;

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
    /// The wait before a call is sent: lanes, token bucket, pacer.
    waits: Family<OperationLabel, Histogram>,
    pub(super) in_flight: watch::Sender<usize>,
    /// The AIMD pacer of every operation called so far.
    adaptive: Mutex<HashMap<&'static str, AimdRate>>,
    adaptive_qps: Family<OperationLabel, Gauge<f64, AtomicU64>>,
    /// The priority gate in front of the token bucket and the pacer.
    lanes: super::lanes::Lanes,
}

struct InFlight<'a>(&'a watch::Sender<usize>);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Budget {
    /// Calls waiting for the budget now (lanes, token bucket, pacer).
    pub(super) fn waiting(&self) -> usize {
        self.lanes.waiting()
    }

    pub(super) fn new(config: &BudgetConfig, metrics: &MetricsRegistry) -> Self {
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
        let waits = Family::<OperationLabel, Histogram>::new_with_constructor(|| {
            // 1 ms … 262 s: a call that did not wait is in the first bucket.
            Histogram::new(exponential_buckets(0.001, 4.0, 10))
        });
        // client-go's `rest_client_rate_limiter_duration_seconds`, for cloud calls.
        metrics.register(
            "cloud_provider_rate_limiter_duration_seconds",
            "How long cloud provider calls waited for the cloud-call budget (priority lanes, --cloud-api-qps token bucket, the AIMD pacer) before they were sent, by operation",
            waits.clone(),
        );
        let adaptive_qps = Family::<OperationLabel, Gauge<f64, AtomicU64>>::default();
        metrics.register(
            "cloud_provider_rate_limit_qps",
            "Calls per second an operation is slowed down to after the provider answered Retry (AIMD); 0 while it is not slowed down",
            adaptive_qps.clone(),
        );
        Budget {
            limiter: config
                .rate_limit
                .map(|(qps, burst)| TokenBucket::new(qps, burst)),
            timeout: config.timeout,
            requests,
            durations,
            waits,
            in_flight: watch::channel(0).0,
            adaptive: Mutex::new(HashMap::new()),
            adaptive_qps,
            lanes: super::lanes::Lanes::default(),
        }
    }

    fn adaptive(&self) -> std::sync::MutexGuard<'_, HashMap<&'static str, AimdRate>> {
        // Each method leaves the map consistent; a poisoned lock means a panic elsewhere.
        self.adaptive.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Passes the operation's AIMD pacer; returns the call's round.
    async fn pace(&self, operation: &'static str) -> u64 {
        let (mut wait, mut round) = {
            let now = Instant::now();
            self.adaptive()
                .entry(operation)
                .or_insert_with(|| AimdRate::new(now))
                .start(now)
        };
        while !wait.is_zero() {
            tokio::time::sleep(wait).await;
            let mut adaptive = self.adaptive();
            let Some(rate) = adaptive.get_mut(operation) else {
                break;
            };
            if rate.round == round {
                break;
            }
            // Slowed down while this call waited: its slot was at the old rate.
            (wait, round) = rate.reserve(Instant::now());
        }
        round
    }

    /// Feeds the call's outcome to the operation's pacer: a Retry answer slows it down.
    fn learn<T>(&self, operation: &'static str, round: u64, result: &CloudResult<T>) {
        let configured = self.limiter.as_ref().map(|l| l.qps);
        let now = Instant::now();
        let qps = {
            let mut adaptive = self.adaptive();
            let Some(rate) = adaptive.get_mut(operation) else {
                return;
            };
            if let Err(CloudError::Retry { .. }) = result {
                let before = rate.round;
                rate.on_retry(now, round, configured);
                if rate.round != before {
                    tracing::info!(
                        operation,
                        qps = rate.qps(now),
                        "the cloud provider asked to retry: slowing the operation down"
                    );
                }
            }
            rate.qps(now)
        };
        self.adaptive_qps
            .get_or_create(&OperationLabel { operation })
            .set(qps);
    }

    pub(super) async fn call<T, F>(&self, operation: &'static str, call: F) -> CloudResult<T>
    where
        F: Future<Output = CloudResult<T>>,
    {
        self.in_flight.send_modify(|n| *n += 1);
        let _guard = InFlight(&self.in_flight);
        let queued = Instant::now();
        let round = self
            .lanes
            .admit(super::lanes::current(), async {
                if let Some(limiter) = &self.limiter {
                    limiter.acquire().await;
                }
                self.pace(operation).await
            })
            .await;
        let start = Instant::now();
        self.waits
            .get_or_create(&OperationLabel { operation })
            .observe(start.duration_since(queued).as_secs_f64());
        let result = match self.timeout {
            Some(timeout) => match tokio::time::timeout(timeout, call).await {
                Ok(result) => result,
                Err(_) => Err(CloudError::msg(format!(
                    "cloud call {operation} timed out after {} (--cloud-api-timeout)",
                    crate::machinery::go_syntax::format_go_duration(timeout)
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
        self.learn(operation, round, &result);
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
