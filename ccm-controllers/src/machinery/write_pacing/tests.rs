use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::time::Instant;

use super::{
    EVENT_WRITES as EVENTS, LatencyLimit, NODE_INITIALISATION_WRITES as NODES, WritePacer,
};

const MS: Duration = Duration::from_millis(1);

/// Feeds `n` writes of `latency`, one every `latency`, from `*now` on, each finishing while
/// every slot is taken.
fn feed(limit: &mut LatencyLimit, now: &mut Instant, n: usize, latency: Duration) -> usize {
    let mut current = limit.current();
    for _ in 0..n {
        *now += latency;
        current = limit.on_sample(*now, latency, false, true);
    }
    current
}

/// A node limit at its maximum of 100, after quiet writes of 2 ms.
fn node_limit_at_full_width(now: &mut Instant) -> LatencyLimit {
    let mut limit = LatencyLimit::new(100, NODES);
    assert_eq!(feed(&mut limit, now, 200, 2 * MS), 100);
    limit
}

#[test]
fn the_node_limit_starts_narrow_and_climbs_only_while_it_holds_writes_back() {
    let mut limit = LatencyLimit::new(100, NODES);
    let mut now = Instant::now();
    assert_eq!(limit.current(), 4);
    // Quiet single writes (a Node joining now and then): the limit is not used, not raised.
    for _ in 0..50 {
        now += 2 * MS;
        assert_eq!(limit.on_sample(now, 2 * MS, false, false), 4);
    }
    // Writes held back and fast: one more per write, up to the workers, never above.
    assert_eq!(feed(&mut limit, &mut now, 10, 2 * MS), 14);
    assert_eq!(feed(&mut limit, &mut now, 200, 2 * MS), 100);
}

#[test]
fn fast_writes_keep_the_limit_at_the_workers() {
    let mut now = Instant::now();
    let mut limit = node_limit_at_full_width(&mut now);
    // Jitter within the slack around a 2 ms baseline is not a queue.
    for latency in [2, 3, 2, 6, 2, 4, 8, 2] {
        assert_eq!(feed(&mut limit, &mut now, 1, latency * MS), 100);
    }
    assert_eq!(
        limit.threshold(),
        Some((2 * MS).mul_f64(NODES.factor) + NODES.slack)
    );
}

#[test]
fn a_queue_at_the_api_server_halves_the_limit_once_per_latency_down_to_a_sixteenth() {
    let mut now = Instant::now();
    let mut limit = node_limit_at_full_width(&mut now);
    // 64 writes in flight report 40 ms at the same moment: one halving, not 64.
    now += 40 * MS;
    let mut after = 0;
    for _ in 0..64 {
        after = limit.on_sample(now, 40 * MS, false, true);
    }
    assert_eq!(after, 50, "one halving for one queue");
    assert_eq!(limit.gap(), Duration::ZERO, "no gap at one write or more");
    // The queue lasts: halved again each time the recent latency has passed, to one write,
    // then below: one write at a time, busy a sixteenth of the time.
    assert_eq!(feed(&mut limit, &mut now, 6, 40 * MS), 1);
    assert_eq!(limit.value(), 50.0 / 64.0);
    let expected = (40 * MS).mul_f64(64.0 / 50.0 - 1.0);
    assert!(limit.gap().abs_diff(expected) < Duration::from_micros(1));
    assert_eq!(feed(&mut limit, &mut now, 100, 40 * MS), 1);
    assert_eq!(limit.value(), 1.0 / 16.0, "never below the rule's lowest");
    // 15 times the latency, bounded.
    assert_eq!(limit.gap(), NODES.longest_gap);
    assert_eq!(feed(&mut limit, &mut now, 2, 12 * MS), 1);
    assert!(limit.gap().abs_diff(12 * MS * 15) < Duration::from_micros(1));
    // Below one write in flight the slower of the last two writes counts: one quick write amid
    // the queue changes nothing, the second in a row ends the gaps.
    assert_eq!(feed(&mut limit, &mut now, 1, 2 * MS), 1);
    assert_eq!(limit.value(), 1.0 / 16.0);
    assert!(limit.gap().abs_diff(12 * MS * 15) < Duration::from_micros(1));
    assert_eq!(feed(&mut limit, &mut now, 1, 2 * MS), 1);
    assert!(limit.value() > 1.0);
    assert_eq!(limit.gap(), Duration::ZERO);
    // Quick writes while every slot is taken: more in flight.
    assert!(feed(&mut limit, &mut now, 20, 2 * MS) > 1);
}

