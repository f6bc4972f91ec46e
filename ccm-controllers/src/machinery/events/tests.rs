//! Unit tests of the Event queue's helpers.

use super::*;

#[tokio::test(start_paused = true)]
async fn the_log_limiter_allows_one_log_per_interval_and_counts_the_rest() {
    let mut l = LogLimiter::default();
    assert_eq!(l.allow(), Some(0));
    assert_eq!(l.allow(), None);
    assert_eq!(l.allow(), None);
    tokio::time::advance(LOG_INTERVAL).await;
    assert_eq!(l.allow(), Some(2));
    assert_eq!(l.allow(), None);
}
