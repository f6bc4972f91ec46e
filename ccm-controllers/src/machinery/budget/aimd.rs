//! The AIMD pacer of one operation (additive increase, multiplicative decrease): pure state,
//! driven with the current time by the budget. The rules are in the [module docs](super).

use std::time::Duration;

use tokio::time::Instant;

/// AIMD: a `CloudError::Retry` multiplies the operation's rate by this (see the module docs).
pub(crate) const AIMD_DECREASE_FACTOR: f64 = 0.5;

/// AIMD: a slowed-down operation's rate grows by this fraction of the rate at which the quota
/// was last hit, per second (so ½ → 1 in 10 s).
pub(crate) const AIMD_RECOVERY_PER_SECOND: f64 = 0.05;

/// AIMD: the lowest rate an operation is slowed down to, in calls per second.
pub(crate) const AIMD_MIN_QPS: f64 = 0.1;

/// The AIMD pacer of one operation: pure state, driven with the current time by the budget.
#[derive(Debug)]
pub(super) struct AimdRate {
    /// `Some` while the operation is slowed down.
    limit: Option<AimdLimit>,
    /// Counts decreases; a Retry answer decreases only if its call started in the current
    /// round (one decrease per round).
    pub(super) round: u64,
    /// Calls started in the current one-second window, and in the previous one.
    window_start: Instant,
    started_in_window: u32,
    started_in_previous_window: u32,
}

#[derive(Debug, Clone, Copy)]
struct AimdLimit {
    /// The rate right after the last decrease, calls per second.
    base: f64,
    /// When that decrease happened; the rate grows linearly from there.
    decreased_at: Instant,
    /// The rate at which the quota was last hit (r₀).
    hit_at: f64,
    /// Above this the operation is no longer paced.
    ceiling: f64,
    /// When the next call may start.
    next_free: Instant,
}

impl AimdLimit {
    /// Additive increase: `base` plus [`AIMD_RECOVERY_PER_SECOND`] × r₀ per second since the
    /// decrease.
    fn qps(&self, now: Instant) -> f64 {
        let secs = now
            .saturating_duration_since(self.decreased_at)
            .as_secs_f64();
        self.base + AIMD_RECOVERY_PER_SECOND * self.hit_at * secs
    }
}

impl AimdRate {
    pub(super) fn new(now: Instant) -> Self {
        AimdRate {
            limit: None,
            round: 0,
            window_start: now,
            started_in_window: 0,
            started_in_previous_window: 0,
        }
    }

    /// A call starts: counts it and reserves its slot (see [`AimdRate::reserve`]).
    pub(super) fn start(&mut self, now: Instant) -> (Duration, u64) {
        let elapsed = now.saturating_duration_since(self.window_start);
        if elapsed >= Duration::from_secs(1) {
            self.started_in_previous_window = if elapsed >= Duration::from_secs(2) {
                0
            } else {
                self.started_in_window
            };
            self.started_in_window = 0;
            self.window_start = now;
        }
        self.started_in_window = self.started_in_window.saturating_add(1);
        self.reserve(now)
    }

    /// Reserves the next slot: how long to wait for it, and the round it was reserved in. A
    /// caller that wakes in a later round (the rate was decreased meanwhile) reserves again,
    /// so a decrease re-spaces the calls already waiting instead of letting them go at the old
    /// rate.
    pub(super) fn reserve(&mut self, now: Instant) -> (Duration, u64) {
        let qps = self.qps(now);
        let wait = match self.limit.as_mut() {
            None => Duration::ZERO,
            Some(limit) => {
                let slot = limit.next_free.max(now);
                limit.next_free = slot + Duration::from_secs_f64(1.0 / qps);
                slot - now
            }
        };
        (wait, self.round)
    }

    /// The rate the operation is being called at, when it is not paced: calls started in the
    /// current or the previous second, whichever is more.
    fn observed_qps(&self) -> f64 {
        f64::from(self.started_in_window.max(self.started_in_previous_window))
    }

    /// The provider answered Retry to a call of `round`: multiplicative decrease, once per
    /// round. `configured` is `--cloud-api-qps`.
    pub(super) fn on_retry(&mut self, now: Instant, round: u64, configured: Option<f64>) {
        if round != self.round {
            return;
        }
        self.round += 1;
        let current = match self.limit {
            Some(limit) => limit.qps(now),
            None => self.observed_qps(),
        };
        let current = current.max(AIMD_MIN_QPS);
        let base = (current * AIMD_DECREASE_FACTOR).max(AIMD_MIN_QPS);
        // The slots handed out in the old round are void (their callers reserve again); the
        // next call is a full new interval away.
        self.limit = Some(AimdLimit {
            base,
            decreased_at: now,
            hit_at: current,
            ceiling: configured.unwrap_or(2.0 * current),
            next_free: now + Duration::from_secs_f64(1.0 / base),
        });
    }