#[test]
fn the_event_limit_never_goes_below_one_write() {
    let mut now = Instant::now();
    let mut limit = LatencyLimit::new(20, EVENTS);
    feed(&mut limit, &mut now, 10, 2 * MS);
    // Within the baseline's window (30 s): the 2 ms writes stay the baseline.
    assert_eq!(feed(&mut limit, &mut now, 20, 900 * MS), 1);
    assert_eq!(limit.value(), 1.0);
    assert_eq!(limit.gap(), Duration::ZERO);
}

#[test]
fn overloaded_answers_halve_the_limit_however_fast() {
    let mut now = Instant::now();
    let mut limit = node_limit_at_full_width(&mut now);
    now += 2 * MS;
    assert_eq!(limit.on_sample(now, 2 * MS, true, true), 50, "a 429 or 5xx");
}

#[test]
fn one_slow_write_among_fast_ones_is_not_a_queue() {
    let mut now = Instant::now();
    let mut limit = node_limit_at_full_width(&mut now);
    // 20 ms once: the recent latency goes to 6.5 ms, below 2 × 2 ms + 5 ms.
    assert_eq!(feed(&mut limit, &mut now, 1, 20 * MS), 100);
}

#[test]
fn when_the_queue_is_gone_the_limit_climbs_back_one_per_write() {
    let mut now = Instant::now();
    let mut limit = node_limit_at_full_width(&mut now);
    assert_eq!(feed(&mut limit, &mut now, 60, 40 * MS), 1);
    // Back to 2 ms: the recent latency falls below the threshold within a few writes, then
    // each write adds one.
    let mut previous = 1;
    let mut rising = 0;
    for _ in 0..200 {
        let current = feed(&mut limit, &mut now, 1, 2 * MS);
        assert!(current >= previous, "no halving once the queue is gone");
        rising += usize::from(current > previous);
        previous = current;
    }
    assert_eq!(previous, 100, "up to the workers, never above");
    assert_eq!(rising, 99);
}

#[test]
fn the_baseline_of_quiet_writes_outlasts_a_quiet_hour_but_not_two_windows_of_load() {
    let mut now = Instant::now();
    let mut limit = node_limit_at_full_width(&mut now);
    // An hour without writes, then a burst: still measured against the quiet writes.
    now += Duration::from_secs(3600);
    assert_eq!(feed(&mut limit, &mut now, 40, 40 * MS), 1);
    // Load that lasts more than a whole window becomes the baseline: the latency of this API
    // server for these writes has changed, and the limit comes back.
    let windows = (2 * NODES.baseline_window.as_millis() / 40) as usize + 10;
    assert_eq!(feed(&mut limit, &mut now, windows, 40 * MS), 100);
}

#[test]
fn a_baseline_far_away_is_not_a_queue() {
    // An API server 80 ms away: 80 to 120 ms is its normal latency.
    let mut limit = LatencyLimit::new(10, NODES);
    let mut now = Instant::now();
    for latency in [80, 120, 90, 110, 100, 85] {
        feed(&mut limit, &mut now, 5, latency * MS);
    }
    assert_eq!(limit.current(), 10);
}

