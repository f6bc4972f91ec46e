//! The node-sync timer: when a pass runs for additions and removals.
use crate::controllers::service::plan::{HostChange, NodeSyncTimer};
use std::time::Duration;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Times are durations since an origin.
fn timer() -> NodeSyncTimer<Duration> {
    NodeSyncTimer::new(ms(200), ms(1600))
}

#[test]
fn joins_that_keep_coming_widen_the_window_up_to_the_max() {
    let mut t = timer();
    let mut now = ms(0);
    let mut passes = Vec::new();
    // A Node every 300 ms for 6 s.
    for _ in 0..20 {
        while let Some(due) = t.due().filter(|d| *d <= now) {
            passes.push(due);
            t.passed(due);
        }
        t.change(HostChange::Addition, now);
        now += ms(300);
    }
    while let Some(due) = t.due() {
        passes.push(due);
        t.passed(due);
    }
    // Windows 200, 400, 800, 1600, 1600, ... instead of one pass per Node.
    assert_eq!(t.addition_window(), ms(1600));
    assert!(passes.len() <= 7, "{passes:?}");
    let last_join = ms(300 * 19);
    assert!(*passes.last().unwrap() >= last_join);
    assert!(*passes.last().unwrap() <= last_join + ms(1600));
}

#[test]
fn a_pause_resets_the_window() {
    let mut t = timer();
    t.change(HostChange::Addition, ms(0));
    t.passed(ms(200));
    t.change(HostChange::Addition, ms(300));
    assert_eq!(t.addition_window(), ms(400));
    t.passed(ms(700));
    // Nothing for longer than the largest window (1600 ms): back to the base.
    t.change(HostChange::Addition, ms(2301));
    assert_eq!(t.addition_window(), ms(200));
    assert_eq!(t.due(), Some(ms(2501)));
}

/// The passes a timer runs for additions at `joins` (in order), each pass at its due
/// time.
fn passes_for_joins(t: &mut NodeSyncTimer<Duration>, joins: &[Duration]) -> Vec<Duration> {
    let mut passes = Vec::new();
    for &now in joins {
        while let Some(due) = t.due().filter(|d| *d <= now) {
            passes.push(due);
            t.passed(due);
        }
        t.change(HostChange::Addition, now);
    }
    while let Some(due) = t.due() {
        passes.push(due);
        t.passed(due);
    }
    passes
}

/// Issue 19's own case: a Node every 2 s against the 1 s base window (and the 8 s
/// default maximum). Each join comes 1 s after the pass of the one before, outside the
/// current window but within the largest: the window widens 1, 2, 4, 8 s, so 9 joins
/// over 16 s cost 5 passes, not 9.
#[test]
fn joins_slower_than_the_base_window_still_widen_it() {
    let mut t = NodeSyncTimer::new(ms(1000), ms(8000));
    let joins: Vec<Duration> = (0..9).map(|n| ms(n * 2000)).collect();
    let passes = passes_for_joins(&mut t, &joins);
    assert_eq!(t.addition_window(), ms(8000));
    // Windows of 1, 2, 4 and 8 s open at the joins at 0, 2, 4 and 8 s (a pass due at
    // the instant of a join runs first), and one more of 8 s at the 16 s join.
    assert_eq!(
        passes,
        vec![ms(1000), ms(4000), ms(8000), ms(16_000), ms(24_000)]
    );
    // The last Node waits at most the largest window.
    assert!(*passes.last().unwrap() <= ms(16_000) + ms(8000));
}

#[test]
fn a_join_within_the_largest_window_of_the_last_pass_keeps_widening() {
    let mut t = timer();
    t.change(HostChange::Addition, ms(0));
    t.passed(ms(200));
    // 1599 ms after the pass: within the 1600 ms maximum.
    t.change(HostChange::Addition, ms(1799));
    assert_eq!(t.addition_window(), ms(400));
}

#[test]
fn a_pass_for_removals_alone_does_not_count_as_joining() {
    let mut t = timer();
    t.change(HostChange::Removal, ms(0));
    t.passed(ms(200));
    t.change(HostChange::Addition, ms(300));
    assert_eq!(t.addition_window(), ms(200));
    assert_eq!(t.due(), Some(ms(500)));
}

#[test]
fn a_removal_goes_out_within_the_base_window_during_a_wide_addition_window() {
    let mut t = timer();
    // Joins every 300 ms until the window is at its widest (passes at 200, 700, 1700,
    // 3400; the join at 3600 opens a 1600 ms window).
    for n in 0..13u64 {
        let now = ms(n * 300);
        while let Some(due) = t.due().filter(|d| *d <= now) {
            t.passed(due);
        }
        t.change(HostChange::Addition, now);
    }
    assert_eq!(t.addition_window(), ms(1600));
    assert_eq!(t.due(), Some(ms(5200)));
    t.change(HostChange::Removal, ms(3700));
    assert_eq!(t.due(), Some(ms(3900)), "the removal's base window");
}

#[test]
fn removals_alone_keep_the_quiet_window_and_its_deadline() {
    let mut t = timer();
    for n in 0..10u64 {
        t.change(HostChange::Removal, ms(n * 150));
    }
    // Quiet window would be 1350 + 200; the burst deadline is 0 + 5 × 200.
    assert_eq!(t.due(), Some(ms(1000)));
}

