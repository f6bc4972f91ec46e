//! The token bucket of `--cloud-api-qps` / `--cloud-api-burst`, also used by the Kubernetes
//! clients (`--kube-api-qps`).

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// A token bucket with client-go's (`golang.org/x/time/rate`) semantics: `qps` tokens per second
/// refill a bucket of `burst` tokens; a caller takes one token, or reserves the next one and
/// sleeps until it is due. Reservations are served in call order.
///
/// Hand-written (about 30 lines) rather than `governor`: it must run on tokio's clock so tests
/// can use paused time, and it is shared between the cloud budget and the Kubernetes client
/// layer; `governor` uses its own clock (`quanta`) and has no async wait on tokio's timer.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    pub(super) qps: f64,
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
    pub(crate) fn new(qps: f64, burst: u32) -> Self {
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
    pub(crate) fn reserve(&self) -> Duration {
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
    pub(crate) async fn acquire(&self) {
        let wait = self.reserve();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

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
