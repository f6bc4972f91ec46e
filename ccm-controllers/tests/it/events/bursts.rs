//! Bursts: Normal Events sampled past half the queue, Warnings kept when it is full, and the
//! writer's bound of writes in flight kept full.

use ccm_controllers::MAX_IN_FLIGHT;
use ccm_testing::wait::eventually;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use std::time::Duration;
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

/// A burst of Normal Events as large as the queue: the first half is written, then one in
/// `SAMPLE_EVERY` of the same component and reason; the rest is skipped and counted.
#[tokio::test]
async fn a_burst_of_normal_events_is_sampled_past_half_the_queue() {
    let (t, writer) = WriterTest::start(None).await;
    let n = t.events.capacity();
    // Queued before the writer runs: the whole burst at once.
    for i in 0..n {
        t.recorder
            .normal(&burst_subject(&t, i), "Synced", "Node synced successfully");
    }
    let kept = n / 2 + (n / 2).div_ceil(10);
    assert_eq!(t.events.queued(), kept);
    assert_eq!(t.counted("sampled"), (n - kept) as u64);
    assert_eq!(t.counted("dropped"), 0);
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    t.wait_counted("written", kept as u64).await;
    let events = all_events(&t).await;
    assert_eq!(events.len(), kept);
    let mut objects: Vec<String> = events
        .iter()
        .map(|e| e.regarding.as_ref().unwrap().name.clone().unwrap())
        .collect();
    objects.sort();
    objects.dedup();
    assert_eq!(objects.len(), kept, "one Event per object");
    assert_eq!(t.counted("dropped"), 0);
    assert_eq!(t.counted("failed"), 0);
    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}

/// Warnings that find the queue full are kept and written; Normal Events are dropped.
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
    assert_eq!(t.events.queued(), 2);
    assert_eq!(t.counted("dropped"), 1, "the third Normal Event");
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    t.wait_counted("written", 7).await;
    let warnings = all_events(&t)
        .await
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .count();
    assert_eq!(warnings, 5);
    assert_eq!(t.counted("dropped"), 1);
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