#[test]
fn a_batch_answered_retry_runs_the_next_pass_after_the_delay_and_none_before() {
    let mut t = timer();
    assert_eq!(t.due(), None);
    t.change(HostChange::Addition, ms(0));
    t.passed(ms(200));
    // The pass's batch was answered Retry: nothing else pending, yet a pass is due.
    t.retry_at(ms(3200));
    assert_eq!(t.due(), Some(ms(3200)));
    // A removal arriving meanwhile waits for the provider's delay: the pass then covers it.
    t.change(HostChange::Removal, ms(1000));
    assert_eq!(t.due(), Some(ms(3200)));
    t.passed(ms(3200));
    assert_eq!(t.due(), None, "the pass covered the removal and the retry");
    // Changes after the delay go out within their windows again.
    t.change(HostChange::Removal, ms(4000));
    assert_eq!(t.due(), Some(ms(4200)));
}

/// Issue 25: while the provider's hosts batch carries every load balancer in a few calls, the
/// joins of issue 19's case (one every 2 s, base 1 s, maximum 8 s) keep the base window: one
/// pass 1 s after each join instead of 5 widening passes, so the last Node reaches every load
/// balancer 1 s after it joined, not up to 8 s.
#[test]
fn cheap_passes_keep_the_base_window() {
    let mut t = NodeSyncTimer::new(ms(1000), ms(8000));
    t.passes_are_cheap(true);
    let joins: Vec<Duration> = (0..9).map(|n| ms(n * 2000)).collect();
    let passes = passes_for_joins(&mut t, &joins);
    assert_eq!(t.addition_window(), ms(1000));
    let expected: Vec<Duration> = joins.iter().map(|j| *j + ms(1000)).collect();
    assert_eq!(passes, expected);
}

/// Passes that become expensive again (load balancers added beyond the batch's few calls)
/// widen the window from the next join on.
#[test]
fn passes_that_become_expensive_widen_again() {
    let mut t = NodeSyncTimer::new(ms(1000), ms(8000));
    t.passes_are_cheap(true);
    t.change(HostChange::Addition, ms(0));
    t.passed(ms(1000));
    t.passes_are_cheap(false);
    t.change(HostChange::Addition, ms(2000));
    assert_eq!(t.addition_window(), ms(2000));
}

#[test]
fn a_batched_pass_costs_one_call_per_max_batch_size_load_balancers() {
    use crate::controllers::service::plan::{CHEAP_BATCHED_PASS_CALLS, batched_pass_calls};
    assert_eq!(batched_pass_calls(10_000, 5_000), 2);
    assert_eq!(batched_pass_calls(10_000, 100), 100);
    assert_eq!(batched_pass_calls(10_001, 5_000), 3);
    assert_eq!(batched_pass_calls(0, 100), 0);
    assert_eq!(batched_pass_calls(5, 0), 5, "max_batch_size 0 counts as 1");
    assert!(batched_pass_calls(10_000, 3_334) <= CHEAP_BATCHED_PASS_CALLS);
}

#[test]
fn joins_under_way_hold_additions_until_none_awaits_initialisation() {
    let mut t = timer();
    t.joining(true);
    // Nodes initialised one after the other, 100 ms apart, while others still await theirs.
    for i in 0..10 {
        t.change(HostChange::Addition, ms(i * 100));
    }
    assert_eq!(t.due(), Some(ms(1600)), "at most the largest window");
    // The last one initialised: the pass is due at once (the base window has passed).
    t.joining(false);
    assert_eq!(t.due(), Some(ms(200)));
    t.passed(ms(1000));
    assert_eq!(t.due(), None);
}

#[test]
fn joins_that_never_end_wait_at_most_the_largest_window() {
    let mut t = timer();
    t.joining(true);
    t.change(HostChange::Addition, ms(0));
    assert_eq!(t.due(), Some(ms(1600)));
    // A removal is not held by the joins.
    t.change(HostChange::Removal, ms(100));
    assert_eq!(t.due(), Some(ms(300)));
}

#[test]
fn joins_under_way_do_not_hold_cheap_passes() {
    let mut t = timer();
    t.passes_are_cheap(true);
    t.joining(true);
    t.change(HostChange::Addition, ms(0));
    assert_eq!(t.due(), Some(ms(200)));
}

#[test]
fn joins_during_a_pass_longer_than_the_largest_window_keep_widening_it() {
    // A pass held by a cloud quota runs 3 s (longer than the 1.6 s largest window); the joins
    // that arrived meanwhile are recorded when it ends.
    let mut t = timer();
    t.change(HostChange::Addition, ms(0));
    assert_eq!(t.due(), Some(ms(200)));
    t.passed(ms(200));
    t.finished(ms(3200));
    t.change(HostChange::Addition, ms(3200));
    // Counted from the pass's start (200 ms), this looked like a join after a pause.
    assert_eq!(t.addition_window(), ms(400));
    assert_eq!(t.due(), Some(ms(3600)));
    t.passed(ms(3600));
    t.finished(ms(3700));
    // A real pause after the end of the last pass still resets it.
    t.change(HostChange::Addition, ms(3700 + 1601));
    assert_eq!(t.addition_window(), ms(200));
}

#[test]
fn a_pass_for_removals_alone_does_not_move_the_joining_reference() {
    let mut t = timer();
    t.change(HostChange::Addition, ms(0));
    t.passed(ms(200));
    t.finished(ms(300));
    t.change(HostChange::Removal, ms(400));
    t.passed(ms(600));
    t.finished(ms(1800));
    // 1,700 ms after the end of the last pass with additions (300 ms): a pause, although
    // only 100 ms after the removals' pass.
    t.change(HostChange::Addition, ms(1901));
    assert_eq!(t.addition_window(), ms(200));
}
