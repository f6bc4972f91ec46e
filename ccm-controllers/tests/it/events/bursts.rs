//! Bursts: Normal Events past their budget told by a summary, Warnings never held back,
//! delayed or dropped, and the writer's bound of writes in flight kept full.

use ccm_controllers::{MAX_IN_FLIGHT, NormalEventBudget};
use ccm_testing::wait::eventually;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use super::{HANG, WAIT, WriterTest, subject};

/// Object `i` of a burst: each its own Event (the spam filter allows 25 per object).
fn burst_subject(t: &WriterTest, i: usize) -> Service {
    subject(&t.ns, &format!("{}-{i}", t.name))
}

/// All Events in the test's namespace.
async fn all_events(t: &WriterTest) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(t.cluster.client(), &t.ns);
    api.list(&ListParams::default()).await.unwrap().items
}

/// A burst of Normal Events larger than the Normal Event budget: the budget's burst (100) is
/// written at once, then about its rate (10 per second); every one held back is counted, by
/// component, reason and cause, and told by one summary Event on the last object held back
/// once the burst is over.
#[tokio::test]
async fn a_burst_of_normal_events_past_the_budget_becomes_one_summary_event() {
    let (t, writer) = WriterTest::start(None).await;
    let quiet = Duration::from_secs(1);
    let budget = NormalEventBudget::default().with_summary_delays(quiet, Duration::from_secs(60));
    assert_eq!((budget.qps, budget.burst), (10.0, 100), "the defaults");
    let writer = writer.with_normal_budget(budget);
    let n = 400;
    // Queued before the writer runs: the whole burst at once.
    for i in 0..n {
        t.recorder
            .normal(&burst_subject(&t, i), "Synced", "Node synced successfully");
    }
    let started = Instant::now();
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    // The summary Event, once nothing was held back for `quiet`.
    assert!(
        eventually(WAIT, || async { t.counted("summaries") == 1 }).await,
        "{}",
        t.metrics.encode().unwrap()
    );
    let written = t.counted("written");
    let summarised = t.counted("summarised");
    let allowed = 100 + (10.0 * started.elapsed().as_secs_f64()).ceil() as u64;
    assert!(
        written >= 100 && written <= allowed,
        "{written} > {allowed}"
    );
    assert_eq!(written + summarised, n as u64);
    assert_eq!(t.not_written("Synced", "budget"), summarised);
    assert_eq!(t.counted("dropped"), 0);
    let events = all_events(&t).await;
    assert_eq!(
        events.len() as u64,
        written + 1,
        "the Events written and one summary"
    );
    let summaries: Vec<&Event> = events
        .iter()
        .filter(|e| {
            e.note
                .as_deref()
                .is_some_and(|n| n.contains("not written one by one"))
        })
        .collect();
    assert_eq!(summaries.len(), 1, "{summaries:#?}");
    let summary = summaries[0];
    assert_eq!(summary.type_.as_deref(), Some("Normal"));
    assert_eq!(summary.reason.as_deref(), Some("Synced"));
    let note = summary.note.as_deref().unwrap();
    assert!(
        note.starts_with(&format!("{summarised} Synced Event(s) of test-controller")),
        "{note}"
    );
    assert!(
        note.ends_with("the last: Node synced successfully"),
        "{note}"
    );
    // On the last object held back: the end of the burst.
    let last = format!("{}-{}", t.name, n - 1);
    assert_eq!(
        summary.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some(last.as_str())
    );
    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}

/// Over budget a Normal Event costs no write: the writer takes it from the queue into its
/// summary even while hung writes hold every Normal write slot, so the queue does not
/// overflow.
#[tokio::test]
async fn events_over_budget_leave_the_queue_while_every_slot_is_held() {
    let (t, writer) = WriterTest::start(Some(50)).await;
    let Some(server) = t.cluster.api_server() else {
        return; // needs fault injection
    };
    let budget = NormalEventBudget::default().with_rate(0.0, MAX_IN_FLIGHT as u32);
    let writer = writer.with_normal_budget(budget);
    server.fail_next("create", "events", MAX_IN_FLIGHT, 429, Some(HANG));
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), Duration::from_millis(500)));
    for i in 0..MAX_IN_FLIGHT {
        t.recorder
            .normal(&burst_subject(&t, i), "Synced", "Node synced successfully");
    }
    let hung = || {
        server
            .requests()
            .iter()
            .filter(|r| r.resource == "events" && r.status == 429)
            .count()
    };
    assert!(eventually(WAIT, || async { hung() == MAX_IN_FLIGHT }).await);
    for i in 0..200 {
        t.recorder.normal(
            &burst_subject(&t, MAX_IN_FLIGHT + i),
            "Synced",
            "Node synced successfully",
        );
        if i % 25 == 24 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    t.wait_counted("summarised", 200).await;
    assert_eq!(t.counted("dropped"), 0);
    assert_eq!(t.not_written("Synced", "queue_full"), 0);
    stop.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    t.cluster.cleanup().await;
}

