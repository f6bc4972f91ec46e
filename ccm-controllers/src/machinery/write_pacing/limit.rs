//! The limit on writes in flight (AIMD on latency): pure state, fed with the time of each
//! write. One rule for every writer that gives way to a busy API server; each writer has its
//! own [`CongestionRule`].

use std::time::Duration;

use tokio::time::Instant;

/// How a writer tells a queue at the API server from its writes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CongestionRule {
    /// The writes are slow when their recent latency is above the baseline × `factor` +
    /// `slack`, and above `floor`.
    pub(crate) factor: f64,
    /// See `factor`: so that a baseline of a millisecond or two does not take jitter for a
    /// queue.
    pub(crate) slack: Duration,
    /// See `factor`.
    pub(crate) floor: Duration,
    /// Weight of the newest write in the recent latency (an exponentially weighted average;
    /// 1 takes each write alone). Below one write in flight the recent latency is the slower
    /// of the last two writes instead.
    pub(crate) smoothing: f64,
    /// At most one halving per this long, or per the recent latency when longer (the writes
    /// already in flight when the queue formed report it too, and must count once).
    pub(crate) decrease_interval: Duration,
    /// The baseline is the lowest recent latency of the current bucket of half this long and
    /// the bucket before, however old: a burst after a quiet hour is measured against the last
    /// quiet writes.
    pub(crate) baseline_window: Duration,
    /// How fast the limit climbs back after writes that are not slow.
    pub(crate) increase: Increase,
    /// The limit at start (at most the writer's maximum): a writer that starts low finds its
    /// pace by climbing, so that the first burst does not meet it at full width.
    pub(crate) start: usize,
    /// The lowest limit, at most 1. Below one write in flight the one slot stays taken after
    /// each write for `(1 / limit - 1)` times the recent latency ([`LatencyLimit::gap`]): the
    /// writer is busy that share of the time, so it gives way further than one write at a
    /// time while the queue lasts.
    pub(crate) lowest: f64,
    /// The longest gap after a write (see `lowest`): the writer's slowest pace.
    pub(crate) longest_gap: Duration,
}

/// How fast a [`LatencyLimit`] climbs back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Increase {
    /// One per write (catches up at once when the queue is gone).
    PerWrite,
    /// One per limit's worth of writes (TCP's additive increase).
    PerLimitOfWrites,
}

/// The lowest value of the current bucket and the one before (buckets of half the window
/// each, a new one started by the first value after the current one is that old): an old
/// bucket is dropped only when a newer one replaces it.
#[derive(Debug, Default)]
struct WindowedMin {
    /// The current bucket: when it started and its lowest value.
    current: Option<(Instant, Duration)>,
    /// The lowest value of the bucket before.
    previous: Option<Duration>,
}

impl WindowedMin {
    fn observe(&mut self, now: Instant, value: Duration, window: Duration) {
        match self.current {
            Some((start, lowest)) if now.saturating_duration_since(start) < window / 2 => {
                self.current = Some((start, lowest.min(value)));
            }
            Some((_, lowest)) => {
                self.previous = Some(lowest);
                self.current = Some((now, value));
            }
            None => self.current = Some((now, value)),
        }
    }

    fn get(&self) -> Option<Duration> {
        let current = self.current.map(|(_, lowest)| lowest);
        match (current, self.previous) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The writes allowed in flight: halved when they are slow or the API server says it is
/// overloaded (`429`, `5xx`), raised again while they are not, between the rule's `lowest`
/// (below one: one write at a time with a [`gap`](Self::gap) after each) and the writer's
/// maximum.
#[derive(Debug)]
pub(crate) struct LatencyLimit {
    rule: CongestionRule,
    limit: f64,
    max: f64,
    /// The recent latency (exponentially weighted average of the writes' latencies).
    recent: Option<Duration>,
    /// The latency of the newest write.
    newest: Option<Duration>,
    /// The lowest recent latency of the window.
    baseline: WindowedMin,
    last_decrease: Option<Instant>,
}

impl LatencyLimit {
    /// A limit that starts at the rule's `start` and never exceeds `max` (at least 1).
    pub(crate) fn new(max: usize, rule: CongestionRule) -> Self {
        let max = max.max(1);
        let lowest = if rule.lowest.is_finite() {
            rule.lowest.clamp(f64::MIN_POSITIVE, 1.0)
        } else {
            1.0
        };
        let rule = CongestionRule { lowest, ..rule };
        LatencyLimit {
            rule,
            limit: rule.start.clamp(1, max) as f64,
            max: max as f64,
            recent: None,
            newest: None,
            baseline: WindowedMin::default(),
            last_decrease: None,
        }
    }

    /// The writes allowed in flight now (at least one).
    pub(crate) fn current(&self) -> usize {
        // In lowest..=max by construction, lowest in (0, 1].
        (self.limit.floor() as usize).max(1)
    }

    /// The limit as it is: writes in flight, or below 1 the share of the time one is.
    pub(crate) fn value(&self) -> f64 {
        self.limit
    }

    /// How long the one slot stays taken after a write while the limit is below one write in
    /// flight: `(1 / limit - 1)` times the recent latency (below one write in flight, the
    /// slower of the last two writes'), at most the rule's `longest_gap`; zero at one write or
    /// more.
    pub(crate) fn gap(&self) -> Duration {
        match self.recent {
            Some(recent) if self.limit < 1.0 => recent
                .mul_f64(1.0 / self.limit - 1.0)
                .min(self.rule.longest_gap),
            _ => Duration::ZERO,
        }
    }

    /// Above this recent latency the writes are slow. `None` before the first write.
    pub(crate) fn threshold(&self) -> Option<Duration> {
        let rule = &self.rule;
        self.baseline.get().map(|b| {
            b.mul_f64(rule.factor)
                .saturating_add(rule.slack)
                .max(rule.floor)
        })
    }

    /// Takes a write that finished at `now` after `latency`; `overloaded` when the API server
    /// answered `429` or `5xx`; `limited` when the limit held writes back as it finished
    /// (every slot taken): only then does a write that was not slow raise the limit, which
    /// thus never climbs beyond what the writer uses (RFC 7661's rule for TCP). Returns the
    /// new limit.
    pub(crate) fn on_sample(
        &mut self,
        now: Instant,
        latency: Duration,
        overloaded: bool,
        limited: bool,
    ) -> usize {
        // Below one write in flight the writes are apart, each alone at the API server: the
        // recent latency is the slower of the last two (not an average over many gaps), so two
        // quick writes in a row end the gaps, and one quick write amid a queue does not.
        let recent = match (self.recent, self.newest) {
            (None, _) => latency,
            (Some(_), Some(newest)) if self.limit < 1.0 => latency.max(newest),
            (Some(r), _) => {
                let a = self.rule.smoothing;
                r.mul_f64(1.0 - a) + latency.mul_f64(a)
            }
        };
        self.newest = Some(latency);
        self.recent = Some(recent);
        self.baseline
            .observe(now, recent, self.rule.baseline_window);
        let slow = self.threshold().is_some_and(|t| recent > t);
        if slow || overloaded {
            let interval = self.rule.decrease_interval.max(recent);
            let due = self
                .last_decrease
                .is_none_or(|at| now.saturating_duration_since(at) >= interval);
            if due {
                self.limit = (self.limit / 2.0).max(self.rule.lowest);
                self.last_decrease = Some(now);
            }
        } else if limited {
            let step = match self.rule.increase {
                Increase::PerWrite => 1.0,
                Increase::PerLimitOfWrites => 1.0 / self.limit,
            };
            self.limit = (self.limit + step).min(self.max);
        }
        self.current()
    }
}
