//! The cloud-call budget: one wrapper around the provider that every controller calls through.
//!
//! [`BudgetedProvider`] implements [`CloudProvider`] and every capability trait, forwarding to
//! the inner provider's capability only when the inner provider has it (so
//! `budgeted.load_balancer().is_none()` exactly when the provider has no load balancers). Every
//! call passes, in order:
//!
//! 0. the priority lanes ([`lanes`]): under a quota, initialisation and ensures before
//!    lifecycle checks before the periodic refresh;
//! 1. the token bucket (`--cloud-api-qps`, `--cloud-api-burst`; unlimited by default), shared by
//!    all controllers: a burst of calls waits for tokens instead of tripping the cloud's own
//!    rate limit;
//! 2. the per-call timeout (`--cloud-api-timeout`): the provider's future is dropped and the
//!    call fails with [`CloudError::Other`] naming the operation and the timeout;
//! 3. metrics: `cloud_provider_requests_total{operation,result}` and
//!    `cloud_provider_request_duration_seconds{operation}` (provider time, without the wait for
//!    a token), where `operation` is the snake_case trait method name and `result` is `success`
//!    or [`CloudError::kind`]; `cloud_provider_rate_limiter_duration_seconds{operation}`, the
//!    wait in steps 0 and 1 and the pacer (client-go's `rest_client_rate_limiter_duration_seconds`
//!    for cloud calls): calls that keep waiting mean the budget is saturated.
//!
//! `CloudError::Retry` is handled consistently: the budget never retries by itself (a retry
//! inside the budget would hold a worker and a token); the error reaches the controller, which
//! requeues the object after exactly `after`. A zero `after` is raised to
//! [`MIN_RETRY_AFTER`] so a provider cannot make a controller hot-loop.
//!
//! # Learning the cloud's quota (AIMD)
//!
//! A `CloudError::Retry` is the cloud saying "over quota" (a 429 with Retry-After). Rather than
//! let every worker find that out on its own, the budget slows the **operation** down for all of
//! them: after step 1, each call also passes a per-operation pacer whose rate follows AIMD
//! (additive increase, multiplicative decrease, as TCP's congestion control):
//!
//! - **Decrease**: a Retry answer multiplies the operation's rate by
//!   [`AIMD_DECREASE_FACTOR`](aimd::AIMD_DECREASE_FACTOR) (½), starting from its current limit, or, the first time, from the
//!   rate the operation was being called at (calls started in the current or the previous
//!   second, whichever is more). Only one decrease per round: the Retry answers of calls
//!   started before the last decrease (already in flight at the old rate) do not decrease again,
//!   so a hundred workers rejected together halve the rate once, not a hundred times. The rate
//!   never goes below [`AIMD_MIN_QPS`](aimd::AIMD_MIN_QPS).
//! - **Increase**: from there the rate grows linearly, by [`AIMD_RECOVERY_PER_SECOND`](aimd::AIMD_RECOVERY_PER_SECOND) (5 %)
//!   of r₀ (the rate at which the quota was last hit) per second: a halved rate is back at r₀
//!   after 10 s and probes the quota again. The growth depends on time, not on traffic, so a
//!   lone Retry (e.g. a provider waiting for a load balancer to be ready) slows a rarely
//!   called operation down for 30 s at most. Other errors change nothing.
//! - **Ceiling**: `--cloud-api-qps` when set; without it, twice r₀. Once the rate reaches the
//!   ceiling the operation is no longer paced (step 1 alone limits it again).
//!
//! The pacer has no burst: calls of a slowed-down operation are spaced `1/r` apart, which is
//! what keeps them under a quota whose window is shorter than a second. Under a steady
//! overload the operation's rate saws between ½ r₀ and a little above r₀ (the cloud's own
//! burst absorbs the probe) with one rejected round every 10 s or so, instead of every call
//! above the quota rejected (`the_budget_converges_below_a_quota` in `tests.rs`; the measured
//! share: `docs/performance.md`, section "The cloud-call budget under a quota").
//! Metrics: `cloud_provider_rate_limit_qps{operation}`, the operation's current rate (0 while
//! it is not slowed down), and the rejected calls in
//! `cloud_provider_requests_total{operation,result="retry"}`.
//!
//! The budget also counts calls in flight, so a graceful shutdown can wait for them
//! ([`BudgetedProvider::wait_idle`]).

mod aimd;
mod call;
pub(crate) mod lanes;
mod provider;
mod token_bucket;

#[cfg(test)]
mod tests;

use std::time::Duration;

pub use self::provider::BudgetedProvider;
pub(crate) use self::token_bucket::TokenBucket;

/// The smallest `CloudError::Retry` delay passed on to controllers.
pub const MIN_RETRY_AFTER: Duration = Duration::from_secs(1);

/// What the budget enforces.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct BudgetConfig {
    /// `(qps, burst)` of the token bucket; `None` is unlimited.
    pub rate_limit: Option<(f64, u32)>,
    /// Per-call timeout; `None` is no timeout.
    pub timeout: Option<Duration>,
}
