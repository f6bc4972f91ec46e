//! Correlation as client-go's `EventCorrelator`: identical Events counted on one, similar ones
//! combined, spam held back.

use std::time::{Duration, Instant};

use ccm_controllers::NormalEventBudget;
use k8s_openapi::api::events::v1::Event;
use tokio_util::sync::CancellationToken;

use super::{WAIT, WriterTest, subject};

/// Identical Events are one Event with their count; the repeats of a Normal one are patched
/// at most once per repeat window (here 2 s), with the full count.
#[tokio::test]
async fn identical_events_are_one_event_with_their_count() {
    let (t, writer) = WriterTest::start(None).await;
    let window = Duration::from_secs(2);
    let writer =
        writer.with_normal_budget(NormalEventBudget::default().with_series_interval(window));
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    t.recorder
        .normal(&t.object, "EnsuredLoadBalancer", "Ensured load balancer");
    t.wait_counted("written", 1).await;
    let created = Instant::now();
    for _ in 0..4 {
        t.recorder
            .normal(&t.object, "EnsuredLoadBalancer", "Ensured load balancer");
    }
    t.wait_counted("written", 5).await;
    assert!(created.elapsed() >= window - Duration::from_millis(200));
    if let Some(server) = t.cluster.api_server() {
        let writes: Vec<String> = server
            .requests()
            .iter()
            .filter(|r| r.resource == "events" && r.verb != "list")
            .map(|r| r.verb.clone())
            .collect();
        assert_eq!(
            writes,
            ["create", "patch"],
            "one create, one PATCH of four repeats"
        );
    }
    let events = t.events_now().await;
    assert_eq!(events.len(), 1, "{events:#?}");
    let event = &events[0];
    assert_eq!(
        event.series.as_ref().map(|s| s.count),
        Some(5),
        "{event:#?}"
    );
    assert_eq!(event.note.as_deref(), Some("Ensured load balancer"));
    // Named as client-go names Events: the object's name, a dot, hex nanoseconds.
    let name = event.metadata.name.as_deref().unwrap();
    let suffix = name.strip_prefix(&format!("{}.", t.name)).unwrap();
    assert!(u64::from_str_radix(suffix, 16).is_ok(), "{name}");
    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn a_flood_of_similar_events_is_combined_into_one() {
    let (t, writer) = WriterTest::start(None).await;
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    for i in 0..15 {
        t.recorder.warning(
            &t.object,
            "SyncLoadBalancerFailed",
            format!("Error syncing load balancer: attempt {i}"),
        );
    }
    t.wait_counted("written", 15).await;
    let events = t.events_now().await;
    // Nine Events with their own notes, then one combining the tenth to the fifteenth.
    assert_eq!(events.len(), 10, "{events:#?}");
    let combined: Vec<&Event> = events
        .iter()
        .filter(|e| {
            e.note
                .as_deref()
                .is_some_and(|n| n.starts_with("(combined from similar events): "))
        })
        .collect();
    assert_eq!(combined.len(), 1, "{events:#?}");
    assert_eq!(
        combined[0].note.as_deref(),
        Some("(combined from similar events): Error syncing load balancer: attempt 9")
    );
    assert_eq!(combined[0].series.as_ref().map(|s| s.count), Some(6));
    assert_eq!(combined[0].type_.as_deref(), Some("Warning"));
    assert_eq!(t.counted("dropped"), 0);
    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn the_spam_filter_holds_back_events_past_the_burst_per_object() {
    let (t, writer) = WriterTest::start(None).await;
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    for i in 0..30 {
        t.recorder
            .normal(&t.object, &format!("Reason{i}"), "one of many");
    }
    t.wait_counted("filtered", 5).await;
    t.wait_counted("written", 25).await;
    let events = t.events_now().await;
    assert_eq!(events.len(), 25);
    // Only this object's bucket is empty.
    let other = subject(&t.ns, &format!("{}-other", t.name));
    t.recorder.normal(&other, "Reason0", "another object");
    t.wait_counted("written", 26).await;
    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}
