//! The fake cloud's API quota: token buckets that reject (rather than delay) calls, as a real
//! cloud answers 429 + Retry-After.
//!
//! Hand-written (a few lines) rather than `governor`: it must run on tokio's clock so tests with
//! paused time see the quota refill, and it rejects instead of waiting.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::config::{QuotaConfig, Rate};

/// One token bucket: `per_second` tokens per second up to `burst`, starting full.
#[derive(Debug)]
struct Bucket {
    per_second: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn new(rate: Rate, now: Instant) -> Self {
        let burst = f64::from(rate.burst.max(1));
        Bucket {
            per_second: if rate.per_second > 0.0 {
                rate.per_second
            } else {
                f64::MIN_POSITIVE
            },
            burst,
            tokens: burst,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        self.last = now;
    }

    /// How long until a whole token is available (zero when one is).
    fn wait(&self) -> Duration {
        if self.tokens >= 1.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((1.0 - self.tokens) / self.per_second)
        }
    }
}

/// The overall bucket and the per-operation buckets of a [`QuotaConfig`].
#[derive(Debug, Default)]
pub(super) struct Quota {
    overall: Option<Bucket>,
    operations: BTreeMap<String, Bucket>,
}

impl Quota {
    pub(super) fn new(config: &QuotaConfig) -> Self {
        let now = Instant::now();
        Quota {
            overall: config.overall.map(|r| Bucket::new(r, now)),
            operations: config
                .operations
                .iter()
                .map(|(op, r)| (op.clone(), Bucket::new(*r, now)))
                .collect(),
        }
    }

    /// Takes a token for `op` from every bucket that applies, or takes none and returns how
    /// long until every one of them has a token again (at least 1 ms).
    pub(super) fn admit(&mut self, op: &str) -> Result<(), Duration> {
        let now = Instant::now();
        let mut buckets: Vec<&mut Bucket> = self
            .overall
            .iter_mut()
            .chain(self.operations.get_mut(op))
            .collect();
        for bucket in buckets.iter_mut() {
            bucket.refill(now);
        }
        let wait = buckets
            .iter()
            .map(|b| b.wait())
            .max()
            .unwrap_or(Duration::ZERO);
        if !wait.is_zero() {
            return Err(wait.max(Duration::from_millis(1)));
        }
        for bucket in buckets {
            bucket.tokens -= 1.0;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(per_second: f64, burst: u32) -> Rate {
        Rate { per_second, burst }
    }

    #[tokio::test(start_paused = true)]
    async fn burst_then_rate_with_the_time_until_a_token_frees() {
        let mut quota = Quota::new(&QuotaConfig {
            overall: Some(rate(10.0, 3)),
            operations: BTreeMap::new(),
        });
        for _ in 0..3 {
            assert_eq!(quota.admit("a"), Ok(()));
        }
        assert_eq!(quota.admit("b"), Err(Duration::from_millis(100)));
        tokio::time::advance(Duration::from_millis(40)).await;
        let wait = quota.admit("a").unwrap_err();
        assert!(
            (wait.as_secs_f64() - 0.06).abs() < 1e-6,
            "{wait:?} (a rejected call takes no token)"
        );
        tokio::time::advance(Duration::from_millis(60)).await;
        assert_eq!(quota.admit("a"), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn per_operation_and_overall_both_apply() {
        let mut quota = Quota::new(&QuotaConfig {
            overall: Some(rate(100.0, 100)),
            operations: [("slow".to_owned(), rate(1.0, 1))].into(),
        });
        assert_eq!(quota.admit("slow"), Ok(()));
        assert_eq!(quota.admit("slow"), Err(Duration::from_secs(1)));
        // Other operations are limited only by the overall bucket, which the rejected call
        // did not spend.
        for _ in 0..99 {
            assert_eq!(quota.admit("fast"), Ok(()));
        }
        assert!(quota.admit("fast").is_err());
        let mut unlimited = Quota::new(&QuotaConfig::default());
        for _ in 0..1000 {
            assert_eq!(unlimited.admit("x"), Ok(()));
        }
    }
}