#[tokio::test]
async fn the_pacer_hands_out_slots_as_the_limit_says() {
    let gauge = Gauge::<f64, AtomicU64>::default();
    let pacer = Arc::new(WritePacer::new(4, NODES, gauge.clone()));
    assert_eq!(gauge.get(), 4.0);
    let held: Vec<_> = futures::future::join_all((0..4).map(|_| pacer.acquire())).await;
    // All four out: a fifth waits.
    let fifth = tokio::time::timeout(Duration::from_millis(50), pacer.acquire()).await;
    assert!(fifth.is_err(), "a fifth write waits for a slot");
    // A quiet baseline, then a queue: the limit halves down to a sixteenth while all four
    // slots are out.
    for permit in &held {
        permit.observe(2 * MS, false);
    }
    for _ in 0..8 {
        held[0].observe(60 * MS, false);
        tokio::time::sleep(Duration::from_millis(61)).await;
    }
    assert_eq!(pacer.limit(), 1.0 / 16.0);
    assert_eq!(gauge.get(), 1.0 / 16.0);
    // Three of the four come back: taken back, not handed out; the last one is the slot,
    // and it waits for the gap after the last write (15 times its latency, at most 250 ms,
    // counted from the write's end, 61 ms ago).
    drop(held);
    let asked = Instant::now();
    let one = pacer.acquire().await;
    let waited = asked.elapsed();
    assert!(
        waited >= Duration::from_millis(150),
        "the gap after a slow write: waited {waited:?}"
    );
    let second = tokio::time::timeout(Duration::from_millis(50), pacer.acquire()).await;
    assert!(second.is_err(), "one slot while the limit is below one");
    // Three writes wait; quiet again: the limit climbs (every slot is taken as it does: the
    // waiting writes take the new ones) and the waiting writes go.
    let went = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let waiting: Vec<_> = (0..3)
        .map(|_| {
            let (pacer, went) = (pacer.clone(), went.clone());
            tokio::spawn(async move {
                let _slot = pacer.acquire().await;
                went.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(3600)).await;
            })
        })
        .collect();
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    assert_eq!(went.load(std::sync::atomic::Ordering::SeqCst), 0);
    for _ in 0..20 {
        one.observe(2 * MS, false);
    }
    assert_eq!(pacer.limit(), 4.0);
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    assert_eq!(went.load(std::sync::atomic::Ordering::SeqCst), 3);
    drop(one);
    for task in waiting {
        task.abort();
    }
}

#[tokio::test(start_paused = true)]
async fn event_writes_halve_on_slow_or_overloaded_writes_and_climb_back_one_per_limit() {
    const FAST: Duration = Duration::from_millis(2);
    let mut c = LatencyLimit::new(32, EVENTS);
    c.on_sample(Instant::now(), FAST, false, true);
    assert_eq!(c.current(), 32);
    // The server slows down: 32 -> 16, and not again within the interval.
    c.on_sample(Instant::now(), Duration::from_millis(300), false, true);
    tokio::time::advance(Duration::from_millis(100)).await;
    c.on_sample(Instant::now(), Duration::from_millis(300), false, true);
    assert_eq!(c.current(), 16);
    for _ in 0..5 {
        tokio::time::advance(EVENTS.decrease_interval).await;
        c.on_sample(Instant::now(), FAST, true, true); // 429
    }
    assert_eq!(c.current(), 1, "never below one");
    // Slow, but under the floor: not a sign of a bottleneck.
    c.on_sample(Instant::now(), Duration::from_millis(50), false, true);
    assert_eq!(c.current(), 2);
    // Additive increase: about one more per limit's worth of fast writes.
    for _ in 0..200 {
        c.on_sample(Instant::now(), FAST, false, true);
    }
    assert!(c.current() >= 19 && c.current() < 32, "{}", c.current());
    for _ in 0..2000 {
        c.on_sample(Instant::now(), FAST, false, true);
    }
    assert_eq!(c.current(), 32);
}