    /// The current rate limit, 0 when not slowed down (the metric's value). Ends the slow-down
    /// once the rate has grown back to the ceiling.
    pub(super) fn qps(&mut self, now: Instant) -> f64 {
        let Some(limit) = self.limit else {
            return 0.0;
        };
        let qps = limit.qps(now);
        if qps >= limit.ceiling {
            self.limit = None;
            return 0.0;
        }
        qps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(start: Instant, secs: f64) -> Instant {
        start + Duration::from_secs_f64(secs)
    }

    /// Starts `n` calls at `now`; returns their rounds.
    fn start_calls(rate: &mut AimdRate, now: Instant, n: usize) -> Vec<u64> {
        (0..n).map(|_| rate.start(now).1).collect()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn first_retry_halves_the_observed_rate_once_per_round() {
        let t0 = Instant::now();
        let mut rate = AimdRate::new(t0);
        // 40 calls in the first second, all in flight when the cloud rejects them.
        let rounds = start_calls(&mut rate, at(t0, 0.5), 40);
        for round in rounds {
            rate.on_retry(at(t0, 0.6), round, None);
        }
        assert!(
            close(rate.qps(at(t0, 0.6)), 20.0),
            "one decrease for the round"
        );
        // A call paced at the new rate and rejected again: a new round, a new decrease.
        let (_, round) = rate.start(at(t0, 0.6));
        rate.on_retry(at(t0, 0.6), round, None);
        assert!(close(rate.qps(at(t0, 0.6)), 10.0));
    }

    #[test]
    fn the_rate_never_drops_below_the_floor() {
        let t0 = Instant::now();
        let mut rate = AimdRate::new(t0);
        for _ in 0..50 {
            let (_, round) = rate.start(t0);
            rate.on_retry(t0, round, None);
        }
        assert!(close(rate.qps(t0), AIMD_MIN_QPS));
    }

    #[test]
    fn a_slowed_down_operation_is_paced_without_burst() {
        let t0 = Instant::now();
        let mut rate = AimdRate::new(t0);
        let rounds = start_calls(&mut rate, t0, 4);
        rate.on_retry(t0, rounds[0], None);
        assert!(close(rate.qps(t0), 2.0));
        let waits: Vec<f64> = (0..3).map(|_| rate.start(t0).0.as_secs_f64()).collect();
        assert_eq!(waits, [0.5, 1.0, 1.5]);
        // A call arriving after them starts at once.
        assert_eq!(rate.start(at(t0, 5.0)).0, Duration::ZERO);
        // A decrease voids the slots of the old round: a caller waking in the new round
        // reserves again, at the new spacing.
        let (wait, old_round) = rate.start(at(t0, 5.0));
        assert!(wait > Duration::ZERO);
        rate.on_retry(at(t0, 5.0), old_round, None);
        assert_ne!(rate.round, old_round);
        let slowed = rate.qps(at(t0, 5.0));
        let (again, _) = rate.reserve(at(t0, 5.0));
        assert!(close(again.as_secs_f64(), 1.0 / slowed), "{again:?}");
    }

    #[test]
    fn the_rate_grows_back_linearly_to_the_configured_ceiling() {
        let t0 = Instant::now();
        let mut rate = AimdRate::new(t0);
        let rounds = start_calls(&mut rate, t0, 20);
        rate.on_retry(t0, rounds[0], Some(30.0));
        assert!(close(rate.qps(t0), 10.0));
        // +5 % of the 20 calls/s that hit the quota per second: back at 20 after 10 s.
        assert!(close(rate.qps(at(t0, 5.0)), 15.0));
        assert!(close(rate.qps(at(t0, 10.0)), 20.0));
        assert!(rate.qps(at(t0, 19.9)) > 29.0);
        // At --cloud-api-qps the slow-down ends.
        assert_eq!(rate.qps(at(t0, 20.0)), 0.0, "no longer slowed down");
        assert_eq!(rate.start(at(t0, 20.0)).0, Duration::ZERO);
    }

    #[test]
    fn without_a_configured_rate_the_ceiling_is_twice_the_rate_that_hit_the_quota() {
        let t0 = Instant::now();
        let mut rate = AimdRate::new(t0);
        let rounds = start_calls(&mut rate, t0, 8);
        rate.on_retry(t0, rounds[0], None);
        assert!(close(rate.qps(t0), 4.0));
        // From 4 to 16 at 0.4 per second: 30 s, whatever the traffic (a single Retry, e.g.
        // from a provider waiting for a load balancer, slows the operation for 30 s at most).
        assert!(rate.qps(at(t0, 29.9)) > 15.9);
        assert_eq!(rate.qps(at(t0, 30.0)), 0.0);
    }
}