/// Warnings are not budgeted: after the Normal Event budget is spent, every Warning is still
/// written, at once.
#[tokio::test]
async fn warnings_are_never_held_back_by_the_normal_budget() {
    let (t, writer) = WriterTest::start(None).await;
    // The default burst, no refill: the last 50 Normal Events are over budget whatever the
    // pace of the server.
    let writer = writer.with_normal_budget(NormalEventBudget::default().with_rate(0.0, 100));
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    for i in 0..150 {
        t.recorder
            .normal(&burst_subject(&t, i), "Synced", "Node synced successfully");
    }
    for i in 0..150 {
        t.recorder.warning(
            &burst_subject(&t, 1000 + i),
            "SyncFailed",
            "the cloud said no",
        );
    }
    let warnings_written = || async {
        all_events(&t)
            .await
            .iter()
            .filter(|e| e.type_.as_deref() == Some("Warning"))
            .count()
    };
    assert!(eventually(WAIT, || async { warnings_written().await == 150 }).await);
    t.wait_counted("summarised", 50).await;
    assert_eq!(t.counted("dropped"), 0);
    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}

/// Warnings never wait behind Normal Events: with every Normal write slot held by a hung
/// write and Normal Events queued behind them, a Warning is written at once.
#[tokio::test]
async fn a_warning_is_not_delayed_behind_hung_normal_writes() {
    let (t, writer) = WriterTest::start(None).await;
    let Some(server) = t.cluster.api_server() else {
        return; // needs fault injection
    };
    server.fail_next("create", "events", MAX_IN_FLIGHT, 429, Some(HANG));
    for i in 0..MAX_IN_FLIGHT + 20 {
        t.recorder
            .normal(&burst_subject(&t, i), "Synced", "Node synced successfully");
    }
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), Duration::from_millis(500)));
    let hung = || {
        server
            .requests()
            .iter()
            .filter(|r| r.resource == "events" && r.status == 429)
            .count()
    };
    assert!(eventually(WAIT, || async { hung() == MAX_IN_FLIGHT }).await);
    t.recorder
        .warning(&burst_subject(&t, 999), "SyncFailed", "the cloud said no");
    assert!(
        eventually(WAIT, || async {
            all_events(&t)
                .await
                .iter()
                .any(|e| e.type_.as_deref() == Some("Warning"))
        })
        .await,
        "the Warning waited"
    );
    assert_eq!(t.events.queued(), 20, "the Normal ones still wait");
    stop.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    t.cluster.cleanup().await;
}

/// Warnings that find the queue full are kept and written; Normal Events go to a summary.
#[tokio::test]
async fn warnings_are_never_dropped_for_a_full_queue() {
    let (t, writer) = WriterTest::start(Some(2)).await;
    for i in 0..3 {
        t.recorder.normal(&burst_subject(&t, i), "Synced", "synced");
    }
    for i in 0..5 {
        t.recorder.warning(
            &burst_subject(&t, 10 + i),
            "SyncFailed",
            "the cloud said no",
        );
    }
    assert_eq!(t.events.queued(), 2 + 5, "two Normal Events, five Warnings");
    assert_eq!(t.counted("summarised"), 1, "the third Normal Event");
    assert_eq!(t.not_written("Synced", "queue_full"), 1);
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    t.wait_counted("written", 7).await;
    let warnings = all_events(&t)
        .await
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .count();
    assert_eq!(warnings, 5);
    assert_eq!(t.counted("dropped"), 0);
    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn the_writer_keeps_max_in_flight_writes_in_flight() {
    let (t, writer) = WriterTest::start(None).await;
    let Some(server) = t.cluster.api_server() else {
        return; // needs fault injection
    };
    let n = MAX_IN_FLIGHT + 8;
    // Every create hangs (the client waits an hour to retry the 429): each holds its slot.
    server.fail_next("create", "events", n, 429, Some(HANG));
    for i in 0..n {
        t.recorder
            .normal(&burst_subject(&t, i), "Synced", "Node synced successfully");
    }
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), Duration::from_millis(500)));
    let hung = || {
        server
            .requests()
            .iter()
            .filter(|r| r.resource == "events" && r.status == 429)
            .count()
    };
    assert!(eventually(WAIT, || async { hung() == MAX_IN_FLIGHT }).await);
    // The rest wait in the queue for a slot: no further write is made.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(hung(), MAX_IN_FLIGHT);
    assert_eq!(t.events.queued(), n - MAX_IN_FLIGHT);
    stop.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .expect("the writer stops at the flush deadline")
        .unwrap();
    assert_eq!(t.counted("dropped"), n as u64);
    assert_eq!(t.counted("written"), 0);
    t.cluster.cleanup().await;
}

/// `event_recorder_in_flight_limit`.
fn in_flight_limit(t: &WriterTest) -> f64 {
    let text = t.metrics.encode().unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("event_recorder_in_flight_limit "))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or_else(|| panic!("no event_recorder_in_flight_limit in {text}"))
}

/// When the API server slows down (its answers take far longer than they did), the writer
/// keeps fewer writes in flight, leaving the server to the controllers' own writes.
#[tokio::test]
async fn the_writer_yields_when_the_api_server_slows_down() {
    let (t, writer) = WriterTest::start(None).await;
    let Some(server) = t.cluster.api_server() else {
        return; // slows the in-process server down
    };
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    t.recorder.normal(&burst_subject(&t, 0), "Synced", "fast");
    t.wait_counted("written", 1).await;
    assert_eq!(in_flight_limit(&t), MAX_IN_FLIGHT as f64);
    server.set_latency(Duration::from_millis(400));
    for i in 1..=40 {
        t.recorder
            .normal(&burst_subject(&t, i), "Synced", "Node synced successfully");
    }
    t.wait_counted("written", 41).await;
    let limit = in_flight_limit(&t);
    assert!(limit <= (MAX_IN_FLIGHT / 2) as f64, "{limit}");
    server.set_latency(Duration::ZERO);
    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}
